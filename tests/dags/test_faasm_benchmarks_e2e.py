"""End-to-end ``dag.test()`` of ``faasm_benchmarks`` on the local target (real processes).

The mandatory teardown is the point: a run whose deploy fails must still tear down,
prove the machine clean, and fail the DAG run.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import DAGS

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, tzinfo=timezone.utc)
ONE = {"target": "local", "experiments": ["sgd_reuters_svm"], "systems": ["native"]}
GROUP = "sgd_reuters_svm__native"


@pytest.fixture
def env(tmp_path, monkeypatch) -> Path:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it on Debian as root)")
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path / "storage"))
    monkeypatch.setenv("FAASM_TASKS_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "faasm_benchmarks.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["faasm_benchmarks"]


def _states(dr) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


def test_one_experiment_runs_and_tears_down(env):
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=ONE)
    states = _states(dr)
    assert dr.state == "success", states
    for t in ("deploy", "wait_ready", "upload_data", "run", "collect", "teardown", "verify_clean"):
        assert states[f"{GROUP}.{t}"] == "success", (t, states)
    # Unselected groups are skipped whole: nothing deployed, so nothing to tear down.
    assert states["sgd_reuters_svm__wasm.deploy"] == "skipped"
    assert states["sgd_reuters_svm__wasm.teardown"] == "skipped"
    assert states["summarize"] == "success" and states["watcher"] == "skipped"
    runs = list((env / "storage" / "faasm_benchmarks" / "2026-11-29").glob("*/sgd_reuters_svm/native/**/run.json"))
    assert runs, "no run record written"
    record = json.loads(runs[0].read_text())
    assert record["target"] == "local"


def test_failed_deploy_still_tears_down_and_fails_the_run(env, monkeypatch):
    monkeypatch.setenv("FAASM_REDIS_SERVER", "/bin/false")  # the local deploy cannot start Redis
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=ONE)
    states = _states(dr)
    assert dr.state == "failed", states
    assert states[f"{GROUP}.deploy"] == "failed"
    assert states[f"{GROUP}.run"] == "upstream_failed"
    assert states[f"{GROUP}.teardown"] == "success", states
    assert states[f"{GROUP}.verify_clean"] == "success", states
    assert states["watcher"] == "failed"
