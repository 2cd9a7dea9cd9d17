"""Run keys (mirage_tasks.run.plan.run_key) of stored configurations never move: the hashes
below were computed before a field at its default stopped entering the key, and
every run prefix written before must still be found."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mirage_tasks.run.plan import run_key, trace_identity
from mirage_tasks.run.runconf import MirageRun

APRIL = datetime(2023, 4, 1, tzinfo=UTC)
REAL = {"trace": "/data/ls6.log", "trace_timezone": "America/Chicago"}

#: ``name: (params, from_params keywords)``: every size, on the synthetic trace and on a real one,
#: scheduled and backfill runs, and non-default confs (models, an integer, a float, a whole float,
#: train_params, several at once).
CONFS = {
    "demo": ({"size": "demo"}, {}),
    "demo_real": ({"size": "demo", **REAL}, {}),
    "demo_backfill": ({"size": "demo"}, {"backfill": True}),
    "month": ({"size": "month"}, {}),
    "paper": ({"size": "paper"}, {}),
    "paper_real": ({"size": "paper", **REAL}, {}),
    "scheduled": ({}, {"scheduled": True}),
    "models": ({"size": "paper", "models": ["xgboost", "transformer", "transformer_policy"]}, {}),
    "train_count": ({"size": "paper", "train_count": 100}, {}),
    "warmup_float": ({"size": "paper", "warmup_days": 1.5}, {}),
    "interval_whole_float": ({"size": "paper", "interval_hours": 6.0}, {}),
    "interval_frac": ({"size": "month", "interval_hours": 2.5}, {}),
    "train_params": ({"size": "demo", "train_params": {"xgboost": ["n_estimators=50"]}}, {}),
    "mixed": (
        {
            "size": "scheduled",
            "seed": 7,
            "preset": "paper",
            "device": "cuda",
            "policy_eval": "greedy",
            "probe_spacing": "end",
            "node_sizes": [4],
            "val_start": "2023-03-05T00:00:00+00:00",
        },
        {},
    ),
}

#: The run keys of CONFS for the logical date APRIL, computed on the code before the change
#: (paper, paper_real and scheduled are also pinned in tests/dags/test_mirage_plan.py).
PINNED = {
    "demo": "2023-04-01T000000Z-3ce040816b54",
    "demo_real": "2023-04-01T000000Z-a1f4885de3c1",
    "demo_backfill": "2023-04-01T000000Z-cdd3ff4e0d2e",
    "month": "2023-04-01T000000Z-25248c5b24e4",
    "paper": "2023-04-01T000000Z-85d52a42ea4b",
    "paper_real": "2023-04-01T000000Z-6364ef39a127",
    "scheduled": "2023-04-01T000000Z-943569fab9f8",
    "models": "2023-04-01T000000Z-89875ccfd959",
    "train_count": "2023-04-01T000000Z-e54a573d458e",
    "warmup_float": "2023-04-01T000000Z-5c1e0b74b87d",
    "interval_whole_float": "2023-04-01T000000Z-bab5a110fb27",
    "interval_frac": "2023-04-01T000000Z-cf95ad07844c",
    "train_params": "2023-04-01T000000Z-91605425eab5",
    "mixed": "2023-04-01T000000Z-e6e3e36185f0",
}


def key_of(cls, name: str, logical_date=APRIL, **extra) -> str:
    params, kw = CONFS[name]
    run = cls.from_params({**params, **extra}, **kw)
    return run_key(run, logical_date, trace_identity(run, "sha256:aa" if run.trace else None))


@pytest.mark.parametrize("name", sorted(CONFS))
def test_run_keys_of_stored_configurations_are_pinned(name):
    assert key_of(MirageRun, name) == PINNED[name]


def test_a_manual_run_key_is_pinned():
    assert key_of(MirageRun, "demo", None) == "manual-3ce040816b54"


# ----------------------------------------------------------------------------- a field added later


def test_the_key_baseline_is_the_fields_every_stored_key_hashed():
    """The fields when the rule came in, every one but size (a stored key hashed each of them,
    default or not); written here again so that editing the literal fails a test. A field
    added later is in FIELDS, not in the baseline: this test must not change then."""
    from mirage_tasks.run.runconf import FIELDS, KEY_BASELINE

    assert KEY_BASELINE == (
        "trace",
        "window_from",
        "window_to",
        "trace_timezone",
        "synth_profile",
        "cluster_config",
        "train_start",
        "train_count",
        "val_start",
        "val_count",
        "interval_hours",
        "warmup_days",
        "workload_days",
        "probes",
        "probe_spacing",
        "node_sizes",
        "shards",
        "models",
        "preset",
        "train_params",
        "device",
        "policy_eval",
        "seed",
    )
    assert set(KEY_BASELINE) <= set(FIELDS) - {"size"}  # a baseline field removed would move every key
    for params in ({}, {"size": "demo"}, {"size": "scheduled"}):
        assert set(KEY_BASELINE) <= set(MirageRun.from_params(params).key_params())  # at default or not


#: New fields a later change could declare: ``(name, type, default, spec, other values)``.
NEW_FIELDS = {
    "string": ("queue_model", str, "fifo", ("string", {"enum": ["fifo", "backfill"]}), ["backfill"]),
    "number": ("load_scale", float, 1.0, ("number", {"exclusiveMinimum": 0}), [1.5, 2, 2.0]),
    "array": (
        "partitions",
        list,
        ["gpu-a100"],
        ("array", {"items": {"type": "string"}, "minItems": 1}),
        [["gpu-a100", "gpu-h100"]],
    ),
}


def with_field(kind: str):
    """:class:`MirageRun` with one more field, declared as MirageRun declares its own (a
    subclass: ``from_params`` reads and checks the fields of its class), the field's name, its
    default and values that are not its default."""
    import dataclasses

    from mirage_tasks.run import runconf

    name, typ, default, (jtype, schema), others = NEW_FIELDS[kind]
    spec = runconf.Spec(name, f"A {kind} param added after the key baseline.", jtype, schema=schema)
    cls = dataclasses.make_dataclass(
        "NewRun", [(name, typ, runconf._f(default, spec))], bases=(MirageRun,), frozen=True
    )
    return cls, name, default, others


@pytest.mark.parametrize("kind", sorted(NEW_FIELDS))
def test_a_new_field_at_its_default_keeps_every_stored_key(kind):
    cls, name, default, _ = with_field(kind)
    assert getattr(cls.from_params({}), name) == default
    for conf in CONFS:
        assert key_of(cls, conf) == PINNED[conf], conf  # not given: its declared default
        assert key_of(cls, conf, **{name: default}) == PINNED[conf], conf  # given, at the default
    assert key_of(cls, "demo", None) == "manual-3ce040816b54"
    if kind == "number":  # a whole number is typed an int (runconf.canonical_number); still the default 1.0
        assert key_of(cls, "paper", load_scale=1) == PINNED["paper"]
    assert name not in cls.from_params({}).key_params() and name in cls.from_params({}).as_dict()


@pytest.mark.parametrize("kind", sorted(NEW_FIELDS))
def test_a_new_field_off_its_default_gets_a_key_of_its_own(kind):
    cls, name, _, others = with_field(kind)
    for conf in CONFS:
        keys = {key_of(cls, conf, **{name: v}) for v in others}
        assert PINNED[conf] not in keys, conf
    if kind == "number":  # 2 and 2.0 are one value (typed alike), 1.5 another
        assert len({key_of(cls, "paper", load_scale=v) for v in others}) == 2
    assert cls.from_params({name: others[0]}).key_params()[name] == others[0]


def test_a_new_field_at_its_default_plans_the_stored_run(tmp_path):
    """Through the planner (plan_run, as the DAG's plan task calls it): with the new field at its
    default, a run plans the same run prefix as before (its pinned key) and every step's argv
    exactly as before. A step's fingerprint comes from its argv (params and inputs), so each
    step finds the output committed under that prefix with the fingerprint it computes and
    skips (the skip itself: tests/dags/test_mirage_pipeline_e2e.py, a second trigger with the
    same params): nothing stored is recomputed. Set off its default, it plans another prefix
    (and the same shared samples)."""
    from mirage_tasks.run.plan import plan_run

    cls, name, _, others = with_field("string")
    shared, runs = str(tmp_path / "mirage"), str(tmp_path / "mirage_pipeline")
    for conf in ("demo", "paper", "scheduled", "train_params"):
        params, kw = CONFS[conf]
        before = plan_run(MirageRun.from_params(params, **kw), shared, runs, APRIL)
        after = plan_run(cls.from_params(params, **kw), shared, runs, APRIL)
        assert after["prefix"] == before["prefix"] == f"{runs}/{PINNED[conf]}", conf
        assert after.pop("config") == {**before.pop("config"), name: NEW_FIELDS["string"][2]}
        assert after == before, conf
        moved = plan_run(cls.from_params({**params, name: others[0]}, **kw), shared, runs, APRIL)
        assert moved["prefix"] != before["prefix"] and moved["families"] == before["families"]
