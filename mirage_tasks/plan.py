"""The command lines of one ``mirage_pipeline`` run, computed from its params (no I/O).

Lives beside the steps it plans, so a flag and its default are written once: in the step's
own ``add_arguments``. :func:`argv` builds a command line from a step name and keyword
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
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
from datetime import datetime, timedelta, timezone
from typing import Any

from .models.registry import BASELINES, FAMILIES, KINDS, POLICIES
from .times import iso as _iso
from .times import parse_iso


def _ts(value: str | None, name: str) -> datetime | None:
    return parse_iso(value, f"param {name}")


# ----------------------------------------------------------------------------- argv from the step parsers

@functools.lru_cache(maxsize=None)
def step_parser(step: str) -> argparse.ArgumentParser:
    """The parser of ``python -m mirage_tasks <step>`` (its module's ``add_arguments``)."""
    from .__main__ import STEPS

    if step not in STEPS:
        raise ValueError(f"unknown mirage_tasks step {step!r}; known: {', '.join(STEPS)}")
    module, helptext = STEPS[step]
    parser = argparse.ArgumentParser(prog=f"python -m mirage_tasks {step}", description=helptext)
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


# ----------------------------------------------------------------------------- windows

def _month_before(t: datetime) -> tuple[datetime, datetime]:
    end = t.astimezone(timezone.utc).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = (end - timedelta(days=1)).replace(day=1)
    return start, end


def windows(params: dict[str, Any], logical_date: datetime | None) -> dict[str, Any]:
    """Training and validation windows (sample starts and counts)."""
    step = timedelta(hours=float(params["interval_hours"]))
    workload = timedelta(days=float(params["workload_days"]))
    if logical_date is not None:  # Airflow hands a pendulum DateTime: use plain datetime arithmetic
        logical_date = datetime.fromtimestamp(logical_date.timestamp(), tz=timezone.utc)
    val_start = _ts(params.get("val_start"), "val_start")
    val_count = params.get("val_count")
    if val_start is None:
        if logical_date is None:
            raise ValueError("val_start is required when the run has no logical date")
        val_start, month_end = _month_before(logical_date)
        if not val_count:  # every sample whose workload ends inside the month (March: 156, the seed's)
            val_count = max(1, math.floor((month_end - workload - val_start) / step))
    if not val_count:
        raise ValueError("val_count is required with an explicit val_start")
    train_count = params.get("train_count")
    if not train_count:
        raise ValueError("train_count must be at least 1")
    train_start = _ts(params.get("train_start"), "train_start")
    latest_train_start = val_start - workload - (int(train_count) - 1) * step - step
    if train_start is None:
        train_start = latest_train_start
    train_data_end = train_start + (int(train_count) - 1) * step + workload
    if train_data_end > val_start:
        raise ValueError(
            f"training samples from {_iso(train_start)} reach {_iso(train_data_end)} with their "
            f"{params['workload_days']}-day workloads, after val_start {_iso(val_start)}: "
            f"start training earlier or use fewer samples"
        )
    val_end = val_start + (int(val_count) - 1) * step + workload
    return {
        "train_start": _iso(train_start), "train_count": int(train_count),
        "val_start": _iso(val_start), "val_count": int(val_count),
        # what the trace must cover: a day of history before the first sample, the last workload
        "trace_from": _iso(train_start - timedelta(days=2)), "trace_to": _iso(val_end + timedelta(days=1)),
    }


def windows_end(w: dict[str, Any], params: dict[str, Any]) -> str:
    """End of the validation window: the last sample's start plus one sample interval."""
    start = _ts(w["val_start"], "val_start")
    step = timedelta(hours=float(params["interval_hours"]))
    return _iso(start + w["val_count"] * step)


def plan(params: dict[str, Any], prefix: str, logical_date: datetime | None) -> dict[str, Any]:
    """Every step's argv for one run under ``prefix``."""
    w = windows(params, logical_date)
    trace = f"{prefix}/trace"
    if params.get("trace"):
        trace_argv = argv("ingest", trace=params["trace"], out=trace, t_from=params.get("window_from") or None,
                          t_to=params.get("window_to") or None, timezone=params.get("trace_timezone") or None)
    else:
        trace_argv = argv("synth", profile=params["synth_profile"], t_from=params.get("window_from") or w["trace_from"],
                          t_to=params.get("window_to") or w["trace_to"], seed=params["seed"], out=trace)
    episode = {"interval_hours": params["interval_hours"], "warmup_days": params["warmup_days"],
               "workload_days": params["workload_days"], "cluster_config": params["cluster_config"]}
    shards = int(params["shards"])
    nodes = [int(n) for n in params["node_sizes"]]
    models = list(params["models"])
    unknown = [m for m in models if m not in KINDS]
    if unknown:
        raise ValueError(f"param models: unknown {unknown}; choose from {list(KINDS)}")
    missing_base = [m for m in models if m in POLICIES and POLICIES[m] not in models]
    if missing_base:
        raise ValueError(f"param models: {missing_base} need their base model(s) {[POLICIES[m] for m in missing_base]}")
    gpu = params.get("device", "cpu") == "cuda"
    sampled = params.get("policy_eval", "sampled") == "sampled"
    train_common = {"preset": params["preset"], "seed": params["seed"]}

    out: dict[str, Any] = {"prefix": prefix, "trace": trace, "trace_argv": trace_argv, "windows": w,
                           "sample": [], "merge": [], "train_cpu": [], "train_gpu": [],
                           "policy_cpu": [], "policy_gpu": [], "validate": []}
    for n in nodes:
        shard_outs = [f"{prefix}/samples/node{n}/shard{i}" for i in range(shards)]
        for i, so in enumerate(shard_outs):
            out["sample"].append(argv("sample", trace=trace, start=w["train_start"], count=w["train_count"],
                                      **episode, probes=params["probes"], node=n, shard=f"{i}/{shards}", out=so))
        dataset = f"{prefix}/datasets/node{n}"
        out["merge"].append(argv("merge", inputs=shard_outs, out=dataset))
        for m in models:
            model_out = f"{prefix}/models/{m}/node{n}"
            hp = list((params.get("train_params") or {}).get(m, []))
            on_gpu = gpu and FAMILIES[m].torch
            if m in POLICIES:
                base = f"{prefix}/models/{POLICIES[m]}/node{n}"
                a = argv("train", model=m, base=base, trace=trace, dataset=dataset, **train_common, param=hp,
                         device="cuda" if on_gpu else "cpu", out=model_out)
                out["policy_gpu" if on_gpu else "policy_cpu"].append(a)
            else:
                a = argv("train", model=m, dataset=dataset, **train_common, param=hp,
                         device="cuda" if on_gpu else "cpu", out=model_out)
                out["train_gpu" if on_gpu else "train_cpu"].append(a)
        for m in [*models, *BASELINES]:
            target = f"{prefix}/models/{m}/node{n}" if m not in BASELINES else m
            # Policies are trained and selected by sampling their actions; argmax would keep
            # P(submit) < 0.5 forever and replay the reactive baseline. Seeded, so reproducible.
            stochastic = m in POLICIES and sampled
            for i in range(shards):
                out["validate"].append(argv(
                    "validate", trace=trace, model=target, name=m, start=w["val_start"], count=w["val_count"],
                    **episode, node=n, stochastic=stochastic, seed=params["seed"] if stochastic else None,
                    shard=f"{i}/{shards}", out=f"{prefix}/validation/{m}/node{n}/shard{i}"))
    # Simulator fidelity over the validation window (real vs simulated waits), for the report.
    out["fidelity"] = argv("fidelity", trace=trace, t_from=w["val_start"], t_to=windows_end(w, params),
                           episode_days=params["workload_days"], cluster_config=params["cluster_config"],
                           out=f"{prefix}/fidelity")
    validation = sorted({a[-1] for a in out["validate"]})
    out["metrics"] = argv("metrics", inputs=validation, out=f"{prefix}/metrics")
    out["report"] = argv("report", inputs=[f"{prefix}/metrics",
                                           *[f"{prefix}/models/{m}/node{n}" for m in models for n in nodes],
                                           *[f"{prefix}/datasets/node{n}" for n in nodes], f"{prefix}/fidelity"],
                         out=f"{prefix}/report")
    return out
