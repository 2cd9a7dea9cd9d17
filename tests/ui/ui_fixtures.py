"""Reports made by the real steps for the UI tests: a Mirage report and a Faasm trend report + summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "faasm"))

from test_trends_history import END, write_history  # noqa: E402

MIRAGE_KEY = "2023-03-01T000000Z"
MIRAGE_TITLE = "Mirage fixture report"


def _step(*argv: str, cwd: Path = REPO) -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run([sys.executable, *argv, "--log-level", "WARNING"], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"{argv[:3]} exited {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}")


def make_reports(root: Path, state_dir: Path) -> dict[str, str]:
    """Write both pipelines' reports under the storage ``root``; returns their pages below the root."""
    from stepkit import Step  # noqa: PLC0415

    run = root / "mirage_pipeline" / MIRAGE_KEY
    train = Step("train", str(run / "train" / "xgboost-n1"), "test", {"model": "xgboost", "node_size": 1})
    train.write_bytes("metrics.json", json.dumps({"val_mae_h": 3.21, "val_constant_mae_h": 7.5,
                                                  "train_mae_h": 2.9, "wall_s": 12.0}).encode())
    train.write_bytes("curves.json", json.dumps([{"epoch": i, "train_loss": 1 / (i + 1), "val_loss": 1.2 / (i + 1)}
                                                 for i in range(5)]).encode())
    train.commit({"val_mae_h": 3.21})
    _step("-m", "mirage_tasks", "report", "--in", str(run / "train" / "xgboost-n1"), "--out", str(run / "report"),
          "--title", MIRAGE_TITLE)
    faasm = root / "faasm_benchmarks"
    # Airflow's own run ids carry ':' and '+': they must survive the URLs of the view and the links
    run_id = write_history(str(faasm), days=6, last={"p99_us": 1.5}, run_id="scheduled__{date}T00:00:00+00:00")
    _step("-m", "faasm_tasks", "summarize", "--run-id", run_id, "--results", str(faasm), "--date", END,
          "--state-dir", str(state_dir))
    return {"mirage": f"mirage_pipeline/{MIRAGE_KEY}/report/report.html",
            "faasm_trends": f"faasm_benchmarks/{END}/{run_id}/trends/trends.html",
            "faasm_run": f"{END}/{run_id}"}
