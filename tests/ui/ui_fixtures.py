"""Reports made by the real steps for the UI tests: a Mirage report and a Faasm trend report + summary."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "faasm"))

from test_trends_history import END, write_history  # noqa: E402

MIRAGE_KEY = "2023-03-01T000000Z"
MIRAGE_KEY_B = "manual-5eed07"  # a second configuration: a manual run with another seed
MIRAGE_TITLE = "Mirage fixture report"
MIRAGE_RUNS = {MIRAGE_KEY: "scheduled__2023-03-01T00:00:00+00:00", MIRAGE_KEY_B: "manual__2026-11-30T09:15:00+00:00"}
DEFAULTS = {"seed": 0, "train_count": 684, "models": ["xgboost", "random_forest", "transformer"]}


def _step(*argv: str, cwd: Path = REPO) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, *argv, "--log-level", "WARNING"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    if p.returncode != 0:
        raise AssertionError(f"{argv[:3]} exited {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}")


def make_reports(root: Path, state_dir: Path) -> dict[str, str]:
    """Write both pipelines' reports under the storage ``root``; returns their pages below the root."""
    from mirage_tasks.run.runlog import record_run
    from stepkit import Step

    for key, seed, mae in ((MIRAGE_KEY, 0, 3.21), (MIRAGE_KEY_B, 7, 2.5)):
        run = root / "mirage_pipeline" / key
        train = Step("train", str(run / "train" / "xgboost-n1"), "test", {"model": "xgboost", "node_size": 1})
        train.write_bytes(
            "metrics.json",
            json.dumps({"val_mae_h": mae, "val_constant_mae_h": 7.5, "train_mae_h": 2.9, "wall_s": 12.0}).encode(),
        )
        train.write_bytes(
            "curves.json",
            json.dumps([{"epoch": i, "train_loss": 1 / (i + 1), "val_loss": 1.2 / (i + 1)} for i in range(5)]).encode(),
        )
        train.commit({"val_mae_h": mae})
        # the headline of the metrics step's marker (what the comparison reads)
        metrics = Step("metrics", str(run / "metrics"), "test", {"seed": seed})
        # the metrics step's table (rows with n and bootstrap intervals) and its inputs' traces: the
        # synthetic trace is drawn with the seed, so the two runs validated on different traces
        rows = [
            {
                "model": "xgboost",
                "node": 1,
                "level": "all",
                "n": 6,
                "mean_interruption_h": mae,
                "mean_interruption_ci_lo": mae - 1.0,
                "mean_interruption_ci_hi": mae + 1.5,
                "zero_share": 0.25 + seed / 100,
                "zero_share_ci_lo": 0.0,
                "zero_share_ci_hi": 0.6,
            },
            {
                "model": "reactive",
                "node": 1,
                "level": "all",
                "n": 6,
                "mean_interruption_h": 5.0,
                "mean_interruption_ci_lo": 3.0,
                "mean_interruption_ci_hi": 7.0,
            },
        ]
        metrics.write_json(
            "metrics.json",
            {
                "params": {"bootstrap": 2000, "seed": 0},
                "rows": rows,
                "runs": [
                    {"model": "xgboost", "node": 1, "n": 6, "trace_fingerprint": f"synthetic-seed{seed}-fingerprint"}
                ],
            },
        )
        metrics.commit(
            summary={
                "n_rows": 24,
                "headline": {
                    "xgboost@1": {
                        "mean_interruption_h": mae,
                        "zero_share": 0.25 + seed / 100,
                        "reduction_vs_reactive": 0.4,
                    },
                    "reactive@1": {"mean_interruption_h": 5.0, "zero_share": 0.1, "reduction_vs_reactive": 0.0},
                },
            }
        )
        _step(
            "-m",
            "mirage_tasks",
            "report",
            "--in",
            str(run / "train" / "xgboost-n1"),
            "--out",
            str(run / "report"),
            "--title",
            MIRAGE_TITLE,
        )
        scheduled = key == MIRAGE_KEY
        params = dict(
            DEFAULTS, seed=seed, **({"train_count": 42, "models": ["xgboost", "random_forest"]} if scheduled else {})
        )
        record_run(
            str(run),
            dag_id="mirage_pipeline",
            run_id=MIRAGE_RUNS[key],
            run_type="scheduled" if scheduled else "manual",
            logical_date=datetime(2023, 3, 1, tzinfo=UTC) if scheduled else datetime(2026, 11, 30, 9, 15, tzinfo=UTC),
            params=params,
            defaults=DEFAULTS,
        )
    faasm = root / "faasm_benchmarks"
    # Airflow's own run ids carry ':' and '+': they must survive the URLs of the view and the links
    run_id = write_history(str(faasm), days=6, last={"p99_us": 1.5}, run_id="scheduled__{date}T00:00:00+00:00")
    _step(
        "-m",
        "faasm_tasks",
        "summarize",
        "--run-id",
        run_id,
        "--results",
        str(faasm),
        "--date",
        END,
        "--state-dir",
        str(state_dir),
    )
    return {
        "mirage": f"mirage_pipeline/{MIRAGE_KEY}/report/report.html",
        "mirage_b": f"mirage_pipeline/{MIRAGE_KEY_B}/report/report.html",
        "faasm_trends": f"faasm_benchmarks/{END}/{run_id}/trends/trends.html",
        "faasm_run": f"{END}/{run_id}",
    }


# ----------------------------------------------------------------------------- the monthly gate

#: Months of stored pipeline metrics for the gate: two earlier months and January (the rule as
#: usual: about 25 % fewer interruption hours than reactive), then February, where the rule
#: interrupts 60 % more than reactive (a regression on every bar).
GATE_EARLIER = ("2022-11", "2022-12")
GATE_PASS, GATE_FAIL = "2023-01", "2023-02"
GATE_NODES = (1, 8)
GATE_SAMPLES = 30


def _month_validations(prefix: str, month: str, factor: float, seed: int) -> list[str]:
    """Committed ``validate`` outputs of one month's run, as the validate step writes them (its own
    row maker, file names and marker params), on seeded episodes: reactive, avg (10 % better)
    and xgboost (``factor`` times reactive's hours); their URIs."""
    import numpy as np

    from mirage_tasks.data import keys
    from mirage_tasks.data.artifacts import DECISIONS_FILE, ROWS_FILE, VALIDATE_INFO_FILE, parquet_bytes
    from mirage_tasks.evaluation.validate import make_rows
    from stepkit import Step

    rng = np.random.default_rng(seed)
    start = int(datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC).timestamp())
    sim = {"warmup_days": 2, "workload_days": 5, "config": {"name": "ls6", "nodes": 16}}
    uris = []
    for node in GATE_NODES:
        reactive = rng.gamma(2.0, 1.0, GATE_SAMPLES) + 0.2  # hours, every sample interrupted
        for name, kind, hours in (
            ("reactive", "reactive", reactive),
            ("avg", "avg", reactive * 0.9),
            ("xgboost", "model", reactive * factor * rng.uniform(0.9, 1.1, GATE_SAMPLES)),
        ):
            results = []
            for k, h in enumerate(hours):
                t0 = start + 4 * 3600 * k
                end = t0 + 86400
                r = {
                    "sample_start": t0,
                    "pred_submit": t0,
                    "pred_start": t0 + 600,
                    "pred_end": end,
                    "succ_submit": end,
                    "succ_start": end + int(h * 3600),
                    "signed_interruption_h": float(h),
                    "backfilled": False,
                    "model_output": 0.0,
                    "n_decisions": 1,
                    "forced": kind == "reactive",
                    "queue_len": 3,
                    "avg_wait_s": 1800.0,
                }
                results.append((k, r, [], 0.01))
            rows, decisions = make_rows(results, name, kind, node)
            params = {"model": name, "model_kind": kind, "node": node, "shard": [0, 1], **sim}
            out = keys.validation(prefix, name, node, 0)
            step = Step("validate", out, "test", params)
            step.write_bytes(ROWS_FILE, parquet_bytes(rows))
            step.write_bytes(DECISIONS_FILE, parquet_bytes(decisions))
            step.write_json(VALIDATE_INFO_FILE, {"params": params, "trace_fingerprint": f"synthetic-{month}"})
            step.commit(summary={"model": name, "node": node, "n_samples": len(rows)})
            uris.append(out)
    return uris


def make_gate_months(root: Path) -> dict[str, str]:
    """The stored outputs the monthly gate reads, one ``mirage_pipeline`` run prefix per month: its
    validate outputs, its ``metrics`` output made by the real ``metrics`` step from them, and the
    plan's record of its DAG run (``samples_complete__<M>``). Returns ``{month: metrics URI}``."""
    from mirage_tasks.__main__ import STEPS
    from mirage_tasks.data import keys
    from mirage_tasks.run.runlog import record_run
    from stepkit.cli import main

    out = {}
    months = [*GATE_EARLIER, GATE_PASS, GATE_FAIL]
    for i, month in enumerate(months):
        prefix = str(root / "mirage_pipeline" / f"{month}-gate{i}")
        factor = 1.6 if month == GATE_FAIL else 0.75
        inputs = _month_validations(prefix, month, factor, seed=i)
        metrics = keys.metrics(prefix)
        argv = ["metrics", "--in", *inputs, "--out", metrics, "--bootstrap", "500", "--log-level", "WARNING"]
        with contextlib.redirect_stdout(io.StringIO()):  # its Markdown table
            rc = main("mirage_tasks", STEPS, argv)
        assert rc == 0, f"metrics of {month} exited {rc}"
        record_run(
            prefix,
            dag_id="mirage_pipeline",
            run_id=f"samples_complete__{month}",
            run_type="asset_triggered",
            logical_date=None,
            params={},
            defaults={},
        )
        out[month] = metrics
    return out
