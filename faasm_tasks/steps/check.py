"""Regression check: this run's points against the trailing median of the previous days.

For every measured point of the run (``--run-id`` on ``--date``) and every metric with a
threshold, the run's value (median over repeats) is compared with the median of the
daily values of the same experiment, system and point over the previous ``--days``
days (dates before the run's). Exit 1 naming each breach (experiment, system, point,
metric, value, trailing median, threshold); exit 0 when nothing is breached, including
when a point has fewer than ``--min-history`` previous days (said in the output).

Thresholds (a negative value or ``--no-...`` turns one off):

* ``--p99-increase-pct X``: p99 latency more than X % above the trailing median;
* ``--throughput-drop-pct Y``: successful throughput more than Y % below it;
* ``--run-time-increase-pct Z``: run time (SGD, matrix multiplication) more than Z % above it.

A report of every comparison goes to the run's ``_ops/`` folder (``check-*.json``).

The A/A control (:func:`faasm_tasks.trends.aa_control`): when the run measured a system as two
arms A and A' and an A'/A ratio interval excludes 1, the day is **untrustworthy**: its changes
past a threshold are listed as ``not_judged`` (not regressions) and the step exits 1 saying
UNTRUSTWORTHY and why, instead of raising a regression; previous runs whose A/A failed are left
out of the trailing medians (``untrustworthy_history``).

A result that cannot be read (a corrupt or truncated ``run.json``, damaged metrics) in the
window is exit 2 naming each file and its cause: a comparison that silently leaves a point
out could pass a regression. A run with nothing measured but failures (failed points,
experiment groups that failed before their first point) is exit 1: nothing to compare is
not "no regression".
"""

from __future__ import annotations

from stepkit import StepError

from ..common import add_common, run_date
from ..results import failed_groups, iter_records, unreadable_text, write_op_report


def _pct(text: str) -> float | None:
    v = float(text)
    if v != v:  # NaN
        raise ValueError("NaN")
    return None if v < 0 else v


def add_arguments(p):
    add_common(p)
    p.add_argument("--days", type=int, default=30, help="days of history before the run's date (default 30)")
    p.add_argument(
        "--p99-increase-pct",
        type=_pct,
        default=25.0,
        help="fail when p99 latency is more than this %% above the trailing median (default 25; negative: off)",
    )
    p.add_argument(
        "--throughput-drop-pct",
        type=_pct,
        default=20.0,
        help="fail when throughput is more than this %% below the trailing median (default 20; negative: off)",
    )
    p.add_argument(
        "--run-time-increase-pct",
        type=_pct,
        default=50.0,
        help="fail when SGD / matrix run time is more than this %% above the trailing median "
        "(default 50; negative: off)",
    )
    p.add_argument(
        "--min-history",
        type=int,
        default=3,
        help="previous days with results a point needs before it is checked (default 3)",
    )


def run(args) -> int:
    if args.days < 1:
        raise StepError(f"--days must be at least 1, got {args.days}")
    if args.min_history < 1:
        raise StepError(f"--min-history must be at least 1, got {args.min_history}")
    date = run_date(args)
    from .. import trends  # pandas only here

    th = trends.Thresholds(
        p99_increase_pct=args.p99_increase_pct,
        throughput_drop_pct=args.throughput_drop_pct,
        run_time_increase_pct=args.run_time_increase_pct,
        min_history=args.min_history,
    )
    # the window covers the run's date plus `days` days before it
    problems: list[dict[str, str]] = []
    history = trends.load_window(args.results, date, args.days + 1, problems)
    if problems:
        write_op_report(args.results, date, args.run_id, "check", {"failed": True, "unreadable": problems})
        raise StepError(f"{len(problems)} result(s) cannot be read: {unreadable_text(problems)}")
    current = history[(history["run_id"] == args.run_id) & (history["date"] == date)]
    res = trends.compare(history, current, date, th)
    report = {"thresholds": th.__dict__, "days": args.days, **res.to_dict()}
    write_op_report(args.results, date, args.run_id, "check", report)
    if res.no_data:
        groups = failed_groups(args.results, date, args.run_id, iter_records(args.results, date, args.run_id))
        failed = int((current["status"] == "failed").sum())
        if groups or failed:
            import sys

            what = [f"{g['experiment']}/{g['system']} failed at {g['step']}: {g['error']}" for g in groups]
            print(
                f"faasm_tasks check: FAILED: run {args.run_id} on {date} has no measured points: "
                f"{failed} failed point(s), {len(groups)} failed experiment group(s)"
                + (": " + "; ".join(what) if what else ""),
                file=sys.stderr,
                flush=True,
            )
            return 1
        print(f"check: run {args.run_id} on {date} has no measured points; nothing to check", flush=True)
        return 0
    for item in res.too_little_history:
        print(
            f"check: too little history for {item['experiment']}/{item['system']} point {item['point']} "
            f"{item['metric']}: {item['history_days']} previous day(s) with results, need {th.min_history}; "
            f"not checked",
            flush=True,
        )
    print(f"check: {trends.aa_text(res.aa)}", flush=True)
    for u in res.untrustworthy_history:
        print(f"check: left out of the trailing medians: run {u['run_id']} on {u['date']} ({u['aa']})", flush=True)
    print(
        f"check: {len(res.checked)} comparisons, {len(res.breaches)} breaches, "
        f"{len(res.within_noise)} past a threshold within the days' noise, "
        f"{len(res.too_little_history)} without enough history",
        flush=True,
    )
    for b in res.within_noise:
        print(f"check: within the noise (its interval includes 1): {trends.breach_text(b)}", flush=True)
    if not res.trustworthy:
        import sys

        for b in res.not_judged:
            print(f"check: not judged (untrustworthy day): {trends.breach_text(b)}", flush=True)
        print(
            f"faasm_tasks check: UNTRUSTWORTHY: run {args.run_id} on {date}: {trends.aa_text(res.aa)}; "
            f"the day's {len(res.not_judged)} change(s) past a threshold are not judged as regressions",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if res.breaches:
        for b in res.breaches:
            print(f"check: BREACH {trends.breach_text(b)}", flush=True)
        import sys

        print(
            "faasm_tasks check: regression: " + "; ".join(trends.breach_text(b) for b in res.breaches),
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0
