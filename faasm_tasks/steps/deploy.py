"""Deploy the target for one experiment and system (idempotent: an identical deployment is kept)."""

from __future__ import annotations

import argparse

from ..catalogue import replicas_for
from ..common import add_common, add_replicas, load_plan, parse_set, record_state_keys, run_date
from ..results import write_op_report
from ..targets import get_target


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a bad value exits 2 naming the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def add_arguments(p):
    add_common(p, experiment=True, experiment_required=True)
    p.add_argument("--workers", type=positive_int, help="override the worker replica count (>= 1)")
    p.add_argument("--set", action="append", default=[], help="parameter override key=value")
    add_replicas(p)


def run(args) -> int:
    date = run_date(args)
    plan = load_plan(args, parse_set(args.set))
    record_state_keys(args, plan)  # what teardown deletes, without reading the catalogue
    if args.replicas == "per-point" and plan.points:  # the first point's N (run redeploys for the others)
        plan.deployment = replicas_for(plan, plan.points[0])
    if args.workers is not None:
        plan.deployment["worker_replicas"] = args.workers
    target = get_target(args.target, args)
    report = target.deploy(plan)
    uri = write_op_report(args.results, date, args.run_id, "deploy",
                          {"target": args.target, "experiment": plan.name, "system": plan.system, "report": report})
    print(f"deploy: {report.get('status')} ({uri})", flush=True)
    return 0
