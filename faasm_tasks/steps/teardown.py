"""Hard, idempotent teardown; safe to run when nothing (or only part) was deployed."""

from __future__ import annotations

from ..billing import stop_sampler
from ..common import add_common, all_run_state_keys, run_date
from ..results import write_op_report
from ..targets import get_target


def add_arguments(p):
    add_common(p, experiment=True)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for things to go away")
    p.add_argument("--full", action="store_true",
                   help="knative: also delete Redis, the upload service and the namespace")


def run(args) -> int:
    date = run_date(args)
    keys = all_run_state_keys(args)
    sampler = stop_sampler(args.state_dir, args.run_id)
    target = get_target(args.target, args)
    report = target.teardown(keys, args.timeout, full=args.full) if args.target == "knative" else \
        target.teardown(keys, args.timeout)
    write_op_report(args.results, date, args.run_id, "teardown",
                    {"target": args.target, "run_state_keys": keys, "sampler": sampler, "report": report})
    if report.get("incomplete"):
        print("teardown: INCOMPLETE: " + "; ".join(report["incomplete"]), flush=True)
        return 1
    print(f"teardown: done ({args.target})", flush=True)
    return 0
