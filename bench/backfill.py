"""Backfills that build on each other, measured (opt-in: ``make airflow-check``, ``make bench-monthly``).

Part 1, through a real Airflow (``devtools/airflow_local.sh``: PostgreSQL, scheduler,
dag-processor, triggerer, api-server on 127.0.0.1, its own database and storage):

* ``airflow backfill create --dag-id mirage_samples`` over three trace days of the log:
  expects three committed day partitions per node size and three asset events naming the days;
* a second backfill over an overlapping range (``--reprocess-behavior completed``, so the
  overlapping days get runs too): expects only the new days sampled (the overlapping days'
  ``sample`` tasks skipped, their partitions untouched);
* the grid of ``mirage_pipeline`` as the api-server serves it to the UI: one folded ``plan``
  group, no GPU tasks (``check_grid``);
* a backfill of every day of February 2023 (small synthetic configuration) with
  ``mirage_monthly`` unpaused: expects the month's rollup run and the ``mirage_pipeline`` run
  it starts for that month (``check_monthly``).

Part 2, without Airflow (the plan and the step CLIs, as the pipeline's tasks run them): a
monthly backfill of ``mirage_pipeline`` validating January, February and March 2023 (logical
dates 2023-02-01, 03-01, 04-01, default params: 684 training samples every 4 h, node sizes
1 and 8): the sampling CPU seconds of each month, months 2 and 3 as a share of month 1.

Prints the figures; exits 1 when a check fails. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VAR = REPO / "var" / "bench-backfill"
PY = sys.executable


def sh(cmd: str, env: dict, timeout: float = 300, check: bool = True) -> str:
    """``cmd`` in bash with the live Airflow's settings sourced."""
    full = f"source {REPO}/var/airflow-live/env.sh && {cmd}"
    out = subprocess.run(["bash", "-c", full], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if check and out.returncode != 0:
        raise RuntimeError(f"{cmd} -> {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return out.stdout


def airflow(args: str, env: dict, timeout: float = 300, check: bool = True) -> str:
    return sh(f"{REPO}/.venv/bin/airflow {args}", env, timeout, check)


def runs(env: dict) -> list[dict]:
    out = airflow("dags list-runs mirage_samples -o json", env, check=False)
    for line in reversed(out.splitlines()):  # the JSON is the last line; log lines come before it
        if line.startswith("[{") or line.strip() == "[]":
            return json.loads(line)
    return []


def backfill(env: dict, dates: str, conf: str) -> None:
    """``airflow backfill create`` of mirage_samples, once the previous backfill is marked complete
    (the scheduler does that a little after its last run ends)."""
    for _ in range(60):
        try:
            airflow(f"backfill create --dag-id mirage_samples {dates} --max-active-runs 2 --dag-run-conf '{conf}'", env)
            return
        except RuntimeError as exc:
            if "AlreadyRunningBackfill" not in str(exc):
                raise
            time.sleep(5)
    raise RuntimeError("the previous backfill never completed")


def wait_backfill(env: dict, n: int, timeout: float = 900) -> list[dict]:
    t = time.time()
    while time.time() - t < timeout:
        rs = [r for r in runs(env) if r["run_id"].startswith("backfill__")]
        if len(rs) >= n and all(r["state"] in ("success", "failed") for r in rs):
            return rs
        time.sleep(5)
    raise RuntimeError(f"backfill runs not finished after {timeout} s: {runs(env)}")


DB_PROBE = r"""
import json, sys
from airflow.utils.session import create_session
from airflow.models.asset import AssetEvent
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
with create_session() as s:
    ev = [{"day": e.partition_key[:10], "computed": e.extra["days"][e.partition_key[:10]]["computed"],
           "partition_key": e.partition_key}
          for e in s.query(AssetEvent).all() if e.asset.name == "mirage_samples"]
    tis = [{"run_id": t.run_id, "task_id": t.task_id, "map_index": t.map_index, "state": str(t.state),
            "label": t.rendered_map_index}
           for t in s.query(TaskInstance).filter(TaskInstance.dag_id == "mirage_samples").all()]
    runs = [{"dag_id": r.dag_id, "run_id": r.run_id, "state": str(r.state), "partition_key": r.partition_key,
             "logical_date": r.logical_date.isoformat() if r.logical_date else None, "conf": r.conf,
             "run_type": str(r.run_type)}
            for r in s.query(DagRun).filter(DagRun.dag_id.in_(["mirage_monthly", "mirage_pipeline"])).all()]
print("JSON" + json.dumps({"events": ev, "tis": tis, "runs": runs}))
"""


def db_probe(env: dict) -> dict:
    (VAR / "probe.py").write_text(DB_PROBE)
    out = sh(f"{REPO}/.venv/bin/python {VAR / 'probe.py'}", env)
    return json.loads(out[out.index("JSON") + 4 :].splitlines()[0])


def partitions(storage: Path) -> dict[str, dict]:
    out = {}
    for marker in sorted(storage.glob("mirage/samples/node*/day=*/_SUCCESS.json")):
        m = json.loads(marker.read_text())
        out[f"{marker.parent.parent.name.split('-')[0]}/{marker.parent.name[4:]}"] = {
            "cpu_s": m["summary"].get("cpu_s"),
            "n_samples": m["summary"]["n_samples"],
            "mtime": marker.stat().st_mtime_ns,
        }
    return out


def check_airflow(trace: str, nodes: list[int]) -> bool:
    storage = VAR / "storage"
    shutil.rmtree(storage, ignore_errors=True)
    storage.mkdir(parents=True)
    env = {
        **os.environ,
        "HOUSE_STORAGE_ROOT": str(storage),
        "HOUSE_RUNNER": "local",
        "AIRFLOW_LOCAL_DB": "bench_backfill",
        "FRESH": "1",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    conf = json.dumps({"trace": trace, "trace_timezone": "America/Chicago", "node_sizes": nodes})
    ok = True
    t0 = time.time()
    subprocess.run([str(REPO / "devtools" / "airflow_local.sh"), "start"], env=env, check=True, cwd=REPO)
    try:
        print(f"services up in {time.time() - t0:.0f} s")
        for _ in range(60):  # the dag-processor's first pass
            if "mirage_samples" in airflow("dags list -o plain", env, check=False):
                break
            time.sleep(3)
        airflow("dags unpause mirage_samples", env)

        t = time.time()
        backfill(env, "--from-date 2023-01-10 --to-date 2023-01-12", conf)
        first = wait_backfill(env, 3)
        wall1 = time.time() - t
        parts = partitions(storage)
        probe = db_probe(env)
        days = sorted(e["day"] for e in probe["events"])
        want = {f"node{n}/2023-01-{d}" for n in nodes for d in (10, 11, 12)}
        print(
            f"backfill 1 (2023-01-10..12): {len(first)} runs {sorted(r['state'] for r in first)} in {wall1:.0f} s; "
            f"partitions {sorted(parts)}; asset events for days {days}"
        )
        print("  sampling CPU s per partition: " + ", ".join(f"{k} {v['cpu_s']}" for k, v in parts.items()))
        labels = sorted({ti["label"] for ti in probe["tis"] if ti["task_id"] == "sample" and ti["label"]})
        print(f"  sample instance labels: {labels}")
        if (
            set(parts) != want
            or days != ["2023-01-10", "2023-01-11", "2023-01-12"]
            or any(r["state"] != "success" for r in first)
        ):
            print("CHECK FAILED: expected 3 committed partitions per node size and 3 asset events")
            ok = False

        before = {k: v["mtime"] for k, v in parts.items()}
        t = time.time()
        backfill(env, "--from-date 2023-01-11 --to-date 2023-01-14 --reprocess-behavior completed", conf)
        wait_backfill(env, 5)
        wall2 = time.time() - t
        parts2 = partitions(storage)
        probe = db_probe(env)
        new = sorted(set(parts2) - set(parts))
        touched = sorted(k for k, m in before.items() if parts2[k]["mtime"] != m)
        first_ids = {r["run_id"] for r in first}
        sample_states: dict[str, list[str]] = {}  # the second backfill's runs: sample states by day
        for ti in probe["tis"]:
            if ti["task_id"] == "sample" and ti["run_id"].startswith("backfill__") and ti["run_id"] not in first_ids:
                sample_states.setdefault(ti["run_id"].split("__")[1][:10], []).append(ti["state"])
        print(
            f"backfill 2 (2023-01-11..14, reprocess completed): {wall2:.0f} s; new partitions {new}; "
            f"rewritten old partitions {touched}; sample task states by day {dict(sorted(sample_states.items()))}"
        )
        cpu_new = sum(parts2[k]["cpu_s"] for k in new)
        print(
            f"  sampling CPU s of backfill 2: {cpu_new:.1f} (new days only; backfill 1: "
            f"{sum(v['cpu_s'] for v in parts.values()):.1f} for 3 days)"
        )
        want_new = {f"node{n}/2023-01-{d}" for n in nodes for d in (13, 14)}
        if (
            set(new) != want_new
            or touched
            or any(sample_states.get(d) != ["skipped"] for d in ("2023-01-11", "2023-01-12"))
        ):
            print("CHECK FAILED: the overlapping backfill must compute only 2023-01-13 and 2023-01-14")
            ok = False
        events = sorted(e["day"] for e in probe["events"])
        print(f"  asset events now: {len(events)} ({events})")
        ok = check_grid(env) and ok
        ok = check_monthly(env) and ok
    finally:
        subprocess.run([str(REPO / "devtools" / "airflow_local.sh"), "stop"], env=env, cwd=REPO)
    return ok


def check_grid(env: dict) -> bool:
    """What the UI's grid shows of mirage_pipeline, from the api-server's structure endpoint:
    the planning helpers folded into one ``plan`` group, no GPU tasks (HOUSE_GPUS unset)."""
    import urllib.request

    settings = dict(
        line.removeprefix("export ").split("=", 1)
        for line in (REPO / "var" / "airflow-live" / "env.sh").read_text().splitlines()
        if line.startswith("export ")
    )
    base = settings["AIRFLOW__API__BASE_URL"].strip('"')
    password = json.loads((REPO / "var" / "airflow-live" / "simple_auth_manager_passwords.json.generated").read_text())[
        "admin"
    ]
    req = urllib.request.Request(
        f"{base}/auth/token",
        data=json.dumps({"username": "admin", "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    token = json.loads(urllib.request.urlopen(req, timeout=30).read())["access_token"]
    req = urllib.request.Request(
        f"{base}/ui/structure/structure_data?dag_id=mirage_pipeline", headers={"Authorization": f"Bearer {token}"}
    )
    nodes = json.loads(urllib.request.urlopen(req, timeout=30).read())["nodes"]
    top = [n["id"] for n in nodes]
    plan = next((sorted(c["id"] for c in n.get("children") or []) for n in nodes if n["id"] == "plan"), [])
    print(f"grid of mirage_pipeline (api-server structure): top-level rows {top}; in the folded 'plan' group {plan}")
    ok = plan == sorted(
        f"plan.{k}" for k in ("commands", "merge", "policy_cpu", "sample", "train_cpu", "validate")
    ) and not any("gpu" in t or t.endswith("_argvs") for t in top)
    if not ok:
        print("CHECK FAILED: the grid must show one folded plan group and no GPU tasks")
    return ok


def check_monthly(env: dict) -> bool:
    """Part 1b: a complete month of partitions starts its experiment (mirage_monthly).

    Backfills every day of February 2023 (a small synthetic-trace configuration: one node
    size, two samples a day, two probes) with mirage_monthly unpaused and mirage_pipeline
    paused; expects one mirage_monthly run with partition key 2023-02 once the 28th day is
    in, and the mirage_pipeline run it starts (samples_complete__2023-02, logical date
    2023-03-01, the days' params as conf), left queued because that DAG is paused."""
    conf = json.dumps({"node_sizes": [1], "interval_hours": 12, "probes": 2})
    for _ in range(60):
        if "mirage_monthly" in airflow("dags list -o plain", env, check=False):
            break
        time.sleep(3)
    airflow("dags unpause mirage_monthly", env)
    t = time.time()
    before = {r["run_id"] for r in runs(env) if r["run_id"].startswith("backfill__")}
    backfill(env, "--from-date 2023-02-01 --to-date 2023-02-28", conf)
    wait_backfill(env, len(before) + 28, timeout=2400)
    monthly_runs, pipeline_runs = [], []
    for _ in range(60):  # the scheduler creates the rollup run, then the run starts the pipeline run
        probe = db_probe(env)
        monthly_runs = [r for r in probe["runs"] if r["dag_id"] == "mirage_monthly"]
        pipeline_runs = [r for r in probe["runs"] if r["dag_id"] == "mirage_pipeline"]
        if pipeline_runs and all(r["state"] in ("success", "failed") for r in monthly_runs):
            break
        time.sleep(5)
    feb = sorted(e["day"] for e in probe["events"] if (e["day"] or "").startswith("2023-02"))
    print(
        f"backfill 3 (2023-02-01..28, synthetic): {time.time() - t:.0f} s; {len(feb)} February asset events; "
        f"mirage_monthly runs {[(r['partition_key'], r['state']) for r in monthly_runs]}; mirage_pipeline runs "
        f"{[(r['run_id'], r['logical_date'], r['state']) for r in pipeline_runs]}"
    )
    ok = (
        len(feb) == 28
        and [(r["partition_key"], r["state"]) for r in monthly_runs] == [("2023-02", "success")]
        and [(r["run_id"], (r["logical_date"] or "")[:10]) for r in pipeline_runs]
        == [("samples_complete__2023-02", "2023-03-01")]
        and pipeline_runs[0]["conf"].get("node_sizes") == [1]
        and pipeline_runs[0]["conf"].get("probes") == 2
    )
    if not ok:
        print(
            "CHECK FAILED: a complete February must give one mirage_monthly run (2023-02) that starts "
            "mirage_pipeline samples_complete__2023-02 for 2023-03-01 with the days' params"
        )
    # unpausing mirage_samples without a trace default started a scheduled run: it skips, never fails
    scheduled = [r for r in runs(env) if r["run_id"].startswith("scheduled__")]
    print(f"scheduled mirage_samples runs (no trace to follow): {[(r['run_id'][:30], r['state']) for r in scheduled]}")
    if any(r["state"] == "failed" for r in scheduled):
        print("CHECK FAILED: a scheduled run without a trace must skip, not fail")
        ok = False
    return ok


def monthly(trace: str) -> None:
    """Sampling CPU of a monthly backfill (validating Jan, Feb, Mar 2023), month by month."""
    sys.path.insert(0, str(REPO))
    from mirage_tasks.run.plan import plan_run
    from mirage_tasks.run.runconf import MirageRun

    root = VAR / "monthly"
    shutil.rmtree(root, ignore_errors=True)
    params = {
        "trace": trace,
        "trace_timezone": "America/Chicago",
        "window_from": None,
        "window_to": None,
        "synth_profile": "ls6-a100",
        "cluster_config": "ls6",
        "train_start": None,
        "train_count": 684,
        "val_start": None,
        "val_count": None,
        "interval_hours": 4,
        "warmup_days": 2,
        "workload_days": 5,
        "probes": 7,
        "node_sizes": [1, 8],
        "shards": 2,
        "preset": "quick",
        "device": "cpu",
        "seed": 0,
        "train_params": {},
        "models": ["xgboost"],
        "policy_eval": "sampled",
    }
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rows = []
    for month in (2, 3, 4):
        logical = datetime(2023, month, 1, tzinfo=UTC)
        p = plan_run(
            MirageRun.from_params(params),
            str(root / "mirage"),
            str(root / "mirage_pipeline"),
            logical,
            workers=1,
            threads=1,
        )
        subprocess.run(
            [PY, "-m", "mirage_tasks", *p["trace_argv"][0:]], env=env, check=True, cwd=REPO, capture_output=True
        )
        t = time.time()
        for a in p["sample"]:
            subprocess.run([PY, "-m", "mirage_tasks", *a], env=env, check=True, cwd=REPO, capture_output=True)
        wall = time.time() - t

        def cpu_of(n: str, d: str, p: dict = p) -> float:
            return json.loads((Path(p["families"][n]) / f"day={d}" / "_SUCCESS.json").read_text())["summary"]["cpu_s"]

        cpu = sum(cpu_of(n, d) for n, days in p["missing_days"].items() for d in days)
        # what a run that recomputes its whole window (before partitions) spends on the same samples
        whole = sum(cpu_of(n, d) for n in p["families"] for d in p["days"])
        for a in p["merge"]:  # the datasets still come out whole
            subprocess.run([PY, "-m", "mirage_tasks", *a], env=env, check=True, cwd=REPO, capture_output=True)
        n_missing = sum(len(v) for v in p["missing_days"].values())
        n_days = len(p["days"]) * len(p["families"])
        val = datetime(2023, month - 1, 1).strftime("%Y-%m")
        rows.append(
            (
                f"logical {logical.date()} (validates {val}, trains {p['days'][0]}..{p['days'][-1]})",
                n_days,
                n_missing,
                cpu,
                whole,
                wall,
            )
        )
    base = rows[0][3]
    print("monthly backfill, sampling (ls6 log, 684 training samples every 4 h, node sizes 1 and 8):")
    for name, n_days, n_missing, cpu, whole, wall in rows:
        print(
            f"  {name}: {n_days} day partitions needed, {n_missing} computed ({100 * n_missing / n_days:.0f} %), "
            f"{cpu:.1f} sampling CPU s = {100 * cpu / base:.0f} % of month 1's and {100 * cpu / whole:.0f} % of "
            f"the {whole:.1f} s a whole-window recompute spends; {wall:.0f} s wall"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True, help="the ls6 sacct log")
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--monthly-only", action="store_true", help="part 2 only (no Airflow)")
    ap.add_argument("--airflow-only", action="store_true", help="part 1 only")
    args = ap.parse_args()
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(ap, args, {"nodes": (1, 10_000)}, folders=(), files=())
    trace = str(Path(args.trace).resolve())
    VAR.mkdir(parents=True, exist_ok=True)
    ok = True
    if not args.monthly_only:
        ok = check_airflow(trace, args.nodes)
    if not args.airflow_only:
        monthly(trace)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
