"""Probe-replay evaluation with fair baselines (``docs/results/protocol.md``).

    python -m lab.evaluation.probe_replay --train-samples S_TRAIN --dataset DS --score-samples S_SCORE \\
        --months 1997-01 1997-02 1997-03 --models M1 M2 --out URI [--bootstrap 2000] [--seed 0]

Every method is a *score* at each probe of a sample and a *threshold*: the successor is submitted
at the first probe whose score reaches the threshold, else at the predecessor's end (the last
probe), and the outcome is that probe's simulated signed interruption
(:func:`mirage_tasks.models.thresholds.outcomes`, the replay the models' thresholds are calibrated
by). Methods:

* ``reactive``: always the last probe;
* ``avg``: score = the recent mean wait at the predecessor's start - the time left to the
  predecessor's (pre-simulated) end, threshold 0 (the reference's rule);
* ``avg-cal``: the same score, threshold chosen by :func:`~mirage_tasks.models.thresholds.calibrate`
  on the training samples' chronological validation split (the split the models' thresholds are
  chosen on: the same fraction and purge as the first model's config), same objective and grid;
* ``avg-load``: the same with :func:`~mirage_tasks.models.thresholds.calibrate_load_aware` (a
  threshold that moves with the load, as the learned rules may);
* each trained model (``--models``): its predictions and its own calibrated rule (``decision`` in
  its config.json), named by its kind; one trained on ``merge --waitpred-features`` (the wait
  predictor's answer as four more channels) is ``<kind>-wp`` (protocol v2's ``xgboost-wp``) and
  gets the same channels from the scored probes' answers;
* with samples drawn by ``sample --waitpred`` (protocol v2, both the training and the scored ones):
  ``wait-pred`` (score = the predictor's wait for the successor submitted at the probe minus the
  time left, threshold 0), ``wait-pred-cal`` (the same, its margin chosen on the validation split
  among :data:`WAIT_PRED_MARGINS_H`, ties toward never early) and ``guarantee-10`` (the predictor's
  90 % bound minus the time left at the sample's next probe, threshold 0), ``guarantee-cal`` (the same
  score, its margin by split conformal calibration on the validation split for at most 10 % interrupted,
  :func:`calibrate_conformal`) and ``guarantee-aci`` (that calibration with its level adapted online to
  the outcomes known at each decision, :func:`aci_outcomes`), both added after guarantee-10 broke its
  level and not among protocol v2's primary candidates; and the *primary* rule,
  the one of :data:`PRIMARY_CANDIDATES` present with the least validation objective, recorded
  under ``calibration.primary`` before any scored month is replayed; and ``policy-stop``, the stopping
  policy trained by gradient on the objective (:mod:`lab.evaluation.stopping`);
* ``oracle``: per sample the probe with the least objective (the ceiling of any probe rule);
* ``oracle-wait``: submit at the predecessor's end minus the true wait (the reactive probe's
  interruption): the latest probe at or before that time.

Per scored month: each method's mean interruption, wasted node-hours and objective (interruption +
waste weight x wasted node-hours), the paired difference of the objective to ``avg-cal`` with a
paired bootstrap 95 % interval (and the same against the plain ``avg``), the share of the oracle's gain, and the trade-off curve (mean
interruption against wasted node-hours over the method's threshold). Protocol v2's measures beside
them: the difference to ``reactive`` with its interval and verdict, each difference's bootstrap
two-sided p-value (for :func:`holm` over a family of cells), the oracle share's interval and the
interrupted share (over a minute late) with its Clopper-Pearson interval.

Outputs under ``--out``: ``evaluation.json`` (parameters, calibrations, rows), ``rows.parquet``,
``curves.parquet``, ``per_sample.parquet`` (each method's outcome per sample), then
``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
import zlib
from typing import Any

import numpy as np
import pandas as pd

from mirage_tasks import __version__

# the rules the service keeper calibrates too (keep-service): one definition, in the product
from mirage_tasks.evaluation.rules import (
    GUARANTEE_LEVEL,
    INTERRUPTED_H,
    Probes,
    calibrate_avg,
    calibrate_conformal,
    interrupted_share,
    level_index,
    per_sample_objective,
    safe_runs,
    sample_spans,
    verdict,
)
from mirage_tasks.models.thresholds import WASTE_WEIGHT, adjusted_score, calibrate, outcomes
from mirage_tasks.sim import decision_rules as dr
from stepkit import Step, StepError, storage

from .stopping import fit as fit_stopping

log = logging.getLogger(__name__)

BASELINE_METHODS = ("reactive", "avg", "avg-cal", "avg-load")
ORACLES = ("oracle", "oracle-wait")
REFERENCE = "avg-cal"
SECOND = "avg"  # also reported: the difference to the plain avg rule (the reference's own baseline)
CURVE_POINTS = 41
GUARANTEE = dr.GUARANTEE_SIM  # protocol v2 pre-registered the bound rule under this name
#: guarantee-10's score with a margin chosen by split conformal calibration on the validation split
#: (:func:`calibrate_conformal`), so the stated rate rests on the rule's own outcomes, not on the bound's
GUARANTEE_CAL = dr.GUARANTEE_CAL
#: guarantee-cal with its level adapted to the outcomes seen so far (:func:`aci_outcomes`)
GUARANTEE_ACI = "guarantee-aci"
ACI_GAMMA = 0.05  # the level's step per outcome (fixed before any scoring)
#: bumped when the rules or measures change, so a stored evaluation is recomputed (2: protocol v2's,
#: 3: guarantee-cal, 4: its candidates the scores themselves, 5: guarantee-aci)
RULES_VERSION = 5
POLICY = "policy-stop"  # protocol v2's policy that learns (lab.evaluation.stopping)
#: wait-pred-cal's margins (h): submit when the predicted wait >= time left - m (protocol v2)
WAIT_PRED_MARGINS_H = np.linspace(-6.0, 6.0, 121)
#: protocol v2's primary rule is the one of these with the least validation objective (ties: first)
PRIMARY_CANDIDATES = ("xgboost", "xgboost-wp", "wait-pred-cal", GUARANTEE)


def oracle_outcomes(y: np.ndarray, sample: np.ndarray, node: int, w: float) -> np.ndarray:
    """Per sample, the probe label with the least objective."""
    starts, _ = sample_spans(sample)
    j = per_sample_objective(y, node, w)
    best = np.minimum.reduceat(j, starts)
    out = np.empty(len(starts))
    for i, (a, b) in enumerate(zip(starts, np.r_[starts[1:], len(y)])):
        out[i] = y[a:b][np.flatnonzero(j[a:b] == best[i])[-1]]  # ties: the latest probe (least waste)
    return out


def oracle_wait_outcomes(y: np.ndarray, sample: np.ndarray, left_h: np.ndarray) -> np.ndarray:
    """Submit at the end minus the true wait W (the last probe's interruption): the latest probe with
    time left >= W (the first probe when none)."""
    starts, ends = sample_spans(sample)
    out = np.empty(len(starts))
    for i, (a, e) in enumerate(zip(starts, ends)):
        w = max(float(y[e]), 0.0)
        ok = np.flatnonzero(left_h[a : e + 1] >= w - 1e-9)
        out[i] = y[a + (ok[-1] if len(ok) else 0)]
    return out


# ----------------------------------------------------------------------------- methods


def model_scores(uri: str, probes: Probes) -> tuple[np.ndarray, dict[str, Any], str]:
    """The model's prediction at every probe, its decision rule and its name among the rules: its kind,
    ``<kind>-wp`` for one trained with the wait predictor's channels (``merge --waitpred-features``),
    whose histories get the same channels from the probes' answers."""
    from mirage_tasks.calibration import atprobe
    from mirage_tasks.models.loader import load_model, read_config

    cfg = read_config(uri)
    fn = load_model(uri, device="cpu")
    if fn.is_policy:
        raise StepError(f"{uri}: a policy; the probe replay scores regressors")
    wp = atprobe.uses_features(fn.feature_names)
    pred = []
    for i in range(0, len(probes.y), 512):
        X = probes.X[i : i + 512]
        if wp:
            X = atprobe.with_features(X, probes.meta.iloc[i : i + 512], f"{probes.uri} (for {uri})")
        pred.append(np.asarray(fn.predict(X), np.float64))
    return np.concatenate(pred), dict(fn.decision_rule or {}), cfg["kind"] + ("-wp" if wp else "")


def aci_outcomes(
    val: Probes, score: Probes, level: float = GUARANTEE_LEVEL, gamma: float = ACI_GAMMA, tol_h: float | None = None
) -> tuple[dict[int, float], dict[str, Any], dict[int, float]]:
    """guarantee-aci: guarantee-cal's calibration with its level adapted online (adaptive conformal
    inference, Gibbs and Candes 2021): the scored samples in the order of their first decision, each
    submitted by the rule at level ``a``, then ``a += gamma (level - interrupted)`` for every earlier
    sample whose outcome is known by the next sample's first decision (its successor started, or its
    predecessor ended with the successor running). Its long-run interrupted share stays within
    ``(1 + gamma) / (gamma T)`` of ``level`` over ``T`` samples whatever the months do; no outcome from
    after a decision feeds it. Returns ({sample: signed interruption}, a summary of the level's path,
    {sample: the level it was decided at})."""
    tol = INTERRUPTED_H if tol_h is None else tol_h
    cands, _, runs = safe_runs(val.guarantee_score(), val.y, val.sample, tol)
    sc, y = score.guarantee_score(), score.y
    starts, ends = sample_spans(score.sample)
    first_t = score.probe_time[starts].astype(np.float64)
    end_t = score.meta["pred_end_without_succ"].to_numpy(np.float64)[starts]
    a, pending, out, path = level, [], {}, {}
    for i in np.argsort(first_t, kind="stable"):
        known = [p for p in pending if p[0] <= first_t[i]]
        pending = [p for p in pending if p[0] > first_t[i]]
        for _, err in sorted(known):
            a += gamma * (level - err)
        thr = cands[level_index(cands, runs, a)[0]]
        seg = sc[starts[i] : ends[i] + 1]
        hit = np.flatnonzero(seg >= thr)
        s = float(y[starts[i] + (hit[0] if len(hit) else ends[i] - starts[i])])
        out[int(score.sample[starts[i]])] = s
        path[int(score.sample[starts[i]])] = a
        pending.append((end_t[i] + max(s, 0.0) * 3600.0, float(s > tol)))
    lv = list(path.values())
    return (
        out,
        {
            "level": level,
            "gamma": gamma,
            "n_scored": len(out),
            "level_min": float(np.min(lv)),
            "level_max": float(np.max(lv)),
            "level_last": float(lv[-1]),
            "method": "adaptive conformal inference over the scored samples in time order, on guarantee-cal's "
            "validation calibration, updated with outcomes known by each decision",
        },
        path,
    )


def sweep(
    score: np.ndarray, y: np.ndarray, sample: np.ndarray, node: int, w: float, points: int = CURVE_POINTS
) -> pd.DataFrame:
    """The trade-off curve: mean interruption and wasted node-hours over thresholds (score quantiles)."""
    fin = score[np.isfinite(score)]  # -inf: a probe where a rule never submits early (the curve skips it)
    cands = np.r_[np.unique(np.quantile(fin, np.linspace(0, 1, points))) if len(fin) else [], np.inf]
    rows = []
    for t in cands:
        s = outcomes(score, y, sample, t)
        rows.append(
            {
                "threshold": float(t) if np.isfinite(t) else None,
                "mean_interruption_h": float(np.maximum(s, 0).mean()),
                "mean_wasted_node_h": float(node * np.maximum(-s, 0).mean()),
                "objective": float(per_sample_objective(s, node, w).mean()),
            }
        )
    return pd.DataFrame(rows)


def _ci(x: np.ndarray, idx: np.ndarray) -> tuple[float, float]:
    b = x[idx].mean(axis=1)
    lo, hi = np.percentile(b, [2.5, 97.5])
    return float(lo), float(hi)


def _p_two_sided(x: np.ndarray, idx: np.ndarray) -> float:
    """Bootstrap two-sided p-value of a mean difference being 0 (protocol v2): ``2 min(P*(mean >=
    0), P*(mean <= 0))`` over the resamples, at least ``1 / (resamples + 1)``, at most 1."""
    b = x[idx].mean(axis=1)
    p = 2 * min(float((b >= 0).mean()), float((b <= 0).mean()))
    return float(min(1.0, max(p, 1.0 / (len(b) + 1))))


def _share_ci(jm: np.ndarray, jr: np.ndarray, jo: np.ndarray, idx: np.ndarray) -> tuple[float | None, float | None]:
    """The bootstrap interval of the oracle's share ``(J_reactive - J) / (J_reactive - J_oracle)``
    (resamples where the oracle gains nothing are left out; none left: no interval)."""
    r, m, o = jr[idx].mean(axis=1), jm[idx].mean(axis=1), jo[idx].mean(axis=1)
    ok = (r - o) > 1e-9
    if ok.sum() < 0.9 * len(r):
        return None, None
    share = (r[ok] - m[ok]) / (r[ok] - o[ok])
    lo, hi = np.percentile(share, [2.5, 97.5])
    return float(lo), float(hi)


def holm(pvalues: list[float | None], alpha: float = 0.05) -> list[bool | None]:
    """Holm's step-down over one family: which hypotheses are rejected at family-wise ``alpha``
    (None where a p-value is missing; missing ones are not counted in the family)."""
    have = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    out: list[bool | None] = [None] * len(pvalues)
    m, going = len(have), True
    for k, (p, i) in enumerate(have):
        going = going and p <= alpha / (m - k)
        out[i] = going
    return out


def month_rows(outs: dict[str, np.ndarray], node: int, w: float, n_boot: int, seed: int, month: str) -> list[dict]:
    j = {m: per_sample_objective(s, node, w) for m, s in outs.items()}
    n = len(next(iter(outs.values())))
    rng = np.random.default_rng([seed, node, zlib.crc32(month.encode())])
    idx = rng.integers(0, n, size=(n_boot, n)) if n_boot > 0 and n > 1 else None
    jr, jo = j["reactive"].mean(), j["oracle"].mean()
    rows = []
    for m, s in outs.items():
        d = j[m] - j[REFERENCE]
        lo, hi = _ci(d, idx) if idx is not None else (None, None)
        d2 = j[m] - j[SECOND]  # the same against the reference's own rule, uncalibrated
        lo2, hi2 = _ci(d2, idx) if idx is not None else (None, None)
        d3 = j[m] - j["reactive"]  # protocol v2: against doing nothing (submit at the end)
        lo3, hi3 = _ci(d3, idx) if idx is not None else (None, None)
        slo, shi = _share_ci(j[m], j["reactive"], j["oracle"], idx) if idx is not None else (None, None)
        gain = jr - jo
        rows.append(
            {
                "month": month,
                "node": node,
                "method": m,
                "n": int(n),
                "mean_interruption_h": float(np.maximum(s, 0).mean()),
                "mean_wasted_node_h": float(node * np.maximum(-s, 0).mean()),
                "zero_share": float((s <= 0).mean()),
                "objective": float(j[m].mean()),
                "diff_vs_avg_cal": float(d.mean()),
                "diff_ci_lo": lo,
                "diff_ci_hi": hi,
                "oracle_gain_share": float((jr - j[m].mean()) / gain) if gain > 1e-9 else None,
                "verdict": verdict(lo, hi) if m != REFERENCE else "reference",
                "diff_vs_avg": float(d2.mean()),
                "diff_avg_ci_lo": lo2,
                "diff_avg_ci_hi": hi2,
                "verdict_vs_avg": verdict(lo2, hi2) if m != SECOND else "reference",
                "diff_vs_reactive": float(d3.mean()),
                "diff_reactive_ci_lo": lo3,
                "diff_reactive_ci_hi": hi3,
                "verdict_vs_reactive": verdict(lo3, hi3) if m != dr.REACTIVE else "reference",
                "p_vs_avg_cal": _p_two_sided(d, idx) if idx is not None and m != REFERENCE else None,
                "p_vs_reactive": _p_two_sided(d3, idx) if idx is not None and m != dr.REACTIVE else None,
                "oracle_share_ci_lo": slo,
                "oracle_share_ci_hi": shi,
                **interrupted_share(s),
            }
        )
    return rows


def month_of(sample_start: np.ndarray) -> np.ndarray:
    return pd.to_datetime(sample_start, unit="s", utc=True).strftime("%Y-%m").to_numpy()


def evaluate(
    train: Probes,
    score: Probes,
    model_uris: list[str],
    months: list[str],
    node: int,
    *,
    waste_weight: float = WASTE_WEIGHT,
    val_fraction: float = 0.2,
    purge_days: float = 5.0,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Everything of the module docstring, in memory: ``{"rows", "curves", "per_sample", "calibration"}``."""
    from mirage_tasks.models.datasets import Dataset, chronological_split

    ds = Dataset(
        train.X_last,
        train.y.astype(np.float32),
        train.sample,
        train.sample_start,
        train.probe_time,
        np.full(len(train.y), node),
        {},
        train.uri,
    )
    split = chronological_split(ds, val_fraction, purge_days)
    val = train.rows(np.isin(np.arange(len(train.y)), split.val))
    cal = {
        "avg-cal": calibrate_avg(val, node, waste_weight, load=False),
        "avg-load": calibrate_avg(val, node, waste_weight, load=True),
    }
    w = waste_weight
    a_sc = score.avg_score()
    # method -> (score over the scored rows, threshold (None: never early), load rule)
    rules: dict[str, tuple[np.ndarray, float | None, dict | None]] = {
        "reactive": (a_sc, None, None),
        "avg": (a_sc, 0.0, None),
        "avg-cal": (a_sc, cal["avg-cal"]["threshold"], None),
        "avg-load": (a_sc, cal["avg-load"]["threshold"], cal["avg-load"].get("load")),
    }
    if score.has_waitpred() != train.has_waitpred():
        raise StepError(
            "--train-samples and --score-samples: one was sampled with --waitpred and the other not "
            "(the wait-predictor rules need it on both)"
        )
    if score.has_waitpred():
        cal["wait-pred-cal"] = calibrate(
            val.wait_pred_score(), val.y, val.sample, node, waste_weight=w, candidates=WAIT_PRED_MARGINS_H
        )
        rules["wait-pred"] = (score.wait_pred_score(), 0.0, None)
        rules["wait-pred-cal"] = (score.wait_pred_score(), cal["wait-pred-cal"]["threshold"], None)
        g_score, g_val = score.guarantee_score(), val.guarantee_score()
        rules[GUARANTEE] = (g_score, 0.0, None)
        cal[GUARANTEE_CAL] = calibrate_conformal(g_val, val.y, val.sample)
        rules[GUARANTEE_CAL] = (g_score, cal[GUARANTEE_CAL]["threshold"], None)
        aci, cal[GUARANTEE_ACI], _ = aci_outcomes(val, score)
        val_scores = {
            "wait-pred-cal": (val.wait_pred_score(), cal["wait-pred-cal"]["threshold"]),
            GUARANTEE: (g_val, 0.0),
        }
        tr = train.rows(np.isin(np.arange(len(train.y)), split.train))
        log.info("probe replay: fitting the stopping policy on %d training rows", len(tr.y))
        pol = fit_stopping(tr, val, node, w, seed=seed)
        rules[POLICY] = (pol.prob(score), 0.5, None)
        cal[POLICY] = pol.info
    else:
        val_scores = {}
    for uri in model_uris:
        log.info("probe replay: scoring %d probes with %s", len(score.y), uri)
        pred, rule, kind = model_scores(uri, score)
        name = kind if kind not in rules else uri.rstrip("/").rsplit("/", 1)[-1]
        rules[name] = (pred, rule.get("low_h"), rule.get("load"))
        hi = float(rule.get("high_h", 500.0))
        if np.any(pred > hi):  # the online rule never submits above high_h: the replay does the same
            rules[name] = (np.where(pred > hi, -np.inf, pred), rule.get("low_h"), rule.get("load"))
        cal[name] = {"threshold": rule.get("low_h"), "load": rule.get("load"), "kind": kind, "uri": uri}
        if val_scores and name in PRIMARY_CANDIDATES:
            vp, _, _ = model_scores(uri, val)
            vp = np.where(vp > hi, -np.inf, vp)
            val_scores[name] = (adjusted_score(vp, val.X_last, rule.get("load")), rule.get("low_h"))
    if val_scores:  # protocol v2: the primary rule, chosen on the training period's validation split
        val_obj = {
            m: float(
                per_sample_objective(outcomes(sc, val.y, val.sample, np.inf if t is None else float(t)), node, w).mean()
            )
            for m, (sc, t) in val_scores.items()
        }
        cal["primary"] = {
            "rule": min(val_obj, key=lambda m: (round(val_obj[m], 9), PRIMARY_CANDIDATES.index(m))),
            "validation_objective": val_obj,
            "chosen_from": [m for m in PRIMARY_CANDIDATES if m in val_obj],
        }
    rows, curves, per = [], [], []
    mo = month_of(score.sample_start)
    for k, month in enumerate(months):
        sel = mo == month
        if not sel.any():
            raise StepError(f"no scored sample starts in {month}")
        log.info(
            "probe replay: month %s (%d of %d): %d probes, %d methods, %d bootstrap draws",
            month,
            k + 1,
            len(months),
            int(sel.sum()),
            len(rules) + 2,
            n_boot,
        )
        sub = score.rows(sel)
        outs: dict[str, np.ndarray] = {}
        for m, (sc, thr, load) in rules.items():
            adj = adjusted_score(sc[sel], sub.X_last, load)
            outs[m] = outcomes(adj, sub.y, sub.sample, np.inf if thr is None or m == dr.REACTIVE else float(thr))
            if m != dr.REACTIVE:
                c = sweep(adj, sub.y, sub.sample, node, w)
                c.insert(0, "method", m)
                c.insert(0, "month", month)
                curves.append(c)
        if score.has_waitpred():  # adapted over every scored sample in time order: this month's share of it
            outs[GUARANTEE_ACI] = np.array([aci[int(k)] for k in np.unique(sub.sample)])
        outs["oracle"] = oracle_outcomes(sub.y, sub.sample, node, w)
        outs["oracle-wait"] = oracle_wait_outcomes(sub.y, sub.sample, sub.time_left_h())
        rows += month_rows(outs, node, w, n_boot, seed, month)
        samples = np.unique(sub.sample)
        for m, s in outs.items():
            per.append(pd.DataFrame({"month": month, "method": m, "sample": samples, "signed_interruption_h": s}))
    return {
        "rows": pd.DataFrame(rows),
        "curves": pd.concat(curves, ignore_index=True),
        "per_sample": pd.concat(per, ignore_index=True),
        "calibration": cal,
        "split": split.info,
    }


# ----------------------------------------------------------------------------- CLI


def _jsonable(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.floating, float)):
        return None if not np.isfinite(o) else float(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return o


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.evaluation.probe_replay", description=__doc__.split("\n\n")[0])
    p.add_argument("--train-samples", required=True, help="sample output of the training window (its probes)")
    p.add_argument("--dataset", required=True, help="merge output the models were trained on (its manifest's node)")
    p.add_argument("--score-samples", required=True, help="sample output of the scored months")
    p.add_argument("--months", nargs="+", required=True, help="scored months YYYY-MM (UTC, by sample start)")
    p.add_argument("--models", nargs="*", default=[], help="trained model folders (train outputs)")
    p.add_argument("--out", required=True)
    p.add_argument("--waste-weight", type=float, default=WASTE_WEIGHT)
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        for m in args.months:
            if len(m) != 7 or m[4] != "-" or not (m[:4] + m[5:]).isdigit():
                raise StepError(f"--months {m!r}: expected YYYY-MM")
        if args.bootstrap < 0 or not (args.waste_weight >= 0):
            raise StepError("--bootstrap and --waste-weight must be >= 0")
        from mirage_tasks.data.artifacts import require_input
        from mirage_tasks.models.datasets import load_dataset  # noqa: F401 - the dataset's manifest names the node

        if args.seed < 0 or args.seed > 2**32 - 1:
            raise StepError(f"--seed {args.seed}: must be between 0 and {2**32 - 1}")
        if args.bootstrap > 100_000 or not np.isfinite(args.waste_weight):
            raise StepError("--bootstrap must be at most 100000 and --waste-weight a finite number")
        require_input(args.dataset, "--dataset", step="merge")
        man = storage.read_json(storage.join(args.dataset, "manifest.json"))
        node = int(man["node"])
        split = {"val_fraction": 0.2, "purge_days": float((man.get("params") or {}).get("workload_days", 5.0))}
        if args.models:
            from mirage_tasks.models.loader import read_config

            split = (read_config(args.models[0]).get("data") or {}).get("split") or split
        params = {
            "months": args.months,
            "node": node,
            "waste_weight": args.waste_weight,
            "bootstrap": args.bootstrap,
            "seed": args.seed,
            "val_fraction": float(split["val_fraction"]),
            "purge_days": float(split["purge_days"]),
            "curve_points": CURVE_POINTS,
            "references": [REFERENCE, SECOND],
            "rules_version": RULES_VERSION,
        }
        step = Step(
            "evaluation",
            args.out,
            __version__,
            params,
            inputs=[args.train_samples, args.dataset, args.score_samples, *args.models],
        )
        if step.skip():
            return 0
        score = Probes(args.score_samples, with_x=True)
        # the models' validation predictions (protocol v2's primary rule) need the training histories
        train = Probes(args.train_samples, with_x=score.has_waitpred())
        res = evaluate(
            train,
            score,
            args.models,
            args.months,
            node,
            waste_weight=args.waste_weight,
            val_fraction=params["val_fraction"],
            purge_days=params["purge_days"],
            n_boot=args.bootstrap,
            seed=args.seed,
        )
    except StepError as exc:
        print(f"lab.evaluation.probe_replay: error: {exc}", file=sys.stderr)
        return 2
    doc = {
        "params": params,
        "calibration": res["calibration"],
        "split": res["split"],
        "rows": res["rows"].to_dict("records"),
    }
    step.write_json("evaluation.json", _jsonable(doc))
    step.write_bytes("rows.parquet", _parquet(res["rows"]))
    step.write_bytes("curves.parquet", _parquet(res["curves"]))
    step.write_bytes("per_sample.parquet", _parquet(res["per_sample"]))
    step.commit(summary={"node": node, "months": args.months})
    r = res["rows"]
    for month in args.months:
        g = r[r["month"] == month].set_index("method")
        print(
            f"evaluation node {node} {month}: " + ", ".join(f"{m} {g.loc[m, 'objective']:.3f}" for m in g.index),
            flush=True,
        )
    return 0


def _entry(argv: list[str] | None = None) -> int:
    """:func:`main` with the step contract's SIGTERM (exit 143 after the ``finally`` blocks ran)."""
    from stepkit.procs import run_trapped

    return run_trapped(main, "lab.evaluation.probe_replay", argv)


if __name__ == "__main__":
    sys.exit(_entry())
