"""The submit rules a service keeper calibrates on sample outputs, and the measures its chains are
judged by: a sample output's probes (:class:`Probes`), avg-cal's threshold (:func:`calibrate_avg`),
guarantee-cal's margin by split conformal calibration (:func:`calibrate_conformal`), the objective
(:func:`per_sample_objective`), the interrupted share with its interval and a paired difference's
verdict.

The ``keep-service`` step (the ``mirage_service`` DAG's policies avg-cal and guarantee-cal) and its
summary (:mod:`mirage_tasks.slurm.keeper_stats`) use them; the probe-replay evaluation
(``lab/evaluation/probe_replay.py``, the research protocol that scores every rule on stored
samples) imports them from here, so the keeper and the evaluation calibrate a rule the same way.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError, storage

from ..data.artifacts import PROBES_FILE, SHARD_FILE
from ..models.thresholds import calibrate, calibrate_load_aware, outcomes

#: guarantee-cal's level: at most this share of the calibration samples' links interrupted
GUARANTEE_LEVEL = 0.10
INTERRUPTED_H = 1 / 60  # a successor starting over a minute after its predecessor's end interrupts the service


class Probes:
    """One sample output: the arrays of ``shard.npz`` and its ``probes.parquet``, rows grouped by
    sample and ordered by probe time (as ``sample`` writes them)."""

    def __init__(self, uri: str, with_x: bool = True):
        with np.load(io.BytesIO(storage.read_bytes(storage.join(uri, SHARD_FILE))), allow_pickle=False) as z:
            self.X = z["X"] if with_x else None
            self.X_last = z["X"][:, -1:, :] if not with_x else self.X[:, -1:, :]
            self.y = z["y"].astype(np.float64)
            self.sample = z["sample"].astype(np.int64)
            self.sample_start = z["sample_start"].astype(np.int64)
            self.probe_time = z["probe_time"].astype(np.int64)
        meta = pd.read_parquet(io.BytesIO(storage.read_bytes(storage.join(uri, PROBES_FILE))))
        if len(meta) != len(self.y) or not (
            np.array_equal(meta["sample"].to_numpy(), self.sample)
            and np.array_equal(meta["probe_time"].to_numpy(), self.probe_time)
        ):
            raise StepError(f"{uri}: {PROBES_FILE} and {SHARD_FILE} do not list the same probes in the same order")
        order = np.lexsort((self.probe_time, self.sample))
        if not np.array_equal(order, np.arange(len(order))):
            raise StepError(f"{uri}: rows are not grouped by sample and ordered by probe time")
        self.meta = meta
        self.uri = uri

    def avg_score(self) -> np.ndarray:
        """Recent mean wait at the predecessor's start minus the time left to its pre-simulated end (h)."""
        m = self.meta
        left = (m["pred_end_without_succ"].to_numpy(np.float64) - m["probe_time"].to_numpy(np.float64)) / 3600.0
        return m["avg_wait_at_pred_start_s"].to_numpy(np.float64) / 3600.0 - left

    def time_left_h(self) -> np.ndarray:
        m = self.meta
        return (m["pred_end_without_succ"].to_numpy(np.float64) - m["probe_time"].to_numpy(np.float64)) / 3600.0

    def has_waitpred(self) -> bool:
        """Whether the sample was drawn with ``--waitpred`` (the predictor's answer at each probe)."""
        return "wp_wait_s" in self.meta.columns

    def wait_pred_score(self) -> np.ndarray:
        """The predicted wait at the probe minus the time left to the predecessor's end (h): >= 0 when
        the predicted start falls at or after the end (waiting longer would predict a gap)."""
        return self.meta["wp_wait_s"].to_numpy(np.float64) / 3600.0 - self.time_left_h()

    def guarantee_score(self) -> np.ndarray:
        """The bound at the probe minus the time left at the sample's next probe (h): >= 0 when waiting
        for the next decision would leave less slack than the bound; -inf at a sample's last probe
        (the predecessor's end: the rule submits there anyway)."""
        left = self.time_left_h()
        nxt = np.r_[left[1:], -np.inf]
        last = np.r_[self.sample[1:] != self.sample[:-1], True]
        out = self.meta["wp_bound_s"].to_numpy(np.float64) / 3600.0 - nxt
        out[last] = -np.inf
        return out

    def rows(self, mask: np.ndarray) -> Probes:
        out = object.__new__(Probes)
        out.X = self.X[mask] if self.X is not None else None
        out.X_last = self.X_last[mask]
        for k in ("y", "sample", "sample_start", "probe_time"):
            setattr(out, k, getattr(self, k)[mask])
        out.meta = self.meta[mask].reset_index(drop=True)
        out.uri = self.uri
        return out


def sample_spans(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.flatnonzero(np.r_[True, sample[1:] != sample[:-1]])
    return starts, np.r_[starts[1:], len(sample)] - 1


def per_sample_objective(signed: np.ndarray, node: int, w: float) -> np.ndarray:
    return np.maximum(signed, 0.0) + w * node * np.maximum(-signed, 0.0)


def calibrate_avg(train: Probes, node: int, w: float, load: bool) -> dict[str, Any]:
    """avg's threshold (offset, h) on the training split: fixed, or load-aware."""
    s = train.avg_score()
    if load:
        from ..sim.features import FEATURE_NAMES

        return calibrate_load_aware(
            s, train.y, train.sample, train.X_last, FEATURE_NAMES, node, waste_weight=w, default=0.0
        )
    return calibrate(s, train.y, train.sample, node, waste_weight=w, default=0.0)


def calibrate_conformal(
    score: np.ndarray, y: np.ndarray, sample: np.ndarray, level: float = GUARANTEE_LEVEL, tol_h: float | None = None
) -> dict[str, Any]:
    """The largest threshold whose rule (submit at the first probe with ``score >= threshold``, else the
    last) keeps the chance of interrupting a new sample at or below ``level``, by split conformal
    calibration on these samples (the validation split).

    The candidate thresholds are the scores' own distinct finite values (where a rule's choice of probe
    can change) and inf (never early, as reactive). Each sample's conformity score is the highest
    candidate up to which every lower candidate's rule leaves it uninterrupted (a successor starting at most ``tol_h`` after the end,
    :data:`INTERRUPTED_H`); a lower threshold submits no later, so it is safe at any threshold not
    above its score. The rule's threshold is the ``k``-th smallest score, ``k = floor(level (n + 1))``:
    for a new sample exchangeable with the ``n`` calibration samples, P(its score < that) <= k / (n + 1)
    <= level. Exchangeability is the assumption a month that differs from the validation split breaks;
    the scored months' realised rate with its interval is what shows whether it held.

    Returns ``threshold`` (h; inf: never early, as reactive; the lowest candidate, flagged
    ``attainable: False``, when even it leaves more than ``level`` interrupted), the realised rate and
    waste on these samples and the inputs."""
    tol = INTERRUPTED_H if tol_h is None else tol_h
    cands, signed, runs = safe_runs(score, y, sample, tol)
    idx, attainable = level_index(cands, runs, level)
    at = signed[idx]
    return {
        "threshold": float(cands[idx]),
        "level": level,
        "n_samples": int(len(runs)),
        "k": int(np.floor(level * (len(runs) + 1))),
        "attainable": attainable,
        "validation_interrupted": float((at > tol).mean()),
        "validation_mean_wasted_h": float(np.maximum(-at, 0).mean()),
        "candidates": len(cands),
        "method": "split conformal on the validation split: the k-th smallest per-sample safe threshold, "
        "k = floor(level (n + 1))",
    }


def safe_runs(
    score: np.ndarray, y: np.ndarray, sample: np.ndarray, tol: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(candidate thresholds ascending, the signed outcome of each candidate's rule per sample
    [candidate, sample], the per-sample count of lowest candidates all safe, sorted)."""
    fin = np.asarray(score, np.float64)
    cands = np.r_[np.unique(fin[np.isfinite(fin)]), np.inf]  # inf: never early (reactive)
    signed = np.stack([outcomes(score, y, sample, float(t)) for t in cands])
    safe_run = np.cumprod(signed <= tol, axis=0).sum(axis=0)
    return cands, signed, np.sort(safe_run)


def level_index(cands: np.ndarray, runs: np.ndarray, level: float) -> tuple[int, bool]:
    """(the index of the candidate split conformal calibration picks at ``level``, whether the level
    is attainable): below one sample's worth of level the most conservative candidate (the lowest),
    at a level of 1 or more never early (inf)."""
    n = len(runs)
    k = int(np.floor(level * (n + 1)))
    if k < 1:
        return 0, False
    if k > n:
        return len(cands) - 1, True
    idx = int(runs[k - 1]) - 1
    return max(idx, 0), idx >= 0


def interrupted_share(signed: np.ndarray, threshold_h: float = INTERRUPTED_H) -> dict[str, float]:
    """The share of samples interrupted (more than ``threshold_h``, :data:`INTERRUPTED_H` by default)
    with its Clopper-Pearson 95 % interval (scipy's exact binomial interval)."""
    from scipy.stats import binomtest

    k, n = int((np.asarray(signed) > threshold_h).sum()), int(len(signed))
    if n == 0:
        return {"interrupted_share": float("nan"), "interrupted_lo": float("nan"), "interrupted_hi": float("nan")}
    ci = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return {"interrupted_share": k / n, "interrupted_lo": float(ci.low), "interrupted_hi": float(ci.high)}


def verdict(lo: float | None, hi: float | None) -> str:
    if lo is None or hi is None:
        return "no interval"
    if hi < 0:
        return "better"
    if lo > 0:
        return "worse"
    return "no difference shown"
