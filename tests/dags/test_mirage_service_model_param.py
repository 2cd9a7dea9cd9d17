"""``mirage_service``'s trigger form submitted untouched: the default policy is ``model`` and the
``model`` field may stay empty (``Param(None, type=["null", "string"])``: a ``Param("", type=
"string")`` is a required field, whose Trigger button waits for a value). A run without a model
then fails at once in its one step: ``keep-service`` exits 2 naming ``--model`` before it
touches a cluster or writes anything, and the local runner does not retry exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import DAGS

pytestmark = pytest.mark.timeout(120)

RUN_ID = "manual__2026-12-02T04:00:00+00:00"


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "mirage_service.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mirage_service"]


def _rendered(dag, **conf):
    """The ``keep_service`` operator with its argv rendered for a run of ``conf`` over the defaults."""
    import copy

    op = copy.deepcopy(dag.get_task("keep_service"))
    params = copy.deepcopy(dag.params)
    for k, v in conf.items():
        params[k] = v
    params = params.validate()
    op.render_template_fields({"dag": dag, "task": op, "run_id": RUN_ID, "params": params})
    return op, params


def test_the_form_untouched_validates_with_policy_model_and_no_model(dag):
    params = dag.params.validate()  # the defaults, as the form shows them
    assert params["policy"] == "model" and params["model"] is None
    schema = dag.params.get_param("model").schema
    assert "null" in schema["type"] and "string" in schema["type"]
    dag.params.get_param("model").resolve(None, suppress_exception=False)  # the form's empty field


def test_a_model_typed_in_the_form_reaches_the_step(dag):
    op, _ = _rendered(dag, model="/data/models/xgboost-n1")
    assert "--model=/data/models/xgboost-n1" in op.argv


@pytest.mark.parametrize("model", [None, ""])
def test_policy_model_without_a_model_fails_at_once_naming_model(dag, model):
    from house.local import StepRejected

    op, params = _rendered(dag, model=model)
    assert params["policy"] == "model"
    assert not any(str(a).startswith("--model") for a in op.argv), op.argv
    out = op.argv[op.argv.index("--out") + 1]
    with pytest.raises(StepRejected) as err:
        op.execute({})
    assert err.value.returncode == 2
    assert "--policy model needs --model" in str(err.value) and "not retried" in str(err.value), err.value
    assert not Path(out).exists(), f"{out}: written before the refusal"


@pytest.mark.parametrize("policy", ["reactive", "avg"])
def test_baselines_need_no_model(dag, policy):
    op, _ = _rendered(dag, policy=policy)
    assert "--policy" in op.argv and policy in op.argv and not any(str(a).startswith("--model") for a in op.argv)


@pytest.mark.parametrize(
    "policy, key, flag",
    [
        ("avg-cal", "avg_cal_samples", "--avg-cal-samples"),
        ("guarantee", "waitpred", "--waitpred"),
        ("wait-pred", "waitpred", "--waitpred"),
        ("guarantee-cal", "guarantee_samples", "--guarantee-samples"),
    ],
)
def test_the_calibrated_and_predictor_policies_take_their_input_from_the_form(dag, policy, key, flag):
    """avg-cal's training samples and the wait predictor's output typed in the form reach the step;
    left empty, the step refuses at once naming the flag (exit 2, nothing written)."""
    from house.local import StepRejected

    op, _ = _rendered(dag, policy=policy, **{key: "/data/x"})
    assert f"{flag}=/data/x" in op.argv and policy in op.argv
    op, _ = _rendered(dag, policy=policy)
    assert not any(str(a).startswith(flag) for a in op.argv), op.argv
    out = op.argv[op.argv.index("--out") + 1]
    with pytest.raises(StepRejected) as err:
        op.execute({})
    assert err.value.returncode == 2 and flag in str(err.value), err.value
    assert not Path(out).exists()
