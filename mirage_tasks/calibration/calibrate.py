"""Fit a :class:`SimConfig` to a trace: what the trace says, then a bounded search.

Read from the trace (the calibration window and its lead-in only, never the scoring window,
and each as it stood at the window's end: a job still waiting then is in the replay's queue but
not scored, a job not ended then runs for its requested time, :mod:`mirage_tasks.calibration.atcut`):

* **concurrency**: busy nodes over time from the real start and replayed run time of
  every job, and per user the running jobs and nodes; each summarised as the highest level
  held for :data:`HOLD_S` in total (instantaneous spikes, such as a burst of jobs failing
  at once, do not count). A QOS limit shows as a ceiling the trace does not cross, so the
  search offers each per-user limit as "none" or that sustained maximum (or a start
  configuration's own value);
* **dispatch latency**: the median real wait of the jobs that started within
  :data:`DISPATCH_HORIZON_S` of their submission (Slurm needs a few seconds to start a job
  the scheduler picked; the simulator starts it at the same instant);
* whether the trace records priorities (then the priority policies that read them, ``trace``,
  are searched).

Searched (Optuna's TPE sampler, seeded; the budget is ``trials``, so the result depends only on the
trials asked, never on the machine's speed; a wall limit ``timeout_s`` is an explicit opt-in that,
when hit, fails with :class:`CalibrationTimeout` naming it and the trials run, rather than returning
the configuration of fewer trials; every trial logs its number of the total, the elapsed time and an
estimate of the time left):
effective cluster size (from the largest job and 75 % of the busy peak to 115 % of it, never
above the log's stated machine size: :func:`machine_warning` says when the data seem to need
more; busy nodes are node-equivalents, see :attr:`~mirage_tasks.sim.workload.Workload.node_equiv`),
per-user job and node limits, priority model, age weight, size weight, age cap and
PriorityMaxAge, backfill mode (the policies declared ``searched`` in :mod:`mirage_tasks.sim.policies`:
conservative, easy, none) and interval, the nodes in service
over time (off, or a quantile of the trace's busy nodes over the past 1, 3 or 7 days, re-read
hourly: drains and maintenance; only the trace's past at each instant is read; the size is
then the top of its range, a bound only) and a short
partition beside the main one (jobs with a limit up to 30 min, 1 h or 2 h keep their own
strict priority order on the same nodes). Asked for (``fairshare=True``, ``calibrate
--search-fairshare``), the search also offers Slurm's multifactor priority with the classic
fair share (:mod:`mirage_tasks.sim.fairshare`), its weight (10 to 100000, log) and its usage
half-life (1, 7 or 14 days), and the report's configuration line says what it chose. The first trials
are the configuration a new user would write (the machine size or the busy peak, age and
size priority, conservative backfill) and, when given, a start configuration, each also
with the capacity model on (7 days, maximum).

Each trial replays every calendar month (trace time zone) of the calibration window
independently with a warm start ``lead_in_days`` before the month (the reference
protocol), pooling the per-job errors. The objective, lower is better::

    mae_h / zero_mae_h  +  (1 - within_1h)  +  0.25 * (1 - daily_corr)

(``daily_corr`` NaN counts as 0): the error relative to predicting no wait, the share of
jobs more than an hour off, and the day-to-day shape of the queue.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError

from ..sim import policies
from ..sim.config import SimConfig
from ..sim.workload import Workload
from .atcut import as_known
from .fidelity import metrics, replay

log = logging.getLogger(__name__)

DISPATCH_HORIZON_S = 60
HOLD_S = 3600  # a concurrency level counts when held this long in total
BF_INTERVALS = (30, 60, 120, 300, 600)
MAX_AGES = (86400, 7 * 86400, 14 * 86400)
FS_HALFLIVES = (86400, 7 * 86400, 14 * 86400)
FS_WEIGHTS = [10.0, 100000.0]
CAPACITY_WINDOWS = (0, 86400, 3 * 86400, 7 * 86400)  # 0 = a fixed cluster size
CAPACITY_QUANTILES = (1.0, 0.95, 0.9)
SHORT_PARTITION_LIMITS = (0, 1800, 3600, 7200)  # 0 = one partition


@dataclass
class TraceFacts:
    jobs: int
    peak_busy_nodes: int  # the most busy nodes held for HOLD_S in total
    instant_max_busy_nodes: int  # the instantaneous maximum (spikes included)
    mean_busy_nodes: float
    max_job_nodes: int
    user_max_jobs: int
    user_max_nodes: int
    dispatch_latency_s: int
    quick_start_share: float
    has_priority: bool
    machine_nodes: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _max_overlap(start: np.ndarray, end: np.ndarray, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, level): the weighted count of intervals ``[start, end)`` after each event."""
    t = np.concatenate([start, end])
    w = np.concatenate([weight, -weight])
    # ends before starts at the same instant (a node freed and taken at once is not double-booked)
    order = np.lexsort((w, t))
    return t[order], np.cumsum(w[order])


def sustained_max(t: np.ndarray, level: np.ndarray, end: int, hold_s: int) -> int:
    """The highest level held for at least ``hold_s`` seconds in total (over ``[t[0], end)``):
    brief spikes (a burst of jobs that fail at once, a one-second overlap of records) do not count."""
    if len(t) == 0:
        return 0
    dt = np.diff(np.append(t, max(end, int(t[-1])))).clip(min=0)
    order = np.argsort(-level, kind="stable")
    held = np.cumsum(dt[order])
    k = int(np.searchsorted(held, hold_s))
    return int(math.ceil(float(level[order][min(k, len(order) - 1)]) - 1e-9))


def trace_facts(wl: Workload, a: int, b: int, machine_nodes: int | None = None, hold_s: int = HOLD_S) -> TraceFacts:
    """What the trace itself says about ``[a, b)`` (jobs running at any time in it)."""
    start = wl.real_start
    end = wl.real_start + wl.duration
    sel = (start < b) & (end > a)
    if not sel.any():
        raise StepError("no job of the trace ran in the calibration window")
    # busy levels in node-equivalents (processors / processors per node where the trace records no
    # node count: jobs sharing a node do not each hold one), so the peak cannot exceed the machine
    # merely by rounding
    s, e, n, u = np.maximum(start[sel], a), np.minimum(end[sel], b), wl.node_equiv[sel], wl.user[sel]
    t, level = _max_overlap(s, e, n)
    dt = np.diff(np.append(t, b)).clip(min=0)
    mean_busy = float((level * dt).sum() / max(1, b - a))
    umax_jobs = umax_nodes = 0
    frame = pd.DataFrame({"s": s, "e": e, "n": n, "u": u})
    for _user, g in frame[frame.u >= 0].groupby("u"):
        gs, ge = g.s.to_numpy(), g.e.to_numpy()
        tj, lj = _max_overlap(gs, ge, np.ones(len(g), dtype=np.int64))
        tn, ln = _max_overlap(gs, ge, g.n.to_numpy())
        umax_jobs = max(umax_jobs, sustained_max(tj, lj, b, hold_s))
        umax_nodes = max(umax_nodes, sustained_max(tn, ln, b, hold_s))
    sub = (wl.submit >= a) & (wl.submit < b)
    wait = (wl.real_start - wl.submit)[sub]
    # a wait is known once the job has started: one still waiting at the end of the window is not a
    # quick start, however recently it was submitted
    quick = wait[(wait <= DISPATCH_HORIZON_S) & (wl.real_start[sub] < b)]
    return TraceFacts(
        jobs=int(sub.sum()),
        peak_busy_nodes=max(sustained_max(t, level, b, hold_s), int(math.ceil(float(n.max()) - 1e-9))),
        instant_max_busy_nodes=int(math.ceil(float(level.max()) - 1e-9)),
        mean_busy_nodes=round(mean_busy, 2),
        max_job_nodes=int(wl.nodes[sel].max()),
        user_max_jobs=umax_jobs,
        user_max_nodes=umax_nodes,
        dispatch_latency_s=int(np.median(quick)) if len(quick) else 0,
        quick_start_share=round(float(len(quick) / max(1, len(wait))), 4),
        has_priority=bool((~np.isnan(wl.priority[sub])).mean() > 0.5) if sub.any() else False,
        machine_nodes=machine_nodes,
    )


def month_windows(a: int, b: int, tz: str) -> list[tuple[int, int]]:
    """``[a, b)`` cut at calendar month starts in ``tz``."""
    edges = [a]
    m = (pd.Timestamp(a, unit="s", tz="UTC").tz_convert(tz) + pd.offsets.MonthBegin(1)).normalize()
    while (t := int(m.timestamp())) < b:
        edges.append(t)
        m = m + pd.offsets.MonthBegin(1)
    edges.append(b)
    return list(zip(edges[:-1], edges[1:]))


def replay_months(
    wl: Workload, cfg: SimConfig, a: int, b: int, lead_in_s: int, tz: str, cut: int | None = None
) -> pd.DataFrame:
    """Per-job waits of ``[a, b)``, each month replayed from ``lead_in_s`` before it. With ``cut``
    (``wl`` then being the log as it stood at the cut, :func:`~mirage_tasks.calibration.atcut.as_known`),
    only the jobs whose wait was known at the cut: one still waiting then stays in the replay's queue
    but is not scored (its error is unknown for any simulated wait past the cut; scoring what the cut
    shows would reward configurations that make the queue wait longer)."""
    parts = [replay(wl, cfg, x, y, lead_in_s) for x, y in month_windows(a, b, tz)]
    df = pd.concat(parts, ignore_index=True)
    if cut is not None and len(df):
        known = (df["submit"].to_numpy(np.int64) + df["real_wait_s"].to_numpy(np.int64)) < cut
        df = df[known].reset_index(drop=True)
    return df


def objective_value(m: dict) -> float:
    if not m.get("n"):
        return math.inf
    dc = m.get("daily_corr", float("nan"))
    dc = 0.0 if dc is None or np.isnan(dc) else dc
    zero = m["zero_mae_h"] if m["zero_mae_h"] > 0 else 1e-9
    return float(m["mae_h"] / zero + (1 - m["within_1h"]) + 0.25 * (1 - dc))


def default_config(facts: TraceFacts) -> SimConfig:
    """What a new user would write: the machine size (else the busy peak), age and size
    priority, conservative backfill, no user limits."""
    nodes = max(facts.machine_nodes or facts.peak_busy_nodes, facts.max_job_nodes)
    return SimConfig(nodes=int(nodes), backfill="conservative", priority="age_size", warm_start=True)


def machine_warning(facts: TraceFacts) -> str | None:
    """Evidence that the log seems to need more nodes than its stated machine (the search is
    capped at the machine all the same), or None."""
    m = facts.machine_nodes
    if not m or max(facts.peak_busy_nodes, facts.max_job_nodes) <= m:
        return None
    return (
        f"the calibration window holds {facts.peak_busy_nodes} nodes busy for an hour in total (instantaneous "
        f"maximum {facts.instant_max_busy_nodes}, largest job {facts.max_job_nodes}) on a machine the log states "
        f"as {m} nodes: overlapping records, a second partition or a wrong processors-per-node; the simulated "
        f"machine is capped at {m} nodes"
    )


def search_space(facts: TraceFacts, fairshare: bool = False) -> dict[str, Any]:
    """The search space; the node count never above the log's stated machine size. With
    ``fairshare`` the multifactor priority with fair share is offered too."""
    lo = max(facts.max_job_nodes, int(0.75 * facts.peak_busy_nodes), 1)
    hi = max(lo + 1, int(math.ceil(1.15 * facts.peak_busy_nodes)))
    if facts.machine_nodes:
        hi = min(hi, int(facts.machine_nodes))
        lo = min(lo, hi)
    return {
        "nodes": [lo, hi],
        "max_jobs_per_user": sorted({0, facts.user_max_jobs}),
        "max_nodes_per_user": sorted({0, facts.user_max_nodes}),
        "priority": policies.searched_priority(facts.has_priority),
        "weight_age": [10.0, 100000.0],
        "weight_size": [0.0, 5000.0],
        "age_cap": [True, False],
        "max_age_s": list(MAX_AGES),
        "backfill": policies.searched_backfill(),
        "bf_interval_s": list(BF_INTERVALS),
        "capacity_window_s": list(CAPACITY_WINDOWS),
        "capacity_quantile": list(CAPACITY_QUANTILES),
        "short_partition_limit_s": list(SHORT_PARTITION_LIMITS),
        "dispatch_latency_s": facts.dispatch_latency_s,
        **(
            {
                "priority": policies.searched_priority(facts.has_priority) + ["multifactor"],
                "weight_fairshare": list(FS_WEIGHTS),
                "fs_halflife_s": list(FS_HALFLIVES),
            }
            if fairshare
            else {}
        ),
    }


def _suggest(trial, space: dict[str, Any], base: SimConfig) -> SimConfig:
    lo, hi = space["nodes"]
    cap_window = trial.suggest_categorical("capacity_window_s", space["capacity_window_s"])
    if cap_window:
        # the nodes in service come from the trace; ``nodes`` only bounds them (against
        # overlapping records). A bound fitted on the calibration months would forbid the
        # growth the capacity model is there to follow: the top of the range.
        nodes = hi
        quantile = trial.suggest_categorical("capacity_quantile", space["capacity_quantile"])
    else:
        nodes = trial.suggest_int("nodes", lo, hi)
        quantile = 1.0
    priority = trial.suggest_categorical("priority", space["priority"])
    fair = {}
    if priority == "multifactor":  # its own parameters, asked only when it is chosen
        fair = dict(
            weight_fairshare=trial.suggest_float("weight_fairshare", *space["weight_fairshare"], log=True),
            fs_halflife_s=trial.suggest_categorical("fs_halflife_s", space["fs_halflife_s"]),
        )
    return base.replace(
        **fair,
        nodes=nodes,
        capacity_window_s=cap_window,
        capacity_quantile=quantile,
        max_jobs_per_user=trial.suggest_categorical("max_jobs_per_user", space["max_jobs_per_user"]),
        max_nodes_per_user=trial.suggest_categorical("max_nodes_per_user", space["max_nodes_per_user"]),
        priority=priority,
        weight_age=trial.suggest_float("weight_age", *space["weight_age"], log=True),
        weight_size=trial.suggest_float("weight_size", *space["weight_size"]),
        age_cap=trial.suggest_categorical("age_cap", space["age_cap"]),
        max_age_s=trial.suggest_categorical("max_age_s", space["max_age_s"]),
        backfill=trial.suggest_categorical("backfill", space["backfill"]),
        bf_interval_s=trial.suggest_categorical("bf_interval_s", space["bf_interval_s"]),
        short_partition_limit_s=trial.suggest_categorical("short_partition_limit_s", space["short_partition_limit_s"]),
    )


def _as_params(cfg: SimConfig, space: dict[str, Any]) -> dict[str, Any] | None:
    """A configuration as trial parameters, or None when it lies outside the space."""
    p = {
        k: getattr(cfg, k)
        for k in (
            "nodes",
            "max_jobs_per_user",
            "max_nodes_per_user",
            "priority",
            "weight_age",
            "weight_size",
            "age_cap",
            "max_age_s",
            "backfill",
            "bf_interval_s",
            "capacity_window_s",
            "capacity_quantile",
            "short_partition_limit_s",
        )
    }
    lo, hi = space["nodes"]
    p["nodes"] = min(max(p["nodes"], lo), hi)
    for k in ("max_jobs_per_user", "max_nodes_per_user"):
        p[k] = p[k] if p[k] in space[k] else (space[k][-1] if p[k] else 0)
    p["weight_age"] = min(max(p["weight_age"], space["weight_age"][0]), space["weight_age"][1])
    p["weight_size"] = min(max(p["weight_size"], space["weight_size"][0]), space["weight_size"][1])
    for k in (
        "priority",
        "max_age_s",
        "bf_interval_s",
        "backfill",
        "age_cap",
        "capacity_window_s",
        "capacity_quantile",
        "short_partition_limit_s",
    ):
        if p[k] not in space[k]:
            return None
    if p["priority"] == "multifactor":  # (in the space only with fairshare)
        w = space["weight_fairshare"]
        p["weight_fairshare"] = min(max(cfg.weight_fairshare, w[0]), w[1])
        p["fs_halflife_s"] = cfg.fs_halflife_s
        if p["fs_halflife_s"] not in space["fs_halflife_s"]:
            return None
    del p["capacity_quantile" if not p["capacity_window_s"] else "nodes"]  # as _suggest asks for them
    return p


@dataclass
class Result:
    config: SimConfig
    facts: TraceFacts
    space: dict[str, Any]
    trials: pd.DataFrame
    best_value: float
    elapsed_s: float
    stopped_by: str


def calibrate(
    wl: Workload,
    a: int,
    b: int,
    *,
    tz: str = "UTC",
    lead_in_s: int = 7 * 86400,
    trials: int = 60,
    timeout_s: float | None = None,
    seed: int = 0,
    machine_nodes: int | None = None,
    start: SimConfig | None = None,
    procs_per_node: int = 0,
    fairshare: bool = False,
) -> Result:
    """Search a configuration for the jobs submitted in ``[a, b)``; see the module docstring. The
    search reads the log as it stood at ``b`` (:func:`~mirage_tasks.calibration.atcut.as_known`):
    the configuration answers for jobs submitted from ``b`` on, so no outcome known only later
    (a wait or a run time still going on at ``b``) may shape it."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    wl, _ = as_known(wl, b)
    facts = trace_facts(wl, a, b, machine_nodes)
    if facts.jobs == 0:
        raise StepError("no job was submitted in the calibration window")
    space = search_space(facts, fairshare)
    if start is not None:  # a start configuration's own limits are choices too
        for k in ("max_jobs_per_user", "max_nodes_per_user"):
            space[k] = sorted(set(space[k]) | {int(getattr(start, k))})
        lo, hi = space["nodes"]
        space["nodes"] = [min(lo, max(start.nodes, facts.max_job_nodes)), max(hi, start.nodes)]
        if machine_nodes:
            space["nodes"] = [min(space["nodes"][0], int(machine_nodes)), min(space["nodes"][1], int(machine_nodes))]
    # fields outside the search come from the start configuration, else the defaults
    base = (start or SimConfig(nodes=space["nodes"][0])).replace(
        warm_start=True, tick_s=0, dispatch_latency_s=facts.dispatch_latency_s, procs_per_node=int(procs_per_node or 0)
    )
    rows: list[dict] = []
    wall = float(timeout_s) if timeout_s else None
    t0 = time.perf_counter()

    def objective(trial) -> float:
        cfg = _suggest(trial, space, base)
        t = time.perf_counter()
        m = metrics(replay_months(wl, cfg, a, b, lead_in_s, tz, cut=b), tz)
        v = objective_value(m)
        rows.append(
            {
                "trial": trial.number,
                **trial.params,
                "objective": v,
                "mae_h": m.get("mae_h"),
                "zero_mae_h": m.get("zero_mae_h"),
                "within_1h": m.get("within_1h"),
                "spearman": m.get("spearman"),
                "daily_corr": m.get("daily_corr"),
                "replay_s": round(time.perf_counter() - t, 2),
            }
        )
        k = trial.number + 1
        spent = time.perf_counter() - t0
        log.info(
            "calibrate: trial %d of %d, objective %.4f MAE %.2f h within 1 h %.1f%%; elapsed %s, ETA %s",
            k,
            trials,
            v,
            m.get("mae_h", float("nan")),
            100 * m.get("within_1h", float("nan")),
            _duration(spent),
            _duration(spent / k * (trials - k)),
        )
        return v

    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(10, max(1, trials // 3)))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    seeds = [default_config(facts)] + ([start] if start is not None else [])
    # the same with the capacity model on (the longest window, its maximum): a new feature
    # first tried on the configurations a user would start from
    seeds += [
        c.replace(capacity_window_s=CAPACITY_WINDOWS[-1], capacity_quantile=1.0)
        for c in seeds
        if not c.capacity_window_s
    ]
    for c in seeds:
        p = _as_params(c, space)
        if p is not None:
            study.enqueue_trial(p)
    log.info("calibrate: %d trials%s", trials, f" (wall limit {wall:g} s)" if wall else " (no wall limit)")
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=trials, timeout=wall)
    elapsed = time.perf_counter() - t0
    done = sum(t.state.is_finished() for t in study.trials)  # not the enqueued seeds still waiting
    if done < trials:  # only a wall limit stops a study early
        raise CalibrationTimeout(
            f"--timeout-s {wall:g}: the calibration reached its wall limit after {done} of {trials} trials "
            f"({elapsed:.0f} s); nothing was written. Its configuration would depend on this machine's speed: "
            "rerun without --timeout-s (the budget is then the trials) or with fewer --trials"
        )
    best = _suggest(optuna.trial.FixedTrial(study.best_params), space, base)
    return Result(
        config=best,
        facts=facts,
        space=space,
        trials=pd.DataFrame(rows),
        best_value=study.best_value,
        elapsed_s=round(elapsed, 1),
        stopped_by="trials",
    )


class CalibrationTimeout(StepError):
    """The opt-in wall limit (``timeout_s``) was reached before the trials asked had run."""


def _duration(s: float) -> str:
    """Seconds as ``1h02m03s`` / ``2m03s`` / ``3s`` (the progress lines)."""
    s = int(round(max(s, 0.0)))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")
