"""A mirage_pipeline param added as the recipe says ("How to change it" in docs/mirage-steps.md).

The param is ``bootstrap``: the bootstrap draws of the ``metrics`` step's 95 % intervals
(``metrics --bootstrap``, default 2000), which the plan leaves at the step's default today. A
real change edits two places, and this test makes the same two edits inside the test, with no
file edited:

1. **the field**, declared in ``MirageRun`` (``mirage_tasks/run/runconf.py``) with its default
   (the step flag's default) and its ``Spec`` (title, description, JSON type, range): here a
   subclass of ``MirageRun`` with one more field, as tests/mirage/test_run_keys.py declares
   one, and ``FIELDS``/``DEFAULTS``/``PIPELINE_FORM`` patched to what runconf derives from the
   class at import;
2. **its use** in ``plan()`` (``mirage_tasks/run/plan.py``): ``bootstrap=run.bootstrap`` in
   the ``argv("metrics", ...)`` call: here ``plan``'s ``argv`` wrapped to add that one keyword
   (the argv is still built from the metrics step's own parser).

It then shows what the recipe promises: the param is in the form the DAG builds, typed and
checked by ``from_params`` (a bad value refused, naming it), passed to the metrics argv, and,
left at its default, every stored run key (the pinned ones) and the metrics step's parsed
params are what they were, so nothing stored is recomputed.
"""

from __future__ import annotations

import dataclasses

import jsonschema
import pytest
from test_run_keys import APRIL, CONFS, PINNED, key_of  # the pinned keys of stored configurations

from mirage_tasks.run import plan as plan_mod, runconf
from mirage_tasks.run.runconf import MirageRun

NAME, DEFAULT = "bootstrap", 2000
SPEC = runconf.Spec(
    "Bootstrap draws",
    "Bootstrap draws of the metrics' 95 % intervals (metrics --bootstrap); 0: no intervals.",
    "integer",
    schema={"minimum": 0, "maximum": 100_000},
)

# ----------------------------------------------------------------------------- edit 1: the field

BootstrapRun = dataclasses.make_dataclass(
    "BootstrapRun", [(NAME, int, runconf._f(DEFAULT, SPEC))], bases=(MirageRun,), frozen=True
)


@pytest.fixture
def declared(monkeypatch):
    """runconf as it reads once the field is in MirageRun: FIELDS, DEFAULTS and the pipeline's
    form are derived from the class at import (runconf.py), so they follow the new field."""
    fields = runconf.field_specs(BootstrapRun)
    monkeypatch.setattr(runconf, "FIELDS", fields)
    monkeypatch.setattr(runconf, "DEFAULTS", {k: v for k, v in BootstrapRun().as_dict().items() if k != "size"})
    monkeypatch.setattr(runconf, "PIPELINE_FORM", tuple(fields))


# ----------------------------------------------------------------------------- edit 2: its use in the plan


def plan_uses_the_param(monkeypatch) -> None:
    """plan() with ``bootstrap=run.bootstrap`` in its ``argv("metrics", ...)`` call."""
    real_plan, real_argv = plan_mod.plan, plan_mod.argv

    def plan(run, prefix, logical_date, **kw):
        def argv(step, **values):
            if step == "metrics":
                values = {**values, NAME: run.bootstrap}
            return real_argv(step, **values)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(plan_mod, "argv", argv)
            return real_plan(run, prefix, logical_date, **kw)

    monkeypatch.setattr(plan_mod, "plan", plan)


def parsed(argv: list[str]) -> dict:
    """What the step reads from an argv (its fingerprint hashes these params, not the argv text)."""
    return vars(plan_mod.step_parser(argv[0]).parse_args(argv[1:]))


# ----------------------------------------------------------------------------- the recipe's test


def test_the_param_is_in_the_dags_form(declared):
    """dags/mirage_pipeline.py builds its params from ``form(PIPELINE_FORM, ...)`` (and
    tests/dags/test_mirage_params.py checks the DAG's params are exactly that form)."""
    rendered = runconf.form(runconf.PIPELINE_FORM, choices={"device": ["cpu"]})
    assert list(rendered)[-1] == NAME and list(rendered)[0] == "size"
    spec = rendered[NAME]
    assert spec == {
        "default": DEFAULT,
        "type": "integer",
        "title": SPEC.title,
        "description": SPEC.description,
        "minimum": 0,
        "maximum": 100_000,
    }
    schema = {k: v for k, v in spec.items() if k not in ("default", "title", "description")}
    jsonschema.validate(DEFAULT, schema)  # what the Airflow form checks
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(-1, schema)


def test_the_param_is_typed_and_checked():
    assert BootstrapRun.from_params({}).bootstrap == DEFAULT
    assert BootstrapRun.from_params({"size": "demo", NAME: None}).bootstrap == DEFAULT  # an empty form field
    assert BootstrapRun.from_params({NAME: 500}).bootstrap == 500
    assert BootstrapRun.from_params({NAME: 500.0}).bootstrap == 500 and isinstance(
        BootstrapRun.from_params({NAME: 500.0}).bootstrap, int
    )
    for bad in ("many", -1, 100_001, 2.5, True, [1]):
        with pytest.raises(ValueError, match=NAME):
            BootstrapRun.from_params({NAME: bad})
    with pytest.raises(ValueError, match=NAME):  # MirageRun itself does not know it (no edit made)
        MirageRun.from_params({NAME: 500})


def test_the_plan_passes_it_to_the_metrics_step(monkeypatch, tmp_path):
    plan_uses_the_param(monkeypatch)
    shared, runs = str(tmp_path / "mirage"), str(tmp_path / "mirage_pipeline")
    p = plan_mod.plan_run(BootstrapRun.from_params({"size": "demo", NAME: 500}), shared, runs, APRIL)
    assert parsed(p["metrics"])[NAME] == 500
    at = p["metrics"].index("--bootstrap")
    assert p["metrics"][at : at + 2] == ["--bootstrap", "500"]
    others = [p["trace_argv"], p["fidelity"], p["report"], *p["merge"], *p["train_cpu"], *p["validate"]]
    assert not any("--bootstrap" in a for a in others)  # only the step it is meant for


def test_at_its_default_nothing_stored_moves(monkeypatch, tmp_path):
    """Left at its default (not given, or given as 2000), every pinned run key is the same; the
    plan computes the same prefix, and the metrics step reads the same params as before (so its
    fingerprint, and every other step's argv, are unchanged: each finds its stored output and
    skips). Set off its default, the run gets a prefix of its own."""
    for conf in CONFS:
        assert key_of(BootstrapRun, conf) == PINNED[conf], conf
        assert key_of(BootstrapRun, conf, **{NAME: DEFAULT}) == PINNED[conf], conf
        assert key_of(BootstrapRun, conf, **{NAME: 500}) != PINNED[conf], conf
    assert NAME not in BootstrapRun.from_params({}).key_params()
    shared, runs = str(tmp_path / "mirage"), str(tmp_path / "mirage_pipeline")
    plans = ("demo", "paper", "scheduled")
    befores = {
        conf: plan_mod.plan_run(MirageRun.from_params(CONFS[conf][0], **CONFS[conf][1]), shared, runs, APRIL)
        for conf in plans
    }  # the code as it is
    plan_uses_the_param(monkeypatch)  # the code with the edit
    for conf in plans:
        params, kw = CONFS[conf]
        before = befores[conf]
        after = plan_mod.plan_run(BootstrapRun.from_params(params, **kw), shared, runs, APRIL)
        assert after["prefix"] == before["prefix"] == f"{runs}/{PINNED[conf]}", conf
        assert parsed(after.pop("metrics")) == parsed(before.pop("metrics")), conf
        assert after.pop("config") == {**before.pop("config"), NAME: DEFAULT}
        assert after == before, conf
