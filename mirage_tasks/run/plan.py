"""The command lines of one ``mirage_pipeline`` run, computed from its params (no I/O).

The params are read once, by :meth:`mirage_tasks.run.runconf.MirageRun.from_params` (typed,
checked, the run size's values filled in), in the DAG's task; every function here takes
that :class:`~mirage_tasks.run.runconf.MirageRun`, and every storage key comes from
:mod:`mirage_tasks.data.keys`, which the steps that derive keys call too.

A flag and its default are written once, in the step's own ``add_arguments``. :func:`argv` builds a command line from a step name and keyword
values (the parser's destinations), looking up each flag in that step's parser; a value
the plan does not set is left to the step's default. Stdlib only at import (the DAG's
``plan`` task imports it inside the task, never at parse time); the step parsers are
built on first use (their modules import numpy and torch only inside ``run``).

Windows (all UTC):

* **validation**: ``val_start`` (default: the month before the run's logical date, so a
  monthly backfill validates each month in turn) for ``val_count`` samples (default: every
  sample of that month whose workload ends inside it: 156 for March at 4 h, as the seed);
* **training**: ``train_count`` samples ending before validation with a gap of
  ``workload_days`` (no training workload reaches into validation), starting at
  ``train_start`` (default: as late as that allows).
* **synthetic trace** (no ``trace`` given): generated to cover both windows plus the
  warm-up history.

Storage is keyed by what each artefact depends on (``<root>`` is the house storage root;
the keys are built by :mod:`mirage_tasks.data.keys`):

* ``<root>/mirage/traces/<key>/``: the ingested trace, once per (trace content
  fingerprint, time zone, window) (:func:`trace_location`);
* ``<root>/mirage/samples/node<N>-<key>/day=YYYY-MM-DD/``: the training samples whose start
  falls on that UTC day, once per (trace location, simulator configuration, sampling
  parameters, sample grid, node size, mode) (:func:`sample_family`); each partition records
  the digest of the trace rows its samples see (:mod:`mirage_tasks.data.prefixes`), so a trace
  that grows in place keeps its earlier days; a run samples only the days without a valid
  committed partition (:func:`sample_argvs`), mapped over up to ``shards`` tasks, and
  ``merge --trace`` joins the days of its window, checking each against the trace;
* ``<root>/mirage_pipeline/<logical date>-<key>/``: datasets, models, validation, metrics
  and report of one configuration (params, windows, trace) (:func:`run_key`): a second run
  with the same params reuses it and every step skips; a run with other params (a manual
  run beside a backfill of the same date) never writes beside it. A param added to
  :class:`~mirage_tasks.run.runconf.MirageRun` later enters the key only when a run sets it
  off its default, so adding one keeps every stored prefix
  (:meth:`~mirage_tasks.run.runconf.MirageRun.key_params`).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import math
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..data import keys
from ..data.keys import digest, partition, trace_location  # the DAGs and tests use them from here
from ..data.times import iso as _iso, parse_iso
from ..models.registry import FAMILIES, POLICIES
from ..sim.probes import BASELINES
from .runconf import FAMILY_PARAMS, MirageRun


def _ts(value: str | None, name: str) -> datetime | None:
    return parse_iso(value, f"param {name}")


def _typed(run: Any) -> None:
    if not isinstance(run, MirageRun):  # a params dict: read it once, where the DAG task has it
        raise TypeError(f"expected a MirageRun (MirageRun.from_params(params)), got {type(run).__name__}")


# ----------------------------------------------------------------------------- argv from the step parsers


@functools.cache
def step_parser(step: str) -> argparse.ArgumentParser:
    """The parser of ``python -m mirage_tasks <step>`` (its module's ``add_arguments``)."""
    from ..__main__ import STEPS

    if step not in STEPS:
        raise ValueError(f"unknown mirage_tasks step {step!r}; known: {', '.join(STEPS)}")
    module, helptext = STEPS[step]
    parser = argparse.ArgumentParser(prog=f"python -m mirage_tasks {step}", description=helptext)
    from stepkit.cli import add_contract_arguments  # the flags every step takes

    add_contract_arguments(parser)
    importlib.import_module(module).add_arguments(parser)
    return parser


def _flag(action: argparse.Action) -> str:
    return next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])


def _text(value: Any) -> str:
    return _iso(value) if isinstance(value, datetime) else str(value)


def argv(step: str, **values: Any) -> list[str]:
    """``[step, --flag value, ...]`` for ``python -m mirage_tasks <step>``.

    Each keyword is a destination of the step's parser (``trace``, ``interval_hours``,
    ``inputs`` for ``--in``, ...). ``None`` and ``False`` leave the flag out (the step's
    default applies); ``True`` gives a bare switch; a list gives the values after one flag
    (``nargs``) or the flag repeated (``action="append"``). An unknown keyword is a
    ``ValueError``: the plan and the step disagree.
    """
    actions = {a.dest: a for a in step_parser(step)._actions if a.option_strings}
    out = [step]
    for dest, value in values.items():
        if dest not in actions:
            raise ValueError(f"mirage_tasks {step} has no option for {dest!r}")
        action = actions[dest]
        flag = _flag(action)
        if value is None or value is False:
            continue
        if value is True and action.nargs == 0:
            out.append(flag)
        elif isinstance(action, argparse._AppendAction):
            for item in value:
                out += [flag, _text(item)]
        elif action.nargs in ("+", "*"):
            out += [flag, *(_text(v) for v in value)]
        else:
            out += [flag, _text(value)]
    return out


def step_label(
    *, model: str | None = None, node: int | None = None, days: list[str] | None = None, shard: str | None = None
) -> str:
    """The label of one mapped step instance (the DAGs' ``map_index_template`` shows it in the
    grid), from the values its argv is built from: model, node size, days, shard, e.g.
    ``xgboost · node 8``, ``node 1 · 1997-01-03..1997-01-09 (7 d)``, ``avg · node 8 · shard 1/2``."""
    span = (f"{days[0]}..{days[-1]} ({len(days)} d)" if len(days) > 1 else days[0]) if days else None
    parts = [model, f"node {node}" if node is not None else None, span, f"shard {shard}" if shard is not None else None]
    return LABEL_SEP.join(p for p in parts if p)


#: Between the parts of a :func:`step_label`.
LABEL_SEP = " · "


# ----------------------------------------------------------------------------- windows


def _month_before(t: datetime) -> tuple[datetime, datetime]:
    end = t.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = (end - timedelta(days=1)).replace(day=1)
    return start, end


def windows(run: MirageRun, logical_date: datetime | None) -> dict[str, Any]:
    """Training and validation windows (sample starts and counts)."""
    step = timedelta(hours=run.interval_hours)
    workload = timedelta(days=run.workload_days)
    if logical_date is not None:  # Airflow hands a pendulum DateTime: use plain datetime arithmetic
        logical_date = datetime.fromtimestamp(logical_date.timestamp(), tz=UTC)
    val_start = _ts(run.val_start, "val_start")
    val_count = run.val_count
    if val_start is None:
        if logical_date is None:
            raise ValueError("val_start is required when the run has no logical date")
        val_start, month_end = _month_before(logical_date)
        if not val_count:  # every sample whose workload ends inside the month (March: 156, the seed's)
            val_count = max(1, math.floor((month_end - workload - val_start) / step))
    if not val_count:
        raise ValueError("val_count is required with an explicit val_start")
    train_count = run.train_count
    train_start = _ts(run.train_start, "train_start")
    latest_train_start = val_start - workload - (train_count - 1) * step - step
    if train_start is None:
        train_start = latest_train_start
    train_data_end = train_start + (train_count - 1) * step + workload
    if train_data_end > val_start:
        raise ValueError(
            f"training samples from {_iso(train_start)} reach {_iso(train_data_end)} with their "
            f"{run.workload_days}-day workloads, after val_start {_iso(val_start)}: "
            f"start training earlier or use fewer samples"
        )
    val_end = val_start + (val_count - 1) * step + workload
    return {
        "train_start": _iso(train_start),
        "train_count": train_count,
        "val_start": _iso(val_start),
        "val_count": val_count,
        # what the trace must cover: a day of history before the first sample, the last workload
        "trace_from": _iso(train_start - timedelta(days=2)),
        "trace_to": _iso(val_end + timedelta(days=1)),
    }


def windows_end(w: dict[str, Any], run: MirageRun) -> str:
    """End of the validation window: the last sample's start plus one sample interval."""
    start = _ts(w["val_start"], "val_start")
    step = timedelta(hours=run.interval_hours)
    return _iso(start + w["val_count"] * step)


# ----------------------------------------------------------------------------- content-keyed locations


def trace_identity(run: MirageRun, fingerprint: str | None = None) -> dict[str, Any]:
    """What the ingested (or generated) trace depends on (:func:`keys.trace_location`'s key).
    ``fingerprint``: the raw trace's content fingerprint (:func:`trace_fingerprint`); without
    it the URI stands in (tests)."""
    if run.trace:
        return {
            "kind": "ingest",
            "content": fingerprint or f"uri:{run.trace}",
            "timezone": run.trace_timezone,
            "from": run.window_from,
            "to": run.window_to,
        }
    return {
        "kind": "synth",
        "profile": run.synth_profile,
        "seed": run.seed,
        "from": run.window_from,
        "to": run.window_to,
    }


def trace_fingerprint(uri: str) -> str:
    """Content fingerprint of a raw trace file (sha256 through fsspec; reads the file), or of a
    folder of daily exports: its export files only (:func:`mirage_tasks.data.exports.fingerprint`)."""
    from stepkit.step import input_fingerprint  # fsspec, only when planning a real run

    from ..data import exports

    return exports.fingerprint(uri) if exports.is_folder(uri) else input_fingerprint(uri)


def sample_source(identity: dict[str, Any], run: MirageRun) -> dict[str, Any]:
    """What names a sample family's trace: a real trace by its location (time zone and window),
    not its content, so a trace that grows in place (a daily ``sacct`` export, or a folder of
    daily exports: :mod:`mirage_tasks.data.exports`, named by the folder) keeps its family;
    each day partition records the digest of the jobs it saw (:mod:`mirage_tasks.data.prefixes`).
    A synthetic trace by its identity (profile, seed, window)."""
    if identity["kind"] == "ingest" and run.trace:
        return {
            "kind": "ingest",
            "source": run.trace,
            "timezone": identity.get("timezone"),
            "from": identity.get("from"),
            "to": identity.get("to"),
        }
    return identity


def sample_family(
    shared: str, trace: dict[str, Any], run: MirageRun, node: int, anchor: str, baseline: str = "default"
) -> str:
    """The root of one sample family (:func:`keys.sample_family`) of this run's sampling
    params at node size ``node``, on the grid through ``anchor``. ``trace``: :func:`sample_source`."""
    return keys.sample_family(
        shared,
        trace,
        cluster_config=run.cluster_config,
        interval_hours=run.interval_hours,
        anchor=int(_ts(anchor, "anchor").timestamp()),
        warmup_days=run.warmup_days,
        workload_days=run.workload_days,
        probes=run.probes,
        node=node,
        probe_spacing=run.probe_spacing,
        baseline=baseline,
    )


def _episode(run: MirageRun) -> dict[str, Any]:
    """The episode flags sample, validate and the baselines share."""
    return {
        "interval_hours": run.interval_hours,
        "warmup_days": run.warmup_days,
        "workload_days": run.workload_days,
        "cluster_config": run.cluster_config,
    }


def sample_days(start: str, count: int, interval_hours: float) -> list[str]:
    """The UTC days (YYYY-MM-DD) the starts of ``count`` samples from ``start`` fall on."""
    t = _ts(start, "start")
    step = timedelta(hours=interval_hours)
    return sorted({(t + k * step).date().isoformat() for k in range(count)})


def committed_days(
    family: str, days: list[str], trace: str | None = None, workload_days: float | None = None
) -> set[str]:
    """The ``days`` whose partition under ``family`` is committed (reads markers) and, when
    ``trace`` has stored prefix digests, was sampled from the jobs ``trace`` holds before the
    day's horizon (a grown trace keeps its earlier days; a changed one does not). Without
    digests (the trace is not ingested yet) a marker is enough: the ``sample`` step checks
    again and recomputes a stale day, and ``merge --trace`` refuses one."""
    from stepkit.step import read_marker

    from ..data.prefixes import prefix_before, read_prefixes

    prefixes = read_prefixes(trace) if trace else None
    out = set()
    for d in days:
        marker = read_marker(partition(family, d))
        if marker is None:
            continue
        if prefixes is not None and marker.get("params", {}).get("trace_prefix") != prefix_before(
            prefixes, d, workload_days
        ):
            continue
        out.add(d)
    return out


def checked_against(trace: str, workload_days: float):
    """``have(family, days)`` for :func:`sample_argvs`: :func:`committed_days` checked against ``trace``."""
    return functools.partial(committed_days, trace=trace, workload_days=workload_days)


def sample_argvs(p: dict[str, Any], have: Any = None) -> tuple[list[list[str]], list[str], dict[str, list[str]]]:
    """(sample argvs, their labels, missing days per node size) of a plan's ``sample_jobs``: only
    the days ``have(family, days)`` does not return, in up to ``shards`` contiguous chunks per node
    size; each chunk's label names its node size and days (:func:`step_label`)."""
    argvs, labels, missing = [], [], {}
    for job in p["sample_jobs"]:
        done = set(have(job["family"], job["days"])) if have else set()
        miss = [d for d in job["days"] if d not in done]
        missing[str(job["node"])] = miss
        for chunk in chunks(miss, job["shards"]):
            argvs.append(argv("sample", **job["argv"], days=chunk))
            labels.append(step_label(node=job["node"], days=chunk))
    return argvs, labels, missing


def chunks(items: list[Any], n: int) -> list[list[Any]]:
    """``items`` in at most ``n`` contiguous chunks of near-equal size (none empty)."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, i = [], 0
    for j in range(n):
        k = size + (1 if j < extra else 0)
        out.append(items[i : i + k])
        i += k
    return [c for c in out if c]


def run_key(run: MirageRun, logical_date: datetime | None, trace: dict[str, Any]) -> str:
    """``<logical date>-<hash>``: the run prefix under ``<root>/mirage_pipeline`` of one
    configuration (its resolved params, not the size that picked them, with the windows
    they resolve to, and the trace's identity). The params are
    :meth:`~mirage_tasks.run.runconf.MirageRun.key_params`: the fields of the key baseline
    always, a field declared after it only off its default (a new param orphans no stored
    run); tests/mirage/test_run_keys.py pins the keys."""
    w = windows(run, logical_date)
    date = (
        datetime.fromtimestamp(logical_date.timestamp(), tz=UTC).strftime("%Y-%m-%dT%H%M%SZ")
        if logical_date is not None
        else "manual"
    )
    return f"{date}-{digest({'params': run.key_params(), 'windows': w, 'trace': trace}, 12)}"


#: The mapped steps of a pipeline run: each one's argv list and ``labels`` list in :func:`plan`'s result.
MAPPED_STEPS = ("sample", "merge", "train_cpu", "train_gpu", "policy_cpu", "policy_gpu", "validate")


def plan_run(run: MirageRun, shared: str, runs: str, logical_date: datetime | None, **settings: Any) -> dict[str, Any]:
    """The whole plan of one run, with the I/O it needs: the raw trace's fingerprint and
    the committed day partitions (so only missing days are sampled). Traces and samples go
    under ``shared`` (``<root>/mirage``), the run's own outputs under ``<runs>/<run_key>``.
    ``run``: the DAG's params as :meth:`MirageRun.from_params` read them (with the run's
    type: a scheduled run's size, a backfill's windows). ``settings``: ``workers``/``threads``
    of the heavy steps (the CPUs each is granted)."""
    _typed(run)
    fingerprint = trace_fingerprint(run.trace) if run.trace else None
    identity = trace_identity(run, fingerprint)
    prefix = keys.run_prefix(runs, run_key(run, logical_date, identity))
    have = checked_against(trace_location(shared, identity), run.workload_days)
    return plan(run, prefix, logical_date, shared=shared, trace_fp=fingerprint, have=have, **settings)


def plan(
    run: MirageRun,
    prefix: str,
    logical_date: datetime | None,
    *,
    shared: str | None = None,
    trace_fp: str | None = None,
    have: Any = None,
    workers: int | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Every step's argv for one run under ``prefix``; shared traces and samples under
    ``shared`` (default: ``mirage`` beside ``prefix``). ``have(family, days)`` returns the days
    already committed (default: none), so the sample argvs cover only the missing days.
    ``workers``/``threads``: processes of sample/validate and torch threads of train
    (None: the steps' defaults).

    Each mapped step's argv list (``sample``, ``merge``, ``train_cpu`` ...) has its labels at the
    same index in ``labels[<step>]`` (:func:`step_label`); ``workload_days`` is the run's, for
    checking committed days against the ingested trace (:func:`checked_against`)."""
    _typed(run)
    w = windows(run, logical_date)
    shared = shared if shared is not None else f"{prefix.rstrip('/').rsplit('/', 1)[0]}/mirage"
    identity = trace_identity(run, trace_fp)
    trace = trace_location(shared, identity)
    if run.trace:
        trace_argv = argv(
            "ingest",
            trace=run.trace,
            out=trace,
            t_from=run.window_from,
            t_to=run.window_to,
            timezone=run.trace_timezone,
        )
    else:
        trace_argv = argv(
            "synth",
            profile=run.synth_profile,
            t_from=run.window_from or w["trace_from"],
            t_to=run.window_to or w["trace_to"],
            seed=run.seed,
            out=trace,
        )
    episode = _episode(run)
    shards, nodes, models = run.shards, run.node_sizes, run.models
    gpu = run.device == "cuda"
    sampled = run.policy_eval == "sampled"
    train_common = {"preset": run.preset, "seed": run.seed, "threads": threads}

    days = sample_days(w["train_start"], w["train_count"], run.interval_hours)
    out: dict[str, Any] = {
        "config": run.as_dict(),
        "prefix": prefix,
        "trace": trace,
        "trace_argv": trace_argv,
        "windows": w,
        "workload_days": run.workload_days,
        "days": days,
        "families": {},
        "missing_days": {},
        "sample_jobs": [],
        **{key: [] for key in MAPPED_STEPS},
        "labels": {key: [] for key in MAPPED_STEPS},
    }
    labels = out["labels"]
    for n in nodes:
        family = sample_family(shared, sample_source(identity, run), run, n, w["train_start"])
        out["families"][str(n)] = family
        out["sample_jobs"].append(
            {
                "node": n,
                "family": family,
                "days": days,
                "shards": shards,
                "argv": {
                    "trace": trace,
                    "start": w["train_start"],
                    **episode,
                    "probes": run.probes,
                    "probe_spacing": run.probe_spacing,
                    "node": n,
                    "out": family,
                    "workers": workers,
                },
            }
        )
        dataset = keys.dataset(prefix, n)
        out["merge"].append(
            argv(
                "merge",
                inputs=[partition(family, d) for d in days],
                start=w["train_start"],
                count=w["train_count"],
                interval_hours=run.interval_hours,
                trace=trace,
                out=dataset,
            )
        )
        labels["merge"].append(step_label(node=n))
        for m in models:
            model_out = keys.model(prefix, m, n)
            hp = run.train_params.get(m, [])
            on_gpu = gpu and FAMILIES[m].torch
            if m in POLICIES:
                base = keys.model(prefix, POLICIES[m], n)
                a = argv(
                    "train",
                    model=m,
                    base=base,
                    trace=trace,
                    dataset=dataset,
                    **train_common,
                    param=hp,
                    device="cuda" if on_gpu else "cpu",
                    out=model_out,
                )
                key = "policy_gpu" if on_gpu else "policy_cpu"
            else:
                a = argv(
                    "train",
                    model=m,
                    dataset=dataset,
                    **train_common,
                    param=hp,
                    device="cuda" if on_gpu else "cpu",
                    out=model_out,
                )
                key = "train_gpu" if on_gpu else "train_cpu"
            out[key].append(a)
            labels[key].append(step_label(model=m, node=n))
        for m in [*models, *BASELINES]:
            target = keys.model(prefix, m, n) if m not in BASELINES else m
            # Policies are trained and selected by sampling their actions; argmax would keep
            # P(submit) < 0.5 forever and replay the reactive baseline. Seeded, so reproducible.
            stochastic = m in POLICIES and sampled
            for i in range(shards):
                out["validate"].append(
                    argv(
                        "validate",
                        trace=trace,
                        model=target,
                        name=m,
                        start=w["val_start"],
                        count=w["val_count"],
                        **episode,
                        node=n,
                        stochastic=stochastic,
                        seed=run.seed if stochastic else None,
                        shard=f"{i}/{shards}",
                        workers=workers,
                        out=keys.validation(prefix, m, n, i),
                    )
                )
                labels["validate"].append(step_label(model=m, node=n, shard=f"{i}/{shards}"))
    # Before the trace is ingested, have() can only read markers: the DAG lists the sample
    # argvs again after ingest (sample_argvs with checked_against), when digests exist.
    out["sample"], labels["sample"], out["missing_days"] = sample_argvs(out, have)
    # Simulator fidelity over the validation window (real vs simulated waits), for the report.
    out["fidelity"] = argv(
        "fidelity",
        trace=trace,
        t_from=w["val_start"],
        t_to=windows_end(w, run),
        episode_days=run.workload_days,
        cluster_config=run.cluster_config,
        out=keys.fidelity(prefix),
    )
    validation = sorted({a[-1] for a in out["validate"]})
    out["metrics"] = argv("metrics", inputs=validation, out=keys.metrics(prefix))
    out["report"] = argv(
        "report",
        inputs=[
            keys.metrics(prefix),
            *[keys.model(prefix, m, n) for m in models for n in nodes],
            *[keys.dataset(prefix, n) for n in nodes],
            keys.fidelity(prefix),
        ],
        out=keys.report(prefix),
    )
    return out


# ----------------------------------------------------------------------------- mirage_samples: one trace day


def samples_trace(run: MirageRun, shared: str, day: str | None, fingerprint: str | None = None) -> dict[str, Any]:
    """The trace a ``mirage_samples`` run samples: a real trace ingested whole (no window),
    once per content; else the synthetic trace of ``day``'s month (padded by the warm-up
    history before and a workload after), so every day of a month shares one trace."""
    _typed(run)
    if run.trace:
        identity = trace_identity(run.replace(window_from=None, window_to=None), fingerprint)
        loc = trace_location(shared, identity)
        return {
            "identity": identity,
            "trace": loc,
            "argv": argv("ingest", trace=run.trace, out=loc, timezone=run.trace_timezone),
        }
    if day is None:
        raise ValueError("a synthetic trace needs the run's day")
    d = datetime.fromisoformat(day).replace(tzinfo=UTC)
    month = d.replace(day=1)
    nxt = (month + timedelta(days=32)).replace(day=1)
    t_from = month - timedelta(days=run.warmup_days + 2)
    t_to = nxt + timedelta(days=run.workload_days + 1)
    identity = trace_identity(run.replace(window_from=_iso(t_from), window_to=_iso(t_to)))
    loc = trace_location(shared, identity)
    return {
        "identity": identity,
        "trace": loc,
        "argv": argv("synth", profile=run.synth_profile, t_from=_iso(t_from), t_to=_iso(t_to), seed=run.seed, out=loc),
    }


def newest_complete_day(last_submit: str, workload_days: float) -> str:
    """The newest UTC day whose every sample has its whole workload in a trace whose last
    job was submitted at ``last_submit``: how a scheduled run follows a growing trace."""
    t = _ts(last_submit, "last_submit") - timedelta(days=workload_days)
    return (t.date() - timedelta(days=1)).isoformat()


def export_sample_day(export_day: str, workload_days: float) -> str:
    """The day a watched folder's export of ``export_day`` completes: ``export_day`` minus one
    day minus the workload (whole days). Every job its samples can see (submitted before its
    horizon, :func:`mirage_tasks.data.prefixes.horizon`: UTC midnight starting ``export_day``)
    is in the exports up to ``export_day``, whatever the site's time zone, so the partition
    sampled when that export arrives stays valid as later exports arrive (unless one changes
    an earlier job's row)."""
    d = datetime.fromisoformat(export_day).date() - timedelta(days=1 + math.ceil(float(workload_days)))
    return d.isoformat()


def watched_days(event_days: Sequence[str], folder_days: Sequence[str], workload_days: float) -> dict[str, Any]:
    """The days a run started by a watched folder's exports samples.

    ``event_days``: the export days its asset events bring (several when exports landed
    together and the scheduler gave them one run); ``folder_days``: the days of every export in
    the folder when the run plans. ``days``: the day each event's export completes
    (:func:`export_sample_day`), from the folder's first export on; ``catch_up``: the other days
    the folder's exports complete, from the folder's first export on, which the run samples
    when not committed (an export whose event reached no run yet, see docs/dags.md: the
    scheduler attaches events queued while the DAG is at ``max_active_runs`` to the run of
    the next export only); ``early``: event days completing a day before the folder's first
    export (nothing to sample); ``first``: the folder's first export day."""
    if not folder_days:
        raise ValueError("a watched folder's run needs the folder's export days")
    first = min(folder_days)
    brought = {export_sample_day(d, workload_days) for d in event_days}
    days = sorted(d for d in brought if d >= first)
    done = {export_sample_day(d, workload_days) for d in folder_days}
    catch_up = sorted(d for d in done if d >= first and d not in brought)
    return {"days": days, "catch_up": catch_up, "early": sorted(brought - set(days)), "first": first}


class NothingToSample(Exception):
    """A watched run whose exports complete no day from the folder's first export on (a skip, not a failure)."""


def run_days(day: str, exports: Sequence[dict[str, str]], run: MirageRun) -> dict[str, Any]:
    """What a ``mirage_samples`` run samples: its own ``day`` (its partition), or for a run started by
    a watched folder's exports (``exports``: their events' payloads, :func:`house.watch.export_events`;
    ``run.trace`` the folder) :func:`watched_days` over the folder's export days as they are now.
    ``days`` and ``catch_up`` as there, ``day`` the one the trace is prepared for (the newest), and
    ``note`` a line for the task's log; :class:`NothingToSample` when the exports complete nothing yet."""
    if not exports:
        return {"days": [day], "catch_up": [], "day": day, "note": None}
    from ..data.exports import list_exports

    folder = [d for d, _ in list_exports(run.trace).files]
    w = watched_days([e["day"] for e in exports], folder, run.workload_days)
    if not w["days"] and not w["catch_up"]:
        raise NothingToSample(
            f"export {exports[-1]['name']} completes {w['early'][-1]}, before the folder's first export "
            f"({w['first']}): nothing to sample yet"
        )
    names = ", ".join(e["name"] for e in exports)
    note = f"exports {names}: days {w['days'] or 'none'}; days to catch up if not committed: {w['catch_up'] or 'none'}"
    return {"days": w["days"], "catch_up": w["catch_up"], "day": (w["days"] or w["catch_up"])[-1], "note": note}


def samples_days(
    run: MirageRun,
    shared: str,
    trace: dict[str, Any],
    days: Sequence[str],
    catch_up: Sequence[str] = (),
    have: Any = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """The sample argvs of several trace days (:func:`samples_day` each, oldest first): every
    day of ``days`` (published even when committed) and each day of ``catch_up`` with a node size
    whose partition is missing (a committed one is left out). ``days`` lists the days kept;
    ``partitions`` and ``missing`` are per day (``{day: {node: partition}}``, ``{day: [node]}``);
    ``sample`` and ``labels["sample"]`` every kept day's argvs and labels (``node N · day``)."""
    out: dict[str, Any] = {
        "days": [],
        "trace": trace["trace"],
        "partitions": {},
        "missing": {},
        "sample": [],
        "labels": {"sample": []},
    }
    keep = set(days)
    for day in sorted(keep | set(catch_up)):
        one = samples_day(run, shared, trace, day, have=have, workers=workers)
        if day not in keep and not one["missing"]:
            continue
        out["days"].append(day)
        out["partitions"][day] = one["partitions"]
        out["missing"][day] = one["missing"]
        out["sample"] += one["sample"]
        out["labels"]["sample"] += one["labels"]["sample"]
    return out


def samples_event(d: dict[str, Any], params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(extra, partition keys) of the ``mirage_samples`` events of a ``samples_days`` plan ``d``:
    one event per day (its key, ``YYYY-MM-DDT00:00:00``, the ``CronPartitionTimetable``'s
    format), all carrying one extra (Airflow gives a task's events of one asset one extra):
    the trace, the family params and, per day, its partitions and the node sizes computed."""
    extra = {
        "trace": d["trace"],
        "days": {day: {"partitions": d["partitions"][day], "computed": d["missing"][day]} for day in d["days"]},
        "params": {k: params.get(k) for k in FAMILY_PARAMS},
    }
    return extra, [f"{day}T00:00:00" for day in d["days"]]


def samples_day(
    run: MirageRun, shared: str, trace: dict[str, Any], day: str, have: Any = None, workers: int | None = None
) -> dict[str, Any]:
    """The sample argvs of one trace day: one per node size whose partition is missing
    (``labels["sample"]``: theirs, ``node N · day``).
    The grid is anchored at midnight UTC (the pipeline's default windows are on it when
    ``interval_hours`` divides 24)."""
    datetime.fromisoformat(day)  # ValueError on a bad day
    anchor = f"{day}T00:00:00+00:00"
    _typed(run)
    episode = _episode(run)
    out: dict[str, Any] = {
        "day": day,
        "trace": trace["trace"],
        "partitions": {},
        "missing": [],
        "sample": [],
        "labels": {"sample": []},
    }
    for n in run.node_sizes:
        family = sample_family(shared, sample_source(trace["identity"], run), run, n, anchor)
        out["partitions"][str(n)] = partition(family, day)
        if have is not None and day in set(have(family, [day])):
            continue
        out["missing"].append(n)
        out["sample"].append(
            argv(
                "sample",
                trace=trace["trace"],
                start=anchor,
                **episode,
                probes=run.probes,
                probe_spacing=run.probe_spacing,
                node=n,
                days=[day],
                out=family,
                workers=workers,
            )
        )
        out["labels"]["sample"].append(step_label(node=n, days=[day]))
    return out


# ----------------------------------------------------------------------------- mirage_monthly: a complete month


def month_run(month: str, extras: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``mirage_pipeline`` run a month of complete sample partitions calls for.

    ``month``: the rolled-up partition key (``YYYY-MM``); ``extras``: the ``mirage_samples``
    asset events of its days (each carries the run's family params). The run validates that
    month (logical date: the first of the next month) with the pipeline's default training
    window, a ``paper``-size run on the trace and sampling params the days were sampled with.
    A ``ValueError`` when the days disagree (e.g. half the month sampled with other params)."""
    start = datetime.strptime(month, "%Y-%m").replace(tzinfo=UTC)
    nxt = (start + timedelta(days=32)).replace(day=1)
    confs = {json.dumps({k: e.get("params", {}).get(k) for k in FAMILY_PARAMS}, sort_keys=True) for e in extras}
    if not extras or any("params" not in e for e in extras):
        raise ValueError(f"the sample events of {month} do not record their params (older mirage_samples runs?)")
    if len(confs) != 1:
        raise ValueError(
            f"the days of {month} were sampled with {len(confs)} different param sets; "
            "trigger mirage_pipeline by hand with the ones to use"
        )
    conf = {"size": "paper", **json.loads(confs.pop())}
    MirageRun.from_params(conf)  # the pipeline can read it (ValueError naming a bad param)
    return {"logical_date": _iso(nxt), "run_id": f"samples_complete__{month}", "conf": conf}
