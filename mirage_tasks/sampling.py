"""``python -m mirage_tasks sample``: offline Mirage training examples, one shard per run.

Sample ``k`` (``0 <= k < --count``) starts at ``--start + k * --interval-hours``; shard
``I/S`` takes the samples with ``k % S == I``. Each sample is simulated once up to the
predecessor's submission, then forked per probe (:func:`mirage_tasks.sim.simulate_sample`):
``--baseline default`` gives ``--probes`` examples per sample, ``reactive``/``avg`` one.

Outputs under ``--out``:

* ``shard.npz``: ``X`` float32 [n, window, F] (features at the decision moment,
  :mod:`mirage_tasks.features`), ``y`` float32 [n] signed interruption in hours, ``sample``
  int64 (global index k), ``sample_start``, ``probe_time`` int64 epoch seconds, ``node``
  int64; rows ordered by sample, then probe time;
* ``probes.parquet``: one row per example with the probe metadata (sample start, probe
  time, predecessor submit/start/end, successor submit/start, interruption, backfilled,
  queue length and average wait at the decision and at the predecessor's start, ...);
* ``shard.json``: parameters, configuration, counts and timing; then ``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing as mp
import os
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stepkit import Step, StepError, storage

from . import __version__
from .features import FEATURE_NAMES, N_FEATURES
from .schema import parse_time, read_trace
from .sim.config import SimConfig, add_config_arguments, config_from_args
from .sim.episode import BASELINES, EpisodeSpec, simulate_sample
from .sim.workload import Workload

log = logging.getLogger(__name__)
SHARD_FILE = "shard.npz"
PROBES_FILE = "probes.parquet"
INFO_FILE = "shard.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument("--start", required=True, help="first sample start (ISO; UTC if no offset)")
    p.add_argument("--count", type=int, required=True, help="number of samples (all shards together)")
    p.add_argument("--interval-hours", type=float, default=4.0, help="hours between sample starts (4)")
    p.add_argument("--warmup-days", type=float, default=2.0, help="predecessor submitted this long after the start (2)")
    p.add_argument("--workload-days", type=float, default=5.0,
                   help="trace jobs submitted within this span are replayed (5)")
    p.add_argument("--probes", type=int, default=7, help="decision times per sample in default mode (7)")
    p.add_argument("--node", type=int, required=True, help="nodes of the predecessor and successor jobs")
    p.add_argument("--baseline", default="default", choices=BASELINES,
                   help="default (training probes), reactive or avg")
    p.add_argument("--shard", default="0/1", help="I/S: this run computes samples k with k %% S == I (0/1)")
    p.add_argument("--window", type=int, default=144, help="snapshots per history (144)")
    p.add_argument("--step-s", type=int, default=600, help="seconds between snapshots (600)")
    p.add_argument("--workers", type=int, default=1, help="processes (0 = all local cores)")
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, s = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise StepError(f"--shard must look like I/S, got {text!r}") from exc
    if s < 1 or not 0 <= i < s:
        raise StepError(f"--shard {text}: need 0 <= I < S")
    return i, s


# worker state (set before forking, or by the initializer)
_W: dict = {}


def pool_context() -> mp.context.BaseContext:
    """Worker processes started from a clean server process, never forked from this one: a
    fork after torch or OpenMP threads exist (a caller that already ran a model, a test
    session) can deadlock the child."""
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


def _init(wl: Workload, cfg: SimConfig, spec: EpisodeSpec, node: int, probes: int, baseline: str) -> None:
    _W.update(wl=wl, cfg=cfg, spec=spec, node=node, probes=probes, baseline=baseline)


def _one(task: tuple[int, int]) -> tuple[int, list]:
    k, t0 = task
    res = simulate_sample(_W["wl"], _W["cfg"], t0, _W["node"], _W["spec"], _W["probes"], _W["baseline"])
    return k, res


def run_samples(wl: Workload, cfg: SimConfig, spec: EpisodeSpec, node: int, probes: int, baseline: str,
                tasks: list[tuple[int, int]], workers: int = 1) -> list[tuple[int, list]]:
    """Simulate ``tasks`` = [(global index, sample start epoch)], in parallel if asked."""
    if workers <= 1 or len(tasks) <= 1:
        _init(wl, cfg, spec, node, probes, baseline)
        return [_one(t) for t in tasks]
    with pool_context().Pool(workers, initializer=_init, initargs=(wl, cfg, spec, node, probes, baseline)) as pool:
        out = list(pool.imap_unordered(_one, tasks, chunksize=max(1, len(tasks) // (workers * 8))))
    out.sort(key=lambda r: r[0])
    return out


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
        "y": ((meta["interruption_s"].to_numpy(np.float64) / 3600.0).astype(np.float32) if n
              else np.zeros(0, np.float32)),
        "sample": meta["sample"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "sample_start": meta["sample_start"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "probe_time": meta["probe_time"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
        "node": meta["node"].to_numpy(np.int64) if n else np.zeros(0, np.int64),
    }
    return arrays, meta


def npz_bytes(arrays: dict[str, np.ndarray], compress: bool = True) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compress else np.savez)(buf, **arrays)
    return buf.getvalue()


def parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf, compression="zstd")
    return buf.getvalue()


def run(args: argparse.Namespace) -> int:
    shard_i, shard_n = parse_shard(args.shard)
    if args.count < 1 or args.probes < 1 or args.node < 1 or args.window < 1 or args.step_s < 1:
        raise StepError("--count, --probes, --node, --window and --step-s must be >= 1")
    if args.interval_hours <= 0 or args.warmup_days < 0 or args.workload_days <= args.warmup_days:
        raise StepError("need --interval-hours > 0 and --workload-days > --warmup-days >= 0")
    start = parse_time(args.start, "--start")
    df, meta = read_trace(args.trace)
    cfg = config_from_args(args, meta.machine_nodes)
    if args.node > cfg.nodes:
        raise StepError(f"--node {args.node} exceeds the {cfg.nodes}-node cluster")
    spec = EpisodeSpec(args.warmup_days, args.workload_days, args.window, args.step_s)
    params = {
        "start": start.isoformat(), "count": args.count, "interval_hours": args.interval_hours,
        "warmup_days": args.warmup_days, "workload_days": args.workload_days, "probes": args.probes,
        "node": args.node, "baseline": args.baseline, "shard": [shard_i, shard_n], "window": args.window,
        "step_s": args.step_s, "config": cfg.to_dict(), "feature_names": FEATURE_NAMES,
    }
    step = Step("sample", args.out, __version__, params, inputs=[args.trace])
    if step.skip():
        return 0
    wl = Workload.from_frame(df, cfg.procs_per_node or None)
    if len(wl) == 0:
        raise StepError(f"{args.trace}: no usable jobs")
    t_first = int(start.timestamp())
    step_s = int(round(args.interval_hours * 3600))
    tasks = [(k, t_first + k * step_s) for k in range(shard_i, args.count, shard_n)]
    last_needed = tasks[-1][1] + int(args.workload_days * 86400) if tasks else t_first
    if tasks and (tasks[0][1] < wl.submit[0] or last_needed > wl.submit[-1]):
        log.warning("sample: samples reach outside the trace's submits (%s .. %s): their workload is truncated",
                    pd.Timestamp(int(wl.submit[0]), unit="s", tz="UTC"),
                    pd.Timestamp(int(wl.submit[-1]), unit="s", tz="UTC"))
    workers = (os.cpu_count() or 1) if args.workers == 0 else args.workers
    t = time.perf_counter()
    results = run_samples(wl, cfg, spec, args.node, args.probes, args.baseline, tasks, workers)
    wall = time.perf_counter() - t
    arrays, probes = assemble(results, args.window)
    step.write_bytes(SHARD_FILE, npz_bytes(arrays))
    step.write_bytes(PROBES_FILE, parquet_bytes(probes))
    info = {
        "params": params, "trace_fingerprint": wl.fingerprint, "n_samples": len(tasks),
        "n_examples": int(len(probes)), "wall_s": round(wall, 3), "workers": workers,
        "sample_start_min": int(arrays["sample_start"].min()) if len(probes) else None,
        "sample_start_max": int(arrays["sample_start"].max()) if len(probes) else None,
        "history_full": int(probes["history_full"].sum()) if len(probes) else 0,
    }
    step.write_json(INFO_FILE, info)
    y = arrays["y"]
    summary = {"n_samples": len(tasks), "n_examples": int(len(y)), "wall_s": round(wall, 3),
               "y_mean_h": float(y.mean()) if len(y) else None}
    step.commit(summary=summary)
    print(f"sample: {len(tasks)} samples, {len(y)} examples in {wall:.1f} s "
          f"({wall / max(1, len(y)) * 1000:.1f} ms per example, {workers} worker(s))", flush=True)
    return 0


def load_shard(uri: str) -> tuple[dict[str, np.ndarray], pd.DataFrame, dict]:
    """(arrays, probes frame, shard.json) of a committed sample output."""
    with storage.open_read(storage.join(uri, SHARD_FILE)) as f:
        z = np.load(io.BytesIO(f.read()), allow_pickle=False)
        arrays = {k: z[k] for k in z.files}
    with storage.open_read(storage.join(uri, PROBES_FILE)) as f:
        probes = pq.read_table(f).to_pandas()
    info = json.loads(storage.read_bytes(storage.join(uri, INFO_FILE)))
    return arrays, probes, info
