"""Wait until the deployment answers: status conditions and registered workers, with a timeout."""

from __future__ import annotations

from ..common import add_common, run_date
from ..results import write_op_report
from ..targets import get_target


def add_arguments(p):
    add_common(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before giving up (default 600)")


def run(args) -> int:
    date = run_date(args)
    report = get_target(args.target, args).wait_ready(args.timeout)
    write_op_report(args.results, date, args.run_id, "wait-ready", {"target": args.target, "report": report})
    print(f"wait-ready: ready {report}", flush=True)
    return 0
