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
node-hour in hours of service interruption. Ties go to the rule that submits latest ("never
submit early" first; protocol v2, ``docs/results/protocol-v2.md``), and the default rule (-0.5 h
for regressors, 0.5 for policies) is kept only when it does strictly better than that
(``kept_default``): with few probes (the uniform spacing's are 8 h apart) many thresholds tie
offline while acting differently online, and a tie is no evidence for submitting early. (Up to
calibration version 3, protocol v1's results, a tie went to the threshold that wastes less and
then the lowest, and the default was kept on a tie.)

:func:`calibrate_load_aware` (what ``train`` runs) adds a threshold that moves with the load at
the decision, chosen on the same split by the same objective; see the section below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where used: the train step's parser imports WASTE_WEIGHT
    import numpy as np

# One wasted node-hour costs as much as 6 minutes of service interruption: an 8-node
# successor that overlaps one hour (8 node-hours) costs 0.8 h, a 1-node one 0.1 h.
WASTE_WEIGHT = 0.1
GRID = 121  # candidate thresholds (score quantiles) besides "never submit early"
CALIBRATION_VERSION = 4  # in the train step's parameters: a model calibrated by older rules is retrained (3: load-aware; 4: ties toward never early)


def outcomes(score: np.ndarray, y: np.ndarray, sample: np.ndarray, threshold: float) -> np.ndarray:
    """Signed interruption per sample when submitting at the first probe with score >= threshold.

    Rows must be grouped by sample and ordered by probe time inside a sample (as
    :func:`mirage_tasks.models.datasets.load_dataset` returns them)."""
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
    return {
        "mean_interruption_h": float(gap.mean()),
        "mean_wasted_node_h": float(node * ovl.mean()),
        "zero_share": float((signed <= 0).mean()),
        "objective": float(gap.mean() + waste_weight * node * ovl.mean()),
    }


def calibrate(
    score: np.ndarray,
    y: np.ndarray,
    sample: np.ndarray,
    node: int,
    *,
    waste_weight: float = WASTE_WEIGHT,
    default: float | None = None,
    grid: int = GRID,
    candidates: Any = None,
) -> dict[str, Any]:
    """The threshold minimising the objective on these rows, with what it and ``default`` score;
    the candidates are ``grid`` quantiles of the score, or the fixed ``candidates`` given."""
    import numpy as np

    score = np.asarray(score, np.float64)
    y = np.asarray(y, np.float64)
    if len(score) == 0:
        raise ValueError("no rows to calibrate on")
    cands = (
        np.unique(np.asarray(candidates, np.float64))
        if candidates is not None
        else np.unique(np.quantile(score, np.linspace(0.0, 1.0, grid)))
    )
    # from "never submit before the predecessor ends" (inf, reactive) down to the lowest
    # threshold, a candidate replacing the best only when strictly better: a tie keeps the rule
    # that submits latest (protocol v2: a tie is no evidence for submitting early)
    cands = np.r_[np.inf, cands[::-1]]
    best: dict[str, Any] | None = None
    for t in cands:
        o = objective(outcomes(score, y, sample, t), node, waste_weight)
        if best is None or round(o["objective"], 9) < round(best["objective"], 9):
            best = {"threshold": float(t), **o}
    assert best is not None
    kept_default = False
    if default is not None:
        d = objective(outcomes(score, y, sample, default), node, waste_weight)
        # the default rule only when it does strictly better on these probes (the probes are
        # sparse: thresholds that tie here can still differ online, and a tie gives no reason to
        # submit earlier than the best)
        if round(d["objective"], 9) < round(best["objective"], 9):
            best = {"threshold": float(default), **d}
            kept_default = True
    out: dict[str, Any] = {
        "threshold": best["threshold"] if np.isfinite(best["threshold"]) else None,
        "never_submits_early": not np.isfinite(best["threshold"]),
        "kept_default": kept_default,
        "waste_weight": float(waste_weight),
        "node": int(node),
        "n_samples": int(len(np.unique(sample))),
        "n_rows": int(len(score)),
        "n_candidates": int(len(cands)),
        "chosen": {k: best[k] for k in ("objective", "mean_interruption_h", "mean_wasted_node_h", "zero_share")},
        "reactive": objective(outcomes(score, y, sample, np.inf), node, waste_weight),
        "method": "first probe with score >= threshold, else the last probe (the predecessor's end), "
        "on the training period's validation split",
    }
    if default is not None:
        out["default_threshold"] = float(default)
        out["default"] = objective(outcomes(score, y, sample, default), node, waste_weight)
    return out


# ----------------------------------------------------------------------------- load-aware rule
#
# A fixed threshold calibrated on a quiet split submits too late in a busy month and too
# early in a quiet one. The load-aware rule moves the threshold with the load seen in the
# decision's own history (its last snapshot, so offline probes and online decisions read
# the very same numbers):
#
#     submit  <=>  score - slope x z  >=  threshold,     z = (load - center) / scale
#
# ``load`` is one of :data:`LOAD_FEATURES`; ``center``/``scale`` are the mean/std of that
# load over the split's probes, and z is clipped to the range the split showed (``z_min``,
# ``z_max``: a month busier or quieter than anything in the split gets the rule's edge, not an
# extrapolation); ``slope`` is ``beta x std(score)`` for ``beta`` in
# :data:`LOAD_BETAS` (a negative slope lowers the threshold, i.e. submits earlier, when the
# queue is long). For every (load, beta) the threshold is calibrated exactly as the fixed
# one (:func:`calibrate` on the adjusted score); the fixed rule (slope 0, the default kept on
# ties) stays unless a load-aware one lowers the objective on the split. Everything is
# chosen on the training period's validation split; nothing of the validation month.

#: load at the decision, from the last snapshot of the history: name -> (meaning, feature names
#: it reads, in order); the columns are resolved from the dataset's feature names at calibration
#: and stored with the rule (``load.columns``)
LOAD_FEATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    # backlog in cluster widths: nodes requested by pending jobs / configured nodes
    "queue_nodes": ("pending_nodes / cluster_nodes", ("pending_nodes", "cluster_nodes")),
    # how long the running jobs waited (median, hours, log1p): the recent wait avg follows
    "running_wait": ("log1p(running_wait_p50 / 3600 s)", ("running_wait_s_p50",)),
}
LOAD_BETAS = (-1.0, -0.5, -0.25, -0.1, 0.1, 0.25, 0.5, 1.0)


def load_columns(feature: str, feature_names: list[str]) -> list[int] | None:
    """The history columns ``feature`` reads, or None when the layout lacks one of them."""
    if feature not in LOAD_FEATURES:
        raise ValueError(f"unknown load feature {feature!r} (known: {sorted(LOAD_FEATURES)})")
    names = LOAD_FEATURES[feature][1]
    if not all(n in feature_names for n in names):
        return None
    return [list(feature_names).index(n) for n in names]


def load_values(X: np.ndarray, feature: str, columns: list[int]) -> np.ndarray:
    """The load ``feature`` of each history ``X`` [n, W, F] (or one [W, F]), float64 [n], read from
    ``columns`` (:func:`load_columns`) of the last snapshot."""
    import numpy as np

    X = np.asarray(X, np.float32)  # the dataset stores float32: online histories are read the same way
    if X.ndim == 2:
        X = X[None]
    last = X[:, -1, :].astype(np.float64)
    if feature == "queue_nodes":
        return last[:, columns[0]] / np.maximum(last[:, columns[1]], 1.0)
    if feature == "running_wait":
        return np.log1p(np.maximum(last[:, columns[0]], 0.0) / 3600.0)
    raise ValueError(f"unknown load feature {feature!r} (known: {sorted(LOAD_FEATURES)})")


def adjusted_score(score: np.ndarray, X: np.ndarray, load: dict[str, Any] | None) -> np.ndarray:
    """``score - slope x z`` (float64), compared with the threshold offline and online; ``score`` unchanged
    (as float64) without a load rule."""
    import numpy as np

    s = np.asarray(score, np.float64)
    if not load:
        return s
    z = (load_values(X, load["feature"], load["columns"]) - float(load["center"])) / float(load["scale"])
    if load.get("z_min") is not None:  # no extrapolation beyond the loads the split showed
        z = np.clip(z, float(load["z_min"]), float(load["z_max"]))
    return s - float(load["slope"]) * z


def submit_mask(score: np.ndarray, X: np.ndarray, threshold: float | None, load: dict[str, Any] | None) -> np.ndarray:
    """The calibrated decision: submit where ``adjusted_score >= threshold``; never when ``threshold`` is None."""
    import numpy as np

    s = np.asarray(score, np.float64)
    if threshold is None:
        return np.zeros(s.shape, bool)
    return adjusted_score(s, X, load) >= float(threshold)


def calibrate_load_aware(
    score: np.ndarray,
    y: np.ndarray,
    sample: np.ndarray,
    X_last: np.ndarray,
    feature_names: list[str],
    node: int,
    *,
    waste_weight: float = WASTE_WEIGHT,
    default: float | None = None,
    grid: int = GRID,
    features: tuple[str, ...] | None = None,
    betas: tuple[float, ...] = LOAD_BETAS,
) -> dict[str, Any]:
    """:func:`calibrate` plus the load-aware search; ``X_last`` holds each row's history (at least its last
    snapshot, [n, 1, F] is enough). Returns the calibration dict with ``load`` (None: the fixed rule won)
    and ``fixed`` (what the fixed rule alone chose) and ``load_search`` (each candidate's objective)."""
    import numpy as np

    score = np.asarray(score, np.float64)
    fixed = calibrate(score, y, sample, node, waste_weight=waste_weight, default=default, grid=grid)
    best, best_obj = fixed, round(fixed["chosen"]["objective"], 9)
    best_load: dict[str, Any] | None = None
    sd = float(np.std(score))
    search = []
    for feat in features or tuple(LOAD_FEATURES):
        cols = load_columns(feat, feature_names)
        if cols is None:
            search.append({"feature": feat, "skipped": f"the features lack {LOAD_FEATURES[feat][1]}"})
            continue
        v = load_values(X_last, feat, cols)
        center, scale = float(v.mean()), float(v.std())
        if not (scale > 0 and sd > 0):
            search.append({"feature": feat, "skipped": "constant load or score on the split"})
            continue
        for beta in betas:
            load = {
                "feature": feat,
                "columns": cols,
                "center": center,
                "scale": scale,
                "slope": float(beta) * sd,
                "beta": float(beta),
                "z_min": float((v.min() - center) / scale),
                "z_max": float((v.max() - center) / scale),
            }
            c = calibrate(adjusted_score(score, X_last, load), y, sample, node, waste_weight=waste_weight, grid=grid)
            obj = round(c["chosen"]["objective"], 9)
            search.append({"feature": feat, "beta": float(beta), "threshold": c["threshold"], "objective": obj})
            # strictly better only (the fixed rule wins ties); a never-submit choice ignores the load
            if c["threshold"] is not None and obj < best_obj:
                best, best_obj, best_load = c, obj, load
    out = dict(best)
    out.update(
        {
            "load": best_load,
            "fixed": {"threshold": fixed["threshold"], "kept_default": fixed["kept_default"], **fixed["chosen"]},
            "load_search": search,
            "load_features": {k: LOAD_FEATURES[k][0] for k in (features or LOAD_FEATURES)},
            "method": "submit at the first probe with score - slope x z(load) >= threshold, else the last probe, "
            "on the training period's validation split (slope 0: the fixed threshold)",
        }
    )
    if best_load is not None:  # the default's figures describe the fixed default rule, kept for the report
        out["kept_default"] = False
    if default is not None:
        out["default_threshold"] = fixed.get("default_threshold")
        out["default"] = fixed.get("default")
    return out
