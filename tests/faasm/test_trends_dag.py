"""``faasm_benchmarks`` under ``dag.test()``: a regression found by ``check`` fails the DAG run,
after the teardowns and ``summarize`` ran (local target, real processes)."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from conftest import DAGS
from test_trends_history import day

from faasm_tasks.catalogue import get_experiment, resolve
from faasm_tasks.results import Attempt, point_prefix

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("airflow_db")]

DATE = "2026-11-29"
GROUP = "sgd_reuters_svm__native"


def test_breach_fails_the_dag_run_after_teardown_and_summarize(tmp_path, monkeypatch):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make test installs it on Debian as root)")
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path / "storage"))
    monkeypatch.setenv("FAASM_TASKS_STATE_DIR", str(tmp_path / "state"))
    # History: three earlier days where every local SGD point took 1 ms, so today's run is a regression.
    results = str(tmp_path / "storage" / "faasm_benchmarks")
    plan = resolve(get_experiment("sgd_reuters_svm"), "native", "local")
    for k in (3, 2, 1):
        date = day(-k, DATE)
        for point in plan.points:
            base = {
                "run_id": f"scheduled__{date}",
                "date": date,
                "experiment": "sgd_reuters_svm",
                "system": "native",
                "target": "local",
                "params": point,
                "repeat": 0,
            }
            Attempt(
                point_prefix(results, date, f"scheduled__{date}", "sgd_reuters_svm", "native", point, 0), base
            ).finish(True, None, {"run_time_ms": 1.0})

    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "faasm_benchmarks.py"))
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["faasm_benchmarks"]
    dag.get_task("check").retries = 0  # the breach is deterministic: no need to wait for the retry here
    dr = dag.test(
        logical_date=datetime(2026, 11, 29, tzinfo=UTC),
        run_conf={"target": "local", "experiments": ["sgd_reuters_svm"], "systems": ["native"]},
    )
    states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    assert dr.state == "failed", states
    for t in ("run", "collect", "teardown", "verify_clean"):
        assert states[f"{GROUP}.{t}"] == "success", (t, states)
    assert states["summarize"] == "success" and states["check"] == "failed" and states["watcher"] == "failed"
    trends = list((tmp_path / "storage" / "faasm_benchmarks" / DATE).glob("*/trends/trends.html"))
    assert len(trends) == 1 and "4 days with results" in trends[0].read_text()
    ops = list((tmp_path / "storage" / "faasm_benchmarks" / DATE).glob("*/_ops/check-*.json"))
    assert ops and '"run_time_ms"' in ops[0].read_text()
    # summarize's "Report" extra link (stored by the worker as an XCom) opens the task's Report tab inside the
    # Airflow UI (plugins/house/links.py), which shows the trend report from the view
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(
                run_id=dr.run_id, key="_link_StepReportLink", task_ids="summarize", dag_ids="faasm_benchmarks"
            )
        ).all()
        links = [XComModel.deserialize_value(r) for r in rows]
    rel = trends[0].relative_to(tmp_path / "storage")
    tab = f"/dags/faasm_benchmarks/runs/{quote(dr.run_id, safe='')}/tasks/summarize/plugin/report"
    assert len(links) == 1 and links[0].endswith(tab) and rel.name == "trends.html", (links, rel)
