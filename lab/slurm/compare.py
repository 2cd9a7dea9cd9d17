"""The project's simulator against the real Slurm replay of the same workload.

:func:`simulate` gives the simulator exactly what Slurm was given, in trace time: each job's
submission as Slurm recorded it (mapped back by the factor; to the millisecond where the replay
read slurmctld's log, :func:`precise_submits`), its compressed sleep and its
minute-rounded limit times the factor, its nodes and priority (the warm start's running
jobs first), on an empty cluster of the same size, with
:func:`~mirage_tasks.slurm.conf.back_to_sim` settings (the backfill Slurm enforces, ``named``
nodes for ``conservative``; Slurm's rounded intervals; and the
rules this Slurm does not enforce switched off: without accounting the age factor, which Slurm
ignores without slurmdbd, fair share and the limits, which need it; with accounting they stay on
and each job keeps its trace user).

:func:`explain` names, for each scored job whose starts differ by more than ``tol_s``, the
rule that separates them, from the two schedules alone:

* ``backfill``: one side started the job ahead of a higher-priority job that was still
  waiting (a backfill start) and the other did not;
* ``priority order``: neither or both backfilled it, but the jobs that started just before
  it differ in order (one side let a job of lower priority or later submission go first);
* ``timing``: same rule, same order: the difference is the compression's resolution
  (Slurm's 1-s clock and scheduling latency times the factor, minute-rounded limits).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mirage_tasks.calibration.fidelity import metrics
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.engine import Simulator
from mirage_tasks.sim.named import NamedNodes, hostlist, parse_hostlist
from mirage_tasks.slurm.conf import sim_config

#: How far past the jobcomp's whole second slurmctld's submission log line may be stamped.
LOG_LAG_S = 0.05


def precise_submits(
    jobs: pd.DataFrame, submit_epochs: dict[str, float], origin: float, t0: float, factor: float
) -> pd.DataFrame:
    """``jobs`` with ``slurm_submit_ms`` (slurmctld's logged submission instant, see
    :func:`~.queue.read_submit_log`) and ``submit_t`` from it wherever it lies in the whole second
    the jobcomp log recorded (``slurm_submit``); elsewhere both stay as they were. Starts keep the
    jobcomp's whole seconds (backfill starts are logged to the ms only with DebugFlags=Backfill),
    raised to the submission where the truncation put them before it. At x120 a whole
    second is 2 trace minutes: on a KTH replay, whole seconds put a backfill pass between jobs
    Slurm had received together, and the simulator started an 8-node job Slurm had planned behind
    them (agreement within 1 h 7.4 %; 100 % from the logged instants)."""
    out = jobs.copy()
    ms = out["slurm_id"].map(lambda i: submit_epochs.get(str(i)) if pd.notna(i) else None).astype(float)
    sec = out["slurm_submit"]
    # the log line is written when the submission RPC ends, a little after the job's submit time
    # was taken (on a busy ls6 replay once 4 ms into the next second): up to LOG_LAG_S past the
    # jobcomp second counts, clipped to that second's end
    ok = ms.notna() & sec.notna() & (ms >= sec - 1e-3) & (ms < sec + 1.0 + LOG_LAG_S)
    ms = ms.clip(upper=sec + 0.999)
    out["slurm_submit_ms"] = ms.where(ok)
    out.loc[ok, "submit_t"] = t0 + (ms[ok] - origin) * factor
    if "start_t" in out:  # a start recorded in the submission's whole second cannot precede it
        early = ok & out["start_t"].notna() & (out["start_t"] < out["submit_t"])
        out.loc[early, "start_t"] = out.loc[early, "submit_t"]
    return out


def job_user(r, accounting: bool) -> int:
    """The simulator's user of a replayed row: its trace user where the cluster kept accounts
    (fair share and limits then apply per user on both sides), else none."""
    if not accounting or "user" not in r or pd.isna(r["user"]):
        return -1
    return int(r["user"])


def last_recalc_epoch(state_dir: str) -> float | None:
    """When slurmctld last re-read usage and recomputed priorities (its multifactor decay thread
    writes ``priority_last_decay_ran`` in StateSaveLocation at every run, every
    PriorityCalcPeriod from its start): the epoch of that write, or None where there is none."""
    import os

    try:
        return os.stat(os.path.join(state_dir, "priority_last_decay_ran")).st_mtime
    except OSError:
        return None


def align_recalc(sim: Simulator, recalc_t: float | None) -> None:
    """Put the simulator's fair-share re-reads at Slurm's instants: ``recalc_t`` (trace time) is
    one of them and they repeat every ``fs_calc_period_s`` (at x120 a 2-trace-hour period; on one
    run of the busy ls6 window, 175 trace seconds of phase moved the agreement within 1 h from
    31.7 % to 44.4 %). And take Slurm's timing of usage (``FairShare.running_lag``: a re-read's
    factors count running jobs only through the re-read before; on two busy ls6 replays this moved
    the agreement within 1 h from 42.6 % and 45.9 % to 86.4 % and 87.9 %)."""
    fs = getattr(sim, "fs", None)
    if fs is None:
        return
    fs.running_lag = True  # Slurm's, whether or not its phase was recorded
    if recalc_t is None or not np.isfinite(recalc_t):
        return
    period = fs.period
    k = np.ceil((sim.now + 1 - recalc_t) / period)
    fs.next = int(round(recalc_t + k * period))
    sim.next_calc = fs.next


def submission_order(jobs: pd.DataFrame) -> pd.DataFrame:
    """The replayed jobs in the order Slurm received them: by recorded submission time, then by
    job id as a number. Slurm records submissions to the second (``factor`` trace seconds), so
    many share one; with equal priority it runs the lower job id first, and so must the
    simulator (a string sort put job 100 before job 99: with age-only priorities the
    simulator disagreed with itself across two runs of one replay)."""
    key = pd.to_numeric(jobs["slurm_id"], errors="coerce")
    return jobs.assign(_id=key).sort_values(["submit_t", "_id"], kind="stable").drop(columns="_id")


def simulate(
    jobs: pd.DataFrame,
    cfg: SimConfig,
    factor: float,
    accounting: bool = False,
    recalc_t: float | None = None,
    sim_backfill: str | None = None,
) -> pd.DataFrame:
    """``jobs`` (replayed rows with ``submit_t``) plus ``sim_start_t`` and ``sim_backfilled``
    (and ``sim_nodes`` on named nodes); ``recalc_t``: an instant (trace time) at which Slurm
    re-read usage (:func:`align_recalc`); ``sim_backfill``: see :func:`sim_config`."""
    scfg = sim_config(cfg, factor, accounting, sim_backfill)
    ok = jobs[jobs["submit_t"].notna()].copy()
    t0 = int(np.floor(ok["submit_t"].min()))
    sim = Simulator(scfg, t0)
    sim.static_default = 0.0
    named = isinstance(sim, NamedNodes)  # a named-node backfill: record where each job ran
    if named:
        sim.placed = {}
    align_recalc(sim, recalc_t)
    local = {}
    for idx, r in submission_order(ok).iterrows():
        sub = int(round(r["submit_t"]))
        dur = int(round(r["sleep_s"] * factor))
        lim = int(r["limit_min"] * 60 * factor)
        j = sim.add_job(
            sub,
            dur,
            lim,
            int(r["nodes"]),
            user=job_user(r, accounting),
            static=float(r["priority"]),
            tag=int(idx),
            tick=0,
        )
        sim.schedule_submit(j)
        local[idx] = j
    sim.drain()
    out = jobs.copy()
    out["sim_start_t"] = np.nan
    out["sim_backfilled"] = False
    if named:
        out["sim_nodes"] = pd.Series(dtype="string")
    for idx, j in local.items():
        out.at[idx, "sim_start_t"] = sim.j_start[j]
        out.at[idx, "sim_backfilled"] = bool(sim.j_bf[j])
        if named and j in sim.placed:
            out.at[idx, "sim_nodes"] = hostlist(sim.placed[j])
    return out


def _submit_times(df: pd.DataFrame) -> str:
    """Where the simulator's submission times came from (every replayed job, scored or not)."""
    ok = df["submit_t"].notna()
    if "slurm_submit_ms" not in df or not df.loc[ok, "slurm_submit_ms"].notna().any():
        return "jobcomp (whole seconds)"
    n, k = int(ok.sum()), int(df.loc[ok, "slurm_submit_ms"].notna().sum())
    return "slurmctld's log (ms)" if k == n else f"slurmctld's log (ms) for {k} of {n}, jobcomp's seconds for the rest"


def same_nodes(both: pd.DataFrame) -> dict | None:
    """Where both sides name each job's nodes (a replay that recorded Slurm's NodeList, scored with
    the named-node backfill): how many compared jobs ran on exactly the same nodes, overall and
    among those that started within ``factor``-scale agreement (1 h)."""
    if "sim_nodes" not in both or "slurm_nodes" not in both:
        return None
    ok = both[both["sim_nodes"].notna() & both["slurm_nodes"].notna()]
    if not len(ok):
        return None
    try:
        same = np.array([parse_hostlist(a) == parse_hostlist(b) for a, b in zip(ok["slurm_nodes"], ok["sim_nodes"])])
    except ValueError:  # a cluster whose nodes are not the local cluster's n1..nN: nothing to compare
        return None
    close = ((ok["sim_start_t"] - ok["start_t"]).abs() <= 3600).to_numpy()
    return {
        "jobs": int(len(ok)),
        "same": int(same.sum()),
        "within_1h": int(close.sum()),
        "same_within_1h": int((same & close).sum()),
    }


def slurm_backfilled(df: pd.DataFrame) -> pd.Series:
    """True where Slurm started a job while a job of higher priority (or equal priority,
    submitted earlier) was still waiting."""
    ok = df[df["start_t"].notna() & df["submit_t"].notna()]
    res = pd.Series(False, index=df.index)
    sub = ok["submit_t"].to_numpy()
    st = ok["start_t"].to_numpy()
    pr = ok["priority"].to_numpy()
    for k, idx in enumerate(ok.index):
        ahead = (sub <= st[k]) & (st > st[k]) & ((pr > pr[k]) | ((pr == pr[k]) & (sub < sub[k])))
        res[idx] = bool(ahead.any())
    return res


def explain(df: pd.DataFrame, tol_s: float) -> pd.Series:
    """A rule name for each row whose Slurm and simulated starts differ by more than ``tol_s``."""
    why = pd.Series("", index=df.index, dtype=object)
    bf = slurm_backfilled(df)
    s_rank = df["start_t"].rank(method="min")
    m_rank = df["sim_start_t"].rank(method="min")
    for idx in df.index:
        a, b = df.at[idx, "start_t"], df.at[idx, "sim_start_t"]
        if pd.isna(a) and pd.isna(b):
            continue  # neither started before the replay stopped watching: they agree so far
        if pd.isna(a) or pd.isna(b):
            why[idx] = "started on one side only (by the horizon)"
            continue
        if abs(a - b) <= tol_s:
            continue
        if bool(bf[idx]) != bool(df.at[idx, "sim_backfilled"]):
            why[idx] = "backfill"
        elif abs(s_rank[idx] - m_rank[idx]) >= 1:
            why[idx] = "priority order"
        else:
            why[idx] = "timing"
    return why


def compare(
    jobs: pd.DataFrame,
    cfg: SimConfig,
    factor: float,
    tz: str = "UTC",
    horizon_t: float | None = None,
    accounting: bool = False,
    recalc_t: float | None = None,
    sim_backfill: str | None = None,
) -> tuple[dict, pd.DataFrame]:
    """(metrics, per-job frame) for the scored (window) jobs. The replay stopped watching at
    ``horizon_t`` (trace time): a simulated start after it is censored like Slurm's.
    ``accounting``: the cluster kept accounts (its age factor, fair share and limits are on in
    the simulator too, per trace user); ``recalc_t``: an instant of Slurm's usage re-reads
    (:func:`align_recalc`); ``sim_backfill``: see :func:`sim_config`."""
    df = simulate(
        jobs.drop(
            columns=[c for c in ("sim_start_t", "sim_backfilled", "slurm_backfilled", "why", "sim_nodes") if c in jobs]
        ),
        cfg,
        factor,
        accounting,
        recalc_t,
        sim_backfill,
    )
    if horizon_t is not None:
        df.loc[df["sim_start_t"] > horizon_t, "sim_start_t"] = np.nan
    df["slurm_backfilled"] = slurm_backfilled(df)
    scored = df[(df["kind"] == "window") & df["submit_t"].notna()].copy()
    if "why" in scored:
        scored = scored.drop(columns="why")
    scored["why"] = explain(scored, tol_s=max(3600.0, 2 * factor))
    both = scored[scored["start_t"].notna() & scored["sim_start_t"].notna()]
    m = pd.DataFrame(
        {
            "submit": both["submit_t"].astype(np.int64),
            "real_wait_s": both["start_t"] - both["submit_t"],
            "sim_wait_s": both["sim_start_t"] - both["submit_t"],
            "nodes": both["nodes"],
        }
    )
    sim_vs_slurm = metrics(m, tz)
    tr = pd.DataFrame(
        {
            "submit": both["trace_submit"],
            "real_wait_s": both["trace_start"] - both["trace_submit"],
            "sim_wait_s": both["start_t"] - both["submit_t"],
            "nodes": both["nodes"],
        }
    )
    tr2 = tr.assign(sim_wait_s=both["sim_start_t"] - both["submit_t"])
    err = (both["sim_start_t"] - both["start_t"]).abs()
    doc = {
        "sim_config": sim_config(cfg, factor, accounting, sim_backfill).to_dict(),
        "recalc_t": recalc_t,
        "submit_times": _submit_times(df),
        "scored": int(len(scored)),
        "compared": int(len(both)),
        "not_started_slurm": int(scored["start_t"].isna().sum()),
        "not_started_sim": int(scored["sim_start_t"].isna().sum()),
        "not_started_both": int((scored["sim_start_t"].isna() & scored["start_t"].isna()).sum()),
        "horizon_t": horizon_t,
        "sim_vs_slurm": sim_vs_slurm,
        "start_error_h": {
            "mean": float(err.mean() / 3600) if len(err) else None,
            "median": float(err.median() / 3600) if len(err) else None,
            "p90": float(err.quantile(0.9) / 3600) if len(err) else None,
            "max": float(err.max() / 3600) if len(err) else None,
        },
        "slurm_vs_trace": metrics(tr, tz),
        "sim_vs_trace": metrics(tr2, tz),
        "why": {k: int(v) for k, v in scored["why"].value_counts().items() if k},
        "backfilled": {"slurm": int(both["slurm_backfilled"].sum()), "sim": int(both["sim_backfilled"].sum())},
        "same_nodes": same_nodes(both),
    }
    return doc, df.assign(why=scored["why"]).loc[:, lambda d: list(d.columns)]
