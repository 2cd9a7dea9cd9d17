"""``mirage_service`` and ``mirage_evaluation`` build their trigger forms from typed configurations
(``mirage_tasks.run.forms``), as ``mirage_pipeline`` does from ``MirageRun``: a field added to the
configuration appears in the form (and, for the service, as a flag of its command line) with no
edit to the DAG file. The service's optional flags are left out of the rendered argv when empty:
no empty argument and no stand-in (the DAG once filled each empty one with another ``--node=1``)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
from dataclasses import dataclass

import pytest
from conftest import DAGS
from test_pod_specs import kube_env, render_pod  # noqa: F401 (kube_env: a fixture)

pytestmark = pytest.mark.timeout(120)

RUN_ID = "manual__2026-12-02T04:00:00+00:00"
OPTIONAL = ("model", "avg_cal_samples", "waitpred", "guarantee_samples", "partition", "account")


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_typed_forms", DAGS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rendered_argv(dag, **conf) -> list:
    op = copy.deepcopy(dag.get_task("keep_service"))
    params = copy.deepcopy(dag.params)
    for k, v in conf.items():
        params[k] = v
    op.render_template_fields({"dag": dag, "task": op, "run_id": RUN_ID, "params": params.validate()})
    return list(op.argv)


def _flags(argv: list) -> list[str]:
    return [str(a).split("=", 1)[0] for a in argv if str(a).startswith("--")]


@pytest.mark.parametrize("empty", [None, ""])
def test_empty_optional_flags_are_left_out_of_the_argv(empty):
    from house import OMIT

    dag = _load("mirage_service").dag
    argv = _rendered_argv(dag, **dict.fromkeys(OPTIONAL, empty))
    assert all(isinstance(a, str) and a for a in argv), argv  # no empty element
    assert OMIT not in argv
    flags = _flags(argv)
    assert len(flags) == len(set(flags)), f"a flag repeated: {argv}"
    assert not any(str(a).startswith("--node=") for a in argv), argv
    assert argv[argv.index("--node") + 1] == "1"
    for name in OPTIONAL:
        assert "--" + name.replace("_", "-") not in flags, argv


def test_set_optional_flags_each_appear_once():
    dag = _load("mirage_service").dag
    conf = {k: f"/data/{k}" for k in OPTIONAL}
    argv = _rendered_argv(dag, policy="guarantee-cal", **conf)
    for name in OPTIONAL:
        assert argv.count(f"--{name.replace('_', '-')}=/data/{name}") == 1, argv
    flags = _flags(argv)
    assert len(flags) == len(set(flags)), argv


def test_the_pod_gets_no_empty_or_omitted_argument(kube_env):
    from house import OMIT

    dag = _load("mirage_service").dag
    op = dag.get_task("keep_service")
    args = render_pod(op)["spec"]["containers"][0]["args"]
    assert args[0] == "keep-service" and all(args) and OMIT not in args, args
    assert not any(a.startswith("--model") or a.startswith("--node=") for a in args), args


def _wider(cls, name: str):
    """``cls`` with one more nullable string field ``name``."""
    from mirage_tasks.run.runconf import Spec, _f

    spec = Spec("Added", "A field added to the configuration.", "string", nullable=True, empty="none")
    return dataclass(frozen=True)(
        type(cls.__name__, (cls,), {"__annotations__": {name: "str | None"}, name: _f(None, spec)})
    )


@pytest.mark.parametrize("dag_id, cls_name", [("mirage_service", "ServiceRun"), ("mirage_evaluation", "EvaluationRun")])
def test_the_form_is_its_typed_configuration(monkeypatch, dag_id, cls_name):
    from mirage_tasks.run import forms

    cls = getattr(forms, cls_name)
    dag = _load(dag_id).dag
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(dag.params.keys()) == names
    for f in dataclasses.fields(cls):
        param = dag.params.get_param(f.name)
        assert param.schema["title"] == f.metadata["spec"].title, f.name

    monkeypatch.setattr(forms, cls_name, _wider(cls, "added_field"))
    dag = _load(dag_id).dag
    assert list(dag.params.keys()) == [*names, "added_field"]
    param = dag.params.get_param("added_field")
    assert param.value is None and "null" in param.schema["type"] and param.schema["title"] == "Added"
    if dag_id == "mirage_service":  # and it is a flag of the step, left out while empty
        assert "--added-field=x" in _rendered_argv(dag, added_field="x")
        assert not any("added" in a for a in _rendered_argv(dag))


@pytest.mark.parametrize("dag_id", ["mirage_service", "mirage_evaluation", "mirage_pipeline", "faasm_benchmarks"])
def test_the_serialized_dag_holds_no_nul(dag_id):
    """Every DAG is stored as JSON in the metadata database, and PostgreSQL refuses a NUL in text
    and JSON: the optional flags' stand-in (and anything else a template holds) must not carry one."""
    from airflow.serialization.serialized_objects import DagSerialization

    text = json.dumps(DagSerialization.to_dict(_load(dag_id).dag))
    assert "\\u0000" not in text and "\x00" not in text
