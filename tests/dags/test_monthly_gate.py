"""``mirage_monthly``'s gate: wired by the house factory after the month's pipeline run, which it
waits for; its margin is the house setting ``HOUSE_GATE_MARGIN``, not a literal in the DAG file."""

from __future__ import annotations

import pytest
from conftest import load_dag

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _fresh_variable_cache():
    from house.config import clear_variable_cache

    clear_variable_cache()
    yield
    clear_variable_cache()


def test_gate_follows_the_pipeline_run_with_the_configured_margin(monkeypatch):
    from airflow.sdk import TriggerRule

    from house.local import LocalStepOperator

    monkeypatch.setenv("HOUSE_GATE_MARGIN", "0.25")
    dag = load_dag("mirage_monthly")
    start, gate = dag.get_task("start_pipeline"), dag.get_task("gate")
    assert isinstance(gate, LocalStepOperator) and gate.package == "mirage_tasks"
    assert gate.upstream_task_ids == {"start_pipeline"}
    # the gate judges the finished run: start_pipeline waits for it (deferred to the triggerer)
    assert start.wait_for_completion and start.deferrable
    # the run existed already (start_pipeline skipped): its stored metrics are still judged
    assert gate.trigger_rule == TriggerRule.NONE_FAILED and gate.retries == 1
    argv = list(gate.argv)
    assert argv[0] == "gate"
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags["--margin"] == "0.25"
    assert flags["--month"] == "{{ dag_run.partition_key }}"
    assert flags["--rule"] == "{{ params.gate_rule }}" and dag.params["gate_rule"] == "xgboost"
    assert flags["--runs"] == "{{ house_storage_prefix('mirage_pipeline') }}"
    assert flags["--out"] == "{{ house_storage_prefix(dag.dag_id, 'gate', dag_run.partition_key) }}"


def test_gate_margin_setting(monkeypatch):
    from house.config import DEFAULT_GATE_MARGIN, ConfigError, get_config

    monkeypatch.setenv("HOUSE_NO_VARIABLES", "1")
    monkeypatch.delenv("HOUSE_GATE_MARGIN", raising=False)
    assert get_config().gate_margin == DEFAULT_GATE_MARGIN == 0.10
    for bad in ("ten", "-0.1", "nan"):
        monkeypatch.setenv("HOUSE_GATE_MARGIN", bad)
        with pytest.raises(ConfigError, match="HOUSE_GATE_MARGIN"):
            get_config()
