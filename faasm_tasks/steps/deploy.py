"""Deploy the target for one experiment and system (idempotent: an identical deployment is kept).

A deploy that does not finish (it fails, or a SIGTERM arrives at any point, even after the
target is up) stops the processes it started itself, from its own records (the local target's
``started`` list, never by scanning for labels: what an earlier deploy left is teardown's),
says which in its last line, and writes a ``deploy-*.json`` report with ``"failed": true`` so
the day's summary counts the group as failed even though it has no points.

On the knative target each Knative Service's name is announced (``stepkit.external``) before it
is created, so the house operator keeps it in the task's state store; a retry of the task passes
the names back (``--adopt-services``) and the deploy adopts them (the target's ``deploy``:
replaced in place, or deleted when this plan no longer deploys them) instead of leaving an
earlier try's Service unowned. Teardown deletes every Service the steps created, of any try
(they all carry the ``app.kubernetes.io/managed-by=faasm-tasks`` label it lists).
"""

from __future__ import annotations

import argparse

from stepkit.external import announce, parse_ids

from .. import procs
from ..catalogue import replicas_for
from ..common import add_common, add_replicas, load_plan, parse_set, record_state_keys, run_date
from ..results import write_failure_report, write_op_report
from ..targets import get_target

#: The most workers one deployment may ask for. The catalogue's largest count is 50 (the SGD
#: sweep's N_WORKERS); a typo like 5000 would start thousands of processes on the local target
#: or ask the cluster for thousands of pods, so it is refused by name (exit 2) instead.
MAX_WORKERS = 256
BOUNDS = {"workers": (1, MAX_WORKERS)}


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
    p.add_argument("--workers", type=positive_int, help=f"override the worker replica count (1 to {MAX_WORKERS})")
    p.add_argument("--set", action="append", default=[], help="parameter override key=value")
    add_replicas(p)
    p.add_argument(
        "--adopt-services",
        metavar="NAMES",
        help="knative: the Knative Services an earlier try of this deploy announced (comma-separated; "
        "the house operator passes them on a retry): adopted instead of left unowned",
    )


def run(args) -> int:
    date = run_date(args)
    target = None
    try:
        plan = load_plan(args, parse_set(args.set))
        record_state_keys(args, plan)  # what teardown deletes, without reading the catalogue
        if args.replicas == "per-point" and plan.points:  # the first point's N (run redeploys for the others)
            plan.deployment = replicas_for(plan, plan.points[0])
        if args.workers is not None:
            plan.deployment["worker_replicas"] = args.workers
        adopt = parse_ids(args.adopt_services, "--adopt-services")
        target = get_target(args.target, args)
        if args.target == "knative":

            def on_service(name: str) -> None:
                announce("knative-service", [name])
                procs.fault("ksvc")  # test hook: a deploy killed between announcing a Service and creating it

            target.on_service = on_service
            if adopt:
                print(f"deploy: adopting the Knative Services of an earlier try: {', '.join(adopt)}", flush=True)
            report = target.deploy(plan, adopt=adopt)
        else:
            if adopt:  # only the knative target announces anything
                print(f"deploy: --adopt-services ignored on the {args.target} target", flush=True)
            report = target.deploy(plan)
        procs.fault("deployed")  # test hook: a deploy stopped after its target came up
        uri = write_op_report(
            args.results,
            date,
            args.run_id,
            "deploy",
            {"target": args.target, "experiment": plan.name, "system": plan.system, "report": report},
        )
    except BaseException as exc:
        if getattr(exc, "cleanup", None) is None:  # the target's deploy returned (or never ran)
            stop = getattr(target, "stop_started", None)
            exc.cleanup = (
                stop()
                if stop
                else "it had started no process"
                if target is None  # type: ignore[attr-defined]
                else "the cluster objects it created are left for teardown"
            )
        write_failure_report(
            args.results,
            date,
            args.run_id,
            "deploy",
            exc,
            {"target": args.target, "experiment": args.experiment, "system": args.system, "cleanup": exc.cleanup},
        )  # type: ignore[attr-defined]
        print(f"deploy: failed; {exc.cleanup}", flush=True)  # type: ignore[attr-defined]
        raise
    print(f"deploy: {report.get('status')} ({uri})", flush=True)
    return 0
