"""What the grid shows of ``mirage_pipeline``: the planning helpers folded into one task group,
and GPU tasks only where the deployment declares GPU nodes (``HOUSE_GPUS``)."""

from __future__ import annotations

import pytest
from conftest import DAGS


def _parse(monkeypatch, gpus: str | None):
    from airflow.dag_processing.dagbag import DagBag

    if gpus is None:
        monkeypatch.delenv("HOUSE_GPUS", raising=False)
    else:
        monkeypatch.setenv("HOUSE_GPUS", gpus)
    bag = DagBag(dag_folder=str(DAGS / "mirage_pipeline.py"))
    return bag


def test_plan_helpers_are_one_folded_group(monkeypatch):
    dag = _parse(monkeypatch, None).dags["mirage_pipeline"]
    top = [k for k in dag.task_group.children]
    assert "plan" in top and not any(k.endswith("_argvs") for k in dag.task_ids)
    group = dag.task_group.children["plan"]
    assert sorted(t.split(".", 1)[1] for t in group.children) == sorted(
        ["commands", "sample", "merge", "train_cpu", "policy_cpu", "validate"]
    )
    # every mapped step expands over a list built in the group
    for tid in ("sample", "merge", "train_cpu", "policy_cpu", "validate"):
        assert f"plan.{tid}" in dag.get_task(tid).upstream_task_ids


def test_no_gpu_tasks_without_gpu_nodes(monkeypatch):
    dag = _parse(monkeypatch, None).dags["mirage_pipeline"]
    assert not [t for t in dag.task_ids if "gpu" in t]
    assert dag.params.get_param("device").schema["enum"] == ["cpu"]
    import copy

    params = copy.deepcopy(dag.params)
    with pytest.raises(Exception, match="cuda"):  # the form (and the API) refuse cuda here
        params["device"] = "cuda"
        params.validate()


def test_gpu_tasks_where_declared(monkeypatch):
    dag = _parse(monkeypatch, "true").dags["mirage_pipeline"]
    assert {"train_gpu", "policy_gpu", "plan.train_gpu", "plan.policy_gpu"} <= set(dag.task_ids)
    assert dag.params.get_param("device").schema["enum"] == ["cpu", "cuda"]
    assert "train_gpu" in dag.get_task("policy_cpu").upstream_task_ids
    assert "policy_gpu" in dag.get_task("validate").upstream_task_ids


def test_bad_gpus_setting_fails_the_parse(monkeypatch):
    bag = _parse(monkeypatch, "maybe")
    assert "mirage_pipeline" not in bag.dags
    assert any("HOUSE_GPUS" in str(err) for err in bag.import_errors.values())
