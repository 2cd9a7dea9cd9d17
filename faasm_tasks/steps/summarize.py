"""One table of a run (the latest attempt of every point, JSON and CSV) and the trend report.

``summary/``: ``summary.json``, ``summary.csv``, then ``_SUCCESS.json``. ``failed`` counts every
failure of the day: failed points, experiment groups that failed before they had a point
(:func:`faasm_tasks.results.failed_groups`: a failed deploy, a run that never reported) and
unreadable results (a corrupt or truncated ``run.json``, damaged metrics, an unreadable
``_ops`` report), each named in ``failed_groups`` / ``unreadable``; ``status`` is ``FAILED``
when it is not 0, and the step then exits 1 after writing both outputs. ``aa`` is the run's
A/A control (:func:`faasm_tasks.trends.aa_control`); ``trustworthy`` is false when it failed
(an A/A ratio interval excludes 1): the day's figures then cannot tell a difference from noise,
and the check step does not judge them.
``trends/``: the last ``--days`` days of results up to the run's date (see
:mod:`faasm_tasks.trends`): ``trends.html`` (self-contained), ``trends.md`` with
``figures/*.png``, ``trends.json``, then ``_SUCCESS.json``. Each skips on its own when
nothing it reads has changed.
"""

from __future__ import annotations

import csv
import io
import json

from stepkit import Step, StepError

from .. import __version__
from ..common import add_common, run_date
from ..results import failed_groups, iter_records, mark_interrupted, run_prefix, unreadable_text

COLUMNS = [
    "experiment",
    "system",
    "target",
    "params",
    "repeat",
    "arm",
    "attempt",
    "status",
    "duration_s",
    "run_time_ms",
    "final_loss",
    "requests_ok",
    "requests_all",
    "throughput_ok",
    "throughput_all",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "errors_total",
    "send_lag_p99_us",
    "send_lag_exceeded",
    "check_ok",
    "memory_gb_s",
    "peak_memory_mb",
    "error",
]


def add_arguments(p):
    add_common(p)
    p.add_argument(
        "--days", type=int, default=30, help="days of results (up to the run's date) in the trend report (default 30)"
    )


def run(args) -> int:
    if args.days < 1:
        raise StepError(f"--days must be at least 1, got {args.days}")
    date = run_date(args)
    mark_interrupted(args.results, date, args.run_id)  # attempts left running by a killed process -> failed
    problems: list[dict[str, str]] = []
    recs = iter_records(args.results, date, args.run_id, problems)
    groups = failed_groups(args.results, date, args.run_id, recs, problems)
    counts = _summary(args, date, recs, groups, problems)
    _trends(args, date, groups, problems)
    if counts["failed"]:
        print(
            f"summarize: FAILED: {counts['failed_points']} failed point(s), {len(groups)} failed experiment "
            f"group(s), {len(problems)} unreadable result(s)",
            flush=True,
        )
        for g in groups:
            print(f"summarize: FAILED group {g['experiment']}/{g['system']} at {g['step']}: {g['error']}", flush=True)
        if problems:
            print(f"summarize: FAILED unreadable: {unreadable_text(problems)}", flush=True)
        import sys

        print(
            f"faasm_tasks summarize: the day has {counts['failed']} failure(s) (see above)", file=sys.stderr, flush=True
        )
        return 1
    return 0


def _trends(args, date: str, groups: list[dict], problems: list[dict]) -> None:
    from .. import trends  # pandas/matplotlib only here

    df = trends.load_window(args.results, date, args.days)
    failures = {"failed_groups": groups, "unreadable": problems}
    step = Step(
        "trends",
        run_prefix(args.results, date, args.run_id) + "/trends",
        __version__,
        {
            "run_id": args.run_id,
            "date": date,
            "days": args.days,
            "records": trends.signature(df),
            "failures": [f"{g['experiment']}/{g['system']}:{g['step']}:{g['error']}" for g in groups]
            + [f"{p['uri']}:{p['error']}" for p in problems],
        },
    )
    if step.skip():
        return
    files = trends.render(df, args.run_id, date, args.days, failures)
    for name in sorted(files, key=lambda n: n == "trends.html"):  # the page last, after its figures
        step.write_bytes(name, files[name])
    failed = len(json.loads(files["trends.json"])["failures"])
    step.commit(
        {
            "days": args.days,
            "dates": int(df["date"].nunique()) if not df.empty else 0,
            "runs": int(df["run_id"].nunique()) if not df.empty else 0,
            "rows": len(df),
            "failed": failed,
            "status": "FAILED" if failed else "ok",
        }
    )
    print(f"summarize: trend report over {args.days} days -> {step.path('trends.html')}", flush=True)


INTERVAL_METRICS = ("run_time_ms", "p50_us", "p99_us", "throughput_ok", "final_loss")


def intervals(rows: list[dict]) -> list[dict]:
    """Per experiment, system, point and metric: n of the succeeded repeats, the median with
    its order-statistic 95 % interval and the mean with its Student-t one (faasm_tasks.stats);
    failed and invalid repeats (a failed check among them) are not counted."""
    from .. import stats  # scipy only here

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "succeeded":
            groups.setdefault((r["experiment"], r["system"], r["params"]), []).append(r)
    out = []
    for (exp, system, params), g in sorted(groups.items()):
        for metric in INTERVAL_METRICS:
            vals = [r[metric] for r in g if isinstance(r.get(metric), (int, float))]
            if vals:
                out.append(
                    {"experiment": exp, "system": system, "params": params, "metric": metric, **stats.describe(vals)}
                )
    return out


def _summary(args, date: str, recs: list, groups: list[dict], problems: list[dict]) -> dict[str, int]:
    """Writes the summary (unless unchanged) and returns its counts."""
    latest: dict[tuple, dict] = {}
    attempts: dict[tuple, int] = {}
    for uri, rec in recs:
        key = (rec["experiment"], rec["system"], uri.rsplit("/attempt-", 1)[0])
        attempts[key] = attempts.get(key, 0) + 1
        if key not in latest or rec["attempt"] > latest[key]["attempt"]:
            latest[key] = rec
    fp_params = {
        "run_id": args.run_id,
        "date": date,
        "records": sorted(
            f"{k[2]}:{r['attempt']}:{r['status']}:{r.get('finished')}:{'billing' in r}" for k, r in latest.items()
        ),
        "failed_groups": [f"{g['experiment']}/{g['system']}:{g['step']}:{g['error']}" for g in groups],
        "unreadable": [f"{p['uri']}:{p['error']}" for p in problems],
    }
    step = Step("summarize", run_prefix(args.results, date, args.run_id) + "/summary", __version__, fp_params)
    failed_points = sum(r["status"] == "failed" for r in latest.values())
    result = {"failed_points": failed_points, "failed": failed_points + len(groups) + len(problems)}
    if step.skip():
        return result
    rows = []
    for key, rec in sorted(latest.items(), key=lambda kv: kv[0]):
        m, b = rec.get("metrics") or {}, rec.get("billing") or {}
        row = {
            "experiment": rec["experiment"],
            "system": rec["system"],
            "target": rec["target"],
            "params": " ".join(f"{k}={v}" for k, v in sorted(rec["params"].items())),
            "repeat": rec["repeat"],
            "arm": rec.get("arm"),
            "attempt": rec["attempt"],
            "attempts_total": attempts[key],
            "status": rec["status"],
            "duration_s": rec.get("duration_s"),
            "error": (rec.get("outcome") or {}).get("error"),
            "memory_gb_s": b.get("memory_gb_s"),
            "peak_memory_mb": b.get("peak_memory_mb"),
        }
        for k in (
            "run_time_ms",
            "final_loss",
            "requests_ok",
            "requests_all",
            "throughput_ok",
            "throughput_all",
            "p50_us",
            "p99_us",
            "p999_us",
            "max_us",
            "errors_total",
            "send_lag_p99_us",
            "send_lag_exceeded",
        ):
            row[k] = m.get(k)
        row["check_ok"] = (m.get("check") or {}).get("ok")
        rows.append(row)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS + ["attempts_total"], extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    # "invalid": measured, but not trustworthy (judge_load): listed and counted apart from "failed"
    # "failed" is every failure of the day: points, groups without points, unreadable results
    # (a day whose every group failed at deploy has 0 points and is FAILED, not "0 failed")
    aa = _aa(args, date)
    counts = {
        "trustworthy": aa.get("verdict") != "fail",
        "aa_verdict": aa.get("verdict"),
        "failed": result["failed"],
        "failed_points": failed_points,
        "failed_groups_count": len(groups),
        "unreadable_count": len(problems),
        "invalid": sum(r["status"] == "invalid" for r in rows),
        "status": "FAILED" if result["failed"] else "ok",
    }
    step.write_json(
        "summary.json",
        {
            "run_id": args.run_id,
            "date": date,
            "points": rows,
            **counts,
            "failed_groups": groups,
            "unreadable": problems,
            "intervals": intervals(rows),
            "aa": aa,
        },
    )
    step.write_bytes("summary.csv", buf.getvalue().encode())
    step.commit({"points": len(rows), **counts})
    for r in rows:
        arm = f" arm {r['arm']}" if r.get("arm") else ""
        print(f"  {r['experiment']}/{r['system']} {r['params']}{arm}: {r['status']}", flush=True)
    from ..trends import aa_text

    print(f"summarize: {'' if counts['trustworthy'] else 'UNTRUSTWORTHY day: '}{aa_text(aa)}", flush=True)
    return result


def _aa(args, date: str) -> dict:
    """The run's A/A control (:func:`faasm_tasks.trends.aa_control`)."""
    import pandas as pd

    from .. import trends  # pandas/scipy only here

    rows = trends.run_rows(args.results, date, args.run_id)
    return trends.aa_control(pd.DataFrame(rows, columns=list(rows[0]) if rows else ["arm"]))
