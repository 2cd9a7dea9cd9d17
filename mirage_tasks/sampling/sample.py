"""Mirage training samples: simulate them, lay them out as arrays, merge shards into a dataset.

Each sample is simulated once up to the predecessor's submission, then forked per probe
(:func:`mirage_tasks.sim.simulate_sample`): ``baseline="default"`` gives ``probes``
examples per sample, ``reactive``/``avg`` one. The ``sample`` step writes one shard of
samples; the ``merge`` step joins shards with :func:`merge_shards`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError
from stepkit.pool import run_pool

from ..data.artifacts import DATASET_KEYS, load_shard
from ..data.times import hours_to_s, iso
from ..sim.config import SimConfig
from ..sim.episode import EpisodeSpec, simulate_sample
from ..sim.features import FEATURE_NAMES, N_FEATURES
from ..sim.workload import Workload
from .schedule import pool_context

# worker state (set in this process, or by the pool's initializer)
_W: dict = {}


def _init(
    wl: Workload,
    cfg: SimConfig,
    spec: EpisodeSpec,
    node: int,
    probes: int,
    baseline: str,
    spacing: str = "uniform",
    at_probe: Any = None,
) -> None:
    _W.update(
        wl=wl, cfg=cfg, spec=spec, node=node, probes=probes, baseline=baseline, spacing=spacing, at_probe=at_probe
    )


def _one(task: tuple[int, int]) -> tuple[int, list, float]:
    k, t0 = task
    cpu0 = time.process_time()
    res = simulate_sample(
        _W["wl"],
        _W["cfg"],
        t0,
        _W["node"],
        _W["spec"],
        _W["probes"],
        _W["baseline"],
        spacing=_W["spacing"],
        at_probe=_W["at_probe"],
    )
    return k, res, time.process_time() - cpu0


def run_samples(
    wl: Workload,
    cfg: SimConfig,
    spec: EpisodeSpec,
    node: int,
    probes: int,
    baseline: str,
    tasks: list[tuple[int, int]],
    workers: int = 1,
    cpu: list[float] | None = None,
    spacing: str = "uniform",
    part: str = "",
    at_probe: Any = None,
) -> list[tuple[int, list]]:
    """Simulate ``tasks`` = [(global index, sample start epoch)], in parallel if asked
    (``spacing``: the probe spacing, :func:`mirage_tasks.sim.episode.probe_times`).
    ``at_probe``: see :func:`~mirage_tasks.sim.episode.simulate_sample` (picklable: it travels to the
    workers). ``cpu``, if given, receives each sample's CPU seconds (measured in the process that ran it).
    A worker that dies ends the run (:class:`stepkit.pool.WorkerDied` naming the sample and
    ``part``, the shard or day it belongs to)."""
    if workers <= 1 or len(tasks) <= 1:
        _init(wl, cfg, spec, node, probes, baseline, spacing, at_probe)
        out = [_one(t) for t in tasks]
    else:
        out = run_pool(
            _one,
            tasks,
            workers,
            initializer=_init,
            initargs=(wl, cfg, spec, node, probes, baseline, spacing, at_probe),
            describe=lambda t: describe_sample(t, part),
            name="sample",
            context=pool_context(),
        )
        out.sort(key=lambda r: r[0])
    if cpu is not None:
        cpu.extend(r[2] for r in out)
    return [(k, res) for k, res, _ in out]


def describe_sample(task: tuple[int, int], part: str = "") -> str:
    """``sample 5 (start 2023-01-01T20:00:00+00:00) of shard 1/2``: a task in an error."""
    k, t0 = task
    return f"sample {k} (start {iso(t0)})" + (f" of {part}" if part else "")


def assemble(results: list[tuple[int, list]], window: int) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    """Arrays in the dataset layout and the per-probe metadata frame, in sample/probe order."""
    rows, hists = [], []
    for k, probes in sorted(results, key=lambda r: r[0]):
        for pr in sorted(probes, key=lambda p: p.meta["probe_time"]):
            rows.append({"sample": k, **pr.meta})
            hists.append(pr.history)
    meta = pd.DataFrame(rows)
    n = len(rows)
    arrays = {
        "X": np.stack(hists).astype(np.float32) if n else np.zeros((0, window, N_FEATURES), np.float32),
        "y": (
            (meta["interruption_s"].to_numpy(np.float64) / 3600.0).astype(np.float32) if n else np.zeros(0, np.float32)
        ),
        "sample": meta["sample"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "sample_start": meta["sample_start"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "probe_time": meta["probe_time"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "node": meta["node"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
    }
    return arrays, meta


#: What tells one shard or day partition of a sample family from another (a day's trace
#: prefix digest differs from day to day by nature).
_PART_KEYS = ("shard", "day", "trace_prefix")


def shared_params(uris: list[str], markers: list[dict]) -> dict:
    """The sample parameters every shard or day partition shares (all but the shard or
    day); an error naming the odd one."""
    shared = None
    for uri, m in zip(uris, markers):
        if m.get("step") != "sample":
            raise StepError(f"{uri}: not a sample output (step {m.get('step')!r})")
        p = {k: v for k, v in m["params"].items() if k not in _PART_KEYS}
        if shared is None:
            shared = p
        elif p != shared:
            diff = sorted(k for k in set(p) | set(shared) if p.get(k) != shared.get(k))
            raise StepError(f"{uri}: shard parameters differ from {uris[0]} in {diff}")
    parts = [json.dumps([m["params"].get(k) for k in ("shard", "day")]) for m in markers]
    if len(set(parts)) != len(markers):
        raise StepError("the same shard or day is given twice")
    if any("day" in m["params"] for m in markers) and any("shard" in m["params"] for m in markers):
        raise StepError("day partitions and shards cannot be merged together")
    return shared or {}


def _window(
    cat: dict[str, np.ndarray], probes: pd.DataFrame, window: tuple[int, int, float], uris: list[str], shared: dict
) -> tuple[dict[str, np.ndarray], pd.DataFrame]:
    start, count, interval_hours = window
    step_s = hours_to_s(interval_hours)
    grid = shared.get("grid") or {}
    if not grid:
        raise StepError("a window (--start/--count) merges day partitions (sample --day), not shards")
    if grid.get("interval_s") != step_s or start % step_s != grid.get("phase_s"):
        raise StepError(
            f"window start {iso(start)} every {interval_hours} h is not on the partitions' sample grid "
            f"(every {grid.get('interval_s')} s, phase {grid.get('phase_s')} s)"
        )
    end = start + count * step_s
    covered: set[str] = set()
    for uri in uris:  # the days the partitions cover (a sample may yield no example)
        covered.add(uri.rstrip("/").rsplit("day=", 1)[-1])
    needed = sorted({iso(t)[:10] for t in range(start, end, step_s)})
    missing = [d for d in needed if d not in covered]
    if missing:
        raise StepError(f"no day partition for {len(missing)} day(s) of the window: {missing[:5]}")
    keep = (cat["sample_start"] >= start) & (cat["sample_start"] < end)
    cat = {k: v[keep] for k, v in cat.items()}
    cat["sample"] = ((cat["sample_start"] - start) // step_s).astype(np.int64)
    probes = probes[keep].reset_index(drop=True)
    if "sample" in probes:
        probes["sample"] = cat["sample"]
    return cat, probes


def check_prefixes(uris: list[str], markers: list[dict], prefixes: dict, workload_days: float) -> None:
    """Every day partition was sampled from the jobs ``prefixes`` (the trace being merged for)
    holds before that day's horizon; an error naming the stale partitions otherwise."""
    from ..data.prefixes import prefix_before

    stale = [
        u
        for u, m in zip(uris, markers)
        if "day" in m["params"]
        and m["params"].get("trace_prefix") != prefix_before(prefixes, m["params"]["day"], workload_days)
    ]
    if stale:
        raise StepError(
            f"{len(stale)} day partition(s) were sampled from another version of the trace "
            f"(the jobs their samples see differ): {stale[:3]}; sample those days again"
        )


def merge_shards(
    uris: list[str], shared: dict, window: tuple[int, int, float] | None = None, trace_fingerprint: str | None = None
) -> tuple[dict[str, np.ndarray], pd.DataFrame, dict]:
    """(arrays, probes, manifest fields) of the shards in ``uris``, sorted by sample then probe time.

    ``window`` = (first start epoch, count, interval hours): keep the samples of that window
    (day partitions hold whole days) and number them from its first start; every start of
    the window must be covered by a partition. ``trace_fingerprint``: the trace the day
    partitions were checked against (:func:`check_prefixes`), recorded in the manifest;
    without it every input must come from one trace."""
    parts, frames, fps = [], [], set()
    for uri in uris:
        arrays, probes, info = load_shard(uri)
        if list(info["params"]["feature_names"]) != FEATURE_NAMES:
            raise StepError(f"{uri}: feature names differ from this version's ({len(FEATURE_NAMES)} features)")
        parts.append(arrays)
        frames.append(probes)
        fps.add(info["trace_fingerprint"])
    if trace_fingerprint is not None:  # days sampled from earlier versions of a grown trace
        fps = {trace_fingerprint}
    if len(fps) != 1:
        raise StepError(f"shards come from different traces: {sorted(fps)}")
    cat = {k: np.concatenate([a[k] for a in parts]) for k in DATASET_KEYS}
    probes = pd.concat(frames, ignore_index=True)
    if window is not None:
        cat, probes = _window(cat, probes, window, uris, shared)
    order = np.lexsort((cat["probe_time"], cat["sample"]))
    cat = {k: v[order] for k, v in cat.items()}
    probes = probes.iloc[order].reset_index(drop=True)
    dup = pd.Series(list(zip(cat["sample"], cat["probe_time"]))).duplicated()
    if dup.any():
        raise StepError(f"{int(dup.sum())} duplicated (sample, probe time) rows: overlapping shards?")
    n = int(len(cat["y"]))
    workload_s = int(round(float(shared["workload_days"]) * 86400))
    manifest = {
        "feature_names": FEATURE_NAMES,
        "window": int(shared["window"]),
        "step_s": int(shared["step_s"]),
        "n_examples": n,
        "n_samples": int(len(np.unique(cat["sample"]))),
        "node": int(shared["node"]),
        "baseline": shared["baseline"],
        "shapes": {k: list(v.shape) for k, v in cat.items()},
        "sample_start_min": int(cat["sample_start"].min()) if n else None,
        "sample_start_max": int(cat["sample_start"].max()) if n else None,
        "sample_start_min_iso": iso(cat["sample_start"].min()) if n else None,
        "sample_start_max_iso": iso(cat["sample_start"].max()) if n else None,
        "data_end": iso(int(cat["sample_start"].max()) + workload_s) if n else None,
        "y_mean_h": float(cat["y"].mean()) if n else None,
        "trace_fingerprint": fps.pop(),
        "params": shared,
    }
    return cat, probes, manifest
