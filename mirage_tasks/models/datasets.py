"""Datasets written by ``merge``, chronological splits by sample, and the feature scaler.

A dataset is a directory URI holding

* ``dataset.npz``: ``X`` float32 [n, W, F] (raw units, non-negative), ``y`` float32 [n]
  (signed interruption in hours), ``sample`` int64 [n], ``sample_start`` int64 [n] (epoch s),
  ``probe_time`` int64 [n], ``node`` int64 [n];
* ``manifest.json``: at least ``feature_names``, ``window``, ``step_s``, ``n_examples``,
  ``n_samples``, ``node``, ``sample_start_min``, ``sample_start_max``, ``data_end``,
  ``trace_fingerprint``.

Splits are chronological *by sample*: every probe of a sample lands on the same side,
validation samples start after every training sample, and training samples whose
episodes could still be running when the first validation sample starts are purged
(``purge_days``), so no training label is decided by trace time a validation feature sees.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepkit import StepError, storage
from stepkit.step import load_json

from ..data.artifacts import DATASET_FILE, MANIFEST_FILE, npz_bytes
from ..data.times import iso

log = logging.getLogger(__name__)

ARRAYS = {
    "X": np.float32,
    "y": np.float32,
    "sample": np.int64,
    "sample_start": np.int64,
    "probe_time": np.int64,
    "node": np.int64,
}
MANIFEST_KEYS = (
    "feature_names",
    "window",
    "step_s",
    "n_examples",
    "n_samples",
    "node",
    "sample_start_min",
    "sample_start_max",
    "data_end",
    "trace_fingerprint",
)


@dataclass
class Dataset:
    X: np.ndarray
    y: np.ndarray
    sample: np.ndarray
    sample_start: np.ndarray
    probe_time: np.ndarray
    node: np.ndarray
    manifest: dict[str, Any]
    uri: str

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @property
    def window(self) -> int:
        return int(self.X.shape[1])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[2])

    def rows(self, idx: np.ndarray) -> Dataset:
        return Dataset(
            self.X[idx],
            self.y[idx],
            self.sample[idx],
            self.sample_start[idx],
            self.probe_time[idx],
            self.node[idx],
            self.manifest,
            self.uri,
        )


def load_dataset(uri: str) -> Dataset:
    """Read and check a ``merge`` output; rows are returned in (sample_start, sample, probe) order."""
    npz_uri, man_uri = storage.join(uri, DATASET_FILE), storage.join(uri, MANIFEST_FILE)
    for u in (npz_uri, man_uri):
        if not storage.exists(u):
            raise StepError(f"dataset file not found: {u}")
    manifest = load_json(man_uri)
    missing = [k for k in MANIFEST_KEYS if k not in manifest]
    if missing:
        raise StepError(f"{man_uri}: missing keys {missing}")
    try:
        with np.load(io.BytesIO(storage.read_bytes(npz_uri)), allow_pickle=False) as z:
            arrays = {k: z[k] for k in ARRAYS if k in z.files}
    except Exception as exc:  # zip/npy errors come in many types
        raise StepError(f"{npz_uri}: not a readable .npz archive ({exc})") from exc
    lacking = [k for k in ARRAYS if k not in arrays]
    if lacking:
        raise StepError(f"{npz_uri}: missing arrays {lacking}")
    X = arrays["X"]
    if X.ndim != 3:
        raise StepError(f"{npz_uri}: X must be [n, W, F], got shape {X.shape}")
    n, W, F = X.shape
    if n == 0:
        raise StepError(f"{npz_uri}: no examples")
    for k in ARRAYS:
        if k != "X" and arrays[k].shape != (n,):
            raise StepError(f"{npz_uri}: {k} has shape {arrays[k].shape}, expected ({n},)")
    if W != int(manifest["window"]) or F != len(manifest["feature_names"]):
        raise StepError(
            f"{npz_uri}: X is [n, {W}, {F}] but {man_uri} says window {manifest['window']} "
            f"and {len(manifest['feature_names'])} features"
        )
    if int(manifest["n_examples"]) != n:
        raise StepError(f"{npz_uri}: {n} examples but {man_uri} says n_examples {manifest['n_examples']}")
    out = {k: np.ascontiguousarray(arrays[k], dtype=t) for k, t in ARRAYS.items()}
    if not np.isfinite(out["X"]).all() or not np.isfinite(out["y"]).all():
        raise StepError(f"{npz_uri}: X or y contains NaN or infinity")
    order = np.lexsort((out["probe_time"], out["sample"], out["sample_start"]))
    if not np.array_equal(order, np.arange(n)):
        log.warning("%s: rows not in chronological order; sorting by (sample_start, sample, probe_time)", npz_uri)
        out = {k: v[order] for k, v in out.items()}
    return Dataset(manifest=manifest, uri=storage.normalize(uri), **out)


@dataclass
class Split:
    train: np.ndarray  # row indices
    val: np.ndarray
    info: dict[str, Any]


def chronological_split(ds: Dataset, val_fraction: float = 0.2, purge_days: float = 5.0) -> Split:
    """Train on the earliest samples, validate on the latest ``val_fraction`` of samples.

    A sample is the unit: its probes stay together. Training samples starting less than
    ``purge_days`` before the first validation sample are dropped (their episodes overlap
    the validation period).
    """
    if not 0.0 < val_fraction < 1.0:
        raise StepError(f"val_fraction must be in (0, 1), got {val_fraction}")
    # Unique samples in chronological order of their start.
    first_row = np.unique(ds.sample, return_index=True)[1]
    samples = ds.sample[first_row]
    starts = ds.sample_start[first_row]
    order = np.lexsort((samples, starts))
    samples, starts = samples[order], starts[order]
    n_s = len(samples)
    n_val = max(1, int(round(n_s * val_fraction)))
    if n_s - n_val < 2:
        raise StepError(f"{ds.uri}: only {n_s} samples, too few for a train/validation split")
    val_samples = samples[n_s - n_val :]
    val_start = int(starts[n_s - n_val])
    cut = val_start - int(purge_days * 86400)
    train_mask_s = starts[: n_s - n_val] <= cut
    train_samples = samples[: n_s - n_val][train_mask_s]
    purged = int((~train_mask_s).sum())
    if len(train_samples) < 2:
        raise StepError(
            f"{ds.uri}: after purging {purged} samples within {purge_days} days of validation, "
            f"fewer than 2 training samples remain; lower --purge-days or use more data"
        )
    train = np.flatnonzero(np.isin(ds.sample, train_samples))
    val = np.flatnonzero(np.isin(ds.sample, val_samples))
    info = {
        "unit": "sample",
        "val_fraction": val_fraction,
        "purge_days": purge_days,
        "n_train": int(len(train)),
        "n_val": int(len(val)),
        "n_train_samples": int(len(train_samples)),
        "n_val_samples": int(len(val_samples)),
        "n_purged_samples": purged,
        "train_sample_start_min": iso(ds.sample_start[train].min()),
        "train_sample_start_max": iso(ds.sample_start[train].max()),
        "train_probe_time_max": iso(ds.probe_time[train].max()),
        "val_sample_start_min": iso(ds.sample_start[val].min()),
        "val_sample_start_max": iso(ds.sample_start[val].max()),
    }
    return Split(train, val, info)


def data_window(ds: Dataset, split: Split) -> dict[str, Any]:
    """What a model config records about its training data (for leakage checks downstream)."""
    m = ds.manifest
    params = m.get("params") or {}
    span_days = float(params.get("workload_days", split.info["purge_days"]))
    train_end = int(ds.sample_start[split.train].max()) + int(span_days * 86400)
    return {
        # the latest trace time any training example depends on: validation must start after it
        "train_data_end": iso(train_end),
        "dataset": ds.uri,
        "trace_fingerprint": m["trace_fingerprint"],
        "node": m["node"],
        "window": int(m["window"]),
        "step_s": int(m["step_s"]),
        "feature_names": list(m["feature_names"]),
        "n_examples": ds.n,
        "n_samples": int(m["n_samples"]),
        "sample_start_min": m["sample_start_min"],
        "sample_start_max": m["sample_start_max"],
        "data_end": m["data_end"],
        "sample_params": m.get("params"),
        "split": split.info,
    }


class FeatureScaler:
    """``log1p`` of the (non-negative) raw features, then per-feature standardisation.

    Fitted on training rows only (every snapshot of every training example). Features
    that are constant in training get scale 1. Serialised as plain JSON lists.
    """

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        self.mean = np.asarray(mean, dtype=np.float32)
        self.std = np.asarray(std, dtype=np.float32)

    @classmethod
    def fit(cls, X: np.ndarray) -> FeatureScaler:
        F = X.shape[-1]
        s = np.zeros(F, np.float64)
        s2 = np.zeros(F, np.float64)
        count = 0
        for i in range(0, X.shape[0], 512):  # chunked: keeps float64 temporaries small
            z = np.log1p(np.maximum(X[i : i + 512], 0.0)).astype(np.float64).reshape(-1, F)
            s += z.sum(0)
            s2 += (z * z).sum(0)
            count += z.shape[0]
        mean = s / count
        var = np.maximum(s2 / count - mean * mean, 0.0)
        std = np.sqrt(var)
        std[std < 1e-6] = 1.0
        return cls(mean, std)

    def transform(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        if X.shape[-1] != self.mean.shape[0]:
            raise ValueError(f"expected {self.mean.shape[0]} features, got {X.shape[-1]}")
        out = np.log1p(np.maximum(X, 0.0, dtype=np.float32))
        out -= self.mean
        out /= self.std
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"transform": "log1p-standardise", "mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureScaler:
        if d.get("transform") != "log1p-standardise":
            raise ValueError(f"unknown scaler transform {d.get('transform')!r}")
        return cls(np.asarray(d["mean"], np.float32), np.asarray(d["std"], np.float32))


def mae(pred: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.abs(np.asarray(pred, np.float64) - np.asarray(y, np.float64))))


def constant_baseline(y_train: np.ndarray, y_val: np.ndarray) -> dict[str, float]:
    """Validation MAE of the best constant under L1 (the training median)."""
    med = float(np.median(y_train))
    return {"value_h": med, "val_mae_h": mae(np.full_like(y_val, med), y_val)}


def write_dataset(
    uri: str,
    X: np.ndarray,
    y: np.ndarray,
    sample: np.ndarray,
    sample_start: np.ndarray,
    probe_time: np.ndarray,
    node: np.ndarray,
    manifest: dict[str, Any],
) -> None:
    """Write and commit a dataset in the ``merge`` format (used by tests and the benchmark).

    Committed like a step output (``_SUCCESS.json`` last, step ``dataset``), since ``train``
    refuses a dataset folder without its marker."""
    from stepkit import Step

    from .. import __version__

    arrays = {
        "X": X.astype(np.float32),
        "y": y.astype(np.float32),
        "sample": sample.astype(np.int64),
        "sample_start": sample_start.astype(np.int64),
        "probe_time": probe_time.astype(np.int64),
        "node": node.astype(np.int64),
    }
    step = Step("dataset", uri, __version__, {"manifest": manifest, "n": int(len(y))})
    step.write_bytes(DATASET_FILE, npz_bytes(arrays, compress=False))
    step.write_bytes(MANIFEST_FILE, (json.dumps(manifest, indent=2) + "\n").encode())
    step.commit(summary={"n_examples": int(len(y))})


def parse_iso(value: str) -> int:
    """Epoch seconds of an ISO time written by :func:`mirage_tasks.data.times.iso` (UTC when no offset)."""
    import pandas as pd

    t = pd.Timestamp(value)
    return int((t.tz_localize("UTC") if t.tzinfo is None else t).timestamp())


def subset(ds: Dataset, *, until: int | None = None, fraction: float = 1.0) -> tuple[Dataset, dict[str, Any]]:
    """The dataset restricted to samples whose episodes end by ``until`` (epoch s: sample start +
    the workload span <= until), then thinned to ``fraction`` of those samples, evenly spaced in
    time (0.25 keeps every 4th sample: a 4-times coarser sampling interval over the same history).
    The manifest's sample window and ``data_end`` describe the rows kept, so the leakage guard
    sees the subset's true end. Returns (dataset, a description for the model config)."""
    if not 0.0 < fraction <= 1.0:
        raise StepError(f"sample fraction must be in (0, 1], got {fraction}")
    m = ds.manifest
    span_s = int(float((m.get("params") or {}).get("workload_days", 5.0)) * 86400)
    first_row = np.unique(ds.sample, return_index=True)[1]
    samples, starts = ds.sample[first_row], ds.sample_start[first_row]
    order = np.lexsort((samples, starts))
    samples, starts = samples[order], starts[order]
    keep = np.ones(len(samples), bool) if until is None else starts + span_s <= until
    samples, starts = samples[keep], starts[keep]
    if fraction < 1.0 and len(samples):
        n_keep = max(2, int(round(len(samples) * fraction)))
        idx = np.unique(np.round(np.linspace(0, len(samples) - 1, n_keep)).astype(int))
        samples, starts = samples[idx], starts[idx]
    if len(samples) < 3:
        raise StepError(
            f"{ds.uri}: only {len(samples)} samples end by {iso(until) if until else 'the end'} "
            f"(fraction {fraction}); too few to train"
        )
    rows = np.flatnonzero(np.isin(ds.sample, samples))
    out = ds.rows(rows)
    man = dict(m)
    man.update(
        {
            "n_examples": int(len(rows)),
            "n_samples": int(len(samples)),
            "sample_start_min": int(starts.min()),
            "sample_start_max": int(starts.max()),
            "sample_start_min_iso": iso(starts.min()),
            "sample_start_max_iso": iso(starts.max()),
            "data_end": iso(int(starts.max()) + span_s),
        }
    )
    out.manifest = man
    info = {
        "until": iso(until) if until is not None else None,
        "fraction": fraction,
        "n_samples": int(len(samples)),
        "n_examples": int(len(rows)),
        "of_n_samples": int(len(first_row)),
    }
    return out, info
