"""The wait predictor asked at a decision time on the simulator's queue (protocol v2):
the simulator's state at ``t`` gives the predictor exactly the inputs the log-side sweep gives for
a job submitted at ``t`` into a log that holds the same history, and the sample step records its
answer at every probe without a word from after the probe."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from mirage_tasks.calibration import atprobe, atsubmit, waitpred
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.engine import Simulator
from mirage_tasks.sim.workload import Workload

T0 = 1_000_000_000  # a Sunday 01:46 UTC


def _log(n: int = 260, seed: int = 3, nodes: int = 16) -> Workload:
    rng = np.random.default_rng(seed)
    sub = T0 + 7 + np.cumsum(rng.integers(30, 300, n) * 2)  # odd seconds: no tie with t below
    lim = rng.choice([3600, 4 * 3600, 12 * 3600], n).astype(np.float64)
    dur = np.maximum(
        62, (lim * rng.uniform(0.05, 1.0, n)).astype(np.int64) // 2 * 2
    )  # even: every event at an odd second
    nod = rng.choice([1, 2, 4, 8], n, p=[0.4, 0.3, 0.2, 0.1])
    user = rng.integers(0, 9, n)
    return Workload(
        job_id=np.arange(n),
        submit=sub.astype(np.int64),
        real_start=sub.astype(np.int64),
        real_end=(sub + dur).astype(np.int64),
        duration=dur.astype(np.int64),
        limit=lim,
        nodes=nod.astype(np.int64),
        user=user.astype(np.int64),
        priority=np.full(n, np.nan),
    )


CFG = SimConfig(nodes=16, warm_start=False, tick_s=0, weight_age=5000.0, weight_size=300.0)


def _same_history_log(wl: Workload, sim: Simulator, t: int, nodes: int, limit: int) -> Workload:
    """A log holding what the simulator did before ``t`` (its starts as the real starts), the jobs
    pending at ``t`` starting after it, and a job of the request submitted at ``t``."""
    tag = np.asarray(sim.j_tag)
    st = np.asarray(sim.j_start)
    real = np.full(len(wl), t + 10**7, dtype=np.int64)  # not started by t (or never submitted in the sim)
    for j in np.flatnonzero(tag >= 0):
        if 0 <= st[j] < t:
            real[tag[j]] = st[j]
    k = int(np.searchsorted(wl.submit, t))
    ins = lambda a, v: np.insert(np.asarray(a), k, v)  # noqa: E731
    real = ins(real, t + 10**7)
    return Workload(
        job_id=ins(wl.job_id, -1),
        submit=ins(wl.submit, t),
        real_start=real,
        real_end=real + ins(wl.duration, limit),
        duration=ins(wl.duration, limit),
        limit=ins(wl.limit, float(limit)),
        nodes=ins(wl.nodes, nodes),
        user=ins(wl.user, -1),
        priority=ins(wl.priority, np.nan),
    ), k


class _Rows(atprobe.WaitAtProbe):
    """The state-to-inputs half of the predictor, without a model (the estimates given)."""

    def __init__(self, est: np.ndarray):
        self.est, self.tz = est, "UTC"


#: Slurm's fair share re-read every 2 s: at an even ``t`` the simulator's factors are those of ``t``,
#: as the sweep's ledger computes them
CFG_FS = CFG.replace(priority="multifactor", weight_fairshare=2000.0, fs_halflife_s=6 * 3600, fs_calc_period_s=2)


@pytest.mark.parametrize("cfg", [CFG, CFG_FS], ids=["age_size", "fair_share"])
@pytest.mark.parametrize("hours", [9.0, 23.0, 40.5])
def test_simulator_state_gives_the_sweeps_inputs(hours, cfg):
    wl = _log()
    sim = Simulator.from_workload(wl, cfg, T0, int(wl.submit[-1]) + 1)
    t = T0 + int(hours * 3600) // 2 * 2  # even: never a submission, start or end of the log
    sim.run_until(t)
    assert len(sim.running) and len(sim.queue), "the state should hold running and pending jobs"
    log2, k = _same_history_log(wl, sim, t, nodes=4, limit=48 * 3600)
    # the estimates as the sweep fixes them, from the same history
    est = atsubmit.estimates(log2)
    est_sim = np.delete(est, k)
    row = _Rows(est_sim).row(sim, 4, 48 * 3600)
    frame = atsubmit.sweep(log2, cfg, t, t + 1)
    assert len(frame) == 1 and frame["job_id"].iloc[0] == -1
    for c in atsubmit.FEATURES:
        assert row[c] == pytest.approx(float(frame[c].iloc[0]), rel=1e-12, abs=1e-9), c
    assert row["plan_request_s"] == pytest.approx(float(frame["plan_request_s"].iloc[0]))


def test_estimates_match_the_sweep():
    wl = _log(n=300, seed=5)
    a, b = int(wl.submit[40]), int(wl.submit[-1]) + 1
    frame = atsubmit.sweep(wl, CFG, a, b)
    assert np.array_equal(atsubmit.estimates(wl)[40:], frame["est_s"].to_numpy())


def test_static_bound_is_the_online_bound_at_a_fixed_offset():
    base = np.array([0.0, 30.0, 3600.0, 7200.0])
    b, thetas = atsubmit.online_bound(base, np.arange(4.0) * 1e6, np.zeros(4), 0.9, 0.7, eta=0.0)
    assert np.allclose(atsubmit.static_bound(base, 0.7), b)
    assert np.all(thetas == 0.7)


def _fit_doc(frame: pd.DataFrame) -> tuple[bytes, dict]:
    model = waitpred.fit_model(frame, 0.9, seed=0)
    doc = {
        "pick": "corrected_q40",
        "theta0": {"corrected_q40": 0.25},
        "params": {"level": 0.9, "features": list(atsubmit.FEATURES)},
    }
    return bytes(model.get_booster().save_raw("ubj")), doc, model


def test_predictor_answers_from_its_stored_model_as_waitpred_does():
    wl = _log(n=400, seed=7)
    frame = atsubmit.sweep(wl, CFG, int(wl.submit[20]), int(wl.submit[-1]) + 1)
    raw, doc, model = _fit_doc(frame)
    pred = atprobe.WaitAtProbe(raw, doc, atsubmit.estimates(wl), "UTC")
    sim = Simulator.from_workload(wl, CFG, T0, int(wl.submit[-1]) + 1)
    sim.run_until(T0 + 30 * 3600)
    got = pred(sim, 2, 48 * 3600)
    row = pred.row(sim, 2, 48 * 3600)
    pt, base = waitpred.points(pd.DataFrame([row]), model)
    # the one-row arrays it builds instead of a frame: the same answer to the bit
    assert got["wp_wait_s"] == float(pt["corrected_q40"][0])
    assert got["wp_bound_s"] == float(atsubmit.static_bound(base["corrected_q40"], 0.25)[0])
    assert got["wp_bound_s"] >= got["wp_wait_s"]
    # to a worker process as the model's own bytes (no pickled booster), same answers there
    import pickle

    again = pickle.loads(pickle.dumps(pred))
    assert again(sim, 2, 48 * 3600) == got


def test_a_predictor_fitted_on_other_features_is_refused():
    wl = _log(n=200, seed=2)
    frame = atsubmit.sweep(wl, CFG, int(wl.submit[10]), int(wl.submit[-1]) + 1)
    raw, doc, _ = _fit_doc(frame)
    doc["params"]["features"] = doc["params"]["features"][:-1]
    with pytest.raises(Exception, match="rerun waitpred"):
        atprobe.WaitAtProbe(raw, doc, atsubmit.estimates(wl), "UTC")


def test_the_state_compared_is_not_trivial():
    """The comparison above sees a queue: jobs ahead of the request, a plan in the future."""
    wl = _log()
    sim = Simulator.from_workload(wl, CFG, T0, int(wl.submit[-1]) + 1)
    sim.run_until(T0 + 23 * 3600)
    row = _Rows(atsubmit.estimates(wl)).row(sim, 4, 48 * 3600)
    assert row["pending_jobs"] >= 3 and row["ahead_jobs"] >= 1 and row["plan_s"] > 600 and row["busy_frac"] > 0.5
