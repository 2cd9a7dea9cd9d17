"""End-to-end ``dag.test()`` of ``faasm_benchmarks`` on the local target (real processes).

The mandatory teardown is the point: a run whose deploy fails must still tear down,
prove the machine clean, and fail the DAG run.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import load_dag, task_states

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, tzinfo=UTC)
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
    return load_dag("faasm_benchmarks")


_states = task_states


def test_one_experiment_runs_and_tears_down(env):
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=ONE)
    states = _states(dr)
    assert dr.state == "success", states
    for t in ("deploy", "wait_ready", "upload_data", "run", "collect", "teardown", "verify_clean"):
        assert states[f"{GROUP}.{t}"] == "success", (t, states)
    # Unselected groups are skipped whole: nothing deployed, so nothing to tear down.
    assert states["sgd_reuters_svm__wasm.deploy"] == "skipped"
    assert states["sgd_reuters_svm__wasm.teardown"] == "skipped"
    # the watcher always runs (all_done) and found nothing wrong
    assert states["summarize"] == "success" and states["watcher"] == "success"
    runs = list((env / "storage" / "faasm_benchmarks" / "2026-11-29").glob("*/sgd_reuters_svm/native/**/run.json"))
    assert runs, "no run record written"
    record = json.loads(runs[0].read_text())
    assert record["target"] == "local"


def test_local_run_without_built_functions_fails_once_at_preflight_naming_make_functions(
    env, monkeypatch, capfd, caplog
):
    """After a fresh ``make airflow``, before ``make functions``: the preflight refuses once, naming
    the missing build and the command, and no group starts (before, all eight groups ran into the
    same deploy failure one after another for minutes); the day's summary counts the selected
    groups as failed instead of "0 points, 0 failed"."""
    (env / "empty-build").mkdir()
    monkeypatch.setenv("FAASM_FUNCTIONS_BUILD_DIR", str(env / "empty-build"))
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf={**ONE, "systems": ["wasm", "native"]})
    states = _states(dr)
    assert dr.state == "failed", states
    assert states["preflight"] == "failed", states
    ran = {t: s for t, s in states.items() if "__" in t and s not in ("upstream_failed", "skipped")}
    assert ran == {}, ran  # no task of any group ran
    assert states["summarize"] == "failed" and states["watcher"] == "failed", states
    out = capfd.readouterr()
    text = out.out + out.err + caplog.text
    assert "functions are not built" in text and "sgd.wasm missing" in text and "make functions" in text
    summary = next((env / "storage" / "faasm_benchmarks" / "2026-11-29").glob("*/summary/summary.json"))
    doc = json.loads(summary.read_text())
    assert doc["status"] == "FAILED" and doc["failed"] == 2 and doc["points"] == [], doc
    assert sorted(g["system"] for g in doc["failed_groups"]) == ["native", "wasm"]
    assert all(g["step"] == "preflight" for g in doc["failed_groups"])


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


def _marking_failed_by_hand(monkeypatch, task_id: str) -> None:
    """dag.test() runs tasks in-process: replace the run of ``task_id`` by what the UI's
    "mark failed" does to a task instance (its state set to failed; the task never finishes)."""
    import airflow.sdk.definitions.dag as dag_mod
    from airflow.utils.state import TaskInstanceState

    real = dag_mod._run_task

    def run_task(*, ti, task, **kw):
        if ti.task_id == task_id:
            ti.set_state(TaskInstanceState.FAILED)
            return None
        return real(ti=ti, task=task, **kw)

    monkeypatch.setattr(dag_mod, "_run_task", run_task)


def test_task_marked_failed_by_hand_fails_the_run_after_teardown_and_verification(env, monkeypatch):
    _marking_failed_by_hand(monkeypatch, f"{GROUP}.upload_data")
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=ONE)
    states = _states(dr)
    assert states[f"{GROUP}.upload_data"] == "failed"
    assert states[f"{GROUP}.run"] == "upstream_failed"
    for t in ("collect", "teardown", "verify_clean"):
        assert states[f"{GROUP}.{t}"] == "success", (t, states)
    assert states["watcher"] == "failed" and dr.state == "failed", states


def test_teardown_marked_failed_by_hand_still_verifies_and_fails(env, monkeypatch):
    """The teardown never ran (marked failed): verify_clean must still run, find the deployment
    left behind, fail, and the watcher must fail the run."""
    _marking_failed_by_hand(monkeypatch, f"{GROUP}.teardown")
    dag = _dag()
    # verify_clean fails on every attempt here (the workers are left behind) and is retried as
    # deployed (2 retries); dag.test() sleeps out each retry delay, 2 min by default (295 s of the
    # test's 300 s under a CPU hog): the retries stay, their delay is cut
    for t in dag.tasks:
        t.retry_delay = timedelta(seconds=1)
    try:
        dr = dag.test(logical_date=LOGICAL_DATE, run_conf=ONE)
        states = _states(dr)
        assert states[f"{GROUP}.run"] == "success", states
        assert states[f"{GROUP}.teardown"] == "failed"
        assert states[f"{GROUP}.verify_clean"] == "failed", states  # it ran and found the workers
        assert states["watcher"] == "failed" and dr.state == "failed", states
    finally:
        from faasm_tasks import procs

        run_dirs = [p.name for p in (env / "state").iterdir() if p.is_dir()]
        for run_id in run_dirs:
            label = procs.run_label(str(env / "state"), run_id)
            procs.stop(procs.find_labelled(label), label, 5)
