"""Queue-wait prediction at submission time, with calibrated bounds.

    python -m mirage_tasks.calibration.waitpred --trace T --cluster-config CFG \\
        --calibrate-from A --calibrate-to B --months 1997-01 1997-02 1997-03 --out URI \\
        [--level 0.9] [--margin 0.05] [--seed 0]

Every candidate predicts a job's wait from what is known at the job's submission only
(:mod:`mirage_tasks.calibration.atsubmit`: the queue and running jobs at that instant with their
requested and elapsed times, the job's own request, and history that had ended before it). No
candidate replays the scored month with real run times: that replay (the ``calibrate`` step's
figures) measures the simulator's fidelity, and is reported as such (``replay_fidelity``), never
as a prediction. The candidates, and what each reads:

* ``zero``: nothing (every job starts at once);
* ``recent``: the mean real wait of the last :data:`~mirage_tasks.calibration.atsubmit.RECENT_N`
  jobs that had started before the submission;
* ``plan_request``: the scheduler's plan from the current queue with requested times as run
  times (Slurm's own ``squeue --start`` estimate), on the calibrated configuration's nodes and
  priority weights;
* ``plan``: the same plan with each job's run time predicted from its user's last two finished
  jobs (capped by the request);
* ``corrected_q20`` .. ``corrected_q50``: gradient-boosted quantiles (xgboost, one model) of the
  real wait from the plans and the queue state at submission
  (:data:`~mirage_tasks.calibration.atsubmit.FEATURES`), fitted on the calibration period. The
  median minimises MAE; a lower quantile trades some of it for jobs that start at once (within
  1 h), and the guard picks among them as among the others.

**Bounds.** Every candidate also gives an upper bound at ``--level`` (0.9): a base (the
candidate's point prediction; for a ``corrected`` one the quantile model's output at that level) moved on
a log scale by an offset, one per job-size class (Mondrian: a 90 % bound calibrated on all jobs
covered the large classes' jobs far less often than the small ones'), fitted by split conformal on
the calibration period's held-back tail (a class's own offset where the tail holds at least
:data:`GROUP_MIN_KNOWN` of its jobs with a known wait and its quantile is not a wait still going on
at the cut; a thinner class starts at the offset of it merged with its neighbouring classes, larger
ones first, until the merged classes hold as many (:func:`~mirage_tasks.calibration.atsubmit.neighbour_run`,
read from the calibration tail only), and at the pooled one only where no merge does), then kept calibrated
online over the scored months: each job's coverage is fed back when its bound runs out, covered or
not (both are known then, and the instant does not depend on the outcome), never earlier, to its
own class's offset only; each outcome moves that offset by at most ``eta``, the offset stays within a range
and the bound at most a cap, the calibration period's longest wait as known at its end (or the
base, where that is larger)
(:func:`~mirage_tasks.calibration.atsubmit.online_bound`). Coverage, the bound's median beside the
real waits' and the share at the cap are reported per month, job-size class and requested-time class.

**Fitted at the cut.** Every fitted part (the quantile model's labels, the guard's folds and
held-back tail, the bound's start offsets, and upstream the ``calibrate`` step's configuration) reads the
calibration period as it stood at its end (:mod:`~mirage_tasks.calibration.atcut`): a job still
waiting then has its wait censored there, never its later real wait.

**The guard** judges every candidate out of sample on rolling-origin folds of the calibration
period (:func:`month_folds`): one per calendar month after the first, each judged on that month's
jobs by a quantile model fitted only on the jobs submitted before it, their waits as known at the
month's start. Eligible are the candidates whose within-1-h share is at most ``--margin`` (5 points)
below zero wait's in every fold, and pooled over the folds with one-sided 95 % confidence
(standard errors clustered by day) (:func:`guard_folds` says why both); the pick is the eligible one
with the least MAE over the folds (ties to the simpler). Zero wait is always eligible. A single
held-back tail judged the promise on one stretch of weeks, and a candidate that kept it there could
break it by several points in a scored month; the folds judge it as the report states it, month by
month. A period with no month to fold on (shorter than two months' worth of jobs) falls back to the
held-back last ``1 - FIT_SHARE`` of its jobs, parts fitted on the rest. The quantile model is
refitted on the whole period for the scored months. The report states, per scored month, whether
the pick kept the promise (``promise``), and what the single tail alone would have picked.

Scored (pooled and per month, submission month in the trace's zone) for every candidate, the
pick (``guarded``): MAE, median absolute error, within 1 h, within 10 minutes among jobs that
waited more than 1 h (which jobs that start at once cannot inflate), Spearman, the bound's
coverage and its median. Beside the bounds, a reference that reads nothing but past waits: the
QBETS bound (:mod:`~mirage_tasks.calibration.qbets`, the ``--level`` quantile at 95 % confidence
per job-size class, online from the log's first job, each job answered from the waits of the
jobs started before its submission); its coverage and median sit in the same tables
(``waitpred.json``'s ``qbets``). Outputs under ``--out``: ``waitpred.json``, ``predictions.parquet``
(per scored job: real wait, every predictor's point and bound, ``qbets_bound``, seconds), ``waitpred.md``,
``model.ubj`` (the quantile model fitted on the whole calibration period, xgboost's UBJ; the
sampling asks it at decision times, :mod:`~mirage_tasks.calibration.atprobe`), then
``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import logging
import math
import re
import sys
from typing import Any

import numpy as np
import pandas as pd

from stepkit import Step, StepError, storage

from .. import __version__
from . import atsubmit, qbets

log = logging.getLogger(__name__)

#: the quantile model fitted on the whole calibration period (xgboost's UBJ) and the report, as
#: the predictor asked at decision times reads them (:mod:`~mirage_tasks.calibration.atprobe`,
#: which imports this module; this one never imports it)
MODEL_FILE = "model.ubj"
DOC_FILE = "waitpred.json"
FIT_SHARE = 0.75
LEVEL = 0.9
MARGIN = 0.05
Z_ONE_SIDED = 1.645  # the guard's one-sided 95 % on the within-1-h difference
ETA = 0.05
QUANTILES = (0.2, 0.3, 0.4, 0.5)
CORRECTED = tuple(f"corrected_q{int(round(100 * q))}" for q in QUANTILES)
CANDIDATES = ("zero", "recent", "plan_request", "plan") + CORRECTED
TIE_ORDER = CANDIDATES  # simpler first
PREDICTORS = CANDIDATES + ("guarded",)
#: what each candidate reads at a job's submission (said in the output and the docs)
READS = {
    "zero": "nothing",
    "recent": f"the real waits of the last {atsubmit.RECENT_N} jobs started before the submission",
    "plan_request": "the queue and running jobs at submission (nodes, requested times, elapsed times), the job's "
    "request; the configuration's nodes and priority weights",
    "plan": "as plan_request, with run times predicted from each user's last two jobs ended before the submission",
    **{
        k: f"the {q:g} quantile of the wait given both plans and the queue state at submission (features), "
        "fitted on the calibration period"
        for k, q in zip(CORRECTED, QUANTILES)
    },
}
#: what the fitted parts read (said in the output)
AT_CUT = (
    "every fitted part (the simulator's configuration, the quantile model's labels, the guard's folds, "
    "the bound's start offsets) reads the calibration period as it stood at its end: a job still waiting then "
    "has the wait 'at least the end minus its submission' (censored), never its later real wait; the model "
    "learns the censored wait, the guard leaves such a job out (and each of its folds fits on the waits as known at "
    "the fold's start), the bound's offset counts it a miss"
)
#: the bound keeps one offset per job-size class (:func:`size_class`); a class starts at its own
#: split-conformal offset where the calibration tail holds at least this many of its jobs with a known wait,
#: else at that of it merged with its neighbouring classes until the merged ones hold as many
GROUP_MIN_KNOWN = 50
BOUND_GROUPING = "job-size class"
BOUND_READS = (
    "the bound is the base moved by an offset on a log scale, at most the cap (the calibration period's "
    "longest wait as known at its end) or the base where that is larger; one offset per job-size class, "
    f"started at the class's own split-conformal offset on the calibration tail where the tail holds at least "
    f"{GROUP_MIN_KNOWN} of its jobs with a known wait and its quantile is not a wait still going on at the cut, "
    "else at the offset of it merged with its neighbouring size classes (larger ones first, then smaller) until "
    "the merged classes hold as many and their quantile is not such a wait (read from the calibration tail only), "
    "else at the pooled one; each job's coverage is fed back "
    "when its bound runs out, covered or not, and moves its class's offset (only that one) by at most eta; "
    "the offset stays within +-log1p(cap / 1 min)"
)
#: one model, one output per quantile (those of the corrected candidates, then the bound's level)
XGB_PARAMS = {
    "objective": "reg:quantileerror",
    "n_estimators": 300,
    "max_depth": 5,
    "learning_rate": 0.05,
    "subsample": 0.8,
    "min_child_weight": 5,
    "random_state": 0,
    "n_jobs": 1,
}
MAX_JOBS = 2_000_000  # the sweep's bound on the jobs it walks


def fit_model(df: pd.DataFrame, level: float, seed: int = 0):
    """Gradient-boosted quantiles (xgboost) of the real wait (h) on :data:`atsubmit.FEATURES`: one
    output per :data:`QUANTILES`, then ``level`` (the bound's base)."""
    import xgboost as xgb

    X = df[list(atsubmit.FEATURES)].to_numpy(np.float64)
    y = df["real_wait_s"].to_numpy(np.float64) / 3600.0
    m = xgb.XGBRegressor(**{**XGB_PARAMS, "quantile_alpha": [*QUANTILES, level], "random_state": seed})
    return m.fit(X, y)


def points(df: pd.DataFrame, model) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(point prediction, bound base) of every candidate, seconds."""
    return points_of(
        df[list(atsubmit.FEATURES)].to_numpy(np.float64),
        df["recent_wait_h"].to_numpy(np.float64),
        df["plan_request_s"].to_numpy(np.float64),
        df["plan_s"].to_numpy(np.float64),
        model,
    )


def points_of(
    X: np.ndarray, recent_wait_h: np.ndarray, plan_request_s: np.ndarray, plan_s: np.ndarray, model
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """:func:`points` of rows given as arrays: ``X`` [n, :data:`atsubmit.FEATURES`] (float64) and the
    plain candidates' columns; what the predictor asked at one decision time computes without
    building a frame (:class:`~mirage_tasks.calibration.atprobe.WaitAtProbe`)."""
    n = len(X)
    q = np.maximum(model.predict(X).astype(np.float64), 0.0) * 3600
    q = q.reshape(n, len(QUANTILES) + 1)
    pt = {
        "zero": np.zeros(n),
        "recent": recent_wait_h * 3600.0,
        "plan_request": plan_request_s,
        "plan": plan_s,
    }
    base = dict(pt)
    for j, k in enumerate(CORRECTED):
        pt[k] = q[:, j]
        base[k] = np.maximum(q[:, -1], q[:, j])
    return pt, base


def wait_metrics(
    real_s: np.ndarray, pred_s: np.ndarray, bound_s: np.ndarray | None = None, cap_s: float | None = None
) -> dict[str, Any]:
    from scipy import stats

    n = len(real_s)
    if n == 0:
        return {"n": 0}
    r, p = real_s / 3600.0, pred_s / 3600.0
    err = np.abs(p - r)
    long = r > 1.0
    rho = stats.spearmanr(r, p).statistic if n > 2 and np.ptp(r) > 0 and np.ptp(p) > 0 else float("nan")
    out = {
        "n": int(n),
        "real_mean_h": float(r.mean()),
        "pred_mean_h": float(p.mean()),
        "mae_h": float(err.mean()),
        "medae_h": float(np.median(err)),
        "within_1h": float((err <= 1.0).mean()),
        "n_waited_over_1h": int(long.sum()),
        "within_10m_waited_over_1h": float((err[long] <= 1 / 6).mean()) if long.any() else float("nan"),
        "spearman": float(rho),
    }
    if bound_s is not None:
        # the bound beside what it bounds: a 90 % bound far above the real waits' 90th percentile
        # covers without telling a user anything
        out["coverage"] = float((real_s <= bound_s + 1e-9).mean())
        out["bound_median_h"] = float(np.median(bound_s) / 3600.0)
        out["real_median_h"] = float(np.median(r))
        out["real_p90_h"] = float(np.quantile(r, 0.9))
        if cap_s is not None:
            out["at_cap"] = float((np.abs(bound_s - cap_s) <= cap_s * 1e-9).mean())
    return out


#: the least jobs a fold may fit on and judge on (as the single held-back tail asked before the folds)
FOLD_MIN_JOBS = 50


def _days(frame: pd.DataFrame, tz: str) -> np.ndarray:
    if "submit" not in frame:
        return np.zeros(len(frame))
    return pd.to_datetime(frame["submit"], unit="s", utc=True).dt.tz_convert(tz).dt.strftime("%Y-%m-%d").to_numpy()


def _hit_diff(real: np.ndarray, pt: np.ndarray) -> np.ndarray:
    """Per job: within 1 h with ``pt`` minus within 1 h with zero wait (-1, 0 or 1)."""
    return (np.abs(pt - real) <= 3600.0).astype(np.float64) - (real <= 3600.0).astype(np.float64)


def guard_folds(
    folds: list[tuple[str, pd.DataFrame, dict[str, np.ndarray]]], margin: float, tz: str = "UTC"
) -> tuple[str, dict[str, dict], str]:
    """(pick, metrics per candidate over the folds, why), from out-of-sample folds: ``(label, judged
    jobs, every candidate's points on them)``, each judged by parts fitted only on what came before it.

    A candidate is eligible when its within-1-h share is at most ``margin`` below zero wait's

    * in **every fold** (the point difference, as the report checks the promise per scored month), and
    * **pooled** over the folds' jobs with one-sided 95 % confidence: the paired difference minus
      :data:`Z_ONE_SIDED` standard errors (clustered by day of submission, since jobs submitted
      together wait together) is at least ``-margin``.

    Every fold, not only the pooled figure: the promise is made per month, and a candidate that
    keeps it on average while breaking it in one month (a busy month where it predicts waits for jobs
    that started at once) is what a single held-back tail let through. Confidence on the pooled
    folds, not per fold: a month has some 30 days to cluster on, so 1.645 standard errors per fold
    come to several points, and a per-fold confidence bound would ask each month to stay within a
    point or two of zero wait, refusing on noise candidates that keep the promise; the per-fold point
    check is the one the report applies to the scored months. Zero wait is always eligible
    (its difference is 0 in every fold). The pick is the eligible candidate with the least MAE over
    the folds' jobs (ties to the simpler, :data:`TIE_ORDER`)."""
    labels = [f[0] for f in folds]
    real_all = np.concatenate([f[1]["real_wait_s"].to_numpy(np.float64) for f in folds])
    day = np.concatenate([_days(f[1], tz) for f in folds])
    m: dict[str, dict] = {}
    for k in CANDIDATES:
        pt_all = np.concatenate([f[2][k] for f in folds])
        m[k] = wait_metrics(real_all, pt_all)
        d = _hit_diff(real_all, pt_all)
        per_day = pd.Series(d).groupby(day).mean()
        se = float(per_day.std(ddof=1) / np.sqrt(len(per_day))) if len(per_day) > 1 else 0.0
        m[k]["within_1h_diff_vs_zero"] = float(d.mean())
        m[k]["within_1h_diff_se"] = se if np.isfinite(se) else 0.0
        per = {}
        for lab, fr, pt in folds:
            r = fr["real_wait_s"].to_numpy(np.float64)
            w = wait_metrics(r, pt[k])
            per[lab] = {
                "n": w["n"],
                "mae_h": w.get("mae_h"),
                "within_1h": w.get("within_1h"),
                "within_1h_diff_vs_zero": float(_hit_diff(r, pt[k]).mean()) if len(r) else 0.0,
            }
        m[k]["folds"] = per
        worst = min(labels, key=lambda f: (per[f]["within_1h_diff_vs_zero"], labels.index(f)))
        m[k]["worst_fold"], m[k]["worst_fold_diff"] = worst, per[worst]["within_1h_diff_vs_zero"]
        pooled_ok = d.mean() - Z_ONE_SIDED * m[k]["within_1h_diff_se"] >= -margin - 1e-12
        folds_ok = m[k]["worst_fold_diff"] >= -margin - 1e-12
        m[k]["eligible"] = bool(k == "zero" or (pooled_ok and folds_ok))
        refused = (["pooled"] if not pooled_ok else []) + ([f"fold {worst}"] if not folds_ok else [])
        m[k]["refused_by"] = None if m[k]["eligible"] else " and ".join(refused)
    eligible = [k for k in CANDIDATES if m[k]["eligible"]]
    pick = min(eligible, key=lambda k: (round(m[k]["mae_h"], 9), TIE_ORDER.index(k)))
    out = [k for k in CANDIDATES if k not in eligible]
    where = (
        f"the {len(folds)} out-of-sample folds ({', '.join(labels)})"
        if len(folds) > 1
        else (f"the {labels[0]}" if labels[0] == "held-back tail" else f"the one out-of-sample fold ({labels[0]})")
    )
    why = (
        f"least MAE over {where} among the candidates whose within-1-h share is at most {100 * margin:g} points below "
        f"zero wait's ({m['zero']['within_1h']:.1%}) in every fold and, pooled, with one-sided 95 % confidence"
        + (
            "; not eligible: "
            + ", ".join(
                f"{k} ({m[k]['within_1h_diff_vs_zero']:+.1%} ± {m[k]['within_1h_diff_se']:.1%}"
                + (f", worst fold {m[k]['worst_fold']} {m[k]['worst_fold_diff']:+.1%}" if len(folds) > 1 else "")
                + ")"
                for k in out
            )
            if out
            else ""
        )
    )
    if pick == "zero":
        why += "; no eligible candidate beat zero wait's MAE there"
    return pick, m, why


def guard(
    tail: pd.DataFrame, pt: dict[str, np.ndarray], margin: float, tz: str = "UTC"
) -> tuple[str, dict[str, dict], str]:
    """:func:`guard_folds` on one fold, the calibration period's held-back tail (the guard before the
    folds, and its fallback where the period holds no month to fold on)."""
    return guard_folds([("held-back tail", tail, pt)], margin, tz)


def month_folds(submit: np.ndarray, known: np.ndarray, a: int, b: int, tz: str) -> list[tuple[str, int, int]]:
    """The rolling-origin folds of the calibration period ``[a, b)``: ``(label, cut, end)``, each
    fitted on the jobs submitted before ``cut`` (their waits as known at ``cut``) and judged on the
    jobs submitted in ``[cut, end)`` whose wait was known at ``b``. The cuts are the month starts
    (``tz``) inside the period; a cut with fewer than :data:`FOLD_MIN_JOBS` jobs before it is
    dropped, and a judged window with fewer known waits than that is merged into the one before it
    (the first is dropped). Empty where no cut is left (a period shorter than two months' worth)."""
    submit = np.asarray(submit, dtype=np.int64)
    t0 = pd.Timestamp(a, unit="s", tz="UTC").tz_convert(tz)
    first = t0.tz_localize(None).to_period("M").to_timestamp().tz_localize(tz) + pd.offsets.MonthBegin(1)
    cuts = [
        int(t.timestamp()) for t in pd.date_range(first, pd.Timestamp(b, unit="s", tz="UTC").tz_convert(tz), freq="MS")
    ]
    cuts = [c for c in cuts if a < c < b and int((submit < c).sum()) >= FOLD_MIN_JOBS]
    while cuts:
        ends = [*cuts[1:], b]
        small = [
            i
            for i, (c, e) in enumerate(zip(cuts, ends))
            if int((known & (submit >= c) & (submit < e)).sum()) < FOLD_MIN_JOBS
        ]
        if not small:
            break
        del cuts[small[0]]
    ends = [*cuts[1:], b]

    def month(t: int) -> str:
        return pd.Timestamp(t, unit="s", tz="UTC").tz_convert(tz).strftime("%Y-%m")

    return [
        (month(c) if month(c) == month(e - 1) else f"{month(c)} to {month(e - 1)}", c, e) for c, e in zip(cuts, ends)
    ]


def promise(res: dict[str, Any], pick: str, margin: float) -> dict[str, dict[str, Any]]:
    """Per scored month: did ``pick`` keep the within-1-h promise, its share at most ``margin``
    below zero wait's in that month (points: percentage points vs zero wait)."""
    out = {}
    for mo, r in res[pick]["months"].items():
        z = res["zero"]["months"][mo]
        d = r["within_1h"] - z["within_1h"]
        out[mo] = {
            "n": r["n"],
            "within_1h": r["within_1h"],
            "zero_within_1h": z["within_1h"],
            "points_vs_zero": 100 * d,
            "kept": bool(d >= -margin - 1e-12),
        }
    return out


#: requested-time classes (upper edges, hours) of the bound's coverage report
LIMIT_CLASSES_H = (1, 4, 12, 24)
LIMIT_NAMES = (
    f"<={LIMIT_CLASSES_H[0]}h",
    *(f"{a}-{b}h" for a, b in itertools.pairwise(LIMIT_CLASSES_H)),
    f">{LIMIT_CLASSES_H[-1]}h",
)


def limit_class(limit_s: np.ndarray) -> np.ndarray:
    """Requested-time classes: "<=1h", "1-4h", "4-12h", "12-24h", ">24h" (upper edges inclusive)."""
    h = np.asarray(limit_s, dtype=np.float64) / 3600.0
    return np.array(LIMIT_NAMES, dtype=object)[np.searchsorted(np.array(LIMIT_CLASSES_H, float), h, side="left")]


def size_class(nodes: np.ndarray) -> np.ndarray:
    """Job-size classes ("1", "2-3", "4-7", ...): the classes the report scores per and the bound's groups."""
    from .fidelity import node_class

    nodes = np.asarray(nodes)
    return node_class(nodes) if len(nodes) else np.array([], dtype=object)


def size_key(g: str) -> int:
    """A job-size class's place in size order (:func:`size_class`): its smallest node count."""
    return int(str(g).split("-")[0])


def bound_levels(frame: pd.DataFrame) -> list[np.ndarray]:
    """The bound's groups (:func:`~mirage_tasks.calibration.atsubmit.group_theta0`), coarse to fine:
    the job-size class (:func:`size_class`)."""
    return [size_class(frame["nodes"].to_numpy())]


def _group_order(g: str) -> tuple:
    """A bound group's place in the report: by size class, then requested-time class."""
    parts = g.split(" / ")
    return (int(re.match(r"\d+", parts[0])[0]), *(LIMIT_NAMES.index(p) if p in LIMIT_NAMES else 99 for p in parts[1:]))


def _classes(pred: pd.DataFrame, tz: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each scored job's submission month (``tz``), job-size class and requested-time class."""
    month = pd.to_datetime(pred["submit"], unit="s", utc=True).dt.tz_convert(tz).dt.strftime("%Y-%m").to_numpy()
    return month, size_class(pred["nodes"].to_numpy()), limit_class(pred["limit_s"].to_numpy())


def _by(keys: np.ndarray, order, f) -> dict[str, Any]:
    return {g: f(keys == g) for g in sorted(set(keys.tolist()), key=order)}


def score_qbets(pred: pd.DataFrame, tz: str) -> dict[str, Any]:
    """The QBETS reference bound's coverage and median (:func:`qbets.bound_metrics`), pooled, per
    month, per job-size class and per requested-time class, as :func:`score` groups the predictors'."""
    month, size, req = _classes(pred, tz)
    real, bd = pred["real_wait_s"].to_numpy(np.float64), pred["qbets_bound"].to_numpy(np.float64)

    def f(m: np.ndarray) -> dict[str, Any]:
        return qbets.bound_metrics(real[m], bd[m])

    return {
        "pooled": f(np.ones(len(pred), dtype=bool)),
        "months": _by(month, str, f),
        "size_classes": _by(size, lambda g: int(g.split("-")[0]), f),
        "limit_classes": _by(req, LIMIT_NAMES.index, f),
    }


def score(pred: pd.DataFrame, tz: str, cap_s: float | None = None) -> dict[str, Any]:
    """Metrics of every predictor, pooled, per month (submission, ``tz``), per job-size class
    (``nodes``: 1, 2-3, 4-7, ...) and per requested-time class (:func:`limit_class`)."""
    month, size, req = _classes(pred, tz)
    real = pred["real_wait_s"].to_numpy(np.float64)
    res: dict[str, Any] = {}

    def by(keys: np.ndarray, order, pt: np.ndarray, bd: np.ndarray) -> dict[str, Any]:
        return {
            g: wait_metrics(real[keys == g], pt[keys == g], bd[keys == g], cap_s)
            for g in sorted(set(keys.tolist()), key=order)
        }

    for p in PREDICTORS:
        pt, bd = pred[p].to_numpy(np.float64), pred[f"{p}_bound"].to_numpy(np.float64)
        res[p] = {
            "pooled": wait_metrics(real, pt, bd, cap_s),
            "months": by(month, str, pt, bd),
            "size_classes": by(size, lambda g: int(g.split("-")[0]), pt, bd),
            "limit_classes": by(req, LIMIT_NAMES.index, pt, bd),
        }
    return res


def criteria(
    res: dict[str, Any], level: float, q_res: dict[str, Any] | None = None, margin: float = MARGIN
) -> dict[str, Any]:
    g, z = res["guarded"]["pooled"], res["zero"]["pooled"]
    kept = {m: r["kept"] for m, r in promise(res, "guarded", margin).items()}
    cov = {m: v.get("coverage") for m, v in res["guarded"]["months"].items()}
    cov_size = {g: v.get("coverage") for g, v in res["guarded"].get("size_classes", {}).items()}
    extra = {"qbets_coverage_months": {m: v.get("coverage") for m, v in q_res["months"].items()}} if q_res else {}
    lo, hi = level - 0.05, level + 0.05
    return {
        "mae_at_or_below_zero": bool(g["mae_h"] <= z["mae_h"] + 1e-12),
        "mae_reduction_vs_zero": (1 - g["mae_h"] / z["mae_h"]) if z["mae_h"] > 0 else None,
        "within_1h_vs_zero_points": 100 * (g["within_1h"] - z["within_1h"]),
        "within_1h_within_5_points": bool(g["within_1h"] >= z["within_1h"] - 0.05 - 1e-12),
        "within_1h_promise_kept_months": kept,
        "within_1h_promise_kept_every_month": bool(all(kept.values())),
        "coverage_months": cov,
        "coverage_target": [lo, hi],
        "coverage_in_target_every_month": bool(all(c is not None and lo <= c <= hi for c in cov.values())),
        "coverage_size_classes": cov_size,
        "coverage_size_classes_outside_target": [
            g for g, c in cov_size.items() if c is None or not lo - 1e-12 <= c <= hi + 1e-12
        ],
        **extra,
    }


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if isinstance(o, (float, np.floating)):
        return None if not np.isfinite(o) else float(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.bool_):
        return bool(o)
    return o


def _f(v: Any, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def guard_lines(doc: dict[str, Any]) -> list[str]:
    """How the guard checked eligibility (one line), and each candidate on its folds."""
    gd = doc.get("guard")
    if not gd:
        return []
    labels = [f["label"] for f in gd["folds"]] or ["held-back tail"]
    out = [
        f"How eligibility was checked: {gd['check']}. The single held-back tail alone would have picked "
        f"{gd['single_tail_pick']}.",
        "",
        "| candidate | MAE h (folds) | within 1 h vs zero, pooled | "
        + " | ".join(f"vs zero, {lab}" for lab in labels)
        + " | eligible |",
        "|---|---|---|" + "---|" * len(labels) + "---|",
    ]
    for k, r in gd["candidates"].items():
        out.append(
            f"| {k} | {_f(r.get('mae_h'), '{:.2f}')} | {100 * r['within_1h_diff_vs_zero']:+.1f} ± "
            f"{100 * r['within_1h_diff_se']:.1f} | "
            + " | ".join(
                f"{100 * r['folds'][lab]['within_1h_diff_vs_zero']:+.1f}" for lab in labels if lab in r["folds"]
            )
            + f" | {'yes' if r['eligible'] else 'no (' + str(r['refused_by']) + ')'} |"
        )
    return out + [""]


def promise_lines(doc: dict[str, Any]) -> list[str]:
    """Per scored month: did the pick keep the within-1-h promise (at most the margin below zero wait)."""
    pr = doc.get("promise")
    if not pr:
        return []
    out = [
        f"Within-1-h promise per scored month ({doc['pick']} at most {100 * pr['margin']:g} points below zero wait's share; "
        "points: percentage points vs zero wait):",
        "",
        "| month | n | within 1 h | zero within 1 h | points vs zero | kept |",
        "|---|---|---|---|---|---|",
    ]
    for m, r in pr["months"].items():
        out.append(
            f"| {m} | {r['n']} | {_f(r['within_1h'], '{:.1%}')} | {_f(r['zero_within_1h'], '{:.1%}')} | "
            f"{r['points_vs_zero']:+.1f} | {'yes' if r['kept'] else 'no'} |"
        )
    return out


def markdown(doc: dict[str, Any]) -> str:
    lv = doc["params"]["level"]
    c = doc["criteria"]
    out = [
        f"# Wait prediction at submission: {doc['trace']}",
        "",
        f"Calibrated on jobs submitted {doc['windows']['calibrate_from']} to {doc['windows']['calibrate_to']} "
        f"(exclusive, {doc['n_calibration']} jobs), scored on {', '.join(doc['params']['months'])} "
        f"({doc['n_scored']} jobs). Every figure reads only what was known at each job's submission.",
        "",
        f"Guard pick: **{doc['pick']}** ({doc['pick_reason']}).",
        "",
        f"Criteria (guarded, out of sample): MAE at or below zero wait's: {c['mae_at_or_below_zero']}; "
        f"MAE reduction {_f(c['mae_reduction_vs_zero'], '{:.1%}')}; within 1 h "
        f"{c['within_1h_vs_zero_points']:+.1f} points vs zero wait; the {lv:.0%} bound's coverage in "
        f"[{c['coverage_target'][0]:.0%}, {c['coverage_target'][1]:.0%}] every month: "
        f"{c['coverage_in_target_every_month']}"
        + (
            f"; every job-size class: {not c['coverage_size_classes_outside_target']}"
            + (
                f" (outside: {', '.join(c['coverage_size_classes_outside_target'])})"
                if c["coverage_size_classes_outside_target"]
                else ""
            )
            if "coverage_size_classes" in c
            else ""
        )
        + ".",
        "",
        *guard_lines(doc),
        "| predictor | n | MAE h | median abs err h | within 1 h | within 10 min (waited > 1 h) | Spearman | "
        f"{lv:.0%} bound coverage | bound median h |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in PREDICTORS:
        r = doc["out_of_sample"][p]["pooled"]
        out.append(
            f"| {p} | {r['n']} | {_f(r['mae_h'], '{:.2f}')} | {_f(r['medae_h'], '{:.2f}')} | "
            f"{_f(r['within_1h'], '{:.1%}')} | {_f(r['within_10m_waited_over_1h'], '{:.1%}')} | "
            f"{_f(r['spearman'], '{:.2f}')} | {_f(r.get('coverage'), '{:.1%}')} | "
            f"{_f(r.get('bound_median_h'), '{:.2f}')} |"
        )
    qb = doc.get("qbets") or {}
    if qb:
        r = qb["pooled"]
        out.append(
            f"| qbets (reference bound only) | {r['n']} | - | - | - | - | - | {_f(r.get('coverage'), '{:.1%}')} | "
            f"{_f(r.get('bound_median_h'), '{:.2f}')} |"
        )
    out += [
        "",
        "Per month (guarded beside zero wait, and the QBETS reference bound's coverage):",
        "",
        "| month | n | MAE h | zero MAE h | within 1 h | zero within 1 h | coverage | QBETS coverage |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in doc["out_of_sample"]["guarded"]["months"].items():
        z = doc["out_of_sample"]["zero"]["months"][m]
        out.append(
            f"| {m} | {r['n']} | {_f(r['mae_h'], '{:.2f}')} | {_f(z['mae_h'], '{:.2f}')} | "
            f"{_f(r['within_1h'], '{:.1%}')} | {_f(z['within_1h'], '{:.1%}')} | {_f(r.get('coverage'), '{:.1%}')} | "
            f"{_f(qb.get('months', {}).get(m, {}).get('coverage'), '{:.1%}')} |"
        )
    out += ["", *promise_lines(doc)]
    bd = doc.get("bound")
    if bd:
        g = doc["out_of_sample"]["guarded"]
        line = (
            f"The {lv:.0%} bound (guarded): capped at {_f(bd['cap_h'], '{:.1f}')} h, the calibration "
            f"period's longest wait as known at its end; {_f(g['pooled'].get('at_cap'), '{:.1%}')} of the "
            f"bounds at the cap; median bound {_f(g['pooled'].get('bound_median_h'), '{:.2f}')} h against "
            f"the real waits' median {_f(g['pooled'].get('real_median_h'), '{:.2f}')} h and 90th percentile "
            f"{_f(g['pooled'].get('real_p90_h'), '{:.2f}')} h. {bd['reads']}."
        )
        out += ["", line, ""]
        grp = (bd.get("groups") or {}).get(doc["pick"])
        if grp:
            own = [g for g, v in grp.items() if v["source"] == "calibrated"]
            mg = [f"{g} with {', '.join(x for x in v['merged'] if x != g)}" for g, v in grp.items() if v.get("merged")]
            fb = [g for g, v in grp.items() if v["source"] != "calibrated" and not v.get("merged")]
            out += [
                f"One offset per {bd['grouping']}, moved only by its own jobs' outcomes; each started at its own "
                f"offset on the calibration tail where at least {bd['group_min_known']} of its jobs' waits were known "
                f"there and its quantile was not a wait still going on at the cut ({', '.join(own) or 'none'}), "
                f"else at the offset of it merged with its neighbouring classes ({'; '.join(mg) or 'none'}), "
                f"else at the pooled offset ({', '.join(fb) or 'none'}).",
                "",
            ]
        if qb:
            out += [
                f"Beside it, the QBETS reference bound (`mirage_tasks/calibration/qbets.py`, the {lv:.0%} quantile "
                f"at {qb['c']:.0%} confidence): {qb['reads']}. Online from the log's first job: "
                f"{sum(qb['resets'].values())} change points in the classes, {qb['answered_from_pooled']} jobs "
                f"answered from all classes' waits; {qb['pooled'].get('no_bound', 0)} scored jobs with no bound "
                "(counted as misses).",
                "",
            ]
        for key, name in (("months", "month"), ("size_classes", "nodes"), ("limit_classes", "requested time")):
            out += [
                f"| {name} | n | coverage | bound median h | QBETS coverage | QBETS bound median h | real median h | "
                "real p90 h | at cap |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for k, r in g.get(key, {}).items():
                rq = qb.get(key, {}).get(k, {})
                out.append(
                    f"| {k} | {r['n']} | {_f(r.get('coverage'), '{:.1%}')} | {_f(r.get('bound_median_h'), '{:.2f}')} | "
                    f"{_f(rq.get('coverage'), '{:.1%}')} | {_f(rq.get('bound_median_h'), '{:.2f}')} | "
                    f"{_f(r.get('real_median_h'), '{:.2f}')} | {_f(r.get('real_p90_h'), '{:.2f}')} | "
                    f"{_f(r.get('at_cap'), '{:.1%}')} |"
                )
            out.append("")
    if doc.get("at_cut"):
        line = (
            f"Fitted on the calibration period as it stood at {doc['at_cut']['cut']} "
            f"({doc['at_cut']['censored_waits']} jobs still waiting then, their waits censored): "
            f"{doc['at_cut']['reads']}."
        )
        out += ["", line]
    rf = doc.get("replay_fidelity")
    if rf:
        out += [
            "",
            f"Replay fidelity (not a prediction: the calibrated simulator replaying the scored window with "
            f"every job's real run time, from `calibrate`): MAE {_f(rf.get('mae_h'), '{:.2f}')} h, within 1 h "
            f"{_f(rf.get('within_1h'), '{:.1%}')}.",
        ]
    hy = _hygiene_line(doc.get("hygiene"))
    if hy:
        out += ["", hy]
    out += ["", "What each candidate reads at submission:", ""] + [f"* `{k}`: {v}" for k, v in READS.items()]
    return "\n".join(out) + "\n"


def hygiene(meta: Any, wl: Any, a: int, d: int) -> dict[str, Any]:
    """What the log left incomplete and how it was made whole: the jobs whose time limit was filled
    (by kind: at ingest, recorded in the trace's metadata, and any filled when the workload was read,
    :func:`mirage_tasks.data.limits.fill_limits`), and the jobs that never ran (queued until they
    left, never scored), in the whole log and among those submitted in ``[a, d)``."""
    nr = wl.never_ran
    return {
        "limit_fill_at_ingest": (getattr(meta, "hygiene", None) or {}).get("limit_fill"),
        "limit_fill_on_read": dict(wl.limit_fill),
        "never_ran": int(len(nr)),
        "never_ran_in_windows": int(((nr.submit >= a) & (nr.submit < d)).sum()),
        "dropped": dict(wl.dropped),
    }


def _hygiene_line(h: dict[str, Any] | None) -> str | None:
    if not h:
        return None
    fill = h.get("limit_fill_at_ingest") or h.get("limit_fill_on_read") or {}
    kinds = ", ".join(
        f"{fill.get(k, 0)} {k.replace('_', ' ')}" for k in ("partition_max", "user_history", "log_default")
    )
    return (
        f"Trace hygiene: {fill.get('jobs_without_limit', 0)} jobs requested no time limit and got one known at "
        f"submission ({kinds}); {h['never_ran']} jobs never ran ({h['never_ran_in_windows']} submitted in the "
        "calibration and scored windows): each waited in the queue until it left and is not scored."
    )


def _ts(v: str, flag: str, tz: str) -> int:
    try:
        t = pd.Timestamp(v)
    except (ValueError, TypeError) as exc:
        raise StepError(f"{flag} {v!r} is not an ISO date/time") from exc
    if t is pd.NaT:
        raise StepError(f"{flag} {v!r} is not an ISO date/time")
    return int((t.tz_localize(tz) if t.tzinfo is None else t).timestamp())


def _replay_fidelity(cfg_uri: str) -> dict[str, Any] | None:
    """The ``calibrate`` step's out-of-sample replay figures beside ``config.json``, if any."""
    if not cfg_uri.endswith("config.json"):
        return None
    cal = cfg_uri[: -len("config.json")] + "calibration.json"
    try:
        doc = json.loads(storage.read_bytes(cal))
    except Exception:  # noqa: BLE001 - a config without its calibration report: no fidelity figure
        return None
    return {
        "source": cal,
        **{
            k: doc.get("out_of_sample", {}).get(k)
            for k in ("n", "mae_h", "zero_mae_h", "within_1h", "zero_within_1h", "spearman")
        },
    }


def _guard_folds(
    cal: pd.DataFrame, censored: np.ndarray, a: int, b: int, tz: str, level: float, seed: int
) -> tuple[list[tuple[str, pd.DataFrame, dict[str, np.ndarray]]], list[dict[str, Any]]]:
    """The guard's rolling-origin folds over the calibration period (:func:`month_folds`): for each,
    the quantile model fitted on the jobs submitted before its cut, their waits censored at the cut
    (what was known then), and every candidate's points on its judged jobs (those whose wait was
    known at the period's end ``b``, as ``cal`` holds them). ([], []) where the period has no cut."""
    sub = cal["submit"].to_numpy(np.int64)
    real = cal["real_wait_s"].to_numpy(np.float64)
    folds, info = [], []
    for label, cut, end in month_folds(sub, ~censored, a, b, tz):
        fit = cal[sub < cut].copy()
        fit["real_wait_s"] = np.minimum(real[sub < cut], cut - sub[sub < cut])
        judged = ((sub >= cut) & (sub < end) & ~censored).nonzero()[0]
        fr = cal.iloc[judged].reset_index(drop=True)
        pt, _ = points(fr, fit_model(fit, level, seed))
        folds.append((label, fr, pt))
        info.append(
            {
                "label": label,
                "cut": pd.Timestamp(cut, unit="s", tz="UTC").tz_convert(tz).isoformat(),
                "end": pd.Timestamp(end, unit="s", tz="UTC").tz_convert(tz).isoformat(),
                "n_fit": int(len(fit)),
                "n_judged": int(len(fr)),
            }
        )
    return folds, info


def _check_line(fold_info: list[dict[str, Any]], margin: float) -> str:
    """How the guard's eligibility was checked, in one line."""
    rule = (
        f"at most {100 * margin:g} points below zero wait's within-1-h share in every fold, and pooled over the folds "
        "with one-sided 95 % confidence (standard errors clustered by day)"
    )
    if not fold_info:
        return (
            f"eligibility judged on the calibration period's held-back last {1 - FIT_SHARE:.0%} (no month to fold "
            f"on), parts fitted on the first {FIT_SHARE:.0%}: {rule}"
        )
    return (
        f"eligibility judged on {len(fold_info)} rolling-origin fold{'s' if len(fold_info) > 1 else ''} of the "
        "calibration period ("
        + ", ".join(
            f"{f['label']}: fitted on {f['n_fit']} jobs before it, judged on {f['n_judged']}" for f in fold_info
        )
        + f"), each fitted only on what was known at its cut: {rule}"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output)")
    p.add_argument(
        "--cluster-config",
        required=True,
        help="calibrated configuration (calibrate's config.json) or preset: nodes and priority weights",
    )
    p.add_argument("--calibrate-from", required=True, help="calibration period start (ISO; trace time zone)")
    p.add_argument("--calibrate-to", required=True, help="calibration period end, exclusive")
    p.add_argument("--months", nargs="+", required=True, help="scored months YYYY-MM (trace time zone), after it")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument("--level", type=float, default=LEVEL, help=f"the upper bound's level, in (0.5, 1) ({LEVEL})")
    p.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help=f"the guard's allowance on within 1 h below zero wait's, in [0, 0.5] ({MARGIN})",
    )
    p.add_argument(
        "--procs-per-node",
        type=int,
        default=None,
        help="processors per node, for traces that record processors but no node counts",
    )
    p.add_argument("--seed", type=int, default=0, help="model seed, 0 .. 2^31-1 (0)")


def run(args: argparse.Namespace) -> int:
    from ..data.schema import read_trace
    from ..sim.config import SimConfig, load_config
    from ..sim.workload import Workload

    if not (0.5 < args.level < 1.0):
        raise StepError(f"--level must lie in (0.5, 1), got {args.level}")
    if not (0.0 <= args.margin <= 0.5):
        raise StepError(f"--margin must lie in [0, 0.5], got {args.margin}")
    if not (0 <= args.seed < 2**31):
        raise StepError(f"--seed must lie in 0 .. 2^31-1, got {args.seed}")
    if args.procs_per_node is not None and args.procs_per_node < 1:
        raise StepError(f"--procs-per-node must be >= 1, got {args.procs_per_node}")
    bad = [m for m in args.months if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", m)]
    if bad:
        raise StepError(f"--months: {', '.join(map(repr, bad))} not of the form YYYY-MM")
    cfg = SimConfig.from_dict(load_config(args.cluster_config))
    df, meta = read_trace(args.trace)
    tz = meta.timezone or "UTC"
    a, b = _ts(args.calibrate_from, "--calibrate-from", tz), _ts(args.calibrate_to, "--calibrate-to", tz)
    months = sorted(set(args.months))
    c = _ts(months[0] + "-01", "--months", tz)
    d = int((pd.Timestamp(months[-1] + "-01").tz_localize(tz) + pd.offsets.MonthBegin(1)).timestamp())
    if not a < b:
        raise StepError("--calibrate-to must be after --calibrate-from")
    if not b <= c:
        raise StepError(
            f"--months {months[0]} begins before --calibrate-to: the scored months must come after the "
            "calibration period"
        )
    ppn = args.procs_per_node or cfg.procs_per_node or None
    wl = Workload.from_frame(df, ppn)
    if len(wl) > MAX_JOBS:
        raise StepError(f"{args.trace}: {len(wl)} jobs, more than this step walks ({MAX_JOBS})")
    first, last = (int(wl.submit[0]), int(wl.submit[-1])) if len(wl) else (0, -1)
    n_cal = int(((wl.submit >= a) & (wl.submit < b)).sum())
    if n_cal == 0:
        raise StepError(
            f"--calibrate-from/--calibrate-to: no job of {args.trace} was submitted in that period (the "
            f"trace's submissions run {pd.Timestamp(first, unit='s', tz='UTC').tz_convert(tz):%Y-%m-%d} to "
            f"{pd.Timestamp(last, unit='s', tz='UTC').tz_convert(tz):%Y-%m-%d})"
        )
    sub_m = pd.to_datetime(wl.submit, unit="s", utc=True).tz_convert(tz).strftime("%Y-%m")
    empty = [m for m in months if not (sub_m == m).any()]
    if empty:
        raise StepError(
            f"--months: no job of {args.trace} was submitted in {', '.join(empty)} (the trace's "
            f"submissions run {pd.Timestamp(first, unit='s', tz='UTC').tz_convert(tz):%Y-%m} to "
            f"{pd.Timestamp(last, unit='s', tz='UTC').tz_convert(tz):%Y-%m})"
        )
    params = {
        "config": cfg.to_dict(),
        "windows": [a, b, c, d],
        "months": months,
        "level": args.level,
        "margin": args.margin,
        "seed": args.seed,
        "xgb": XGB_PARAMS,
        "features": list(atsubmit.FEATURES),
        "fit_share": FIT_SHARE,
        "guard_folds": "rolling-origin, one per calendar month of the calibration period after the first",
        "fold_min_jobs": FOLD_MIN_JOBS,
        "eta": ETA,
        "guard_z": Z_ONE_SIDED,
        "quantiles": list(QUANTILES),
        "recent_n": atsubmit.RECENT_N,
        "procs_per_node": ppn,
        "model_file": MODEL_FILE,
        "fitted_at_cut": True,
        "bound_feedback": "at the bound's end",
        "bound_cap": "the calibration period's longest wait as known at its end",
        "bound_groups": BOUND_GROUPING,
        "bound_group_min_known": GROUP_MIN_KNOWN,
        "qbets_confidence": qbets.C,
    }
    step = Step("waitpred", args.out, __version__, params, inputs=[args.trace])
    if step.skip():
        return 0

    log.info(
        "waitpred: the queue at each submission, %d jobs from %s (the log before is walked for state)",
        int(((wl.submit >= a) & (wl.submit < d)).sum()),
        args.calibrate_from,
    )
    frame = atsubmit.sweep(wl, cfg, a, d, tz, label=args.trace)
    log.info("waitpred: fitting the quantile models (%d calibration jobs), then the bounds", n_cal)
    scored_mask = frame["submit"].to_numpy() >= c
    cal = frame[(frame["submit"] < b).to_numpy()].reset_index(drop=True)
    scored = frame[scored_mask].reset_index(drop=True)
    # every fitted part reads the calibration period as it stood at its end (mirage_tasks.calibration.atcut):
    # a job still waiting then has the wait "at least b - submit" (censored), never its later real wait
    cal_sub = cal["submit"].to_numpy(np.float64)
    censored = (cal_sub + cal["real_wait_s"].to_numpy(np.float64)) >= b
    cal["real_wait_s"] = np.where(censored, b - cal_sub, cal["real_wait_s"].to_numpy(np.float64))
    cap_s = atsubmit.bound_cap(cal["real_wait_s"].to_numpy(np.float64))
    cut = int(round(FIT_SHARE * len(cal)))
    if cut < 50 or len(cal) - cut < 50:
        raise StepError(f"the calibration period has {len(cal)} jobs: too few to fit and hold back a tail (>= 200)")
    head, tail = cal.iloc[:cut], cal.iloc[cut:].reset_index(drop=True)
    cen_tail = censored[cut:]
    pt_tail, base_tail = points(tail, fit_model(head, args.level, args.seed))
    real_tail = tail["real_wait_s"].to_numpy(np.float64)
    # the guard scores the tail's jobs whose wait was known at the cut: a censored job's error is
    # unknown for every prediction past the cut, and scoring it "as far as the cut shows" would
    # reward predicting long waits. Leaving them out drops the longest waits, which favours the
    # smaller predictions, zero wait first: the guard's safe side.
    known = ~cen_tail
    if known.sum() < 2:
        raise StepError(
            f"--calibrate-to: {int(cen_tail.sum())} of the {len(tail)} held-back jobs of the calibration "
            "period were still waiting at its end, too few known waits to score the candidates on: end "
            "the calibration period earlier or make it longer"
        )
    tail_pick, tail_m, _ = guard(
        tail[known].reset_index(drop=True), {k: pt_tail[k][known] for k in CANDIDATES}, args.margin, tz
    )
    folds, fold_info = _guard_folds(cal, censored, a, b, tz, args.level, args.seed)
    if not folds:  # no month to fold on: the held-back tail is the one fold
        folds = [("held-back tail", tail[known].reset_index(drop=True), {k: pt_tail[k][known] for k in CANDIDATES})]
    pick, fold_m, why = guard_folds(folds, args.margin, tz)
    if cen_tail.any() or censored.any():
        why += f"; {int(censored.sum())} calibration jobs still waiting at its end are not judged"
    theta0 = {k: atsubmit.static_theta(base_tail[k], real_tail, args.level, cen_tail, cap_s) for k in CANDIDATES}
    # one offset per job-size class, each started at its own class's offset on the tail where enough of it is known
    lv_tail, lv_scored = bound_levels(tail), bound_levels(scored)
    g_scored = atsubmit.group_keys(lv_scored)
    theta0_g, groups = {}, {}
    for k in CANDIDATES:
        theta0_g[k], info = atsubmit.group_theta0(
            base_tail[k],
            real_tail,
            args.level,
            cen_tail,
            lv_tail,
            cap_s,
            GROUP_MIN_KNOWN,
            also=lv_scored,
            merge_order=size_key,
        )
        groups[k] = dict(sorted(info.items(), key=lambda kv: _group_order(kv[0])))
    for k in CANDIDATES:
        tail_m[k]["coverage_static"] = float(
            (~cen_tail & (real_tail <= atsubmit.static_bound(base_tail[k], theta0[k], cap_s))).mean()
        )
    model = fit_model(cal, args.level, args.seed)
    pt, base = points(scored, model)
    pred = scored[["job_id", "submit", "real_wait_s", "nodes", "limit_s", "est_s", "plannable"]].copy()
    sub = scored["submit"].to_numpy(np.float64)
    real = scored["real_wait_s"].to_numpy(np.float64)
    for k in CANDIDATES:
        pred[k] = pt[k]
        pred[f"{k}_bound"], _ = atsubmit.online_bound(
            base[k], sub, real, args.level, theta0_g[k], ETA, cap_s, group=g_scored
        )
    pred["guarded"] = pred[pick]
    pred["guarded_bound"] = pred[f"{pick}_bound"]
    # the QBETS reference bound, online over the log from its first job: each job answered from the
    # waits of the jobs started before its submission (nothing fitted on the calibration period)
    from .fidelity import node_class

    lo_c, hi_d = (int(np.searchsorted(wl.submit, t, "left")) for t in (c, d))
    qb, q_info = qbets.bounds(wl.submit[:hi_d], wl.real_start[:hi_d], node_class(wl.nodes[:hi_d]), args.level, qbets.C)
    if not np.array_equal(wl.job_id[lo_c:hi_d], pred["job_id"].to_numpy()):  # the sweep's rows are these jobs
        raise AssertionError("waitpred: the scored jobs are not the log's jobs submitted in the scored months")
    pred["qbets_bound"] = qb[lo_c:hi_d]
    res = score(pred, tz, cap_s)
    q_res = score_qbets(pred, tz)
    doc = {
        "trace": args.trace,
        "timezone": tz,
        "params": params,
        "windows": {
            "calibrate_from": pd.Timestamp(a, unit="s", tz="UTC").tz_convert(tz).isoformat(),
            "calibrate_to": pd.Timestamp(b, unit="s", tz="UTC").tz_convert(tz).isoformat(),
        },
        "pick": pick,
        "pick_reason": why,
        "guard": {
            "check": _check_line(fold_info, args.margin),
            "folds": fold_info,
            "candidates": fold_m,
            "single_tail_pick": tail_pick,
        },
        "promise": {"margin": args.margin, "months": promise(res, pick, args.margin)},
        "tail": tail_m,
        "theta0": theta0,  # pooled, per candidate (each size class's start: bound.groups)
        "reads": READS,
        "at_cut": {
            "cut": pd.Timestamp(b, unit="s", tz="UTC").tz_convert(tz).isoformat(),
            "censored_waits": int(censored.sum()),
            "reads": AT_CUT,
        },
        "bound": {
            "cap_s": cap_s,
            "cap_h": cap_s / 3600.0,
            "theta_limit": atsubmit.theta_limit(cap_s),
            "eta": ETA,
            "grouping": BOUND_GROUPING,
            "group_min_known": GROUP_MIN_KNOWN,
            "groups": groups,
            "reads": BOUND_READS,
        },
        "n_calibration": int(len(cal)),
        "n_scored": int(len(scored)),
        "hygiene": hygiene(meta, wl, a, d),
        "unplannable_scored": int((~scored["plannable"]).sum()),
        "out_of_sample": res,
        "criteria": criteria(res, args.level, q_res, args.margin),
        "qbets": {**q_res, **q_info, "reads": qbets.READS},
        "feature_importance": dict(zip(atsubmit.FEATURES, map(float, model.feature_importances_))),
        "replay_fidelity": _replay_fidelity(args.cluster_config),
    }
    doc = _clean(doc)
    step.write_json(DOC_FILE, doc)
    buf = io.BytesIO()
    pred.to_parquet(buf, index=False)
    step.write_bytes("predictions.parquet", buf.getvalue())
    step.write_bytes("waitpred.md", markdown(doc).encode())
    # the model fitted on the whole calibration period, for the sampling's predictor at decision
    # times (mirage_tasks.calibration.atprobe): xgboost's own format, never a pickle
    step.write_bytes(MODEL_FILE, bytes(model.get_booster().save_raw("ubj")))
    step.commit(summary={"pick": pick, "criteria": doc["criteria"]})
    print(
        f"waitpred: pick {pick}; out of sample MAE h: "
        + ", ".join(f"{k} {res[k]['pooled']['mae_h']:.2f}" for k in PREDICTORS)
        + f"; within 1 h guarded {res['guarded']['pooled']['within_1h']:.1%} vs zero "
        f"{res['zero']['pooled']['within_1h']:.1%}; {args.level:.0%} bound coverage per month: "
        + ", ".join(f"{m} {v:.1%}" for m, v in doc["criteria"]["coverage_months"].items() if v is not None)
        + f"; guarded bound median {res['guarded']['pooled']['bound_median_h']:.2f} h (real waits' median "
        f"{res['guarded']['pooled']['real_median_h']:.2f} h), {res['guarded']['pooled']['at_cap']:.1%} at the cap of "
        f"{cap_s / 3600.0:.1f} h; QBETS reference bound coverage per month: "
        + ", ".join(f"{m} {v:.1%}" for m, v in doc["criteria"]["qbets_coverage_months"].items() if v is not None)
        + f", median {_f(q_res['pooled'].get('bound_median_h'), '{:.2f}')} h. "
        + (_hygiene_line(doc["hygiene"]) or ""),
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mirage_tasks.calibration.waitpred", description=__doc__.split("\n\n")[0]
    )
    add_arguments(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except StepError as exc:
        print(f"mirage_tasks.calibration.waitpred: error: {exc}", file=sys.stderr)
        return 2


def _entry(argv: list[str] | None = None) -> int:
    """:func:`main` with the step contract's SIGTERM (exit 143 after the ``finally`` blocks ran)."""
    from stepkit.procs import run_trapped

    return run_trapped(main, "mirage_tasks.calibration.waitpred", argv)


if __name__ == "__main__":
    sys.exit(_entry())
