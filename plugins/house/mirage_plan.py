"""The command lines of one ``mirage_pipeline`` run, computed from its params (no I/O).

Kept out of the DAG file so the DAG reads as a recipe and this arithmetic is unit-tested.
It never imports ``mirage_tasks``: it only builds argv lists for ``python -m mirage_tasks``.

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

import math
from datetime import datetime, timedelta, timezone
from typing import Any

REGRESSORS = ("xgboost", "random_forest", "transformer", "moe")
NETS = ("transformer", "moe")
POLICIES = {"moe_policy": "moe", "transformer_policy": "transformer"}
BASELINES = ("reactive", "avg")


def _ts(value: str | None, name: str) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        t = datetime.fromisoformat(value)
    except ValueError as exc:
        raise ValueError(f"param {name}={value!r} is not an ISO 8601 date/time") from exc
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+00:00")


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
        trace_argv = ["ingest", "--trace", params["trace"], "--out", trace]
        options = zip(("--from", "--to", "--timezone"),
                      [params.get("window_from"), params.get("window_to"), params.get("trace_timezone")])
        trace_argv += [x for flag, value in options if value for x in (flag, value)]
    else:
        trace_argv = ["synth", "--profile", params["synth_profile"],
                      "--from", params.get("window_from") or w["trace_from"],
                      "--to", params.get("window_to") or w["trace_to"],
                      "--seed", str(params["seed"]), "--out", trace]
    episode = ["--interval-hours", str(params["interval_hours"]), "--warmup-days", str(params["warmup_days"]),
               "--workload-days", str(params["workload_days"])]
    cluster = ["--cluster-config", params["cluster_config"]]
    shards = int(params["shards"])
    nodes = [int(n) for n in params["node_sizes"]]
    models = list(params["models"])
    unknown = [m for m in models if m not in REGRESSORS and m not in POLICIES]
    if unknown:
        raise ValueError(f"param models: unknown {unknown}; choose from {[*REGRESSORS, *POLICIES]}")
    missing_base = [m for m in models if m in POLICIES and POLICIES[m] not in models]
    if missing_base:
        raise ValueError(f"param models: {missing_base} need their base model(s) {[POLICIES[m] for m in missing_base]}")
    gpu = params.get("device", "cpu") == "cuda"
    sampled = params.get("policy_eval", "sampled") == "sampled"
    train_common = ["--preset", params["preset"], "--seed", str(params["seed"])]

    out: dict[str, Any] = {"prefix": prefix, "trace": trace, "trace_argv": trace_argv, "windows": w,
                           "sample": [], "merge": [], "train_cpu": [], "train_gpu": [],
                           "policy_cpu": [], "policy_gpu": [], "validate": []}
    for n in nodes:
        shard_outs = [f"{prefix}/samples/node{n}/shard{i}" for i in range(shards)]
        for i, so in enumerate(shard_outs):
            out["sample"].append(["sample", "--trace", trace, "--start", w["train_start"], "--count", str(w["train_count"]),
                                  *episode, "--probes", str(params["probes"]), "--node", str(n),
                                  "--shard", f"{i}/{shards}", *cluster, "--out", so])
        dataset = f"{prefix}/datasets/node{n}"
        out["merge"].append(["merge", "--in", *shard_outs, "--out", dataset])
        for m in models:
            model_out = f"{prefix}/models/{m}/node{n}"
            hp = [x for kv in (params.get("train_params") or {}).get(m, []) for x in ("--param", kv)]
            if m in POLICIES:
                base = f"{prefix}/models/{POLICIES[m]}/node{n}"
                argv = ["train", "--model", m, "--base", base, "--trace", trace, "--dataset", dataset,
                        *train_common, *hp, "--device", "cuda" if gpu else "cpu", "--out", model_out]
                out["policy_gpu" if gpu else "policy_cpu"].append(argv)
            else:
                on_gpu = gpu and m in NETS
                argv = ["train", "--model", m, "--dataset", dataset, *train_common, *hp,
                        "--device", "cuda" if on_gpu else "cpu", "--out", model_out]
                out["train_gpu" if on_gpu else "train_cpu"].append(argv)
        for m in [*models, *BASELINES]:
            target = f"{prefix}/models/{m}/node{n}" if m not in BASELINES else m
            # Policies are trained and selected by sampling their actions; argmax would keep
            # P(submit) < 0.5 forever and replay the reactive baseline. Seeded, so reproducible.
            how = ["--stochastic", "--seed", str(params["seed"])] if m in POLICIES and sampled else []
            for i in range(shards):
                out["validate"].append(["validate", "--trace", trace, "--model", target, "--name", m,
                                        "--start", w["val_start"],
                                        "--count", str(w["val_count"]), *episode, "--node", str(n),
                                        "--decide-every-minutes", "10", *how, "--shard", f"{i}/{shards}", *cluster,
                                        "--out", f"{prefix}/validation/{m}/node{n}/shard{i}"])
    # Simulator fidelity over the validation window (real vs simulated waits), for the report.
    val_end = windows_end(w, params)
    out["fidelity"] = ["fidelity", "--trace", trace, "--from", w["val_start"], "--to", val_end,
                       "--episode-days", str(params["workload_days"]), *cluster, "--out", f"{prefix}/fidelity"]
    validation = sorted({argv[-1] for argv in out["validate"]})
    out["metrics"] = ["metrics", "--in", *validation, "--out", f"{prefix}/metrics"]
    out["report"] = ["report", "--in", f"{prefix}/metrics", *[f"{prefix}/models/{m}/node{n}" for m in models for n in nodes],
                     *[f"{prefix}/datasets/node{n}" for n in nodes],
                     f"{prefix}/fidelity", "--out", f"{prefix}/report"]
    return out
