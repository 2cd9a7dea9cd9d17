"""Prove the teardown worked; exits 1 (and says what is left) when it did not."""

from __future__ import annotations

import sys

from ..common import add_common, all_run_state_keys, run_date
from ..results import write_op_report
from ..targets import get_target


def add_arguments(p):
    add_common(p, experiment=True)


def run(args) -> int:
    date = run_date(args)
    report = get_target(args.target, args).verify_clean(all_run_state_keys(args))
    write_op_report(args.results, date, args.run_id, "verify-clean", {"target": args.target, "report": report})
    if not report["clean"]:
        print("verify-clean: NOT clean: " + "; ".join(report["problems"]), file=sys.stderr, flush=True)
        return 1
    print("verify-clean: clean", flush=True)
    return 0
