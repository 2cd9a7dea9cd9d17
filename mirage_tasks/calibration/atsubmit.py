"""What is known at a job's submission, and the scheduler's plan from it.

The wait predictor's candidates (:mod:`mirage_tasks.calibration.waitpred`) read, for a job
``j`` submitted at ``t``, only what a site knows at that instant:

* the jobs submitted before ``j`` (in the same second: earlier in the log's order);
* of those, the ones that had started before ``t`` and not ended (running: nodes, start,
  requested time) and the ones not yet started (pending: nodes, submission, requested time);
* a job's real run time and wait only once they are over: a run time when the job has ended
  (``end <= t``), a wait when it has started (``start < t``);
* ``j``'s own request (nodes, time limit, user).

A job that never ran (:class:`~mirage_tasks.sim.workload.NeverRan`: cancelled while pending) is
pending from its submission (strictly before ``t``) until the log says it left (at or before
``t``: gone): the site saw it queued and did not know it would leave. It is planned like any
pending job and never scored.

:func:`sweep` walks the log once in submission order with three pointers (submissions, starts,
ends) and reads nothing else; ``tests/mirage/test_waitpred_atsubmit.py`` builds a log where a
later job's real run time would change the answer and shows that it does not.

**Run-time estimates** (``est_s``): fixed at the job's own submission, the mean run time of its
user's last two jobs that had ended by then (Tsafrir, Etsion and Feitelson, "Backfilling using
system-generated predictions rather than user runtime estimates", TPDS 2007), capped by its
request; the request when the user has no history yet. A running job that has outlived its
estimate is given its request (the same paper's correction).

**The plan** (:func:`plan_start`): the start the scheduler would promise ``j`` now, planned as
Slurm's backfill scheduler plans it (what ``squeue --start`` shows): the nodes free now and the
running jobs' expected ends give a profile of free nodes over time; the pending jobs ahead of
``j`` in priority order each reserve the earliest slot where they fit, then ``j`` does. Run
times are the estimates (``plan_s``) or the requested times (``plan_request_s``: Slurm's own
plan). Priority is the configuration's age and size terms, plus, for Slurm's multifactor priority
with fair share, each user's fair-share term from the runs started before ``t``
(:func:`fair_share_ledger`); a ``trace``-priority configuration's
recorded values contain the real wait (the outcome), so only its weights are used. The nodes in
service are the configuration's (its capacity model, when on, reads only the trace's past).
Node counts are node-equivalents (:attr:`~mirage_tasks.sim.workload.Workload.node_equiv`).
Not modelled: later arrivals of higher priority, per-user limits, partitions, node topology.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

RECENT_N = 50  # the "recent" average: last this many starts
USER_RECENT_N = 3  # a user's recent waits
USER_RUNTIME_N = 2  # a user's last run times (Tsafrir et al.)
PROGRESS_S = 30.0  # a log line at most this often while sweeping

#: the columns :func:`sweep` returns beside ``job_id``, ``submit``, ``real_wait_s``, ``nodes``, and
#: what each may know (all: only the state at the job's submission)
FEATURES = (
    "plan_h",
    "plan_request_h",
    "plan_easy_h",
    "log_limit_h",
    "log_nodes",
    "log_est_h",
    "pending_jobs",
    "pending_node_frac",
    "ahead_jobs",
    "ahead_node_h_frac",
    "busy_frac",
    "free_frac",
    "fits_now",
    "recent_wait_h",
    "user_recent_wait_h",
    "user_pending_jobs",
    "user_running_jobs",
    "user_running_node_frac",
    "hour",
    "weekday",
)


def _place(T: list[float], F: list[float], n: float, d: float) -> float:
    """Reserve ``n`` nodes for ``d`` seconds at the earliest start in the profile (``F[k]`` free
    nodes on ``[T[k], T[k+1])``, the last segment open-ended; both lists are updated in place)
    and return that start. The last segment must hold at least ``n`` free nodes.

    Plain lists: a profile holds tens of segments, where numpy's per-call cost would dominate."""
    L = len(F)
    n = n - 1e-9
    k = 0
    while True:
        while F[k] < n:
            k += 1
        e = T[k] + d
        j = k + 1
        while j < L and T[j] < e and F[j] >= n:
            j += 1
        if j < L and T[j] < e:  # a segment inside [start, end) lacks the nodes: start after it
            k = j + 1
            continue
        break
    s = T[k]
    i = bisect.bisect_left(T, e)
    if i == L or T[i] != e:
        T.insert(i, e)
        F.insert(i, F[i - 1])
    n += 1e-9
    for m in range(k, i):
        F[m] -= n
    return s


def plan_start(
    now: float,
    capacity: float,
    run_end: np.ndarray,
    run_nodes: np.ndarray,
    ahead_nodes: np.ndarray,
    ahead_dur: np.ndarray,
    nodes: float,
    dur: float,
) -> float:
    """The planned start of a job of ``nodes`` x ``dur`` s submitted at ``now``: the running jobs
    end at ``run_end`` (all > now), the jobs ahead of it in priority order (``ahead_*``, in that
    order) reserve their slots first. ``inf`` when it cannot fit in ``capacity``."""
    if nodes > capacity + 1e-9:
        return np.inf
    order = np.argsort(run_end, kind="stable")
    T = [float(now), *run_end[order].astype(np.float64).tolist()]
    F = (
        capacity - float(run_nodes.sum()) + np.concatenate(([0.0], np.cumsum(run_nodes[order], dtype=np.float64)))
    ).tolist()
    F[-1] = capacity  # every running job has ended: exact, whatever the rounding of the sums
    cap = capacity + 1e-9
    for n, d in zip(ahead_nodes.tolist(), ahead_dur.tolist()):
        if n > cap:
            continue  # never fits: the scheduler plans around it
        _place(T, F, n, d)
    return _place(T, F, float(nodes), float(dur))


def fair_share_ledger(wl: Any, cfg: Any, t0: int) -> Any:
    """The fair-share ledger of the plan (:class:`~mirage_tasks.sim.fairshare.RunningUsage`) when
    the configuration's priority keeps fair share, else None: each user's usage from the runs
    that started before the instant planned (their ends as they become known)."""
    from ..sim.policies import priority_policy

    if not priority_policy(cfg.priority).fair_share(cfg):
        return None
    from ..sim.fairshare import RunningUsage

    users = int(wl.user.max()) + 1 if len(wl.user) and wl.user.max() >= 0 else 0
    return RunningUsage(users, cfg.fs_halflife_s, cfg.weight_fairshare, t0)


def priority_weights(cfg: Any) -> tuple[float, float, float]:
    """The plan's priority terms from a configuration: (age weight per second, age cap in
    seconds, size weight)."""
    return (
        float(cfg.weight_age) / float(cfg.max_age_s),
        float(cfg.max_age_s) if cfg.age_cap else np.inf,
        float(cfg.weight_size),
    )


def queue_row(
    t: int,
    C: float,
    weights: tuple[float, float, float],
    r_start: np.ndarray,
    r_limit: np.ndarray,
    r_est: np.ndarray,
    r_nodes: np.ndarray,
    p_submit: np.ndarray,
    p_limit: np.ndarray,
    p_est: np.ndarray,
    p_nodes: np.ndarray,
    p_order: np.ndarray,
    nodes: float,
    limit: float,
    est: float,
    recent: Any,
    user: tuple[Any, int, int, float] | None,
    p_fs: np.ndarray | None = None,
    me_fs: float = 0.0,
) -> dict[str, float]:
    """What a job of ``nodes`` x ``limit`` s (run-time estimate ``est``) submitted at ``t`` would
    see: the queue features of :data:`FEATURES` that depend on the state (the request's own and
    the calendar's are added by the caller) and the plans (``plan_s``, ``plan_easy_s``,
    ``plan_request_s``: seconds from ``t``, ``inf`` when it cannot fit in ``C``).

    The state, all as known at ``t``: the running jobs (start, requested time, run-time estimate,
    nodes), the pending ones (submission, requested time, estimate, nodes, and ``p_order``: their
    order among equal priorities, the submission order), the waits of the latest starts
    (``recent``) and, for a known user, (their latest waits, pending jobs, running jobs, running
    nodes); ``user=None`` for an unknown user. :func:`sweep` calls it for every job of a log; the
    sampling calls it on the simulator's queue at a decision time. With fair share (a multifactor
    configuration) ``p_fs`` is each pending job's fair-share term at ``t`` and ``me_fs`` the
    request's."""
    wa, max_age, ws = weights
    if len(r_nodes):
        e_est = r_start + r_est
        r_end = np.where(e_est > t, e_est, r_start + r_limit).astype(np.float64)
        r_end = np.maximum(r_end, t + 1.0)
        r_end_req = np.maximum((r_start + r_limit).astype(np.float64), t + 1.0)
        r_nodes = np.asarray(r_nodes, dtype=np.float64)
    else:
        r_nodes = r_end = r_end_req = np.zeros(0)
    if len(p_nodes):
        age = np.minimum(t - p_submit, max_age)
        prio = wa * age + ws * p_nodes / C
        me = ws * nodes / C
        if p_fs is not None:
            prio = prio + p_fs
            me += me_fs
        sel = np.flatnonzero(prio >= me - 1e-12)
        ahead = sel[np.lexsort((p_order[sel], -prio[sel]))]  # priority, then submission
    else:
        ahead = np.zeros(0, dtype=np.int64)
    a_nodes, a_est, a_lim = p_nodes[ahead], p_est[ahead], p_limit[ahead]
    busy = float(r_nodes.sum())
    free = max(C - busy, 0.0)
    if user is not None:
        uw, u_pend, u_run, u_run_nodes = user
    return {
        "plan_s": plan_start(t, C, r_end, r_nodes, a_nodes, a_est, nodes, est) - t,
        "plan_easy_s": plan_start(t, C, r_end, r_nodes, a_nodes[:1], a_est[:1], nodes, est) - t,
        "plan_request_s": plan_start(t, C, r_end_req, r_nodes, a_nodes, a_lim, nodes, limit) - t,
        "est_s": est,
        "capacity": C,
        "pending_jobs": len(p_nodes),
        "pending_node_frac": float(np.sum(p_nodes)) / C,
        "ahead_jobs": len(ahead),
        "ahead_node_h_frac": float((a_nodes * a_est).sum()) / 3600.0 / C,
        "busy_frac": busy / C,
        "free_frac": free / C,
        "fits_now": float(len(ahead) == 0 and free >= nodes - 1e-9),
        "recent_wait_h": (float(np.mean(recent)) if len(recent) else 0.0) / 3600.0,
        "user_recent_wait_h": -1.0 if user is None or not uw else float(np.mean(uw)) / 3600.0,
        "user_pending_jobs": -1 if user is None else u_pend,
        "user_running_jobs": -1 if user is None else u_run,
        "user_running_node_frac": -1 if user is None else u_run_nodes / C,
    }


class _Capacity:
    """Nodes in service at ``t``: the configuration's fixed size, or its capacity schedule (which
    reads only the trace's busy nodes before each step)."""

    def __init__(self, wl: Any, cfg: Any, t0: int, t1: int):
        self.nodes = float(cfg.nodes)
        self.times = self.caps = None
        if getattr(cfg, "capacity_window_s", 0):
            from ..sim.workload import capacity_schedule

            sched = capacity_schedule(
                wl,
                int(cfg.nodes),
                int(cfg.capacity_window_s),
                float(cfg.capacity_quantile),
                int(cfg.capacity_step_s),
                int(t0),
                int(t1),
            )
            self.times = np.array([a for a, _ in sched], dtype=np.int64)
            self.caps = np.array([b for _, b in sched], dtype=np.float64)

    def at(self, t: int) -> float:
        if self.times is None:
            return self.nodes
        k = int(np.searchsorted(self.times, t, side="right")) - 1
        return float(self.caps[max(k, 0)])


def sweep(wl: Any, cfg: Any, t_from: int, t_to: int, tz: str = "UTC", *, label: str = "") -> pd.DataFrame:
    """Per job submitted in ``[t_from, t_to)`` (log order): what was known at its submission
    (:data:`FEATURES`), its run-time estimate and both plans (seconds), and its real wait (the
    target, never an input). The log before ``t_from`` is walked for state only."""
    n_all = len(wl)
    sub = wl.submit.astype(np.int64)
    st = wl.real_start.astype(np.int64)
    en = (wl.real_start + wl.duration).astype(np.int64)
    lim = wl.limit.astype(np.float64)
    dur = wl.duration.astype(np.float64)
    nod = np.asarray(wl.node_equiv, dtype=np.float64)
    user = wl.user.astype(np.int64)
    # the jobs that never ran, indices n_all.. (pending from their submission until they left)
    nr = getattr(wl, "never_ran", None)
    n_nr = len(nr) if nr is not None else 0
    if n_nr:
        never = np.iinfo(np.int64).max
        sub = np.concatenate([sub, nr.submit.astype(np.int64)])
        st = np.concatenate([st, np.full(n_nr, never, dtype=np.int64)])
        en = np.concatenate([en, np.full(n_nr, never, dtype=np.int64)])
        lim = np.concatenate([lim, nr.limit.astype(np.float64)])
        dur = np.concatenate([dur, np.zeros(n_nr)])
        nod = np.concatenate([nod, np.asarray(nr.node_equiv, dtype=np.float64)])
        user = np.concatenate([user, nr.user.astype(np.int64)])
        nr_leave = nr.leave.astype(np.int64)
        o_leave = np.argsort(nr_leave, kind="stable")
    p_nr = p_lv = 0
    o_st = np.argsort(st, kind="stable")
    o_en = np.argsort(en, kind="stable")
    lo = int(np.searchsorted(sub[:n_all], t_from, "left"))
    hi = int(np.searchsorted(sub[:n_all], t_to, "left"))
    cap = _Capacity(wl, cfg, t_from, t_to)
    weights = priority_weights(cfg)
    ledger = fair_share_ledger(wl, cfg, int(sub[0]) if n_all else 0)

    est = np.empty(n_all + n_nr, dtype=np.float64)
    hist: dict[int, deque] = defaultdict(lambda: deque(maxlen=USER_RUNTIME_N))
    u_wait: dict[int, deque] = defaultdict(lambda: deque(maxlen=USER_RECENT_N))
    recent: deque = deque(maxlen=RECENT_N)
    running: set[int] = set()
    pending: set[int] = set()
    u_pend: dict[int, int] = defaultdict(int)
    u_run: dict[int, int] = defaultdict(int)
    u_run_nodes: dict[int, float] = defaultdict(float)
    p_st = p_en = 0
    rows = {
        c: np.full(hi - lo, np.nan)
        for c in (
            "est_s",
            "plan_s",
            "plan_request_s",
            "pending_jobs",
            "pending_node_frac",
            "ahead_jobs",
            "ahead_node_h_frac",
            "busy_frac",
            "free_frac",
            "fits_now",
            "recent_wait_h",
            "user_recent_wait_h",
            "capacity",
            "plan_easy_s",
            "user_pending_jobs",
            "user_running_jobs",
            "user_running_node_frac",
        )
    }
    t_log = time.monotonic()
    for i in range(hi):
        t = int(sub[i])
        # starts strictly before t: running, and their waits are known
        while p_st < n_all and st[o_st[p_st]] < t:
            k = int(o_st[p_st])
            p_st += 1
            pending.discard(k)
            running.add(k)
            u_pend[int(user[k])] -= 1
            u_run[int(user[k])] += 1
            u_run_nodes[int(user[k])] += nod[k]
            if ledger is not None:
                ledger.start(int(user[k]), float(wl.nodes[k]), float(st[k]))
            w = float(st[k] - sub[k])
            recent.append(w)
            u_wait[int(user[k])].append(w)
        # ends at or before t: their run times are known
        while p_en < n_all and en[o_en[p_en]] <= t:
            k = int(o_en[p_en])
            p_en += 1
            running.discard(k)
            u_run[int(user[k])] -= 1
            u_run_nodes[int(user[k])] -= nod[k]
            if ledger is not None:
                ledger.end(int(user[k]), float(wl.nodes[k]), float(st[k]), float(en[k]))
            if user[k] >= 0:
                hist[int(user[k])].append(dur[k])
        # jobs that never ran: queued if submitted before t, gone once they left (at or before t)
        while p_nr < n_nr and sub[n_all + p_nr] < t:
            k = n_all + p_nr
            p_nr += 1
            h = hist.get(int(user[k])) if user[k] >= 0 else None
            est[k] = min(lim[k], max(1.0, float(np.mean(h)))) if h else lim[k]
            if nr_leave[k - n_all] > t:
                pending.add(k)
                u_pend[int(user[k])] += 1
        while p_lv < n_nr and nr_leave[o_leave[p_lv]] <= t:
            k = n_all + int(o_leave[p_lv])
            p_lv += 1
            if k in pending:
                pending.discard(k)
                u_pend[int(user[k])] -= 1
        h = hist.get(int(user[i])) if user[i] >= 0 else None
        est[i] = min(lim[i], max(1.0, float(np.mean(h)))) if h else lim[i]
        if i >= lo:
            r = i - lo
            C = cap.at(t)
            ri = np.fromiter(running, dtype=np.int64, count=len(running)) if running else np.zeros(0, dtype=np.int64)
            pi = np.fromiter(pending, dtype=np.int64, count=len(pending)) if pending else np.zeros(0, dtype=np.int64)
            pi.sort()
            uw = u_wait.get(int(user[i])) if user[i] >= 0 else None
            u = int(user[i])
            p_fs, me_fs = (None, 0.0)
            if ledger is not None:
                terms, _ = ledger.terms(t, np.concatenate([user[pi], [u]]))
                p_fs, me_fs = terms[:-1], float(terms[-1])
            row = queue_row(
                t,
                C,
                weights,
                st[ri],
                lim[ri],
                est[ri],
                nod[ri],
                sub[pi],
                lim[pi],
                est[pi],
                nod[pi],
                pi,
                nod[i],
                lim[i],
                est[i],
                recent,
                (uw, u_pend.get(u, 0), u_run.get(u, 0), u_run_nodes.get(u, 0.0)) if u >= 0 else None,
                p_fs,
                me_fs,
            )
            for c, v in row.items():
                rows[c][r] = v
            if time.monotonic() - t_log > PROGRESS_S:
                t_log = time.monotonic()
                log.info(
                    "waitpred%s: %d of %d jobs planned (%d pending, %d running now)",
                    f" {label}" if label else "",
                    r + 1,
                    hi - lo,
                    len(pending),
                    len(running),
                )
        pending.add(i)
        u_pend[int(user[i])] += 1
    idx = np.arange(lo, hi)
    local = pd.to_datetime(sub[idx], unit="s", utc=True).tz_convert(tz)
    unplannable = ~np.isfinite(rows["plan_s"])
    out = pd.DataFrame(
        {
            "job_id": wl.job_id[idx],
            "submit": sub[idx],
            "real_wait_s": (st[idx] - sub[idx]).astype(np.float64),
            "nodes": wl.nodes[idx],
            "limit_s": lim[idx],
            **rows,
            "log_limit_h": np.log1p(lim[idx] / 3600.0),
            "log_nodes": np.log1p(nod[idx]),
            "log_est_h": np.log1p(rows["est_s"] / 3600.0),
            "hour": local.hour.to_numpy(np.float64),
            "weekday": local.day_of_week.to_numpy(np.float64),
        }
    )
    # a job larger than the nodes in service cannot be planned: its plan is its request (reported)
    for c in ("plan_s", "plan_request_s", "plan_easy_s"):
        out[c] = np.where(np.isfinite(out[c]), out[c], out["limit_s"])
    out["plannable"] = ~unplannable
    out["plan_h"] = out["plan_s"] / 3600.0
    out["plan_request_h"] = out["plan_request_s"] / 3600.0
    out["plan_easy_h"] = out["plan_easy_s"] / 3600.0
    return out


def next_outcomes(submit: np.ndarray, real_wait: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """When :func:`online_bound` learns each job's coverage: when its bound runs out
    (``submit + bound``), whether it was covered or not. Both are known then (the job had started,
    or it still waited), and the instant does not depend on the outcome: a miss is learned no sooner
    than a cover of the same bound would be. Learning a miss when a short bound ran out but a cover
    only at the job's start (hours or days later) fed back a run of misses before the covers of the
    same jobs, and drove the offset up without end."""
    return np.asarray(submit, dtype=np.float64) + np.asarray(bound, dtype=np.float64)


def theta_limit(cap_s: float) -> float:
    """The offset's range of :func:`online_bound`, ``[-L, L]``: at ``L = log1p(cap / 60)`` even a
    zero base reaches the cap, so a larger offset would change no bound, only how long the update
    takes to come back."""
    return float(np.log1p(max(float(cap_s), 0.0) / 60.0)) if np.isfinite(cap_s) else np.inf


def bound_cap(real_wait: np.ndarray) -> float:
    """The bound's cap from the calibration period (its waits as known at the cut, a censored one as
    its known part): the longest wait it saw, at least one hour. A bound past every wait ever seen
    tells a user nothing more than that wait does; the share of bounds at the cap is reported."""
    w = np.asarray(real_wait, dtype=np.float64)
    return float(max(3600.0, float(w.max()) if len(w) else 0.0))


def online_bound(
    base_s: np.ndarray,
    submit: np.ndarray,
    real_wait: np.ndarray,
    level: float,
    theta0: float | dict[Any, float],
    eta: float = 0.05,
    cap_s: float = np.inf,
    group: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """An upper bound at ``level`` kept calibrated online (quantile tracking, Angelopoulos, Candès
    and Tibshirani 2023): ``log1p(bound / 60) = log1p(base / 60) + theta``, at most ``cap_s`` (or the
    base where that is larger: the offset never lifts a bound past the cap, nor does the cap take
    it below the base, the candidate's own answer); each
    job's outcome (covered or not) is fed back when its bound runs out (:func:`next_outcomes`), never
    before, and moves ``theta`` by ``eta * (miss - (1 - level))``, a step of at most ``eta``;
    ``theta`` stays within ``±`` :func:`theta_limit` of the cap. Jobs in submission order.

    Class-conditional (Mondrian) with ``group`` (one key per job, e.g. its job-size class): each
    group keeps its own ``theta``, started at ``theta0[key]`` (``theta0`` a mapping; a key it lacks
    starts at ``theta0[None]``) and moved only by its own jobs' outcomes, each when it is known; a
    float ``theta0`` starts every group there. Without ``group``, one ``theta`` for all jobs.
    Returns (bound seconds, the job's group's theta at each submission)."""
    n = len(base_s)
    bound = np.empty(n)
    thetas = np.empty(n)
    lim = theta_limit(cap_s)
    keys = [None] * n if group is None else list(group)
    if len(keys) != n:
        raise ValueError(f"online_bound: {len(keys)} group keys for {n} jobs")
    start = theta0 if isinstance(theta0, dict) else {None: float(theta0)}
    theta: dict[Any, float] = {}
    alpha = 1.0 - level
    heap: list[tuple[float, int, bool]] = []
    base = np.maximum(np.asarray(base_s, dtype=np.float64), 0.0)
    lb = np.log1p(base / 60.0)
    for i in range(n):
        t = submit[i]
        while heap and heap[0][0] <= t:
            _, k, miss = heapq.heappop(heap)
            g = keys[k]
            theta[g] = min(max(theta[g] + eta * ((1.0 if miss else 0.0) - alpha), -lim), lim)
        g = keys[i]
        if g not in theta:
            theta[g] = float(min(max(float(start[g] if g in start else start[None]), -lim), lim))
        th = theta[g]
        thetas[i] = th
        b = min(60.0 * np.expm1(max(lb[i] + th, 0.0)), max(cap_s, base[i]))
        bound[i] = b
        miss = bool(real_wait[i] > b)
        # ties: an outcome known at the same second as a submission is not yet known to it
        heapq.heappush(heap, (submit[i] + b + 1e-6, i, miss))
    return bound, thetas


def group_keys(levels: Sequence[np.ndarray]) -> np.ndarray:
    """Each job's group of a grouped :func:`online_bound`: its keys at every level (coarse to fine,
    e.g. its job-size class, then its requested-time class) joined by " / "."""
    if not levels:
        raise ValueError("group_keys: no level")
    out = np.asarray(levels[0], dtype=object).astype(str).astype(object)
    for lv in levels[1:]:
        out = np.array([f"{a} / {b}" for a, b in zip(out, np.asarray(lv, dtype=object))], dtype=object)
    return out


def neighbour_run(
    order: Sequence[Any], start: Any, calibrated: Callable[[tuple[Any, ...]], bool]
) -> tuple[Any, ...] | None:
    """The groups a thin group borrows its start offset from: ``start`` and its neighbours in
    ``order`` (e.g. job-size classes, small to large), grown one group at a time, first toward the
    larger ones, then (past the largest) toward the smaller, until ``calibrated(run)`` holds (the run
    in ``order``); None where even every group together is not. Deterministic: it reads nothing but
    ``order`` and ``calibrated`` (what the calibration period knew at its cut)."""
    order = list(order)
    i = order.index(start)
    members = [i]
    for j in [*range(i + 1, len(order)), *range(i - 1, -1, -1)]:
        members.append(j)
        run = tuple(order[k] for k in sorted(members))
        if calibrated(run):
            return run
    return None


def group_theta0(
    base_s: np.ndarray,
    real_wait: np.ndarray,
    level: float,
    censored: np.ndarray,
    levels: Sequence[np.ndarray],
    cap_s: float = np.inf,
    min_known: int = 50,
    also: Sequence[np.ndarray] | None = None,
    merge_order: Callable[[Any], Any] | None = None,
) -> tuple[dict[Any, float], dict[str, dict[str, Any]]]:
    """The start offsets of a grouped :func:`online_bound` from a calibration sample, its jobs' keys
    at ``levels`` (coarse to fine, :func:`group_keys`): a group at a level is *calibrated* where it
    holds at least ``min_known`` jobs whose wait is known (not ``censored``) and its quantile is not
    a censored job's; each finest group starts at the :func:`static_theta` of its finest calibrated
    level, else at the pooled one (key ``None``, every job of the sample). ``also``: the keys of
    jobs to come (the scored ones), whose groups the sample may lack. Returns (the offsets by
    finest group, and per finest group: ``theta0``, ``source`` ("calibrated" at the finest level,
    "level k" at a coarser one, "pooled fallback"), ``n``, ``n_known`` and ``quantile_censored`` of
    the group itself).

    ``merge_order`` (one level only; a sort key of its groups, e.g. the job-size class's smallest
    node count): a group not calibrated itself starts instead at the offset of its
    :func:`neighbour_run`, the neighbouring groups merged until calibrated (source "merged (a, b,
    ...)", ``merged`` the run), and at the pooled one only where no run is; its offset online stays
    its own."""
    cen = np.asarray(censored, dtype=bool)
    if merge_order is not None and len(levels) != 1:
        raise ValueError(f"group_theta0: merge_order needs one level, got {len(levels)}")
    pooled = static_theta(base_s, real_wait, level, cen, cap_s)
    keys = [group_keys(levels[: i + 1]) for i in range(len(levels))]
    own: list[dict[str, float]] = []
    stats: dict[str, tuple[int, int, bool]] = {}
    for lv, kk in enumerate(keys):
        own.append({})
        for g in set(kk.tolist()):
            m = kk == g
            n_known = int((m & ~cen).sum())
            # its own offset only where its known waits say where its quantile lies: at least
            # min_known of them, and the quantile not on a wait still going on at the cut (that
            # offset would be the range's end: a bound at the cap for every job of the group,
            # learned back only as each ran out)
            censored_q = not np.isfinite(_score_quantile(base_s[m], real_wait[m], level, cen[m]))
            if n_known >= min_known and not censored_q:
                own[lv][g] = static_theta(base_s[m], real_wait[m], level, cen[m], cap_s)
            if lv == len(keys) - 1:
                stats[g] = (int(m.sum()), n_known, censored_q)
    finest = set(keys[-1].tolist())
    prefixes: dict[str, list[str]] = {}
    for kk in (keys, [group_keys(also[: i + 1]) for i in range(len(also))] if also is not None else None):
        for j, g in enumerate(kk[-1] if kk else ()):
            if g not in prefixes:
                prefixes[g] = [kk[i][j] for i in range(len(levels))]
                finest.add(g)
    out: dict[Any, float] = {None: pooled}
    info: dict[str, dict[str, Any]] = {}
    top = len(levels) - 1
    for g in finest:
        src, th = "pooled fallback", pooled
        for lv in range(top, -1, -1):
            p = prefixes[g][lv]
            if p in own[lv]:
                src, th = ("calibrated" if lv == top else f"level {lv + 1} ({p})"), own[lv][p]
                break
        n, n_known, censored_q = stats.get(g, (0, 0, False))
        out[g] = th
        info[g] = {"theta0": th, "source": src, "n": n, "n_known": n_known, "quantile_censored": bool(censored_q)}
    if merge_order is not None:
        kk = keys[0]
        order = sorted(finest, key=merge_order)

        def calibrated(run: tuple[Any, ...]) -> bool:
            m = np.isin(kk, run)
            return int((m & ~cen).sum()) >= min_known and bool(
                np.isfinite(_score_quantile(base_s[m], real_wait[m], level, cen[m]))
            )

        for g in order:
            if info[g]["source"] == "calibrated":
                continue
            run = neighbour_run(order, g, calibrated)
            if run is not None:
                m = np.isin(kk, run)
                out[g] = static_theta(base_s[m], real_wait[m], level, cen[m], cap_s)
                info[g].update(theta0=out[g], source=f"merged ({', '.join(map(str, run))})", merged=list(run))
    return out, info


def static_bound(base_s: np.ndarray, theta: float, cap_s: float = np.inf) -> np.ndarray:
    """The bound of :func:`online_bound` at a fixed offset ``theta`` (seconds), at most ``cap_s`` or
    the base where that is larger."""
    base = np.maximum(np.asarray(base_s, dtype=np.float64), 0.0)
    return np.minimum(60.0 * np.expm1(np.maximum(np.log1p(base / 60.0) + theta, 0.0)), np.maximum(cap_s, base))


def estimates(wl: Any) -> np.ndarray:
    """Every job's run-time estimate as :func:`sweep` fixes it at the job's submission (the mean run
    time of its user's last :data:`USER_RUNTIME_N` jobs that had ended by then, at least 1 s,
    capped by its request; the request without such history), for the whole log."""
    sub = wl.submit.astype(np.int64)
    en = (wl.real_start + wl.duration).astype(np.int64)
    lim = wl.limit.astype(np.float64)
    dur = wl.duration.astype(np.float64)
    user = wl.user.astype(np.int64)
    o_en = np.argsort(en, kind="stable")
    hist: dict[int, deque] = defaultdict(lambda: deque(maxlen=USER_RUNTIME_N))
    est = lim.copy()
    p_en = 0
    n = len(sub)
    for i in range(n):
        t = int(sub[i])
        while p_en < n and en[o_en[p_en]] <= t:
            k = int(o_en[p_en])
            p_en += 1
            if user[k] >= 0:
                hist[int(user[k])].append(dur[k])
        h = hist.get(int(user[i])) if user[i] >= 0 else None
        if h:
            est[i] = min(lim[i], max(1.0, float(np.mean(h))))
    return est


def _score_quantile(
    base_s: np.ndarray, real_wait: np.ndarray, level: float, censored: np.ndarray | None = None
) -> float:
    """The split-conformal quantile of :func:`static_theta` before its range: ``inf`` where it falls
    on a censored job (the sample does not say where its ``level`` quantile lies), 0 on no job."""
    s = np.log1p(np.maximum(real_wait, 0.0) / 60.0) - np.log1p(np.maximum(base_s, 0.0) / 60.0)
    if censored is not None:
        s = np.where(np.asarray(censored, dtype=bool), np.inf, s)
    n = len(s)
    if n == 0:
        return 0.0
    q = min(1.0, np.ceil((n + 1) * level) / n)
    return float(np.quantile(s, q, method="higher"))


def static_theta(
    base_s: np.ndarray, real_wait: np.ndarray, level: float, censored: np.ndarray | None = None, cap_s: float = np.inf
) -> float:
    """The split-conformal offset (log scale of :func:`online_bound`) that covers ``level`` of a
    calibration sample: the ``ceil((n + 1) level) / n`` quantile of the scores, within ``±``
    :func:`theta_limit`. A ``censored`` job (still waiting at the cut: its wait only "at least")
    counts as a miss whatever the offset (its score infinite): conservative."""
    lim = theta_limit(cap_s)
    return float(min(max(_score_quantile(base_s, real_wait, level, censored), -lim), lim))
