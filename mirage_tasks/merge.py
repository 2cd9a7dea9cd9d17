"""``python -m mirage_tasks merge``: sample shards -> one chronological dataset.

``--in`` takes committed ``sample`` outputs (any order); they must share every parameter
but the shard (same trace, node size, baseline, window, configuration, ...). Rows are
sorted by sample index, then probe time; a sample present twice is an error.

Outputs under ``--out``: ``dataset.npz`` (``X`` float32 [n, window, F], ``y`` float32 [n]
hours, ``sample``, ``sample_start``, ``probe_time``, ``node`` int64 [n]), ``probes.parquet``
(per-probe metadata, same row order) and ``manifest.json``::

    feature_names, window, step_s, n_examples, n_samples, node, baseline, shapes,
    sample_start_min, sample_start_max (epoch s), sample_start_min_iso/max_iso,
    data_end (ISO: max sample_start + workload_days, the latest trace time any example
    depends on), trace_fingerprint, params (shared sample parameters), shards (fingerprints)
"""

from __future__ import annotations

import argparse
import logging

import numpy as np
import pandas as pd

from stepkit import Step, StepError, require_committed

from . import __version__
from .features import FEATURE_NAMES
from .sampling import load_shard, npz_bytes, parquet_bytes

log = logging.getLogger(__name__)
KEYS = ("X", "y", "sample", "sample_start", "probe_time", "node")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in", dest="inputs", nargs="+", required=True, help="sample output prefixes (shards)")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument("--no-compress", action="store_true", help="write dataset.npz uncompressed")


def _iso(epoch: int) -> str:
    return pd.Timestamp(int(epoch), unit="s", tz="UTC").isoformat()


def run(args: argparse.Namespace) -> int:
    markers = [require_committed(u, "sample shard") for u in args.inputs]
    shared = None
    for uri, m in zip(args.inputs, markers):
        if m.get("step") != "sample":
            raise StepError(f"{uri}: not a sample output (step {m.get('step')!r})")
        p = {k: v for k, v in m["params"].items() if k != "shard"}
        if shared is None:
            shared = p
        elif p != shared:
            diff = sorted(k for k in set(p) | set(shared) if p.get(k) != shared.get(k))
            raise StepError(f"{uri}: shard parameters differ from {args.inputs[0]} in {diff}")
    shards = sorted({tuple(m["params"]["shard"]) for m in markers})
    if len(shards) != len(markers):
        raise StepError("the same shard is given twice")
    step = Step("merge", args.out, __version__, {"compress": not args.no_compress}, inputs=list(args.inputs))
    if step.skip():
        return 0
    parts, frames, fps = [], [], set()
    for uri in args.inputs:
        arrays, probes, info = load_shard(uri)
        if list(info["params"]["feature_names"]) != FEATURE_NAMES:
            raise StepError(f"{uri}: feature names differ from this version's ({len(FEATURE_NAMES)} features)")
        parts.append(arrays)
        frames.append(probes)
        fps.add(info["trace_fingerprint"])
    if len(fps) != 1:
        raise StepError(f"shards come from different traces: {sorted(fps)}")
    cat = {k: np.concatenate([a[k] for a in parts]) for k in KEYS}
    probes = pd.concat(frames, ignore_index=True)
    order = np.lexsort((cat["probe_time"], cat["sample"]))
    cat = {k: v[order] for k, v in cat.items()}
    probes = probes.iloc[order].reset_index(drop=True)
    dup = pd.Series(list(zip(cat["sample"], cat["probe_time"]))).duplicated()
    if dup.any():
        raise StepError(f"{int(dup.sum())} duplicated (sample, probe time) rows: overlapping shards?")
    n = int(len(cat["y"]))
    window = int(shared["window"])
    workload_s = int(round(float(shared["workload_days"]) * 86400))
    manifest = {
        "feature_names": FEATURE_NAMES,
        "window": window,
        "step_s": int(shared["step_s"]),
        "n_examples": n,
        "n_samples": int(len(np.unique(cat["sample"]))),
        "node": int(shared["node"]),
        "baseline": shared["baseline"],
        "shapes": {k: list(v.shape) for k, v in cat.items()},
        "sample_start_min": int(cat["sample_start"].min()) if n else None,
        "sample_start_max": int(cat["sample_start"].max()) if n else None,
        "sample_start_min_iso": _iso(cat["sample_start"].min()) if n else None,
        "sample_start_max_iso": _iso(cat["sample_start"].max()) if n else None,
        "data_end": _iso(int(cat["sample_start"].max()) + workload_s) if n else None,
        "y_mean_h": float(cat["y"].mean()) if n else None,
        "trace_fingerprint": fps.pop(),
        "params": shared,
        "shards": [m["fingerprint"] for m in markers],
    }
    step.write_bytes("dataset.npz", npz_bytes(cat, compress=not args.no_compress))
    step.write_bytes("probes.parquet", parquet_bytes(probes))
    step.write_json("manifest.json", manifest)
    step.commit(summary={k: manifest[k] for k in ("n_examples", "n_samples", "node", "data_end", "y_mean_h")})
    print(f"merge: {manifest['n_samples']} samples, {n} examples, X {manifest['shapes']['X']}, "
          f"samples {manifest['sample_start_min_iso']} .. {manifest['sample_start_max_iso']}, "
          f"data_end {manifest['data_end']}", flush=True)
    return 0
