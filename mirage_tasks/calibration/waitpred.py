"""A queue-wait predictor that is never knowingly worse than predicting zero (issue 22).

    python -m mirage_tasks.calibration.waitpred --trace T --cluster-config CFG --calibrate-from A --calibrate-to B \\
        --months 1997-01 1997-02 1997-03 --out URI [--lead-in-days 7] [--seed 0]

Three candidate predictors of each job's wait, all fitted on the jobs submitted in the
calibration period ``[A, B)`` only (dates in the trace's time zone):

* ``simulator``: the calibrated simulator (``CFG``, e.g. the ``calibrate`` step's config.json),
  each calendar month replayed from a warm start ``--lead-in-days`` before it (as ``calibrate``);
* ``corrected``: a gradient-boosted model (xgboost, absolute-error objective) of the real wait from
  the simulator's wait and what is known at the job's submission (:data:`FEATURES`: its request,
  and the real queue then: pending jobs and nodes, busy nodes over the machine, the recent
  average wait, hour and weekday);
* ``zero``: no wait.

The **guard** fits the correction on the first :data:`FIT_SHARE` of the calibration jobs (by
submission), and picks the candidate with the least MAE on the rest (the held-back tail); a
picked correction is refitted on the whole period. The pick (``guarded``) is scored on the jobs
submitted in ``--months`` beside every candidate and the ``recent`` average predictor (mean real
wait of the last :data:`RECENT_N` jobs started before the submission), with
:func:`mirage_tasks.calibration.fidelity.metrics` (MAE, within 1 h, Spearman, daily-mean correlation), pooled
and per month.

Outputs under ``--out``: ``waitpred.json``, ``predictions.parquet`` (every scored job: real wait and
each predictor's, seconds), then ``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from typing import Any

import numpy as np
import pandas as pd

from stepkit import Step, StepError, storage

from .. import __version__

log = logging.getLogger(__name__)

FIT_SHARE = 0.75
RECENT_N = 50
PREDICTORS = ("simulator", "corrected", "zero", "recent", "guarded")
CANDIDATES = ("simulator", "corrected", "zero")
TIE_ORDER = ("zero", "simulator", "corrected")
FEATURES = ("sim_wait_h", "log_limit_h", "log_nodes", "pending_jobs", "pending_nodes_frac", "busy_frac",
            "recent_wait_h", "hour", "weekday")
XGB_PARAMS = {"objective": "reg:absoluteerror", "n_estimators": 200, "max_depth": 4, "learning_rate": 0.05,
              "subsample": 0.8, "random_state": 0, "n_jobs": 1}


def submission_features(wl: Any, machine_nodes: int, tz: str) -> pd.DataFrame:
    """Per job of ``wl`` (its order), what the real queue looked like at its submission: only jobs
    submitted before it and only starts/ends at or before it are read."""
    sub = wl.submit.astype(np.int64)
    st = wl.real_start.astype(np.int64)
    en = (wl.real_start + wl.duration).astype(np.int64)
    nd = wl.nodes.astype(np.float64)
    wait = (st - sub).astype(np.float64)
    o_sub, o_st, o_en = np.argsort(sub, kind="stable"), np.argsort(st, kind="stable"), np.argsort(en, kind="stable")
    s_sub, s_st, s_en = sub[o_sub], st[o_st], en[o_en]
    c_sub = np.r_[0.0, np.cumsum(nd[o_sub])]
    c_st = np.r_[0.0, np.cumsum(nd[o_st])]
    c_en = np.r_[0.0, np.cumsum(nd[o_en])]
    c_wait = np.r_[0.0, np.cumsum(wait[o_st])]
    k_sub = np.searchsorted(s_sub, sub, "left")       # jobs submitted strictly before
    k_st = np.searchsorted(s_st, sub, "right")        # jobs started at or before
    k_en = np.searchsorted(s_en, sub, "right")        # jobs ended at or before
    k_st_strict = np.searchsorted(s_st, sub, "left")  # started strictly before: their wait is known
    lo = np.maximum(k_st_strict - RECENT_N, 0)
    cnt = k_st_strict - lo
    recent = np.where(cnt > 0, (c_wait[k_st_strict] - c_wait[lo]) / np.maximum(cnt, 1), 0.0)
    local = pd.to_datetime(sub, unit="s", utc=True).tz_convert(tz)
    return pd.DataFrame({
        "job_id": wl.job_id,
        "log_limit_h": np.log1p(wl.limit.astype(np.float64) / 3600.0),
        "log_nodes": np.log1p(nd),
        "pending_jobs": np.maximum(k_sub - np.minimum(k_st, k_sub), 0).astype(np.float64),
        "pending_nodes_frac": np.maximum(c_sub[k_sub] - c_st[np.minimum(k_st, k_sub)], 0.0) / machine_nodes,
        "busy_frac": np.maximum(c_st[k_st] - c_en[k_en], 0.0) / machine_nodes,
        "recent_wait_h": recent / 3600.0,
        "hour": local.hour.to_numpy(np.float64),
        "weekday": local.day_of_week.to_numpy(np.float64),
    })


def _frame(wl: Any, cfg: Any, a: int, b: int, lead_in_s: int, tz: str, feats: pd.DataFrame) -> pd.DataFrame:
    from .calibrate import replay_months

    df = replay_months(wl, cfg, a, b, lead_in_s, tz)
    df = df.merge(feats, on="job_id", how="left", validate="one_to_one")
    df["sim_wait_h"] = df["sim_wait_s"] / 3600.0
    return df.sort_values(["submit", "job_id"], kind="stable").reset_index(drop=True)


def fit_correction(df: pd.DataFrame, seed: int = 0):
    import xgboost as xgb

    m = xgb.XGBRegressor(**{**XGB_PARAMS, "random_state": seed})
    m.fit(df[list(FEATURES)].to_numpy(np.float64), df["real_wait_s"].to_numpy(np.float64) / 3600.0)
    return m


def _predict_h(model, df: pd.DataFrame) -> np.ndarray:
    return np.maximum(model.predict(df[list(FEATURES)].to_numpy(np.float64)).astype(np.float64), 0.0)


def guard(cal: pd.DataFrame, seed: int = 0) -> tuple[str, dict[str, float], Any]:
    """(pick, tail MAE per candidate, the correction refitted on all of ``cal``)."""
    cut = int(round(FIT_SHARE * len(cal)))
    if cut < 50 or len(cal) - cut < 50:
        raise StepError(f"the calibration period has {len(cal)} jobs: too few to fit and hold back a tail")
    head, tail = cal.iloc[:cut], cal.iloc[cut:]
    real = tail["real_wait_s"].to_numpy(np.float64) / 3600.0
    corr = fit_correction(head, seed)
    mae = {"simulator": float(np.abs(tail["sim_wait_h"].to_numpy() - real).mean()),
           "corrected": float(np.abs(_predict_h(corr, tail) - real).mean()),
           "zero": float(np.abs(real).mean())}
    # ties go to the simpler predictor: zero, then the simulator, then the correction
    pick = min(CANDIDATES, key=lambda k: (round(mae[k], 9), TIE_ORDER.index(k)))
    return pick, mae, fit_correction(cal, seed)


def predictions(df: pd.DataFrame, corr, pick: str) -> pd.DataFrame:
    out = df[["job_id", "submit", "real_wait_s", "nodes"]].copy()
    out["simulator"] = df["sim_wait_s"].to_numpy(np.float64)
    out["corrected"] = _predict_h(corr, df) * 3600.0
    out["zero"] = 0.0
    out["recent"] = df["recent_wait_h"].to_numpy(np.float64) * 3600.0
    out["guarded"] = out[pick]
    return out


def score(pred: pd.DataFrame, tz: str) -> dict[str, Any]:
    """fidelity metrics of every predictor, pooled and per month (submission, ``tz``)."""
    from .fidelity import metrics

    month = pd.to_datetime(pred["submit"], unit="s", utc=True).dt.tz_convert(tz).dt.strftime("%Y-%m")
    res: dict[str, Any] = {}
    for p in PREDICTORS:
        f = pred[["submit", "real_wait_s"]].assign(sim_wait_s=pred[p])
        res[p] = {"pooled": metrics(f, tz), "months": {m: metrics(g, tz) for m, g in f.groupby(month, sort=True)}}
    return res


def _clean(o: Any) -> Any:
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, float):
        return None if not np.isfinite(o) else o
    return o


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mirage_tasks.calibration.waitpred", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", required=True, help="normalised trace (ingest output)")
    p.add_argument("--cluster-config", required=True, help="calibrated configuration (calibrate's config.json) or preset")
    p.add_argument("--calibrate-from", required=True, help="calibration period start (ISO; trace time zone)")
    p.add_argument("--calibrate-to", required=True, help="calibration period end, exclusive")
    p.add_argument("--months", nargs="+", required=True, help="scored months YYYY-MM (trace time zone)")
    p.add_argument("--out", required=True)
    p.add_argument("--lead-in-days", type=float, default=7.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        from ..data.schema import read_trace
        from ..sim.config import SimConfig, load_config
        from ..sim.workload import Workload

        cfg = SimConfig.from_dict(load_config(args.cluster_config))
        df, meta = read_trace(args.trace)
        tz = meta.timezone or "UTC"

        def ts(v: str, flag: str) -> int:
            try:
                t = pd.Timestamp(v)
            except (ValueError, TypeError) as exc:
                raise StepError(f"{flag} {v!r} is not an ISO date/time") from exc
            return int((t.tz_localize(tz) if t.tzinfo is None else t).timestamp())

        a, b = ts(args.calibrate_from, "--calibrate-from"), ts(args.calibrate_to, "--calibrate-to")
        months = sorted(args.months)
        c = ts(months[0] + "-01", "--months")
        d = int((pd.Timestamp(months[-1] + "-01").tz_localize(tz) + pd.offsets.MonthBegin(1)).timestamp())
        if not a < b <= c < d:
            raise StepError("the calibration period must end before the first scored month begins")
        if args.lead_in_days < 0:
            raise StepError("--lead-in-days must be >= 0")
        params = {"config": cfg.to_dict(), "windows": [a, b, c, d], "months": months, "lead_in_days": args.lead_in_days,
                  "seed": args.seed, "xgb": XGB_PARAMS, "features": list(FEATURES), "fit_share": FIT_SHARE,
                  "recent_n": RECENT_N}
        step = Step("waitpred", args.out, __version__, params, inputs=[args.trace])
        if step.skip():
            return 0
        wl = Workload.from_frame(df, cfg.procs_per_node or None)
        feats = submission_features(wl, int(cfg.nodes), tz)
        lead = int(round(args.lead_in_days * 86400))
        cal = _frame(wl, cfg, a, b, lead, tz, feats)
        pick, tail_mae, corr = guard(cal, args.seed)
        scored = _frame(wl, cfg, c, d, lead, tz, feats)
    except StepError as exc:
        print(f"mirage_tasks.calibration.waitpred: error: {exc}", file=sys.stderr)
        return 2
    pred = predictions(scored, corr, pick)
    res = score(pred, tz)
    cal_pred = predictions(cal, corr, pick)
    doc = {"params": params, "timezone": tz, "pick": pick, "tail_mae_h": tail_mae,
           "n_calibration": int(len(cal)), "n_scored": int(len(scored)),
           "in_sample": {k: v["pooled"] for k, v in score(cal_pred, tz).items()},
           "out_of_sample": res,
           "feature_importance": dict(zip(FEATURES, map(float, corr.feature_importances_)))}
    zero = res["zero"]["pooled"]["mae_h"]
    g = res["guarded"]["pooled"]["mae_h"]
    doc["criteria"] = {"mae_at_or_below_zero": bool(g <= zero + 1e-12),
                       "mae_reduction_vs_zero": (1 - g / zero) if zero > 0 else None}
    step.write_json("waitpred.json", _clean(doc))
    buf = io.BytesIO()
    pred.to_parquet(buf, index=False)
    step.write_bytes("predictions.parquet", buf.getvalue())
    step.commit(summary={"pick": pick, "criteria": doc["criteria"]})
    print(f"waitpred: pick {pick} (tail MAE h: " + ", ".join(f"{k} {v:.2f}" for k, v in tail_mae.items())
          + f"); out of sample MAE h: " + ", ".join(f"{k} {res[k]['pooled']['mae_h']:.2f}" for k in PREDICTORS),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
