"""Hard, idempotent teardown; safe to run when nothing (or only part) was deployed.

It never stops on input errors: a bad ``--date`` or an unusable run record is reported
and the teardown goes on. It never reads the catalogue: what it stops comes from the
run's own records (the local target's state file, journal and process labels; the
run-state keys ``deploy`` and ``run`` recorded, :func:`faasm_tasks.common.state_keys_record`),
so a broken or hostile catalogue file (an alias bomb) cannot keep anything running. Attempts left ``running`` by a killed ``run`` are marked
``failed`` (``interrupted``).
"""

from __future__ import annotations

import datetime as dt
import logging

from stepkit import StepError

from ..billing import stop_sampler
from ..common import add_common, check_run_id, run_date, teardown_state_keys
from ..results import mark_interrupted, write_op_report
from ..targets import get_target

log = logging.getLogger(__name__)


def add_arguments(p):
    add_common(p, experiment=True)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for things to go away")
    p.add_argument(
        "--full",
        action="store_true",
        help="knative: also delete Redis and the upload service (never the namespace: the platform's)",
    )


def run(args) -> int:
    check_run_id(args.run_id)
    problems: list[str] = []
    try:
        date = run_date(args)
    except StepError as exc:
        date = dt.datetime.now(dt.UTC).date().isoformat()
        problems.append(f"{exc}; reporting under {date}")
    keys, key_problem = teardown_state_keys(args)
    if key_problem:
        problems.append(key_problem)
    try:
        sampler = stop_sampler(args.state_dir, args.run_id)
    except Exception as exc:  # noqa: BLE001 - go on: the target's teardown finds the sampler by label too
        sampler = {"action": "error", "error": f"{type(exc).__name__}: {exc}"}
    target = get_target(args.target, args)
    report = (
        target.teardown(keys, args.timeout, full=args.full)
        if args.target == "knative"
        else target.teardown(keys, args.timeout)
    )
    try:
        interrupted = mark_interrupted(args.results, date, args.run_id)
    except Exception as exc:  # noqa: BLE001 - results storage trouble must not hide the teardown's outcome
        interrupted = []
        problems.append(f"could not sweep interrupted attempts: {exc}")
    for msg in problems:
        print(f"teardown: warning: {msg}", flush=True)
    write_op_report(
        args.results,
        date,
        args.run_id,
        "teardown",
        {
            "target": args.target,
            "run_state_keys": keys,
            "sampler": sampler,
            "report": report,
            "interrupted_attempts": interrupted,
            "input_problems": problems,
        },
    )
    if report.get("incomplete"):
        print("teardown: INCOMPLETE: " + "; ".join(report["incomplete"]), flush=True)
        return 1
    print(
        f"teardown: done ({args.target}); {len(report.get('processes', []))} process(es) handled, "
        f"{len(report.get('found_by_label_only', []))} found by run label only",
        flush=True,
    )
    return 0
