"""What the simulator predicts for a kept service, given the workload the real run saw.

The background is a replay's job table (:mod:`lab.slurm.replay`: Slurm's own submission times
mapped back to trace time, compressed sleeps and minute-rounded limits times the factor);
the chain starts with the predecessor at the keeper's real submission time; the settings
are :func:`~mirage_tasks.slurm.conf.sim_config`. The policies decide as the keeper does
(:mod:`mirage_tasks.slurm.keeper`): snapshots every ``step_s`` from the predecessor's submission, the model
asked where the keeper asks it once the predecessor runs (every step, within its trained span or
at its probe times), ``avg`` = end minus the simulator's mean wait of
the last 100 starts when the predecessor started, ``avg-cal`` = the end minus (that mean wait
minus the calibrated offset) where that is before the end, ``wait-pred`` and ``guarantee`` the
wait predictor asked every step on the simulator's queue (every estimate the request, as the
keeper's live queue shows it), ``reactive`` and every policy at the latest at the predecessor's end. The other policies' chains are not in the simulated
workload (each chain is predicted alone).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from lab.slurm.compare import align_recalc, job_user, submission_order
from mirage_tasks.sim import decision_rules as dr, features
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.engine import Simulator
from mirage_tasks.slurm.asking import asks
from mirage_tasks.slurm.conf import sim_config
from mirage_tasks.slurm.livewait import WAIT_RULES, decide as decide_wait, next_decision_s

PRED_TAG, SUCC_TAG = -2, -3


def _background(
    jobs: pd.DataFrame,
    cfg: SimConfig,
    factor: float,
    t0: int,
    accounting: bool = False,
    recalc_t: float | None = None,
    late: tuple[float, int] | None = None,
) -> Simulator:
    sim = Simulator(sim_config(cfg, factor, accounting), t0)
    sim.static_default = 0.0
    if late is not None:  # (trace instant, k): k of the nodes join only then, as the session's late nodes did
        sim.hold_nodes(int(late[1]), int(round(late[0])))
    align_recalc(sim, recalc_t)
    ok = jobs[jobs["submit_t"].notna()]
    for idx, r in submission_order(ok).iterrows():
        j = sim.add_job(
            int(round(r["submit_t"])),
            int(round(r["sleep_s"] * factor)),
            int(r["limit_min"] * 60 * factor),
            int(r["nodes"]),
            user=job_user(r, accounting),
            static=float(r["priority"]),
            tag=int(idx),
            tick=0,
        )
        sim.schedule_submit(j)
    return sim


def predict(
    jobs: pd.DataFrame,
    cfg: SimConfig,
    factor: float,
    pred_submit_t: float,
    node: int,
    service_s: int,
    policy: str,
    priority: float = 0.0,
    decide: Callable[[np.ndarray], tuple[bool, float]] | None = None,
    step_s: int = 600,
    window: int = 144,
    accounting: bool = False,
    recalc_t: float | None = None,
    avg_offset_h: float | None = None,
    waitpred: Callable | None = None,
    late: tuple[float, int] | None = None,
    decide_within_s: float | None = None,
    decide_at_s: tuple[float, ...] | None = None,
    guarantee_margin_h: float | None = None,
    guarantee_at_s: tuple[float, ...] | None = None,
) -> dict:
    """Signed interruption (h) and the decision the simulator makes for one link (``accounting``:
    the cluster kept accounts, so the background's jobs keep their users; ``recalc_t``: an instant
    of Slurm's fair-share re-reads, :func:`~.compare.align_recalc`; ``late``: (trace instant, k),
    k nodes of the cluster in service only from then on, the session's late nodes). The model is
    asked where the keeper asks it (``decide_within_s``, ``decide_at_s``: :func:`.asking.asks`)."""
    ps = int(round(pred_submit_t))
    t0 = int(min(ps, np.floor(jobs["submit_t"].min()))) if jobs["submit_t"].notna().any() else ps
    sim = _background(jobs, cfg, factor, t0, accounting, recalc_t, late)
    sim.static_default = float(priority)
    pred = sim.add_probe_job(ps, service_s, node, PRED_TAG)
    sim.schedule_submit(pred)
    sim.run_until(ps)
    sim.record_history(features.snapshot, ps, step_s, window)
    pre = sim.fork()
    pre.stop_history()
    pstart = pre.run_until_started(pred)
    avg = pre.avg_wait_s()
    del pre
    pend = pstart + service_s
    raw = float("nan")
    n = 0
    if policy == dr.REACTIVE:
        t = pend
    elif policy == dr.AVG:
        t = max(ps, int(pend - avg))
    elif policy == dr.AVG_CAL:
        lead = avg - avg_offset_h * 3600.0 if avg_offset_h is not None else 0.0
        t = max(ps, int(pend - lead)) if lead > 0 else pend
    elif policy in WAIT_RULES:  # the keeper's wait-predictor rules, asked where it asks them
        sim.run_until(pstart)
        t = pend
        asked: set = set()
        while sim.now < pend:
            nxt_s = next_decision_s(policy, pend - sim.now, step_s, guarantee_at_s, asked)
            if nxt_s is not None:
                ans = waitpred(sim, node, service_s)
                n += 1
                if decide_wait(policy, ans, pend - sim.now, nxt_s, guarantee_margin_h):
                    t, raw = sim.now, ans["wp_wait_s" if policy == dr.WAIT_PRED else "wp_bound_s"] / 3600.0
                    break
            nxt = (sim.now // step_s + 1) * step_s
            sim.run_until(min(nxt, pend))
    else:
        sim.run_until(pstart)
        t = pend
        asked: set = set()
        while sim.now < pend:
            if asks(pend - sim.now, decide_within_s, decide_at_s, asked):
                hist = features.history(sim, pred, node, service_s, window)
                ok, out = decide(hist)
                n += 1
                if ok:
                    t, raw = sim.now, out
                    break
            nxt = (sim.now // step_s + 1) * step_s
            sim.run_until(min(nxt, pend))
    sim.run_until(t)
    sim.stop_history()
    succ = sim.add_probe_job(int(t), service_s, node, SUCC_TAG)
    sim.submit_now(succ)
    ss = sim.run_until_started(succ)
    signed = (ss - pend) / 3600
    return {
        "policy": policy,
        "sim_pred_start": pstart,
        "sim_pred_end": pend,
        "sim_succ_submit": int(t),
        "sim_succ_start": ss,
        "sim_signed_interruption_h": signed,
        "sim_interruption_h": max(signed, 0.0),
        "sim_overlap_h": max(-signed, 0.0),
        "sim_wasted_node_h": node * max(-signed, 0.0),
        "sim_decision_lead_h": (pend - t) / 3600,
        "sim_avg_wait_h": avg / 3600,
        "sim_model_output": raw,
        "sim_n_decisions": n,
        "sim_backfilled": bool(sim.j_bf[succ]),
    }
