"""The one run configuration of the Mirage DAGs (mirage_tasks.run.runconf): types, ranges, unknown
params, run sizes and the form rendered from it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mirage_tasks.models.registry import KINDS
from mirage_tasks.run.runconf import (
    DEFAULTS,
    FIELDS,
    PIPELINE_FORM,
    SAMPLES_FORM,
    SIZE_NAMES,
    SIZED,
    SIZES,
    SYNTHETIC,
    MirageRun,
    form,
)


def test_no_params_is_the_paper_configuration():
    run = MirageRun.from_params({})
    assert run == MirageRun() and run.size == "paper"
    assert (run.train_count, run.interval_hours, run.val_count, run.shards, run.models) == (
        684,
        4,
        None,
        4,
        list(KINDS),
    )
    assert MirageRun.from_params({"size": "demo"}).train_count == 30


def test_values_are_typed_and_numbers_canonical():
    run = MirageRun.from_params(
        {
            "interval_hours": 4.0,
            "warmup_days": 1.5,
            "train_count": 12.0,
            "node_sizes": [1.0, 8],
            "val_count": 3,
            "trace": "",
            "trace_timezone": "",
        }
    )
    # a whole number is an int (the storage keys hash the JSON: 4, as the form has always sent)
    assert run.interval_hours == 4 and isinstance(run.interval_hours, int)
    assert run.warmup_days == 1.5 and run.train_count == 12 and isinstance(run.train_count, int)
    assert run.node_sizes == [1, 8] and all(isinstance(n, int) for n in run.node_sizes)
    assert run.trace is None and run.trace_timezone is None  # empty text: not given
    assert json.loads(json.dumps(run.as_dict())) == run.as_dict()


@pytest.mark.parametrize(
    "params, message",
    [
        ({"train_count": 0}, "param train_count: must be at least 1"),
        ({"train_count": "30"}, "param train_count: must be a whole number"),
        ({"train_count": True}, "param train_count: must be a whole number"),
        ({"train_count": 2.5}, "param train_count: must be a whole number"),
        ({"interval_hours": 0}, "param interval_hours: must be more than 0"),
        ({"interval_hours": 25}, "param interval_hours: must be at most 24"),
        ({"interval_hours": float("nan")}, "param interval_hours: must be a number"),
        ({"warmup_days": -1}, "param warmup_days: must be at least 0"),
        ({"probes": 1}, "param probes: must be at least 2"),
        ({"shards": 65}, "param shards: must be at most 64"),
        ({"node_sizes": []}, "param node_sizes: must be a list of at least 1"),
        ({"node_sizes": [0]}, "param node_sizes: must be at least 1"),
        ({"node_sizes": 8}, "param node_sizes: must be a list"),
        ({"models": ["lstm"]}, "param models: unknown 'lstm'"),
        ({"models": ["transformer_policy"]}, "param models: .* need their base model"),
        ({"probe_spacing": "sparse"}, "param probe_spacing: unknown 'sparse'"),
        ({"preset": "huge"}, "param preset: unknown 'huge'"),
        ({"device": "tpu"}, "param device: unknown 'tpu'"),
        ({"train_params": {"moe": "epochs=3"}}, "param train_params: must map each model"),
        ({"train_params": {"moe": ["epochs"]}}, "param train_params: must map each model"),
        ({"train_params": {"lstm": ["a=1"]}}, "param train_params: unknown model"),
        ({"val_start": "March"}, "param val_start='March' is not an ISO 8601"),
        ({"window_from": "2023-02-30"}, "param window_from='2023-02-30' is not an ISO 8601"),
        ({"trace": 3}, "param trace: must be text"),
        ({"synth_profile": ""}, None),  # empty: not given, the default profile
        ({"size": "huge"}, "param size: 'huge' is not one of demo, month, paper, scheduled"),
    ],
)
def test_bad_values_name_the_param(params, message):
    if message is None:
        assert MirageRun.from_params(params).synth_profile == "ls6-a100"
        return
    with pytest.raises(ValueError, match=message):
        MirageRun.from_params(params)


def test_unknown_params_are_refused():
    with pytest.raises(ValueError, match="unknown param.*train_cout"):
        MirageRun.from_params({"train_cout": 30})
    with pytest.raises(ValueError, match="unknown param"):
        MirageRun.from_params({"size": "demo", "epochs": 4})


def test_sizes_fill_what_is_empty_and_explicit_params_win():
    demo = MirageRun.from_params({"size": "demo", "train_count": None, "val_count": None})
    assert (demo.train_count, demo.interval_hours, demo.val_count, demo.shards) == (30, 12, 6, 2)
    assert demo.train_params == {"transformer_policy": ["epochs=4"], "moe_policy": ["epochs=4"]}
    # on the synthetic trace the demo's windows are pinned; with a trace they are the defaults'
    assert (demo.window_from, demo.window_to, demo.val_start) == (
        "2023-01-01T00:00:00+00:00",
        "2023-03-31T00:00:00+00:00",
        "2023-02-11T00:00:00+00:00",
    )
    real = MirageRun.from_params({"size": "demo", "trace": "/data/t.log"})
    assert (real.window_from, real.window_to, real.val_start, real.train_count) == (None, None, None, 30)
    mine = MirageRun.from_params({"size": "demo", "train_count": 8, "val_start": "2023-03-01", "shards": 1})
    assert (mine.train_count, mine.val_start, mine.shards, mine.interval_hours) == (8, "2023-03-01", 1, 12)
    assert MirageRun.from_params({"size": "month"}).train_count == 180
    # a backfill walks months: each run validates the month before its own date, demo-sized
    walk = MirageRun.from_params({"size": "demo"}, backfill=True)
    assert (walk.window_from, walk.window_to, walk.val_start, walk.train_count) == (None, None, None, 30)
    sched = MirageRun.from_params({"size": "demo", "train_count": 5}, scheduled=True)
    assert sched.size == "scheduled" and sched.models == ["xgboost", "random_forest"] and sched.val_count == 12
    # the size picks values; it is not part of what outputs are keyed by
    assert "size" not in demo.key_params()
    assert MirageRun.from_params({"size": "paper"}).key_params() == MirageRun.from_params(DEFAULTS).key_params()


def test_the_sizes_only_set_declared_fields():
    assert list(SIZES) == list(SIZE_NAMES)
    for values in [*SIZES.values(), *SYNTHETIC.values()]:
        MirageRun.from_params(values)  # every value a size sets passes its field's checks
    assert set(SIZED) == {k for v in [*SIZES.values(), *SYNTHETIC.values()] for k in v}


def test_form_renders_every_field_from_its_spec():
    pipeline = form(PIPELINE_FORM)
    assert list(pipeline) == list(FIELDS) and list(pipeline)[0] == "size"
    assert pipeline["size"]["default"] == "demo" and pipeline["size"]["enum"] == list(SIZE_NAMES)
    for name, spec in pipeline.items():
        assert spec["title"] and spec["description"], name
        assert set(spec) >= {"default", "type", "title", "description"}
    assert pipeline["train_count"]["default"] is None and pipeline["train_count"]["type"] == ["null", "integer"]
    assert "demo: 30; month: 180; paper: 684; scheduled: 42" in pipeline["train_count"]["description"]
    assert pipeline["val_start"]["description"].count("Empty:") == 1
    assert pipeline["trace"]["description"].endswith(
        "Empty: a synthetic trace drawn from the synthetic profile "
        "(mirage_pipeline: covering the run's windows; mirage_samples: "
        "the month of the run's day)."
    )
    samples = form(SAMPLES_FORM)
    assert samples["interval_hours"]["default"] == 4 and samples["interval_hours"]["type"] == "number"
    assert "size" not in samples and "Empty: the size" not in json.dumps(samples)
    narrowed = form(["device"], choices={"device": ["cpu"]})
    assert narrowed["device"]["enum"] == ["cpu"] and form(["device"])["device"]["enum"] == ["cpu", "cuda"]


def test_the_form_accepts_what_it_shows():
    """Every default and every size's values fit the rendered JSON schema (what Airflow checks)."""
    import jsonschema

    specs = form(PIPELINE_FORM)
    for name, spec in specs.items():
        schema = {k: v for k, v in spec.items() if k not in ("default", "title", "description")}
        jsonschema.validate(spec["default"], schema)
        for values in [*SIZES.values(), *SYNTHETIC.values()]:
            if name in values:
                jsonschema.validate(values[name], schema)


def test_runconf_imports_stdlib_only():
    code = (
        "import sys; import mirage_tasks.run.runconf\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'pyarrow', 'airflow', 'fsspec', 'stepkit', "
        "'jsonschema') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(st.sampled_from([*FIELDS, "not_a_param"]), json_values, max_size=8), st.booleans(), st.booleans()
)
def test_any_conf_is_a_run_or_a_value_error_naming_a_param(conf, scheduled, backfill):
    """What a trigger form, `--conf` or the REST API can send: the plan gets a typed run or a
    ValueError that names the param (the plan task fails at once with it), never anything else."""
    try:
        run = MirageRun.from_params(conf, scheduled=scheduled, backfill=backfill)
    except ValueError as exc:
        assert "param" in str(exc), exc
        return
    assert isinstance(run, MirageRun) and run.size in SIZES
    assert json.loads(json.dumps(run.as_dict())) == run.as_dict()


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


@pytest.mark.parametrize(
    "conf,name",
    [
        ({"train_count": 10**9}, "train_count"),
        ({"val_count": 10**9}, "val_count"),
        ({"workload_days": 1e6}, "workload_days"),
        ({"probes": 10**6}, "probes"),
        ({"node_sizes": list(range(1, 40))}, "node_sizes"),
        ({"seed": 2**40}, "seed"),
    ],
)
def test_the_pipeline_forms_bound_the_work_a_run_asks_for(conf, name):
    from mirage_tasks.run.runconf import MirageRun

    with pytest.raises(ValueError, match=f"param {name}"):
        MirageRun.from_params(conf)
