"""Synthetic datasets and a toy environment with a known, learnable signal (tests and benchmarks).

Histories follow the 42-feature layout of the ``merge`` datasets (raw units: counts,
node sums, minutes, seconds). A latent queue load drifts slowly from sample to sample;
the successor's wait grows with the load seen in the pending-queue features, and the
predecessor's remaining time is readable from its elapsed-time feature, so

    interruption_h = WAIT_PER_LOAD_H * load  -  (48 h - predecessor elapsed)  + noise

is predictable from the history while a constant predictor is poor. Nothing here is
used to train real models.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from ..data.times import iso
from .datasets import write_dataset

STEP_S = 600
PRED_LIMIT_H = 48.0
WAIT_PER_LOAD_H = 1.5

FEATURE_NAMES = (
    ["pending_count", "pending_nodes"]
    + [f"pending_limit_min_p{q}" for q in (0, 25, 50, 75, 100)]
    + [f"pending_waited_s_p{q}" for q in (0, 25, 50, 75, 100)]
    + [f"pending_runtime_s_p{q}" for q in (0, 25, 50, 75, 100)]
    + ["running_count", "running_nodes"]
    + [f"running_limit_min_p{q}" for q in (0, 25, 50, 75, 100)]
    + [f"running_wait_s_p{q}" for q in (0, 25, 50, 75, 100)]
    + [f"running_elapsed_s_p{q}" for q in (0, 25, 50, 75, 100)]
    + ["pred_limit_min", "pred_nodes", "pred_wait_s", "pred_elapsed_s"]
    + ["succ_limit_min", "succ_nodes", "succ_wait_s", "succ_elapsed_s"]
)
assert len(FEATURE_NAMES) == 42

_PCT = np.array([0.1, 0.5, 1.0, 2.0, 4.0], np.float32)


def histories(load: np.ndarray, pred_elapsed_last_s: np.ndarray, rng: np.random.Generator, node: int = 1) -> np.ndarray:
    """Raw histories float32 [n, W, 42] from the latent load [n, W] and the predecessor's elapsed time now."""
    n, W = load.shape
    X = np.zeros((n, W, 42), np.float32)
    noise = lambda *shape: rng.normal(1.0, 0.05, size=shape).astype(np.float32)  # noqa: E731
    L = np.maximum(load, 0.0).astype(np.float32)
    X[:, :, 0] = np.round(L * 10 * noise(n, W))
    X[:, :, 1] = X[:, :, 0] * 2
    X[:, :, 2:7] = np.array([30, 120, 600, 1440, 2880], np.float32) * noise(n, W, 5)
    X[:, :, 7:12] = L[..., None] * 3600 * _PCT * noise(n, W, 5)
    X[:, :, 17] = np.round(50 * noise(n, W))
    X[:, :, 18] = 80
    X[:, :, 19:24] = np.array([60, 240, 720, 1440, 2880], np.float32) * noise(n, W, 5)
    X[:, :, 24:29] = L[..., None] * 1800 * _PCT * noise(n, W, 5)
    X[:, :, 29:34] = np.array([600, 3600, 14400, 43200, 100000], np.float32) * noise(n, W, 5)
    back = (W - 1 - np.arange(W, dtype=np.float32)) * STEP_S
    elapsed = np.maximum(pred_elapsed_last_s[:, None].astype(np.float32) - back, 0.0)
    running = elapsed > 0
    X[:, :, 34] = PRED_LIMIT_H * 60 * running
    X[:, :, 35] = node * running
    X[:, :, 36] = 1800.0 * running
    X[:, :, 37] = elapsed
    return X


def _load_paths(levels: np.ndarray, W: int, rng: np.random.Generator) -> np.ndarray:
    t = np.arange(W, dtype=np.float32) / W
    phase = rng.uniform(0, 2 * np.pi, size=(len(levels), 1))
    wiggle = 0.15 * np.sin(2 * np.pi * t[None] + phase)
    return np.maximum(levels[:, None] * (1 + wiggle), 0.0).astype(np.float32)


def make_dataset(
    n_samples: int = 60,
    probes: int = 7,
    window: int = 144,
    seed: int = 0,
    node: int = 1,
    noise_h: float = 0.5,
    start: str = "2022-11-01T00:00:00+00:00",
) -> dict[str, Any]:
    """Arrays and manifest of a synthetic dataset (samples every 4 h, ``probes`` per sample)."""
    rng = np.random.default_rng(seed)
    t0 = int(dt.datetime.fromisoformat(start).timestamp())
    level = np.clip(1.5 + np.cumsum(rng.normal(0, 0.25, n_samples)), 0.1, 6.0)  # slow drift across samples
    sample = np.repeat(np.arange(n_samples, dtype=np.int64), probes)
    sample_start = t0 + sample * 4 * 3600
    probe_idx = np.tile(np.arange(probes), n_samples)
    pred_start = sample_start + 2 * 86400
    offsets = 60 + probe_idx * ((PRED_LIMIT_H * 3600 - 60) / max(probes - 1, 1))
    probe_time = (pred_start + offsets).astype(np.int64)
    elapsed = (probe_time - pred_start).astype(np.float32)
    lv = level[sample] * rng.uniform(0.8, 1.2, size=len(sample))
    load = _load_paths(lv, window, rng)
    X = histories(load, elapsed, rng, node)
    recent = load[:, -6:].mean(1)
    y = WAIT_PER_LOAD_H * recent - (PRED_LIMIT_H - elapsed / 3600) + rng.normal(0, noise_h, len(sample))
    n = len(sample)
    manifest = {
        "feature_names": FEATURE_NAMES,
        "window": window,
        "step_s": STEP_S,
        "n_examples": n,
        "n_samples": n_samples,
        "node": node,
        "sample_start_min": int(sample_start.min()),
        "sample_start_max": int(sample_start.max()),
        "sample_start_min_iso": iso(sample_start.min()),
        "sample_start_max_iso": iso(sample_start.max()),
        "data_end": iso(sample_start.max() + 5 * 86400),
        "trace_fingerprint": f"synthetic-seed{seed}",
        "probes": probes,
        "synthetic": True,
    }
    return {
        "X": X,
        "y": y.astype(np.float32),
        "sample": sample,
        "sample_start": sample_start,
        "probe_time": probe_time,
        "node": np.full(n, node, np.int64),
        "manifest": manifest,
    }


def write_synthetic_dataset(uri: str, **kw: Any) -> dict[str, Any]:
    d = make_dataset(**kw)
    write_dataset(uri, d["X"], d["y"], d["sample"], d["sample_start"], d["probe_time"], d["node"], d["manifest"])
    return d["manifest"]


class ToyQueueEnv:
    """A tiny :class:`~.env.Env`: the successor waits ``WAIT_PER_LOAD_H * load`` once submitted.

    Each episode draws a load (hence the successor's wait) and the predecessor's remaining
    time (``remaining_h`` range); every step advances 10 minutes. Submitting when the
    remaining time equals the wait gives zero interruption; once the predecessor has
    ended, submission is forced. Observations are histories in the dataset layout.
    """

    def __init__(
        self,
        window: int = 144,
        remaining_h: tuple[float, float] = (0.5, 5.0),
        load: tuple[float, float] = (0.2, 2.5),
        node: int = 1,
    ):
        self.window, self.remaining_h, self.load_range, self.node = window, remaining_h, load, node
        self._rng: np.random.Generator | None = None

    def copy(self) -> ToyQueueEnv:
        return ToyQueueEnv(self.window, self.remaining_h, self.load_range, self.node)

    def _obs(self) -> np.ndarray:
        assert self._rng is not None
        elapsed = np.array([(PRED_LIMIT_H * 60 - self.remaining_min) * 60.0], np.float32)
        load = np.full((1, self.window), self.load, np.float32)
        return histories(load, elapsed, self._rng, self.node)[0]

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        self._rng = rng
        self.load = float(rng.uniform(*self.load_range))
        self.wait_min = WAIT_PER_LOAD_H * self.load * 60
        self.remaining_min = float(np.round(rng.uniform(*self.remaining_h) * 6) * 10)
        return self._obs()

    def step(self, submit: bool) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        forced = self.remaining_min <= 0
        if forced or submit:
            interruption = self.wait_min - self.remaining_min
            return self._obs(), -abs(interruption), True, {"forced": forced, "interruption_min": interruption}
        self.remaining_min -= STEP_S / 60
        return self._obs(), 0.0, False, {"forced": False}
