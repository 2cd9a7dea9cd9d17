"""mirage_service's form: each number has the range keep-service accepts (no 1e9 links or service
hours), and a run conf with a key the form does not have fails at once naming it."""

from __future__ import annotations

import copy

import pytest
from conftest import DAGS


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "mirage_service.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mirage_service"]


def _module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("mirage_service_dag", DAGS / "mirage_service.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_form_ranges_are_the_steps_own():
    from mirage_tasks.run.forms import SERVICE_BOUNDS
    from mirage_tasks.steps.keep_service import BOUNDS

    for k, v in SERVICE_BOUNDS.items():
        assert BOUNDS[k] == v, k


@pytest.mark.parametrize(
    "key,value",
    [
        ("service_hours", 1e9),
        ("links", 10**9),
        ("node", 10**9),
        ("factor", 1e12),
        ("service_hours", 0),
        ("links", 0),
        ("factor", 0),
    ],
)
def test_out_of_range_values_are_refused_by_the_form(dag, key, value):
    from airflow.sdk.definitions.param import ParamValidationError

    params = copy.deepcopy(dag.params)
    with pytest.raises(ParamValidationError, match=key):
        params[key] = value  # the form validates on assignment
        params.validate()


def test_the_defaults_validate(dag):
    copy.deepcopy(dag.params).validate()


def test_unknown_conf_keys_are_refused_naming_them(dag):
    mod = _module()
    assert mod.unknown_conf({"links": 2, "policy": "avg"}, dag.params.keys()) is None
    why = mod.unknown_conf({"link": 2, "servce_hours": 3}, dag.params.keys())
    assert "link" in why and "servce_hours" in why and "known:" in why
    assert "check_conf" in dag.task_dict
    # the conf is checked before anyone is asked to approve the run (house.approvals)
    assert dag.task_dict["approve"].upstream_task_ids == {"check_conf"}
    assert dag.task_dict["keep_service"].upstream_task_ids == {"approve"}


def test_untouched_without_a_slurm_says_first_that_it_needs_one(
    airflow_db, local_storage, tmp_path, monkeypatch, capfd
):
    """The form submitted untouched on a machine with no Slurm said only, from its step, that no
    model was given: it must say first that a Slurm is needed and how to start one, and start nothing."""
    from conftest import load_dag, task_states

    monkeypatch.setenv("HOUSE_CODE_ROOT", str(tmp_path / "checkout"))  # a checkout where make slurm never ran
    (tmp_path / "checkout").mkdir()
    dr = load_dag("mirage_service").test(run_conf={})
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["check_conf"] == "failed", states
    assert states["keep_service"] in ("upstream_failed", "None"), states
    out = capfd.readouterr()
    said = out.out + out.err
    assert "there is none here" in said and "make slurm" in said, said[-2000:]
    assert "--model" not in said
