"""One typed configuration of a Mirage run: every param of the Mirage DAGs declared once.

:class:`MirageRun` is the run configuration. Each of its fields carries its :class:`Spec`
(JSON type, range or choices, title and a description in the user's words) and its default,
the paper's full configuration (the Mirage seed: 684 training samples every 4 h, a whole
validation month, every model). Three things are derived from it:

* :func:`form`: the Airflow ``Param`` keyword arguments (JSON-schema pieces) of a list of
  fields: ``mirage_pipeline`` and ``mirage_samples`` build their trigger forms from it
  (``Param(**spec)``), so a param shared by the two cannot drift;
* :meth:`MirageRun.from_params`: a form's values (or any conf dict) checked and typed, with
  a ``ValueError`` naming the param on a bad value and unknown keys refused; the plan
  (:mod:`mirage_tasks.run.plan`) reads only this. The check is ``jsonschema`` against
  :func:`run_schema`, whose properties are each field's :func:`field_schema`, the very dict
  its form ``Param`` is built from (so the form and the check cannot drift either), plus the
  few things a JSON schema of the form does not say (:func:`_beyond_schema`: ISO times,
  train_params' shape; ``_check_models``: a policy's base model); only the typing step is
  by hand;
* :data:`SIZES`: what each ``size`` of a run changes in the defaults. A field a size sets
  shows empty (null) in the pipeline's form; left empty it takes the size's value, set it
  and it wins.

Run keys. A run's own outputs live under a prefix keyed by a hash of
:meth:`MirageRun.key_params` (:func:`mirage_tasks.run.plan.run_key`), so the key must not move
when nothing a run computes has changed. The fields of :data:`KEY_BASELINE` (every field but
``size`` when this rule was introduced) hash as they always did, at their default or not;
a field declared after them enters the key only when its value is not its declared default,
so adding a param (at a default that changes nothing) keeps every stored run's prefix.

Numbers in storage keys (the int/float history): the keys hash JSON, where ``4`` and ``4.0``
differ, and both spellings are history that committed outputs depend on; it is handled and
written down in one place, :func:`canonical_number`, which types every number a run reads.

Stdlib only at import (the DAG files import it at parse time): the model registry and the
probe spacings it names are stdlib-only modules too, and ``jsonschema`` is imported only when
values are checked (on an Airflow worker: an Airflow dependency, and in requirements.txt).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..data.times import parse_iso
from ..models.registry import KINDS, POLICIES
from ..sim.probes import PROBE_SPACINGS


@dataclass(frozen=True)
class Spec:
    """How one field is shown and checked. ``type``: the JSON type of a value (``string``,
    ``integer``, ``number``, ``array``, ``object``); ``nullable``: None (an empty form field)
    has a meaning of its own, written in ``description``; ``iso``: an ISO 8601 time;
    ``schema``: further JSON-schema keywords (minimum, maximum, enum, items, ...);
    ``empty``: what None means, for a nullable field (shown as "Empty: ..."); ``none``: the
    same in a few words, for the size table of the pipeline's form."""

    title: str
    description: str
    type: str
    nullable: bool = False
    iso: bool = False
    schema: Mapping[str, Any] = field(default_factory=dict)
    empty: str = ""
    none: str = "none"


def _f(default: Any, spec: Spec) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: json.loads(json.dumps(default)), metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


_ISO = "ISO 8601, e.g. 2023-03-01T00:00:00+00:00; UTC when it has no offset"

#: The model presets of ``train --preset`` (mirage_tasks.models.presets, which imports more than
#: the stdlib; a test checks they agree).
MODEL_PRESETS = ("quick", "paper")
#: The sizes a run can have, in the form's order; ``scheduled`` is what a scheduled run uses.
SIZE_NAMES = ("demo", "month", "paper", "scheduled")
#: The form's size: submitting the form unchanged finishes in minutes.
FORM_SIZE = "demo"


@dataclass(frozen=True)
class MirageRun:
    """Every param of a Mirage run, typed; the defaults are the paper's full configuration."""

    size: str = _f(
        "paper",
        Spec(
            "Run size",
            "How big the run is; every param left empty takes the size's value, a param you set wins. "
            "demo (minutes): 30 training samples 12 h apart, 6 validation samples, node sizes 1 and 8, 2 shards, "
            "short policy training; on the synthetic trace it always validates from 2023-02-11, whatever the "
            "logical date. month: the whole month before the logical date validated (156 samples in March at 4 h) "
            "on models trained on the 180 samples (30 days) before it: the paper's validation with about a quarter "
            "of its training samples. paper: the Mirage paper's configuration: 684 training samples every 4 h "
            "(114 days), the whole month before the logical date, every model. scheduled: what the DAG's own "
            "monthly runs use: 42 training samples (a week), 12 validation samples, xgboost and random_forest, "
            "one shard.",
            "string",
            schema={
                "enum": list(SIZE_NAMES),
                "values_display": {
                    "demo": "demo (minutes)",
                    "month": "month (a month validated, 180 training samples)",
                    "paper": "paper (the full experiment)",
                    "scheduled": "scheduled (the monthly schedule's)",
                },
            },
        ),
    )
    trace: str | None = _f(
        None,
        Spec(
            "Trace URI",
            "The Slurm trace to replay: a sacct log (sacct --parsable2, gzipped or not) or an SWF log, as a local "
            "path, file:// or s3:// URI.",
            "string",
            nullable=True,
            empty="a synthetic trace drawn from the synthetic profile (mirage_pipeline: "
            "covering the run's windows; mirage_samples: the month of the run's day)",
        ),
    )
    window_from: str | None = _f(
        None,
        Spec(
            "Trace window start",
            f"Keep only the jobs submitted from this time on ({_ISO}): trims a real trace; on the synthetic "
            "trace, where the generated trace starts.",
            "string",
            nullable=True,
            iso=True,
            empty="the whole trace (synthetic: what the windows need)",
            none="whole trace",
        ),
    )
    window_to: str | None = _f(
        None,
        Spec(
            "Trace window end",
            f"... and submitted before this time (exclusive; {_ISO}).",
            "string",
            nullable=True,
            iso=True,
            empty="to the end of the trace (synthetic: what the windows need)",
            none="whole trace",
        ),
    )
    trace_timezone: str | None = _f(
        None,
        Spec(
            "Trace time zone",
            "IANA time zone of a sacct log's local times, e.g. America/Chicago for Lonestar6. SWF logs carry "
            "their own.",
            "string",
            nullable=True,
            empty="UTC",
        ),
    )
    synth_profile: str = _f(
        "ls6-a100",
        Spec(
            "Synthetic profile",
            "The workload the synthetic trace is drawn from, used only when no trace is given: a packaged profile "
            "(ls6-a100: fitted on Lonestar6's A100 partition) or the URI of a profile JSON.",
            "string",
            schema={"minLength": 1},
        ),
    )
    cluster_config: str = _f(
        "ls6",
        Spec(
            "Simulator configuration",
            "The simulated cluster and scheduler: a preset (ls6: Lonestar6, 78 nodes, its recorded priorities; "
            "reference: the Mirage paper's simulator, 88 nodes) or the URI of a JSON file of simulator settings.",
            "string",
            schema={"minLength": 1},
        ),
    )
    train_start: str | None = _f(
        None,
        Spec(
            "First training sample",
            f"Start of the first training sample ({_ISO}).",
            "string",
            nullable=True,
            iso=True,
            empty="as late as possible, so the last training sample's workload ends where validation starts",
            none="as late as possible",
        ),
    )
    train_count: int = _f(
        684,
        Spec(
            "Training samples",
            "How many training samples, one every 'Hours between samples': each is one simulated workload with "
            "a service job and its probes (decision times), and gives one training example per probe. More "
            "samples: better models and proportionally longer sampling; 30 (a demo) to 684 (the paper: 114 days "
            "at 4 h) is sensible; at most 100000.",
            "integer",
            schema={"minimum": 1, "maximum": 100_000},
        ),
    )
    val_start: str | None = _f(
        None,
        Spec(
            "First validation sample",
            f"Start of the first validation sample ({_ISO}).",
            "string",
            nullable=True,
            iso=True,
            empty="the first day of the month before the run's logical date, so "
            "a monthly backfill validates each month in turn",
            none="the month before the logical date",
        ),
    )
    val_count: int | None = _f(
        None,
        Spec(
            "Validation samples",
            "How many validation samples (one every 'Hours between samples'), on each of which every model "
            "decides online when to submit, against the reactive and avg baselines.",
            "integer",
            nullable=True,
            schema={"minimum": 1, "maximum": 100_000},
            empty="the whole validation month: every sample whose workload ends inside it (156 for March at 4 h)",
            none="whole month",
        ),
    )
    interval_hours: float = _f(
        4,
        Spec(
            "Hours between samples",
            "Hours between the starts of consecutive samples, training and validation alike. Keep it a divisor "
            "of 24 (1, 2, 3, 4, 6, 8, 12 or 24) so runs share mirage_samples' day partitions.",
            "number",
            schema={"exclusiveMinimum": 0, "maximum": 24},
        ),
    )
    warmup_days: float = _f(
        2,
        Spec(
            "Warm-up days",
            "Days of the trace replayed in each sample before its service job is submitted, so the simulated "
            "queue is realistic when the job arrives. 2 (the paper's); 1 to 3 is sensible; at most 60.",
            "number",
            schema={"minimum": 0, "maximum": 60},
        ),
    )
    workload_days: float = _f(
        5,
        Spec(
            "Workload days per sample",
            "Days of trace jobs each sample replays (from its start), which the service jobs compete with. Also "
            "the gap between training and validation, so no training workload reaches into validation. 5 (the "
            "paper's); at most 60.",
            "number",
            schema={"exclusiveMinimum": 0, "maximum": 60},
        ),
    )
    probes: int = _f(
        7,
        Spec(
            "Probes per training sample",
            "Decision times per training sample with uniform probe spacing, equally spaced from the first service "
            "job's submission to its end; each gives one training example (wait, or submit the next job now). "
            "7 (the paper's); at most 1000.",
            "integer",
            schema={"minimum": 2, "maximum": 1000},
        ),
    )
    probe_spacing: str = _f(
        "uniform",
        Spec(
            "Probe spacing",
            "uniform: probes equally spaced from the first service job's submission to its end (the paper's); "
            "end: at its end minus 24 h, 16 h, 8 h, 4 h, 2 h, 1 h, 30 min and 10 min, and at its end (probes not "
            "used).",
            "string",
            schema={"enum": list(PROBE_SPACINGS)},
        ),
    )
    node_sizes: list[int] = _f(
        [1, 8],
        Spec(
            "Service job sizes (nodes)",
            "Node counts of the service jobs studied; each size gets its own samples, dataset, models and "
            "validation. 1 and 8 (the paper's).",
            "array",
            schema={"items": {"type": "integer", "minimum": 1, "maximum": 100_000}, "minItems": 1, "maxItems": 16},
        ),
    )
    shards: int = _f(
        4,
        Spec(
            "Shards per node size",
            "Parallel tasks per node size: the sample days still missing are split into up to this many tasks, "
            "and each model's validation into this many. More shards: more tasks at once (one CPU each locally); "
            "1 to 16 is sensible.",
            "integer",
            schema={"minimum": 1, "maximum": 64},
        ),
    )
    models: list[str] = _f(
        list(KINDS),
        Spec(
            "Models",
            "Model families to train and validate (one per node size). transformer_policy and moe_policy need "
            "transformer and moe. The reactive and avg baselines are always validated.",
            "array",
            schema={"items": {"type": "string", "enum": list(KINDS)}, "examples": list(KINDS), "minItems": 1},
        ),
    )
    preset: str = _f(
        "quick",
        Spec(
            "Training preset",
            "Hyper-parameters of every model: quick (small networks; minutes per model on 2 CPU cores) or paper "
            "(the paper's sizes, 300 epochs: meant for a GPU).",
            "string",
            schema={"enum": list(MODEL_PRESETS)},
        ),
    )
    train_params: dict[str, list[str]] = _f(
        {},
        Spec(
            "Hyper-parameter overrides",
            'Per model, a list of "key=value" overriding the preset (train --param), e.g. '
            '{"transformer": ["epochs=10"]}.',
            "object",
        ),
    )
    device: str = _f(
        "cpu",
        Spec(
            "Training device",
            "cuda trains the torch models (transformer, moe and their policies) on a GPU (the gpu preset, the gpu "
            "pool in kubernetes mode); offered where the deployment has GPU nodes (HOUSE_GPUS=true).",
            "string",
            schema={"enum": ["cpu", "cuda"]},
        ),
    )
    policy_eval: str = _f(
        "sampled",
        Spec(
            "Policy evaluation",
            "How the policies decide in validation: sampled (seeded sampling of their actions, as they were "
            "trained) or greedy (the most likely action).",
            "string",
            schema={"enum": ["sampled", "greedy"]},
        ),
    )
    seed: int = _f(
        0,
        Spec(
            "Seed",
            "Seeds the synthetic trace, the models' training and the policies' sampled decisions: the same seed "
            "gives the same run.",
            "integer",
            schema={"minimum": 0, "maximum": 2**32 - 1},
        ),
    )

    # ------------------------------------------------------------------ reading a form

    @classmethod
    def from_params(cls, params: Mapping[str, Any], *, scheduled: bool = False, backfill: bool = False) -> MirageRun:
        """The run a form's (or conf's) values ask for. ``size`` picks the defaults (a conf
        without one gets ``paper``: every default as written above; ``scheduled=True``, a
        scheduled run, gets ``scheduled``); every other param that is set (not None or "")
        wins over the size's value. ``backfill=True``: a backfill's run, which validates the
        month before its own logical date, so the fixed windows a size pins on the synthetic
        trace (:data:`SYNTHETIC`, demo's) do not apply (else every month of a backfill would
        validate the same days). A ``ValueError`` names the param of a bad value, and unknown
        params are refused."""
        specs = field_specs(cls)
        unknown = sorted(set(params) - set(specs))
        if unknown:
            raise ValueError(f"unknown param(s) {', '.join(unknown)}; known: {', '.join(specs)}")
        size = "scheduled" if scheduled else (params.get("size") or "paper")
        if not isinstance(size, str) or size not in SIZES:
            raise ValueError(f"param size: {size!r} is not one of {', '.join(SIZE_NAMES)}")
        given = {k: v for k, v in params.items() if k != "size" and not _empty(v)}
        values = {**declared_defaults(cls), **SIZES[size]}
        if _empty(given.get("trace")) and not backfill:
            values.update(SYNTHETIC.get(size, {}))
        values.update(given)
        values["size"] = size
        run = cls(**_checked(cls, values))
        run._check_models()
        return run

    def _check_models(self) -> None:
        need = [m for m in self.models if m in POLICIES and POLICIES[m] not in self.models]
        if need:
            raise ValueError(f"param models: {need} need their base model(s) {[POLICIES[m] for m in need]}")
        odd = sorted(set(self.train_params) - set(KINDS))
        if odd:
            raise ValueError(f"param train_params: unknown model(s) {odd}; choose from {list(KINDS)}")

    def as_dict(self) -> dict[str, Any]:
        """Every field, JSON-able (the resolved configuration a run records)."""
        return {f.name: json.loads(json.dumps(getattr(self, f.name))) for f in dataclasses.fields(self)}

    def key_params(self) -> dict[str, Any]:
        """What a run's outputs depend on, as :func:`mirage_tasks.run.plan.run_key` hashes it
        (JSON values, as :meth:`as_dict`). Never ``size``, which only picks values (a paper run
        and a conf spelling out the same values share their outputs). Every field of
        :data:`KEY_BASELINE` (the fields that existed when this rule came in), at its default or
        not, exactly as keys have always hashed it, so no stored run's key changes. A field
        declared later only when its value differs from its declared default: adding a field
        (at a default that computes what runs computed before) leaves every key as it was, and
        only a run that sets it (or a size that sets it: :data:`SIZES`) gets a key of its own.
        (A baseline field can never be dropped at its default: that would move every key.)"""
        declared = declared_defaults(type(self))
        return {
            name: value
            for name, value in self.as_dict().items()
            if name != "size" and (name in KEY_BASELINE or value != declared[name])
        }

    def replace(self, **changes: Any) -> MirageRun:
        return dataclasses.replace(self, **_checked(type(self), changes))


def input_params(run: MirageRun) -> dict[str, str]:
    """The params of ``run`` a step opens as a path or URI: ``trace``, and ``synth_profile`` and
    ``cluster_config`` unless they name a packaged profile or a simulator preset. What a plan
    checks against the allowed roots (``stepkit.reach.check_params``) before reading anything."""
    from ..data.profiles import PACKAGED  # importlib.resources; the plan's, not the DAG parse's
    from ..sim.config import PRESETS

    out = {"trace": run.trace} if run.trace else {}
    if run.synth_profile not in PACKAGED:
        out["synth_profile"] = run.synth_profile
    if run.cluster_config not in PRESETS:
        out["cluster_config"] = run.cluster_config
    return out


def field_specs(cls: type) -> dict[str, Spec]:
    """``{field: Spec}`` of a run class (:data:`FIELDS` for :class:`MirageRun`); what
    :meth:`MirageRun.from_params` checks against, so a subclass declaring one more field (the
    tests of a field added after :data:`KEY_BASELINE`) reads and checks it like any other."""
    return {f.name: f.metadata["spec"] for f in dataclasses.fields(cls)}


def declared_defaults(cls: type) -> dict[str, Any]:
    """``{field: declared default}`` of a run class (JSON values, as :meth:`MirageRun.as_dict`):
    what :meth:`MirageRun.key_params` compares a field outside :data:`KEY_BASELINE` with. Read
    from the class itself, so a subclass that declares one more field (tests) has its own."""
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = json.loads(json.dumps(value))
    return out


FIELDS: dict[str, Spec] = field_specs(MirageRun)
DEFAULTS: dict[str, Any] = {k: v for k, v in MirageRun().as_dict().items() if k != "size"}

#: The key baseline: the fields of :class:`MirageRun` (every one but ``size``) when a field at
#: its default stopped entering the run key. Every run key stored before then
#: hashed all of these, default or not, so :meth:`MirageRun.key_params` keeps hashing them that
#: way (the keys of every existing configuration stay byte-identical; tests/mirage/test_run_keys.py
#: pins them). A field declared after these enters the key only when it is not at its declared
#: default. A frozen literal on purpose: never add a name here (every key would move), never
#: derive it from the class.
KEY_BASELINE: tuple[str, ...] = (
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

#: What each size changes in the defaults (the paper's configuration).
SIZES: dict[str, dict[str, Any]] = {
    # the Makefile's former DEMO_CONF: minutes on 2 cores, every step, both node sizes
    "demo": {
        "train_count": 30,
        "interval_hours": 12,
        "val_count": 6,
        "shards": 2,
        "train_params": {"transformer_policy": ["epochs=4"], "moe_policy": ["epochs=4"]},
    },
    # a month validated (as the paper's) on the month of samples before it
    "month": {"train_count": 180},
    "paper": {},
    # the DAG's own monthly runs: one week of training, two days of validation, the tree models
    "scheduled": {"train_count": 42, "val_count": 12, "shards": 1, "models": ["xgboost", "random_forest"]},
}
#: What a size pins on the synthetic trace (no ``trace``): the demo's windows are fixed, so its
#: run means the same whatever the logical date. The synthetic trace of Jan-Mar 2023 (seed 0)
#: has the 6 samples from 2023-02-11 at mixed load levels on both node sizes (node 1: medium,
#: low, heavy, medium, medium, low; node 8: M M H M M L), so the models differ.
SYNTHETIC: dict[str, dict[str, Any]] = {
    "demo": {
        "window_from": "2023-01-01T00:00:00+00:00",
        "window_to": "2023-03-31T00:00:00+00:00",
        "val_start": "2023-02-11T00:00:00+00:00",
    },
}
#: The fields a size sets: empty in the pipeline's form (null: the size's value).
SIZED: tuple[str, ...] = tuple(n for n in FIELDS if any(n in v for v in [*SIZES.values(), *SYNTHETIC.values()]))

#: The params that name a sample family (mirage_samples' form; a pipeline run reads
#: mirage_samples' partitions only when these agree).
FAMILY_PARAMS = (
    "trace",
    "trace_timezone",
    "synth_profile",
    "cluster_config",
    "interval_hours",
    "warmup_days",
    "workload_days",
    "probes",
    "probe_spacing",
    "node_sizes",
    "seed",
)
#: The forms of the two DAGs, in order.
PIPELINE_FORM: tuple[str, ...] = tuple(FIELDS)
SAMPLES_FORM: tuple[str, ...] = FAMILY_PARAMS


# ----------------------------------------------------------------------------- checking values


def field_schema(spec: Spec, *, nullable: bool | None = None) -> dict[str, Any]:
    """The JSON Schema of one field's value: its JSON type (with ``null`` where None has a
    meaning: ``nullable``, default the spec's) and the spec's keywords (minimum, maximum, enum,
    items, ...; a fresh copy). The one source of both the trigger form (:func:`form` builds each
    ``Param`` from it) and the check of a run's values (:func:`run_schema`), so the two cannot
    drift. Annotations the form shows (``values_display``, ``examples``) ride along; a validator
    ignores them."""
    nullable = spec.nullable if nullable is None else nullable
    return {"type": ["null", spec.type] if nullable else spec.type, **json.loads(json.dumps(dict(spec.schema)))}


def run_schema(cls: type | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a run class's resolved values, ``{field: value}``
    (:class:`MirageRun` by default; a subclass with one more field has its own): each property
    is the field's :func:`field_schema`, exactly what the form's ``Param`` is built from. Built
    from the specs on each call, so a changed spec moves the form and the check together."""
    specs = field_specs(cls or MirageRun)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {name: field_schema(spec) for name, spec in specs.items()},
    }


@functools.cache
def _validator_class() -> Any:
    """Draft 2020-12 with JSON's own reading of Python values: a ``number`` is finite (JSON has
    no NaN or Infinity), an ``array`` is a list or a tuple, an ``object`` any mapping (what
    ``json.dumps`` writes as such). jsonschema is imported here, not at module import: the DAG
    files import this module at parse time, stdlib only; the values are checked on an Airflow
    worker, which has jsonschema (an Airflow dependency, and in requirements.txt)."""
    from jsonschema import Draft202012Validator, validators

    base = Draft202012Validator.TYPE_CHECKER
    checker = base.redefine_many(
        {
            "number": lambda c, v: base.is_type(v, "number") and not (isinstance(v, float) and not math.isfinite(v)),
            "array": lambda c, v: isinstance(v, (list, tuple)),
            "object": lambda c, v: isinstance(v, Mapping),
        }
    )
    return validators.extend(Draft202012Validator, type_checker=checker)


_WORDS = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "array": "a list",
    "object": "an object",
    "boolean": "true or false",
}


def _why(error: Any) -> str:
    """What a jsonschema error asks of the value, in the form's words."""
    kw, want, got = error.validator, error.validator_value, error.instance
    if kw == "type":
        types = [want] if isinstance(want, str) else list(want)
        if got is None:
            return "is required"
        return (
            "must be "
            + " or ".join(_WORDS.get(t, t) for t in types if t != "null")
            + (" or empty" if "null" in types else "")
        )
    words = {
        "minimum": "must be at least {}",
        "maximum": "must be at most {}",
        "exclusiveMinimum": "must be more than {}",
        "exclusiveMaximum": "must be less than {}",
        "minItems": "must be a list of at least {} item(s)",
        "maxItems": "must be a list of at most {} item(s)",
        "minLength": "must be at least {} character(s) long",
        "maxLength": "must be at most {} character(s) long",
        "pattern": "must match the pattern {!r}",
    }
    if kw == "enum":
        return f"unknown {got!r}; choose from {', '.join(map(str, want))}"
    return words[kw].format(want) if kw in words else error.message


def _message(error: Any) -> str:
    """``param <name>: <why> (got <value>)``; inside a list or mapping, where (``item 0``)."""
    name, *inner = list(error.absolute_path) or ["(the run)"]
    where = ", ".join(f"item {p}" if isinstance(p, int) else f"key {p!r}" for p in inner)
    if error.validator == "enum":
        return f"param {name}: {_why(error)}" + (f" ({where})" if where else "")
    return f"param {name}: {_why(error)} (got {error.instance!r}{', ' + where if where else ''})"


def _validate(cls: type, values: Mapping[str, Any]) -> None:
    """``values`` checked against :func:`run_schema` of ``cls``: every error, in the fields'
    order, in one ``ValueError`` naming each param."""
    order = {name: i for i, name in enumerate(field_specs(cls))}

    def key(e: Any) -> tuple:
        path = list(e.absolute_path)
        inner = [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in path[1:]]
        return (order.get(path[0], -1) if path else -1, inner, e.validator != "type", e.validator)

    errors = sorted(_validator_class()(run_schema(cls)).iter_errors(dict(values)), key=key)
    if errors:
        raise ValueError("; ".join(dict.fromkeys(_message(e) for e in errors)))


def canonical_number(value: int | float) -> int | float:
    """A JSON number (already checked) as run keys have always hashed it: a whole value as an
    int (``4``, never ``4.0``), any other as a float. The int/float history, written here only:
    a run key hashes the JSON of :meth:`MirageRun.key_params`, where ``4`` and ``4.0`` differ,
    and every stored run's key was computed with whole numbers as ints (what the form has
    always sent), also for a ``number`` field annotated ``float`` (``interval_hours``, ...). So
    every number a run reads (``integer`` and ``number`` fields, and list items) is typed here;
    changing it would move the keys of existing configurations (tests/mirage/test_run_keys.py
    pins them) and orphan their outputs. (A sample family key hashes the same params as floats,
    the other spelling: :func:`mirage_tasks.data.keys.sample_family`.)"""
    if isinstance(value, int):
        return value
    return int(value) if value.is_integer() else float(value)


def _beyond_schema(name: str, value: Any, spec: Spec) -> None:
    """What a value must be that the form's schema does not say (so the form lets it through
    and the run refuses it, naming the param): an ISO 8601 time, and an object field's shape
    (train_params: each model to a list of "key=value")."""
    if value is None:
        return
    if spec.iso:
        parse_iso(value, f"param {name}")  # ValueError naming the param; the text is kept as given
    if spec.type == "object" and not all(
        isinstance(v, (list, tuple)) and all(isinstance(x, str) and "=" in x for x in v) for v in value.values()
    ):
        raise ValueError(f'param {name}: must map each model to a list of "key=value" (got {value!r})')


def _typed(value: Any, spec: Spec) -> Any:
    """A checked JSON value as the field's Python type: the typing step, all that is done by hand."""
    if value is None:
        return None
    if spec.type in ("integer", "number"):
        return canonical_number(value)
    if spec.type == "array":
        numbers = spec.schema.get("items", {}).get("type") in ("integer", "number")
        return [canonical_number(v) if numbers else v for v in value]
    if spec.type == "object":
        return {str(k): list(v) for k, v in value.items()}
    return value


def _checked(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (``{field: value}``) of a run class validated (:func:`run_schema`, then
    :func:`_beyond_schema`) and typed (:func:`_typed`). An empty value (None or "") of a
    nullable field is None."""
    specs = field_specs(cls)
    values = {k: None if _empty(v) and specs[k].nullable else v for k, v in values.items()}
    _validate(cls, values)
    for name, value in values.items():
        _beyond_schema(name, value, specs[name])
    return {name: _typed(value, specs[name]) for name, value in values.items()}


def _empty(value: Any) -> bool:
    return value is None or value == ""


# ----------------------------------------------------------------------------- the trigger form


def _show(value: Any, spec: Spec) -> str:
    if value is None:
        return spec.none
    if value == list(KINDS):
        return "every model"
    if value in ({}, []):
        return "none"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def size_note(name: str) -> str:
    """What an empty field takes, size by size (the pipeline's form), sizes of one value together."""
    spec = FIELDS[name]
    shown: dict[str, list[str]] = {}
    for size in SIZE_NAMES:
        text = _show(SIZES[size].get(name, DEFAULTS[name]), spec)
        synth = SYNTHETIC.get(size, {}).get(name)
        if synth is not None:
            text = f"{_show(synth, spec)} on the synthetic trace, else {text}"
        shown.setdefault(text, []).append(size)
    parts = [f"{', '.join(sizes[:-1])} and {sizes[-1]}" if len(sizes) > 1 else sizes[0] for sizes in shown.values()]
    return "Empty: the size's value (" + "; ".join(f"{p}: {t}" for p, t in zip(parts, shown)) + ")."


def form(names: Sequence[str], choices: Mapping[str, Sequence[Any]] | None = None) -> dict[str, dict[str, Any]]:
    """``{name: Param kwargs}`` of ``names`` (``Param(**spec)``): default, JSON type, range or
    choices, title and description. With ``size`` among ``names`` (the pipeline) the fields a
    size sets default to empty (null: the size's value); without it (mirage_samples) every
    field shows its default. ``choices``: narrower enums (``device`` where there is no GPU)."""
    sized = "size" in names
    out = {}
    for name in names:
        spec = FIELDS[name]
        sized_here = sized and name in SIZED
        schema = field_schema(spec, nullable=spec.nullable or sized_here)
        if choices and name in choices:
            schema["enum"] = list(choices[name])
            if "values_display" in schema:
                schema["values_display"] = {k: v for k, v in schema["values_display"].items() if k in schema["enum"]}
        default = FORM_SIZE if name == "size" else DEFAULTS[name]
        if sized_here:
            default = None
            description = f"{spec.description} {size_note(name)}"
        else:
            description = f"{spec.description} Empty: {spec.empty}." if spec.nullable else spec.description
        out[name] = {
            "default": default,
            "type": schema.pop("type"),
            "title": spec.title,
            "description": description,
            **schema,
        }
    return out


def class_form(
    cls: type, defaults: Mapping[str, Any] | None = None, choices: Mapping[str, Sequence[Any]] | None = None
) -> dict[str, dict[str, Any]]:
    """``{name: Param kwargs}`` of every field of a typed configuration without sizes (the
    ``mirage_service`` and ``mirage_evaluation`` forms, :mod:`mirage_tasks.run.forms`), in the
    class's order: each field's :func:`field_schema`, its declared default (or ``defaults``'s:
    the deployment's own, e.g. the slurm.conf a pod mounts), title and description ("Empty: ..."
    appended for a nullable field). ``choices``: narrower enums."""
    out = {}
    declared = declared_defaults(cls)
    for name, spec in field_specs(cls).items():
        schema = field_schema(spec)
        if choices and name in choices:
            schema["enum"] = list(choices[name])
        description = f"{spec.description} Empty: {spec.empty}." if spec.nullable else spec.description
        out[name] = {
            "default": (defaults or {}).get(name, declared[name]),
            "type": schema.pop("type"),
            "title": spec.title,
            "description": description,
            **schema,
        }
    return out
