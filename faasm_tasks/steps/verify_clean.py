"""Prove the teardown worked; exits 1 (and says what is left) when it did not.

On the local target it looks for the run's processes by their run label (billing sampler
and load driver included), so a missing or broken state file cannot make it say clean."""

from __future__ import annotations

import sys

from ..common import add_common, run_date, teardown_state_keys
from ..results import write_op_report
from ..targets import get_target


def add_arguments(p):
    add_common(p, experiment=True)
    p.add_argument(
        "--full",
        action="store_true",
        help="knative: after a teardown --full, also check that the Redis and upload pods and Services are gone",
    )


def run(args) -> int:
    date = run_date(args)
    keys, key_problem = teardown_state_keys(args)
    target = get_target(args.target, args)
    report = target.verify_clean(keys, full=args.full) if args.target == "knative" else target.verify_clean(keys)
    if key_problem:
        report["input_problem"] = key_problem
    write_op_report(args.results, date, args.run_id, "verify-clean", {"target": args.target, "report": report})
    if not report["clean"]:
        print("verify-clean: NOT clean: " + "; ".join(report["problems"]), file=sys.stderr, flush=True)
        return 1
    print("verify-clean: clean", flush=True)
    return 0
