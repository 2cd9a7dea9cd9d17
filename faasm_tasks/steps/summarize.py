"""One table of a run (the latest attempt of every point, JSON and CSV) and the trend report.

``summary/``: ``summary.json``, ``summary.csv``, then ``_SUCCESS.json``.
``trends/``: the last ``--days`` days of results up to the run's date (see
:mod:`faasm_tasks.trends`): ``trends.html`` (self-contained), ``trends.md`` with
``figures/*.png``, ``trends.json``, then ``_SUCCESS.json``. Each skips on its own when
nothing it reads has changed.
"""

from __future__ import annotations

import csv
import io

from stepkit import Step, StepError

from .. import __version__
from ..common import add_common, run_date
from ..results import iter_records, mark_interrupted, run_prefix

COLUMNS = ["experiment", "system", "target", "params", "repeat", "attempt", "status", "duration_s",
           "run_time_ms", "final_loss", "requests_ok", "requests_all", "throughput_ok", "throughput_all",
           "p50_us", "p99_us", "p999_us", "max_us", "errors_total", "send_lag_p99_us", "send_lag_exceeded",
           "check_ok", "memory_gb_s", "peak_memory_mb", "error"]


def add_arguments(p):
    add_common(p)
    p.add_argument("--days", type=int, default=30,
                   help="days of results (up to the run's date) in the trend report (default 30)")


def run(args) -> int:
    if args.days < 1:
        raise StepError(f"--days must be at least 1, got {args.days}")
    date = run_date(args)
    mark_interrupted(args.results, date, args.run_id)  # attempts left running by a killed process -> failed
    _summary(args, date)
    _trends(args, date)
    return 0


def _trends(args, date: str) -> None:
    from .. import trends  # noqa: PLC0415 - pandas/matplotlib only here

    df = trends.load_window(args.results, date, args.days)
    step = Step("trends", run_prefix(args.results, date, args.run_id) + "/trends", __version__,
                {"run_id": args.run_id, "date": date, "days": args.days, "records": trends.signature(df)})
    if step.skip():
        return
    files = trends.render(df, args.run_id, date, args.days)
    for name in sorted(files, key=lambda n: n == "trends.html"):  # the page last, after its figures
        step.write_bytes(name, files[name])
    step.commit({"days": args.days, "dates": int(df["date"].nunique()) if not df.empty else 0,
                 "runs": int(df["run_id"].nunique()) if not df.empty else 0, "rows": len(df)})
    print(f"summarize: trend report over {args.days} days -> {step.path('trends.html')}", flush=True)


INTERVAL_METRICS = ("run_time_ms", "p50_us", "p99_us", "throughput_ok", "final_loss")


def intervals(rows: list[dict]) -> list[dict]:
    """Per experiment, system, point and metric: n of the succeeded repeats, the median with
    its order-statistic 95 % interval and the mean with its Student-t one (faasm_tasks.stats);
    failed and invalid repeats (a failed check among them) are not counted."""
    from .. import stats  # noqa: PLC0415 - scipy only here

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "succeeded":
            groups.setdefault((r["experiment"], r["system"], r["params"]), []).append(r)
    out = []
    for (exp, system, params), g in sorted(groups.items()):
        for metric in INTERVAL_METRICS:
            vals = [r[metric] for r in g if isinstance(r.get(metric), (int, float))]
            if vals:
                out.append({"experiment": exp, "system": system, "params": params, "metric": metric,
                            **stats.describe(vals)})
    return out


def _summary(args, date: str) -> None:
    recs = iter_records(args.results, date, args.run_id)
    latest: dict[tuple, dict] = {}
    attempts: dict[tuple, int] = {}
    for uri, rec in recs:
        key = (rec["experiment"], rec["system"], uri.rsplit("/attempt-", 1)[0])
        attempts[key] = attempts.get(key, 0) + 1
        if key not in latest or rec["attempt"] > latest[key]["attempt"]:
            latest[key] = rec
    fp_params = {"run_id": args.run_id, "date": date,
                 "records": sorted(f"{k[2]}:{r['attempt']}:{r['status']}:{r.get('finished')}:{'billing' in r}"
                                   for k, r in latest.items())}
    step = Step("summarize", run_prefix(args.results, date, args.run_id) + "/summary", __version__, fp_params)
    if step.skip():
        return
    rows = []
    for key, rec in sorted(latest.items(), key=lambda kv: kv[0]):
        m, b = rec.get("metrics") or {}, rec.get("billing") or {}
        row = {"experiment": rec["experiment"], "system": rec["system"], "target": rec["target"],
               "params": " ".join(f"{k}={v}" for k, v in sorted(rec["params"].items())), "repeat": rec["repeat"],
               "attempt": rec["attempt"], "attempts_total": attempts[key], "status": rec["status"],
               "duration_s": rec.get("duration_s"), "error": (rec.get("outcome") or {}).get("error"),
               "memory_gb_s": b.get("memory_gb_s"), "peak_memory_mb": b.get("peak_memory_mb")}
        for k in ("run_time_ms", "final_loss", "requests_ok", "requests_all", "throughput_ok", "throughput_all",
                  "p50_us", "p99_us", "p999_us", "max_us", "errors_total", "send_lag_p99_us", "send_lag_exceeded"):
            row[k] = m.get(k)
        row["check_ok"] = (m.get("check") or {}).get("ok")
        rows.append(row)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS + ["attempts_total"], extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    # "invalid": measured, but not trustworthy (judge_load): listed and counted apart from "failed"
    counts = {k: sum(r["status"] == k for r in rows) for k in ("failed", "invalid")}
    step.write_json("summary.json", {"run_id": args.run_id, "date": date, "points": rows, **counts,
                                     "intervals": intervals(rows)})
    step.write_bytes("summary.csv", buf.getvalue().encode())
    step.commit({"points": len(rows), **counts})
    for r in rows:
        print(f"  {r['experiment']}/{r['system']} {r['params']}: {r['status']}", flush=True)
