"""The faasm_benchmarks form's measurement params come from the typed configuration
(faasm_tasks.forms.Measurement) and reach each run step's command line: repeats, time budget,
order seed, and the A/A control on the A/A system's groups only."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util

import pytest
from conftest import DAGS

from faasm_tasks import stats
from faasm_tasks.forms import MIN_REPEATS, Check, Deployment, Measurement
from stepkit.forms import class_params, param

pytestmark = pytest.mark.timeout(120)

RUN_ID = "manual__2026-12-07T04:00:00+00:00"


@pytest.fixture(scope="module")
def dag():
    spec = importlib.util.spec_from_file_location("faasm_benchmarks_measurement_form", DAGS / "faasm_benchmarks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.dag


def test_the_forms_params_are_the_typed_configurations_fields(dag):
    fields = {f.name: f for f in dataclasses.fields(Measurement)}
    form = class_params(Measurement)
    assert list(form) == list(fields)
    for name, f in fields.items():
        p = dag.params.get_param(name)
        assert p.value == f.default, name
        assert p.schema["type"] == form[name]["type"] and p.schema["title"] == form[name]["title"], name
        assert p.description == form[name]["description"], name
    assert set(dag.params.get_param("aa_system").schema["enum"]) == {"wasm", "native"}  # the catalogue's


def test_the_whole_form_is_the_typed_configurations(dag):
    """Every param of the form is a field of Deployment, Measurement or Check, in that order, with
    its title and type; the choices only the catalogue knows are the catalogue's."""
    classes = (Deployment, Measurement, Check)
    names = [f.name for c in classes for f in dataclasses.fields(c)]
    assert list(dag.params) == names
    for c in classes:
        for name, spec in class_params(c).items():
            p = dag.params.get_param(name)
            assert p.schema["title"] == spec["title"] and p.schema["type"] == spec["type"], name
    for name in ("experiments", "systems"):
        p = dag.params.get_param(name)
        assert p.value == p.schema["items"]["enum"] and p.value, name  # all, by default
    assert set(dag.params.get_param("systems").schema["items"]["enum"]) == {"wasm", "native"}
    assert dag.params.get_param("release").schema["enum"][0] == dag.params.get_param("release").value


def test_an_arrays_choices_are_its_items():
    @dataclasses.dataclass
    class Form:
        picked: list = param([], "array", "Picked", "which", items={"type": "string"})
        one: str = param("a", "string", "One", "which one")

    form = class_params(Form, choices={"picked": ["a", "b"], "one": ["a", "c"]})
    assert form["picked"]["items"] == {"type": "string", "enum": ["a", "b"]} and "enum" not in form["picked"]
    assert form["one"]["enum"] == ["a", "c"]


def test_the_default_repeats_give_every_figure_an_interval():
    assert MIN_REPEATS == stats.min_n_for_median()
    assert Measurement().repeats >= stats.min_n_for_median()
    assert stats.median_ci([1.0] * Measurement().repeats) is not None
    assert "ratio_lo" in stats.ratio_ci([1.0, 2, 3, 4, 5, 6], [2.0, 3, 4, 5, 6, 7], paired=True)


def _argv(dag, task_id: str, **conf) -> list[str]:
    op = copy.deepcopy(dag.get_task(task_id))
    params = copy.deepcopy(dag.params)
    for k, v in conf.items():
        params[k] = v
    op.render_template_fields(
        {"dag": dag, "task": op, "run_id": RUN_ID, "ds": "2026-12-07", "params": params.validate()}
    )
    return [str(a) for a in op.argv]


def _run_args(argv: list[str]):
    """The run step's parse of a rendered argv (the step's own parser, as stepkit.cli builds it)."""
    import argparse

    from faasm_tasks.steps import run as run_step
    from stepkit.cli import add_contract_arguments

    assert argv[0] == "run"
    parser = argparse.ArgumentParser()
    add_contract_arguments(parser)
    run_step.add_arguments(parser)
    return parser.parse_args(argv[1:])


def test_the_run_steps_get_the_measurement_flags(dag):
    native = _argv(dag, "sgd_reuters_svm__native.run")
    wasm = _argv(dag, "sgd_reuters_svm__wasm.run")
    assert native[native.index("--repeats") + 1] == str(MIN_REPEATS)
    assert "--aa-control" in native and "--no-aa-control" in wasm  # the A/A arms: the native group only
    assert "--seed=" in native
    args = _run_args(native)
    assert args.seed is None and args.aa_control is True and args.repeats == MIN_REPEATS
    assert args.time_budget_min == 0
    set_ = _argv(dag, "sgd_reuters_svm__wasm.run", seed=17, repeats=9, time_budget_min=30, aa_system="wasm")
    args = _run_args(set_)
    assert (args.seed, args.repeats, args.time_budget_min, args.aa_control) == (17, 9, 30, True)
    off = _run_args(_argv(dag, "sgd_reuters_svm__native.run", aa_control=False))
    assert off.aa_control is False


def test_class_params_refuses_an_undeclared_field():
    @dataclasses.dataclass
    class Bad:
        ok: int = param(1, "integer", "Ok", "fine")
        bare: int = 2

    with pytest.raises(ValueError, match=r"Bad.bare is not declared with stepkit.forms.param"):
        class_params(Bad)
    with pytest.raises(ValueError, match="unknown JSON type 'int'"):
        param(1, "int", "x", "y")
