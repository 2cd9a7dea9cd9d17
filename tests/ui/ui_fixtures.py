"""Reports made by the real steps for the UI tests: a Mirage report and a Faasm trend report + summary."""

from __future__ import annotations

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
