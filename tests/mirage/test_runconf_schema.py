"""The run configuration is checked by jsonschema against the schema its trigger form is built
from (mirage_tasks.run.runconf.run_schema / field_schema): every kind of constraint refuses a
bad value naming the param and the value, a changed spec moves the form and the check
together, and only the typing step (canonical_number: the int/float history) is by hand."""

from __future__ import annotations

import pytest

from mirage_tasks.run import runconf
from mirage_tasks.run.runconf import FIELDS, PIPELINE_FORM, SAMPLES_FORM, SIZED, MirageRun, form, run_schema

#: One bad value per kind of constraint the specs use: ``(params, message)``; the message names
#: the param and shows the value.
BAD = {
    "type integer": ({"train_count": "30"}, "param train_count: must be a whole number (got '30')"),
    "type integer, a fraction": ({"shards": 2.5}, "param shards: must be a whole number (got 2.5)"),
    "type integer, a boolean": ({"seed": True}, "param seed: must be a whole number (got True)"),
    "type number": ({"warmup_days": "2"}, "param warmup_days: must be a number (got '2')"),
    "type number, not finite": ({"workload_days": float("inf")}, "param workload_days: must be a number (got inf)"),
    "type string": ({"cluster_config": 5}, "param cluster_config: must be text (got 5)"),
    "type string or empty": ({"trace_timezone": ["UTC"]}, "param trace_timezone: must be text or empty (got ['UTC'])"),
    "type array": ({"models": "xgboost"}, "param models: must be a list (got 'xgboost')"),
    "type object": ({"train_params": ["epochs=3"]}, "param train_params: must be an object (got ['epochs=3'])"),
    "type of an item": ({"node_sizes": [1, "8"]}, "param node_sizes: must be a whole number (got '8', item 1)"),
    "minimum": ({"probes": 1}, "param probes: must be at least 2 (got 1)"),
    "minimum of an item": ({"node_sizes": [8, 0]}, "param node_sizes: must be at least 1 (got 0, item 1)"),
    "maximum": ({"seed": 2**32}, f"param seed: must be at most {2**32 - 1} (got {2**32})"),
    "exclusiveMinimum": ({"interval_hours": 0}, "param interval_hours: must be more than 0 (got 0)"),
    "enum": ({"policy_eval": "random"}, "param policy_eval: unknown 'random'; choose from sampled, greedy"),
    "enum of an item": ({"models": ["xgboost", "lstm"]}, "param models: unknown 'lstm'; choose from xgboost, "),
    "minItems": ({"models": []}, "param models: must be a list of at least 1 item(s) (got [])"),
    "maxItems": ({"node_sizes": list(range(1, 18))}, "param node_sizes: must be a list of at most 16 item(s)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_kind_of_constraint_refuses_a_bad_value_naming_the_param(case):
    params, message = BAD[case]
    with pytest.raises(ValueError) as exc:
        MirageRun.from_params(params)
    assert message in str(exc.value), str(exc.value)


def test_an_item_error_says_which_item():
    with pytest.raises(ValueError, match=r"param models: unknown 'lstm'; choose from .* \(item 1\)"):
        MirageRun.from_params({"models": ["xgboost", "lstm"]})


def test_min_length_and_a_missing_value_name_the_param():
    """An empty value is "not given" in a form (from_params takes the default), so these are
    reached by MirageRun.replace, which checks its changes with the same schema."""
    run = MirageRun()
    with pytest.raises(ValueError, match=r"param synth_profile: must be at least 1 character\(s\) long \(got ''\)"):
        run.replace(synth_profile="")
    with pytest.raises(ValueError, match=r"param shards: is required \(got None\)"):
        run.replace(shards=None)
    assert run.replace(trace="").trace is None  # a nullable field: empty is None
    assert run.replace(shards=2.0).shards == 2 and isinstance(run.replace(shards=2.0).shards, int)


def test_pattern_a_keyword_no_spec_uses_yet_is_checked_and_shown(monkeypatch):
    """No field declares a pattern today; one added to a spec is in the form and refused by the check."""
    monkeypatch.setitem(FIELDS["trace_timezone"].schema, "pattern", "^[A-Z][A-Za-z_]+(/[A-Za-z_]+)*$")
    assert form(["trace_timezone"])["trace_timezone"]["pattern"] == "^[A-Z][A-Za-z_]+(/[A-Za-z_]+)*$"
    assert MirageRun.from_params({"trace_timezone": "America/Chicago"}).trace_timezone == "America/Chicago"
    with pytest.raises(ValueError, match=r"param trace_timezone: must match the pattern .* \(got 'utc\+1'\)"):
        MirageRun.from_params({"trace_timezone": "utc+1"})


def test_every_bad_param_is_reported_at_once_in_the_fields_order():
    with pytest.raises(ValueError) as exc:
        MirageRun.from_params({"seed": -1, "train_count": 0, "node_sizes": [0, 0]})
    assert str(exc.value) == (
        "param train_count: must be at least 1 (got 0); "
        "param node_sizes: must be at least 1 (got 0, item 0); "
        "param node_sizes: must be at least 1 (got 0, item 1); "
        "param seed: must be at least 0 (got -1)"
    )


def test_what_the_schema_cannot_say_is_still_refused_naming_the_param():
    for params, message in [
        ({"val_start": "March"}, "param val_start='March' is not an ISO 8601"),
        ({"train_params": {"moe": ["epochs"]}}, "param train_params: must map each model"),
        ({"models": ["moe_policy"]}, "param models: .* need their base model"),
    ]:
        with pytest.raises(ValueError, match=message):
            MirageRun.from_params(params)


# ----------------------------------------------------------------------------- one schema


def _form_schema(param: dict) -> dict:
    return {k: v for k, v in param.items() if k not in ("default", "title", "description")}


def test_the_schema_checked_is_the_one_the_form_is_built_from():
    """Every param's form schema is the run schema's property (in the pipeline's form a field a
    size sets also takes null: the size's value); and the run schema is valid 2020-12."""
    from jsonschema import Draft202012Validator

    schema = run_schema()
    Draft202012Validator.check_schema(schema)
    assert list(schema["properties"]) == list(FIELDS)
    for name, param in form(SAMPLES_FORM).items():
        assert _form_schema(param) == schema["properties"][name], name
    for name, param in form(PIPELINE_FORM).items():
        expected = dict(schema["properties"][name])
        if name in SIZED:
            expected["type"] = ["null", FIELDS[name].type]
        assert _form_schema(param) == expected, name


def test_a_changed_spec_moves_the_form_and_the_check_together(monkeypatch):
    assert MirageRun.from_params({"shards": 9}).shards == 9
    monkeypatch.setitem(FIELDS["shards"].schema, "maximum", 8)
    monkeypatch.setitem(FIELDS["probe_spacing"].schema, "enum", ["uniform"])
    assert form(PIPELINE_FORM)["shards"]["maximum"] == 8 and form(SAMPLES_FORM)["probe_spacing"]["enum"] == ["uniform"]
    assert run_schema()["properties"]["shards"]["maximum"] == 8
    with pytest.raises(ValueError, match=r"param shards: must be at most 8 \(got 9\)"):
        MirageRun.from_params({"shards": 9})
    with pytest.raises(ValueError, match="param probe_spacing: unknown 'end'; choose from uniform$"):
        MirageRun.from_params({"probe_spacing": "end"})
    assert MirageRun.from_params({"shards": 8}).shards == 8
    monkeypatch.undo()
    assert form(["shards"])["shards"]["maximum"] == 64 and MirageRun.from_params({"shards": 9}).shards == 9


def test_a_subclass_field_is_checked_from_its_own_spec():
    import dataclasses

    spec = runconf.Spec("Load scale", "A number param of a subclass.", "number", schema={"exclusiveMinimum": 0})
    cls = dataclasses.make_dataclass(
        "ScaledRun", [("load_scale", float, runconf._f(1.0, spec))], bases=(MirageRun,), frozen=True
    )
    assert run_schema(cls)["properties"]["load_scale"] == {"type": "number", "exclusiveMinimum": 0}
    assert "load_scale" not in run_schema()["properties"]
    with pytest.raises(ValueError, match=r"param load_scale: must be more than 0 \(got -1\)"):
        cls.from_params({"load_scale": -1})
    with pytest.raises(ValueError, match=r"param load_scale: must be a number \(got nan\)"):
        cls.from_params({"load_scale": float("nan")})


# ----------------------------------------------------------------------------- the typing step


def test_canonical_number_is_the_int_float_history():
    """A whole number is an int (as every stored run key hashed it), any other a float."""
    from mirage_tasks.run.runconf import canonical_number

    for value, typed in [(4, 4), (4.0, 4), (2.5, 2.5), (0.0, 0), (10**15, 10**15), (1e20, 10**20)]:
        out = canonical_number(value)
        assert out == typed and type(out) is type(typed), value
    run = MirageRun.from_params({"interval_hours": 6.0, "warmup_days": 1.5, "node_sizes": (1.0, 8), "val_count": 3.0})
    assert (run.interval_hours, run.warmup_days, run.node_sizes, run.val_count) == (6, 1.5, [1, 8], 3)
    assert type(run.interval_hours) is int and type(run.val_count) is int
    assert all(type(n) is int for n in run.node_sizes)
