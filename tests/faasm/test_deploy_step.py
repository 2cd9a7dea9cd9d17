"""The deploy step's bad inputs: exit 2 naming the flag or folder, before anything is started or written."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stepkit.cli import main


@pytest.mark.e2e  # runs the deploy step
@pytest.mark.parametrize("workers", ["-3", "0", "many"])
def test_faasm_deploy_rejects_bad_worker_count(tmp_path, workers):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "faasm_tasks",
            "deploy",
            "--target",
            "local",
            "--run-id",
            "r1",
            "--results",
            str(tmp_path / "results"),
            "--experiment",
            "sgd_reuters_svm",
            "--system",
            "native",
            "--state-dir",
            str(tmp_path / "state"),
            "--workers",
            workers,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert "argument --workers: must be a positive integer" in proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "state").exists()


def test_faasm_deploy_with_unwritable_results_exits_2_before_starting_anything(tmp_path, capsys, monkeypatch):
    """In the unit tier a started redis-server or worker would also fail this test (the tier's guard)."""
    from faasm_tasks.__main__ import STEPS as FAASM_STEPS

    monkeypatch.setenv("FAASM_TASKS_STATE_DIR", str(tmp_path / "state"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [
        "deploy",
        "--target",
        "local",
        "--run-id",
        "unwritable",
        "--results",
        str(blocker / "results"),
        "--experiment",
        "sgd_reuters_svm",
    ]
    assert main("faasm_tasks", FAASM_STEPS, argv) == 2
    err = capsys.readouterr().err
    assert f"--results {blocker / 'results'}: cannot " in err and "Traceback" not in err
