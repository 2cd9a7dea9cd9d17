"""One table of a run: the latest attempt of every point (JSON and CSV), with a marker."""

from __future__ import annotations

import csv
import io

from stepkit import Step

from .. import __version__
from ..common import add_common, run_date
from ..results import iter_records, mark_interrupted, run_prefix

COLUMNS = ["experiment", "system", "target", "params", "repeat", "attempt", "status", "duration_s",
           "run_time_ms", "final_loss", "requests_ok", "requests_all", "throughput_ok", "throughput_all",
           "p50_us", "p99_us", "p999_us", "max_us", "errors_total", "memory_gb_s", "peak_memory_mb", "error"]


def add_arguments(p):
    add_common(p)


def run(args) -> int:
    date = run_date(args)
    mark_interrupted(args.results, date, args.run_id)  # attempts left running by a killed process -> failed
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
        return 0
    rows = []
    for key, rec in sorted(latest.items(), key=lambda kv: kv[0]):
        m, b = rec.get("metrics") or {}, rec.get("billing") or {}
        row = {"experiment": rec["experiment"], "system": rec["system"], "target": rec["target"],
               "params": " ".join(f"{k}={v}" for k, v in sorted(rec["params"].items())), "repeat": rec["repeat"],
               "attempt": rec["attempt"], "attempts_total": attempts[key], "status": rec["status"],
               "duration_s": rec.get("duration_s"), "error": (rec.get("outcome") or {}).get("error"),
               "memory_gb_s": b.get("memory_gb_s"), "peak_memory_mb": b.get("peak_memory_mb")}
        for k in ("run_time_ms", "final_loss", "requests_ok", "requests_all", "throughput_ok", "throughput_all",
                  "p50_us", "p99_us", "p999_us", "max_us", "errors_total"):
            row[k] = m.get(k)
        rows.append(row)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS + ["attempts_total"], extrasaction="ignore")
    w.writeheader()
    w.writerows(rows)
    step.write_json("summary.json", {"run_id": args.run_id, "date": date, "points": rows,
                                     "failed": sum(r["status"] == "failed" for r in rows)})
    step.write_bytes("summary.csv", buf.getvalue().encode())
    step.commit({"points": len(rows), "failed": sum(r["status"] == "failed" for r in rows)})
    for r in rows:
        print(f"  {r['experiment']}/{r['system']} {r['params']}: {r['status']}", flush=True)
    return 0
