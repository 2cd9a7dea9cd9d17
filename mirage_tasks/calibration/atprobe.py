"""The wait predictor asked at a decision time, on the simulator's queue (protocol v2).

A submitter on the simulated machine who asks, at a decision time ``t``, "if I submit the
successor now, when will it start?" sees the simulator's queue at ``t``: the jobs running (their
starts, requested times, node counts), the jobs pending (their submissions, requests), the waits
of the latest starts. :class:`WaitAtProbe` turns that state into the wait predictor's inputs with
the code that computes them for a log (:func:`~mirage_tasks.calibration.atsubmit.queue_row`), and
asks the predictor fitted by ``waitpred`` on the log's calibration period (its model,
``model.ubj``, and its guard's pick) for the successor's wait ``w(t)`` and its upper bound ``b(t)``
at the predictor's level.

What each figure may know: only the simulator's state at ``t`` (nothing the simulation does
after ``t``), and per job its run-time estimate, fixed at the job's submission from its user's
jobs that had ended in the log by then (:func:`~mirage_tasks.calibration.atsubmit.estimates`; the
simulator replays the same jobs with the same run times, so which of a user's jobs had ended by a
submission can differ from the simulation only by the simulation's shift of their starts). The
service's own jobs have no user history: their estimate is their request, and the per-user
features are "unknown" (-1), as for a log's jobs without a user.

The bound uses the calibration period's split-conformal offset (``theta0`` of the pick) and the
bound's cap (``bound.cap_s``, the calibration period's longest wait as known at its end): the
online correction ``waitpred`` applies over a log's months needs each job's outcome as it becomes
known, which a fork of the simulation at ``t`` would learn only from its own future.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError, storage

from ..sim import decision_rules as dr
from . import atsubmit, waitpred

# named where they are written; the service reads them from here
from .waitpred import DOC_FILE, MODEL_FILE

#: per-probe columns the sampling adds to ``probes.parquet`` when given a predictor
COLUMNS = ("wp_wait_s", "wp_bound_s", "wp_plan_request_s")


class WaitAtProbe:
    """Callable at a decision time: ``(sim, nodes, limit_s) -> {wp_wait_s, wp_bound_s,
    wp_plan_request_s}`` for a job of that request submitted now (seconds)."""

    def __init__(self, raw_model: bytes, doc: dict[str, Any], estimates: np.ndarray | None, tz: str):
        import xgboost as xgb

        self.pick = str(doc["pick"])
        if self.pick not in waitpred.CANDIDATES:
            raise StepError(f"waitpred pick {self.pick!r} is not a known candidate ({', '.join(waitpred.CANDIDATES)})")
        self.theta = float(doc["theta0"][self.pick])
        # the bound's cap (an output of an older waitpred has none: uncapped, as it was fitted)
        self.cap = float((doc.get("bound") or {}).get("cap_s") or np.inf)
        self.level = float(doc["params"]["level"])
        feats = list(doc["params"]["features"])
        if feats != list(atsubmit.FEATURES):
            raise StepError(
                f"the waitpred output was fitted on features {feats}, this version computes "
                f"{list(atsubmit.FEATURES)}: rerun waitpred"
            )
        self.model = xgb.XGBRegressor()
        self.model.load_model(bytearray(raw_model))
        # None: every job's estimate is its request (what a live queue shows: the service keeper's
        # view, and the simulator predicting it, :mod:`mirage_tasks.slurm.livewait`)
        self.est = None if estimates is None else np.asarray(estimates, dtype=np.float64)
        self.tz = tz
        self.raw = bytes(raw_model)
        self.doc = doc

    @classmethod
    def load(cls, uri: str, wl: Any, tz: str) -> WaitAtProbe:
        """The predictor of a committed ``waitpred`` output at ``uri``, for the log ``wl``."""
        from ..data.artifacts import require_input

        require_input(uri, "--waitpred")
        try:
            raw = storage.read_bytes(storage.join(uri, MODEL_FILE))
        except FileNotFoundError as exc:
            raise StepError(
                f"--waitpred {uri}: no {MODEL_FILE} (an output of an older waitpred): rerun waitpred"
            ) from exc
        doc = json.loads(storage.read_bytes(storage.join(uri, DOC_FILE)))
        return cls(raw, doc, atsubmit.estimates(wl), tz)

    def __reduce__(self):  # to a worker process: the model's own bytes (UBJ), not a pickled booster
        return (WaitAtProbe, (self.raw, self.doc, self.est, self.tz))

    def row(self, sim: Any, nodes: int, limit_s: int) -> dict[str, float]:
        """The predictor's inputs (:data:`atsubmit.FEATURES`) and plans for the request now."""
        t = int(sim.now)
        tag = np.asarray(sim.j_tag, dtype=np.int64)
        lim = np.asarray(sim.j_limit, dtype=np.float64)
        est = lim if self.est is None else np.minimum(np.where(tag >= 0, self.est[np.maximum(tag, 0)], lim), lim)
        ri = np.fromiter(sim.running, dtype=np.int64, count=len(sim.running))
        pend = [j for _, _, j in sim.queue] + [j for v in sim.held.values() for j in v]
        pi = np.array(sorted(pend), dtype=np.int64)
        start = np.asarray(sim.j_start, dtype=np.int64)
        sub = np.asarray(sim.j_submit, dtype=np.int64)
        nod = np.asarray(sim.j_nodes, dtype=np.float64)
        recent = list(sim.waits)[-atsubmit.RECENT_N :]
        C = float(sim.cap)
        fs = getattr(sim, "fs", None)  # fair share: the queued jobs' terms as the simulator holds them now
        p_fs = None if fs is None else np.array([fs.term(sim.j_user[j]) for j in pi.tolist()], dtype=np.float64)
        row = atsubmit.queue_row(
            t,
            C,
            atsubmit.priority_weights(sim.cfg),
            start[ri],
            lim[ri],
            est[ri],
            nod[ri],
            sub[pi],
            lim[pi],
            est[pi],
            nod[pi],
            pi,
            float(nodes),
            float(limit_s),
            float(limit_s),
            recent,
            None,
            p_fs,
            0.0 if fs is None else fs.term(-1),
        )
        return self.finish(row, t, nodes, limit_s)

    def finish(self, row: dict[str, float], t: int, nodes: int, limit_s: int) -> dict[str, float]:
        """A :func:`atsubmit.queue_row` completed as the sweep completes it: an unplannable plan
        is the request, then the request's own and the calendar's columns (``t``: trace time)."""
        for c in ("plan_s", "plan_request_s", "plan_easy_s"):  # as the sweep: unplannable -> the request
            if not np.isfinite(row[c]):
                row[c] = float(limit_s)
        local = pd.Timestamp(t, unit="s", tz="UTC").tz_convert(self.tz)
        row.update(
            log_limit_h=np.log1p(limit_s / 3600.0),
            log_nodes=np.log1p(nodes),
            log_est_h=np.log1p(row["est_s"] / 3600.0),
            hour=float(local.hour),
            weekday=float(local.day_of_week),
            plan_h=row["plan_s"] / 3600.0,
            plan_request_h=row["plan_request_s"] / 3600.0,
            plan_easy_h=row["plan_easy_s"] / 3600.0,
        )
        return row

    def __call__(self, sim: Any, nodes: int, limit_s: int) -> dict[str, float]:
        return self.answer(self.row(sim, nodes, limit_s))

    def answer(self, row: dict[str, float]) -> dict[str, float]:
        """The pick's wait and bound (seconds) for a completed row (:meth:`row`, :meth:`finish`)."""
        # the row as the one-row frame of waitpred.points would give it, without the frame (a frame
        # costs more than the model's prediction, and the predictor is asked at every decision)
        pt, base = waitpred.points_of(
            np.array([[row[c] for c in atsubmit.FEATURES]], dtype=np.float64),
            np.array([row["recent_wait_h"]], dtype=np.float64),
            np.array([row["plan_request_s"]], dtype=np.float64),
            np.array([row["plan_s"]], dtype=np.float64),
            self.model,
        )
        w = float(pt[self.pick][0])
        b = float(atsubmit.static_bound(base[self.pick], self.theta, self.cap)[0])
        return {"wp_wait_s": w, "wp_bound_s": b, "wp_plan_request_s": float(row["plan_request_s"])}


# ----------------------------------------------------------------------------- as model features

#: the channels ``merge --waitpred-features`` appends to every history (protocol v2's ``xgboost-wp``),
#: in hours: the predictor's wait ``w(t)`` and bound ``b(t)`` for the successor submitted at the
#: decision time, and ``w(t) - D`` (``D``: the time left to the predecessor's pre-simulated end) as
#: its two parts, ``max(w - D, 0)`` (a predicted gap) and ``max(D - w, 0)`` (a predicted overlap).
#: Two parts because the models' scaler reads every feature as non-negative (``log1p`` of the value
#: clipped at 0): one signed channel would lose every predicted overlap.
FEATURES = ("wp_wait_h", "wp_bound_h", "wp_gap_h", "wp_overlap_h")


def feature_columns(meta: pd.DataFrame, where: str) -> np.ndarray:
    """:data:`FEATURES` of each probe row (float32 [n, 4]) from a sample's ``probes.parquet`` rows;
    ``where`` names the input in errors (one sampled without ``--waitpred`` has no answers)."""
    need = [*COLUMNS[:2], "pred_end_without_succ", "probe_time"]
    missing = [c for c in need if c not in meta.columns]
    if missing:
        raise StepError(
            f"{where}: its probes have no {', '.join(missing)} (sampled without --waitpred?): the "
            "wait predictor's features need the predictor's answer at every probe"
        )
    left = (meta["pred_end_without_succ"].to_numpy(np.float64) - meta["probe_time"].to_numpy(np.float64)) / 3600.0
    cols = channels(meta["wp_wait_s"].to_numpy(np.float64), meta["wp_bound_s"].to_numpy(np.float64), left)
    bad = ~np.isfinite(cols).all(axis=1)
    if bad.any():
        raise StepError(
            f"{where}: {int(bad.sum())} probe(s) without a finite wait-predictor answer "
            f"(first at row {int(np.flatnonzero(bad)[0])})"
        )
    return cols.astype(np.float32)


def channels(wait_s: np.ndarray | float, bound_s: np.ndarray | float, left_h: np.ndarray | float) -> np.ndarray:
    """:data:`FEATURES` (float32 [n, 4]) of answers (seconds) with ``left_h`` hours to the predecessor's
    end: the one formula of the sampled probes (:func:`feature_columns`) and the online decider."""
    w = np.atleast_1d(np.asarray(wait_s, np.float64)) / 3600.0
    left = np.atleast_1d(np.asarray(left_h, np.float64))
    return np.stack(
        [
            w,
            np.atleast_1d(np.asarray(bound_s, np.float64)) / 3600.0,
            np.maximum(w - left, 0.0),
            np.maximum(left - w, 0.0),
        ],
        axis=1,
    ).astype(np.float32)


def submits(rule: str, answer: dict[str, float], left_s: float, next_s: float, margin_h: float | None = 0.0) -> bool:
    """Whether a wait-predictor rule submits now, given the predictor's ``answer`` (seconds), ``left_s``
    to the predecessor's end and ``next_s`` to the next decision: ``wait-pred`` when the predicted wait
    reaches the time left (``wait - left >= margin_h``, 0 unless calibrated; None: never early),
    ``guarantee`` when the bound reaches the time left at the next decision, ``guarantee-cal`` when
    the bound minus that time reaches ``margin_h`` (its conformal margin; None: never early). The
    probe replay's scores (``Probes.wait_pred_score``, ``guarantee_score``) are the same tests on
    the probe grid."""
    if rule == dr.WAIT_PRED:
        return margin_h is not None and (answer["wp_wait_s"] - left_s) / 3600.0 >= margin_h
    if rule == dr.GUARANTEE:
        return answer["wp_bound_s"] >= left_s - next_s
    if rule == dr.GUARANTEE_CAL:
        return margin_h is not None and (answer["wp_bound_s"] - (left_s - next_s)) / 3600.0 >= margin_h
    raise ValueError(f"not a wait-predictor rule: {rule!r}")


def with_features(X: np.ndarray, meta: pd.DataFrame, where: str) -> np.ndarray:
    """Histories ``X`` [n, W, F] with :data:`FEATURES` appended as channels [n, W, F + 4]: the answer
    at the decision time, the same at every step of the window (the predictor is asked once, at the
    decision: no earlier answer is known to the sample)."""
    cols = feature_columns(meta, where)
    if len(cols) != len(X):
        raise StepError(f"{where}: {len(X)} histories but {len(cols)} probe rows")
    n, W, _ = X.shape
    return np.concatenate([np.asarray(X, np.float32), np.broadcast_to(cols[:, None, :], (n, W, len(FEATURES)))], axis=2)


def uses_features(feature_names: list[str] | tuple[str, ...]) -> bool:
    """Whether a model was trained on histories with :data:`FEATURES` appended."""
    return tuple(feature_names[-len(FEATURES) :]) == FEATURES
