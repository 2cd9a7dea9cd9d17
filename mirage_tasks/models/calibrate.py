"""Decision thresholds chosen on the training period's own validation split, never on the
validation month.

Every model answers a score per history: a regressor the predicted signed interruption
(hours; a quantile model its quantile), a policy P(submit). Online, the successor is
submitted at the first decision whose score is ``>= threshold`` and forced when the
predecessor ends. The dataset's probes replay exactly that offline: each sample holds
probes at increasing times from the predecessor's submission to its end (the last probe
*is* the forced submission), each labelled with the signed interruption it produced in
the simulator. For a threshold, a sample's outcome is the label of its first probe whose
score reaches the threshold, else of its last probe. No extra simulation is needed; the
probes are coarser than the online decisions (one every 10 minutes): 7 per 48 h with the
reference's uniform spacing, 9 with ``sample --probe-spacing end`` (most in the predecessor's
last hours), so the calibrated value is an approximation of the online optimum. Samples may
hold different numbers of probes (the end spacing drops probes before the predecessor's
submission): only the grouping by sample and the order inside a sample matter.

The objective, minimised over a grid of candidate thresholds (quantiles of the scores,
plus "never submit early"):

    mean interruption (h) + waste_weight x mean wasted node-hours (node x overlap)

``waste_weight`` (:data:`WASTE_WEIGHT`, the ``train --waste-weight`` flag) prices one wasted
node-hour in hours of service interruption. Ties go to the threshold that wastes less, and
the default rule (-0.5 h for regressors, 0.5 for policies) is kept when nothing does
better than it on the probes (``kept_default``): with few probes (the uniform spacing's are
8 h apart) many thresholds tie offline while acting differently online, and a tie is no
evidence to move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where used: the train step's parser imports WASTE_WEIGHT
    import numpy as np

# One wasted node-hour costs as much as 6 minutes of service interruption: an 8-node
# successor that overlaps one hour (8 node-hours) costs 0.8 h, a 1-node one 0.1 h.
WASTE_WEIGHT = 0.1
GRID = 121  # candidate thresholds (score quantiles) besides "never submit early"
CALIBRATION_VERSION = 2  # in the train step's parameters: a model calibrated by older rules is retrained


def outcomes(score: np.ndarray, y: np.ndarray, sample: np.ndarray, threshold: float) -> np.ndarray:
    """Signed interruption per sample when submitting at the first probe with score >= threshold.

    Rows must be grouped by sample and ordered by probe time inside a sample (as
    :func:`mirage_tasks.models.data.load_dataset` returns them)."""
    import numpy as np

    starts = np.flatnonzero(np.r_[True, sample[1:] != sample[:-1]])
    ends = np.r_[starts[1:], len(sample)] - 1
    idx = np.arange(len(sample))
    hit = np.where(score >= threshold, idx, len(sample))
    first = np.minimum.reduceat(hit, starts)
    chosen = np.where(first < len(sample), first, ends)
    return y[chosen]


def objective(signed: np.ndarray, node: int, waste_weight: float) -> dict[str, float]:
    import numpy as np

    gap = np.maximum(signed, 0.0)
    ovl = np.maximum(-signed, 0.0)
    return {"mean_interruption_h": float(gap.mean()), "mean_wasted_node_h": float(node * ovl.mean()),
            "zero_share": float((signed <= 0).mean()),
            "objective": float(gap.mean() + waste_weight * node * ovl.mean())}


def calibrate(score: np.ndarray, y: np.ndarray, sample: np.ndarray, node: int, *,
              waste_weight: float = WASTE_WEIGHT, default: float | None = None,
              grid: int = GRID) -> dict[str, Any]:
    """The threshold minimising the objective on these rows, with what it and ``default`` score."""
    import numpy as np

    score = np.asarray(score, np.float64)
    y = np.asarray(y, np.float64)
    if len(score) == 0:
        raise ValueError("no rows to calibrate on")
    cands = np.unique(np.quantile(score, np.linspace(0.0, 1.0, grid)))
    cands = np.r_[cands, np.inf]  # inf: never submit before the predecessor ends (reactive)
    best: dict[str, Any] | None = None
    for t in cands:
        o = objective(outcomes(score, y, sample, t), node, waste_weight)
        key = (round(o["objective"], 9), o["mean_wasted_node_h"])
        if best is None or key < best["_key"]:
            best = {"_key": key, "threshold": float(t), **o}
    assert best is not None
    best.pop("_key")
    kept_default = False
    if default is not None:
        d = objective(outcomes(score, y, sample, default), node, waste_weight)
        # no evidence against the default rule on these probes: keep it (the probes are sparse, so
        # thresholds that tie here can still differ online; the tie gives no reason to move)
        if round(d["objective"], 9) <= round(best["objective"], 9):
            best = {"threshold": float(default), **d}
            kept_default = True
    out: dict[str, Any] = {
        "threshold": best["threshold"] if np.isfinite(best["threshold"]) else None,
        "never_submits_early": not np.isfinite(best["threshold"]),
        "kept_default": kept_default,
        "waste_weight": float(waste_weight), "node": int(node),
        "n_samples": int(len(np.unique(sample))), "n_rows": int(len(score)), "n_candidates": int(len(cands)),
        "chosen": {k: best[k] for k in ("objective", "mean_interruption_h", "mean_wasted_node_h", "zero_share")},
        "reactive": objective(outcomes(score, y, sample, np.inf), node, waste_weight),
        "method": "first probe with score >= threshold, else the last probe (the predecessor's end), "
                  "on the training period's validation split",
    }
    if default is not None:
        out["default_threshold"] = float(default)
        out["default"] = objective(outcomes(score, y, sample, default), node, waste_weight)
    return out
