"""Compact, immutable job arrays built once per trace and shared by every episode.

``Workload.from_frame(df)`` takes a trace in the normalised schema
(:mod:`mirage_tasks.data.schema`) and keeps, per job, sorted by submit time:

* ``submit``, ``real_start``, ``real_end`` (int64 epoch seconds; real times only serve
  the warm start, the recorded priority's age term and the fidelity comparison),
* ``duration`` = real end - real start, clipped to the time limit (the simulator replays
  this run time; it recomputes the start),
* ``limit`` (seconds; a job without one gets a limit known at its submission,
  :func:`mirage_tasks.data.limits.fill_limits`, counted in ``limit_fill``; ``ingest`` fills them
  first, with the log description's declared maxima and default),
* ``nodes`` (a job without a node count uses ``ceil(procs / procs_per_node)``),
* ``node_equiv`` (float: ``nodes`` where the trace records them, ``procs / procs_per_node``
  where they are derived: jobs that share nodes do not each hold a whole one, so the busy
  peak in node-equivalents cannot exceed the machine the way the ceiling's can),
* ``user`` (dense int ids, -1 unknown), ``priority`` (recorded, NaN unknown).

Jobs that never ran (no start, but a time they left: cancelled while pending) are kept apart in
``never_ran`` (:class:`NeverRan`: submit, the time they left, limit, nodes, user): the simulator
queues them from their submission until they left and never starts them, and the at-submission
replay counts them pending until then; nothing scores them. Jobs with neither (no start and no
leave time, no run time, or no size) are dropped, and counted in ``dropped``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stepkit import StepError

from ..data.schema import epoch_seconds


@dataclass
class NeverRan:
    """Jobs that left the queue without running, sorted by submission: ``leave`` is when the log
    says they left (SWF: submit + wait of a cancelled job; sacct: the end of a job that never
    started)."""

    job_id: np.ndarray
    submit: np.ndarray
    leave: np.ndarray
    limit: np.ndarray
    nodes: np.ndarray
    node_equiv: np.ndarray
    user: np.ndarray
    priority: np.ndarray

    def __len__(self) -> int:
        return len(self.submit)

    @classmethod
    def empty(cls) -> NeverRan:
        i, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        return cls(np.zeros(0, dtype=object), i, i, i, i, f, i, f)

    def take(self, idx: np.ndarray) -> NeverRan:
        return NeverRan(**{k: v[idx] for k, v in self.__dict__.items()})


@dataclass
class Workload:
    job_id: np.ndarray
    submit: np.ndarray
    real_start: np.ndarray
    real_end: np.ndarray
    duration: np.ndarray
    limit: np.ndarray
    nodes: np.ndarray
    user: np.ndarray
    priority: np.ndarray
    dropped: dict[str, int] = field(default_factory=dict)
    fingerprint: str = ""
    node_equiv: np.ndarray | None = None
    never_ran: NeverRan = field(default_factory=NeverRan.empty)
    limit_fill: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.node_equiv is None:
            self.node_equiv = np.asarray(self.nodes, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.submit)

    @classmethod
    def from_frame(cls, df: pd.DataFrame, procs_per_node: int | None = None) -> Workload:
        submit = epoch_seconds(df["submit"])
        start = epoch_seconds(df["start"])
        end = epoch_seconds(df["end"])
        limit = df["time_limit_s"].to_numpy(dtype="float64", na_value=np.nan)
        nodes = df["nodes"].to_numpy(dtype="float64", na_value=np.nan)
        equiv = nodes.copy()
        if np.isnan(nodes).any():
            procs = df["procs"].to_numpy(dtype="float64", na_value=np.nan)
            if procs_per_node:
                equiv = np.where(np.isnan(nodes), procs / procs_per_node, nodes)
                nodes = np.where(np.isnan(nodes), np.ceil(procs / procs_per_node), nodes)
            elif np.isnan(nodes).all():
                raise StepError(
                    "the trace records processors but no node counts: pass --procs-per-node P "
                    "(nodes = ceil(processors / P))"
                )
        sized = (submit >= 0) & ~np.isnan(nodes) & (nodes >= 1)
        ran = (start >= 0) & (end >= 0) & (end >= start) & sized
        gone = (start < 0) & (end >= submit) & sized  # left the queue without running
        dropped = {"never_ran_or_no_size": int((~ran & ~gone).sum())}
        dur = (end - start).astype(np.float64)
        users = df["user"].astype("string").fillna("")
        from ..data.limits import fill_limits

        limit, _, limit_fill = fill_limits(submit, start, end, limit, users.to_numpy(dtype=object))
        dur = np.minimum(dur, limit)
        prio = df["priority"].to_numpy(dtype="float64", na_value=np.nan)
        codes, _ = pd.factorize(users, sort=True)
        user_code = np.where(users.to_numpy() == "", -1, codes).astype(np.int64)
        g = np.flatnonzero(gone)
        g = g[np.lexsort((np.arange(len(g)), submit[g]))]
        never_ran = NeverRan(
            job_id=df["job_id"].astype(str).to_numpy()[g],
            submit=submit[g].astype(np.int64),
            leave=end[g].astype(np.int64),
            limit=np.maximum(np.ceil(limit[g]), 1).astype(np.int64),
            nodes=nodes[g].astype(np.int64),
            node_equiv=np.minimum(equiv[g], nodes[g]).astype(np.float64),
            user=user_code[g],
            priority=prio[g],
        )
        idx = np.flatnonzero(ran)
        order = idx[np.lexsort((np.arange(len(idx)), submit[idx]))]
        job_id = df["job_id"].astype(str).to_numpy()[order]
        wl = cls(
            job_id=job_id,
            submit=submit[order].astype(np.int64),
            real_start=np.maximum(start[order], submit[order]).astype(np.int64),
            real_end=end[order].astype(np.int64),
            duration=np.maximum(dur[order], 1).astype(np.int64),
            limit=np.maximum(np.ceil(limit[order]), 1).astype(np.int64),
            nodes=nodes[order].astype(np.int64),
            user=user_code[order],
            priority=prio[order],
            dropped=dropped,
            node_equiv=np.minimum(equiv[order], nodes[order]).astype(np.float64),
            never_ran=never_ran,
            limit_fill=limit_fill,
        )
        h = hashlib.sha256()
        for a in (wl.submit, wl.duration, wl.limit, wl.nodes, wl.user, np.nan_to_num(wl.priority, nan=-1)):
            h.update(np.ascontiguousarray(a).tobytes())
        if len(never_ran):  # (a log without such jobs keeps its fingerprint)
            for a in (never_ran.submit, never_ran.leave, never_ran.limit, never_ran.nodes, never_ran.user):
                h.update(np.ascontiguousarray(a).tobytes())
        wl.fingerprint = h.hexdigest()
        return wl

    def window(self, t0: int, t1: int) -> np.ndarray:
        """Indices of jobs submitted in ``[t0, t1]`` (inclusive, as the reference)."""
        lo = int(np.searchsorted(self.submit, t0, side="left"))
        hi = int(np.searchsorted(self.submit, t1, side="right"))
        return np.arange(lo, hi)

    def active_at(self, t0: int) -> tuple[np.ndarray, np.ndarray]:
        """(running, pending) indices at ``t0`` according to the trace.

        running: submitted before t0, started at or before t0, still running after t0 (by
        the clipped duration). pending: submitted before t0 and started after t0.
        """
        lo = int(np.searchsorted(self.submit, t0, side="left"))
        sub = slice(0, lo)
        rs = self.real_start[sub]
        run_end = rs + self.duration[sub]
        running = np.flatnonzero((rs <= t0) & (run_end > t0))
        pending = np.flatnonzero(rs > t0)
        return running, pending


BUSY_GRID_S = 300  # the trace's busy nodes are sampled every 5 minutes for the capacity model


def busy_grid(wl: Workload) -> tuple[int, np.ndarray]:
    """(g0, busy): the trace's busy nodes (real start to start + replayed run time) at
    ``g0 + k * BUSY_GRID_S``, from the first start to the last end; cached on ``wl``."""
    cache = wl.__dict__.setdefault("_cap_cache", {})
    if "grid" not in cache:
        start = wl.real_start
        end = wl.real_start + wl.duration
        if len(start) == 0:
            cache["grid"] = (0, np.zeros(0, dtype=np.int64))
        else:
            g0 = int(start.min()) // BUSY_GRID_S * BUSY_GRID_S
            g = np.arange(g0, int(end.max()) + BUSY_GRID_S, BUSY_GRID_S)
            # busy at g: nodes of the jobs started at or before g minus those ended at or before g
            os_, oe = np.argsort(start, kind="stable"), np.argsort(end, kind="stable")
            ns = np.concatenate(([0], np.cumsum(wl.nodes[os_])))
            ne = np.concatenate(([0], np.cumsum(wl.nodes[oe])))
            level = ns[np.searchsorted(start[os_], g, side="right")] - ne[np.searchsorted(end[oe], g, side="right")]
            cache["grid"] = (g0, level.astype(np.int64))
    return cache["grid"]


def capacity_schedule(
    wl: Workload, nodes: int, window_s: int, quantile: float, step_s: int, t0: int, t_end: int
) -> tuple[tuple[int, int], ...]:
    """The nodes in service at every multiple of ``step_s`` in ``[t0, t_end]`` (first entry
    at ``t0``): ``min(nodes, ceil(q))`` with ``q`` the ``quantile`` of the trace's busy nodes
    sampled in ``[u - window_s, u)``, i.e. only what had happened before ``u``. Where the
    trace shows no busy node in the window (before its first job) or ``u`` lies after its
    last submission (the trace's later load is unknown), and after ``t_end``, the partition
    is whole (``nodes``). Only changes are listed."""
    cache = wl.__dict__.setdefault("_cap_cache", {})
    g0, level = busy_grid(wl)
    key = ("roll", window_s, quantile)
    if key not in cache:
        w = max(1, window_s // BUSY_GRID_S)
        s = pd.Series(level.astype(np.float64))
        r = s.rolling(w, min_periods=1)
        cache[key] = (r.max() if quantile >= 1.0 else r.quantile(quantile, interpolation="higher")).to_numpy()
    roll = cache[key]
    last_submit = int(wl.submit[-1]) if len(wl) else t0
    first = (t0 // step_s + 1) * step_s
    times = np.concatenate(([t0], np.arange(first, t_end + 1, step_s, dtype=np.int64))).astype(np.int64)
    k = (times - 1 - g0) // BUSY_GRID_S  # the last sample strictly before each time
    ok = (times <= last_submit) & (k >= 0) & (k < len(roll))
    v = np.where(ok, roll[np.clip(k, 0, max(len(roll) - 1, 0))] if len(roll) else 0.0, 0.0)
    v = np.nan_to_num(v, nan=0.0)
    caps = np.where(ok & (v >= 1), np.minimum(nodes, np.ceil(v)), nodes).astype(np.int64)
    keep = np.concatenate(([True], caps[1:] != caps[:-1]))
    out = [(int(t), int(c)) for t, c in zip(times[keep], caps[keep])]
    if out[-1][1] != nodes:  # whole again after the schedule, so that every job can eventually start
        out.append((int(times[-1] + step_s), int(nodes)))
    return tuple(out)


def infer_holds(
    submit: np.ndarray, start: np.ndarray, end: np.ndarray, user: np.ndarray, tolerance_s: int = 60
) -> np.ndarray:
    """The inferred predecessor of every job (an index into the same arrays, -1 for none).

    Job ``J`` of user ``U`` is inferred to have waited for ``U``'s job ``P`` (a dependency,
    or an array throttle releasing one task as another ends) when ``P`` was submitted no
    later than ``J`` and ended after ``J``'s submission (``J`` was pending while ``P``
    existed), and ``J``'s real start lies in ``[P's real end, P's real end + tolerance_s]``
    (so ``J`` did not start while ``P`` ran), and ``P`` started strictly before ``J`` (jobs
    that ran for no time at one instant are not chained to each other, and the pairing has
    no cycle). Of several such ``P`` the one that ended last is taken. Jobs of unknown users (``user < 0``) are never paired.

    This reads real start and end times, i.e. part of the outcome a replay is scored on: it
    reconstructs input the real scheduler had (``Dependency``, ``ArrayTaskThrottle``) and an
    ``sacct`` export omits; it is not a prediction.
    """
    submit = np.asarray(submit, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    user = np.asarray(user, dtype=np.int64)
    pred = np.full(len(submit), -1, dtype=np.int64)
    known = np.flatnonzero(user >= 0)
    if len(known) == 0:
        return pred
    # per user, jobs by real end; for each job the candidates whose end lies in [start - tol, start]
    order = known[np.lexsort((known, end[known], user[known]))]
    u_sorted = user[order]
    bounds = np.flatnonzero(np.diff(u_sorted)) + 1
    for grp in np.split(order, bounds):
        e = end[grp]
        for j in grp:
            s = int(start[j])
            lo = int(np.searchsorted(e, s - tolerance_s, side="left"))
            hi = int(np.searchsorted(e, s, side="right"))
            for k in range(hi - 1, lo - 1, -1):  # the latest end first
                p = int(grp[k])
                if p != j and submit[p] <= submit[j] < end[p] and start[p] < s:
                    pred[j] = p
                    break
    return pred


def infer_holds_frame(df: pd.DataFrame, tolerance_s: int = 60) -> pd.Series:
    """:func:`infer_holds` over a normalised trace frame: the ``job_id`` of each row's
    inferred predecessor (``<NA>`` where none; rows that never ran have none)."""
    submit = epoch_seconds(df["submit"])
    start = epoch_seconds(df["start"])
    end = epoch_seconds(df["end"])
    users = df["user"].astype("string").fillna("")
    codes, _ = pd.factorize(users, sort=True)
    ran = (start >= 0) & (end >= start) & (submit >= 0)
    user = np.where(ran & (users.to_numpy() != ""), codes, -1)
    pred = infer_holds(submit, np.where(ran, np.maximum(start, submit), -1), np.where(ran, end, -1), user, tolerance_s)
    ids = df["job_id"].astype("string").to_numpy()
    out = pd.array([ids[p] if p >= 0 else pd.NA for p in pred], dtype="string")
    return pd.Series(out, index=df.index, name="held_by")


def workload_holds(wl: Workload, tolerance_s: int) -> np.ndarray:
    """:func:`infer_holds` on a workload (its real start and real end), cached on ``wl``."""
    cache = wl.__dict__.setdefault("_holds_cache", {})
    if tolerance_s not in cache:
        cache[tolerance_s] = infer_holds(wl.submit, wl.real_start, wl.real_end, wl.user, tolerance_s)
    return cache[tolerance_s]
