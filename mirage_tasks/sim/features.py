"""Decision-time queue features: ``window`` snapshots x ``len(FEATURE_NAMES)`` values.

A *snapshot* summarises the simulated partition at one instant (every ``step_s`` = 600 s
on the absolute clock, i.e. at epoch multiples of 600 s). A *history* is the last
``window`` (144 = 24 h) snapshots taken at or before the decision moment, oldest first,
with the predecessor/successor tuples of the decision moment written into every row
(as the reference does). Missing snapshots (a history shorter than the window) are
zero rows at the front. The offline sampler and the online :class:`DecisionEpisode`
both call :func:`snapshot` and :func:`history`, so offline and online features agree.

Features are raw (no scaling); the models normalise. Percentiles use linear
interpolation (numpy's default) over the jobs in the set; an empty set gives zeros.

| index | name | unit |
|---|---|---|
| 0 | pending_count: jobs waiting (the predecessor included while it waits) | jobs |
| 1 | pending_nodes: nodes they request | nodes |
| 2-6 | pending_limit_p{0,25,50,75,100}: their time limits | minutes |
| 7-11 | pending_wait_p{...}: how long each has waited so far | s |
| 12-16 | pending_runtime_p{...}: always 0 (kept for the reference's layout) | s |
| 17 | running_count | jobs |
| 18 | running_nodes | nodes |
| 19-23 | running_limit_p{...} | minutes |
| 24-28 | running_wait_p{...}: start - submit of each running job | s |
| 29-33 | running_elapsed_p{...}: time each has run so far | s |
| 34-37 | pred_limit, pred_nodes, pred_wait, pred_elapsed at the decision (1) | min, nodes, s, s |
| 38-41 | succ_limit, succ_nodes, succ_wait (0), succ_elapsed (0) | min, nodes, s, s |
| 42 | free_nodes: idle nodes at the snapshot (new) | nodes |
| 43 | cluster_nodes: configured partition size (new; differs per trace) | nodes |

(1) the predecessor's limit (minutes), nodes, wait so far (start - submit once it has
started) and run time so far (0 while pending; the full 48 h once it has ended).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .engine import Simulator

PCTS = (0, 25, 50, 75, 100)
_Q = np.array(PCTS, dtype=np.float64) / 100.0


def _p(prefix: str) -> list[str]:
    return [f"{prefix}_p{q}" for q in PCTS]


FEATURE_NAMES: list[str] = (
    ["pending_count", "pending_nodes"]
    + _p("pending_limit_min")
    + _p("pending_wait_s")
    + _p("pending_runtime_s")
    + ["running_count", "running_nodes"]
    + _p("running_limit_min")
    + _p("running_wait_s")
    + _p("running_elapsed_s")
    + ["pred_limit_min", "pred_nodes", "pred_wait_s", "pred_elapsed_s"]
    + ["succ_limit_min", "succ_nodes", "succ_wait_s", "succ_elapsed_s"]
    + ["free_nodes", "cluster_nodes"]
)
N_FEATURES = len(FEATURE_NAMES)
PRED_COL = 34
SUCC_COL = 38
assert N_FEATURES == 44 and FEATURE_NAMES[PRED_COL] == "pred_limit_min" and FEATURE_NAMES[42] == "free_nodes"


def _percentiles(rows: np.ndarray) -> np.ndarray:
    """Row-wise 0/25/50/75/100th percentiles (linear) of a [k, n] array, n >= 1."""
    n = rows.shape[1]
    s = np.sort(rows, axis=1)
    pos = (n - 1) * _Q
    lo = np.floor(pos).astype(np.intp)
    hi = np.minimum(lo + 1, n - 1)
    frac = pos - lo
    return s[:, lo] + (s[:, hi] - s[:, lo]) * frac


def snapshot_direct(sim: Simulator) -> np.ndarray:
    """:func:`snapshot` computed from scratch from the simulator's queue and running set (the
    definition :class:`QueueStats` must reproduce bit for bit; tests compare the two)."""
    v = np.zeros(N_FEATURES, dtype=np.float64)
    now = sim.now
    lim = sim.j_limit
    nodes = sim.j_nodes
    sub = sim.j_submit
    pend = sim.pending
    if pend:
        a = np.array([(lim[j], nodes[j], sub[j]) for j in pend], dtype=np.float64)
        v[0] = len(pend)
        v[1] = a[:, 1].sum()
        pc = _percentiles(np.stack([a[:, 0] / 60.0, now - a[:, 2]]))
        v[2:7] = pc[0]
        v[7:12] = pc[1]
    run = sim.running
    if run:
        st = sim.j_start
        a = np.array([(lim[j], nodes[j], sub[j], st[j]) for j in run], dtype=np.float64)
        v[17] = len(run)
        v[18] = a[:, 1].sum()
        pc = _percentiles(np.stack([a[:, 0] / 60.0, a[:, 3] - a[:, 2], now - a[:, 3]]))
        v[19:24] = pc[0]
        v[24:29] = pc[1]
        v[29:34] = pc[2]
    v[42] = max(sim.free, 0)  # nodes leaving service while busy make free < 0 (capacity_window_s)
    v[43] = sim.cap  # nodes in service: cfg.nodes unless capacity_window_s is on
    return v


class QueueStats:
    """Sorted multisets of what :func:`snapshot` summarises, kept up to date by the simulator
    while a history is recorded (``Simulator.queue_stats``; the engine calls :meth:`enqueued`,
    :meth:`dequeued`, :meth:`started` and :meth:`finished`), so a snapshot reads its order
    statistics instead of sorting the queue every 600 s.

    Pending jobs: their time limits and submit times; running jobs: limits, waits (start -
    submit) and starts, all exact integers, plus the nodes of each set. A snapshot's values
    are the same float64 operations on the same operands as :func:`snapshot_direct`'s
    (``limit / 60.0`` is monotone, ``now - submit`` is exact), so the features are identical.
    """

    __slots__ = ("p_lim", "p_sub", "p_nodes", "r_lim", "r_wait", "r_start", "r_nodes", "_sim")

    def __init__(self, sim: Simulator | None = None):
        self._sim = sim
        self.p_lim: list[int] = []
        self.p_sub: list[int] = []
        self.r_lim: list[int] = []
        self.r_wait: list[int] = []
        self.r_start: list[int] = []
        self.p_nodes = self.r_nodes = 0
        if sim is None:
            return
        lim, nodes, sub, st = sim.j_limit, sim.j_nodes, sim.j_submit, sim.j_start
        pend = [k[2] for k in sim.queue]
        self.p_lim = sorted(lim[j] for j in pend)
        self.p_sub = sorted(sub[j] for j in pend)
        self.p_nodes = sum(nodes[j] for j in pend)
        run = list(sim.running)
        self.r_lim = sorted(lim[j] for j in run)
        self.r_wait = sorted(st[j] - sub[j] for j in run)
        self.r_start = sorted(st[j] for j in run)
        self.r_nodes = sum(nodes[j] for j in run)

    def copy(self, sim: Simulator) -> QueueStats:
        c = QueueStats()
        c._sim = sim
        c.p_lim, c.p_sub, c.r_lim, c.r_wait, c.r_start = (
            self.p_lim.copy(),
            self.p_sub.copy(),
            self.r_lim.copy(),
            self.r_wait.copy(),
            self.r_start.copy(),
        )
        c.p_nodes, c.r_nodes = self.p_nodes, self.r_nodes
        return c

    # the engine's hooks ---------------------------------------------------------------
    def enqueued(self, j: int) -> None:
        sim = self._sim
        insort(self.p_lim, sim.j_limit[j])
        insort(self.p_sub, sim.j_submit[j])
        self.p_nodes += sim.j_nodes[j]

    def dequeued(self, j: int) -> None:
        sim = self._sim
        _remove(self.p_lim, sim.j_limit[j])
        _remove(self.p_sub, sim.j_submit[j])
        self.p_nodes -= sim.j_nodes[j]

    def started(self, j: int) -> None:
        sim = self._sim
        s = sim.j_start[j]
        insort(self.r_lim, sim.j_limit[j])
        insort(self.r_wait, s - sim.j_submit[j])
        insort(self.r_start, s)
        self.r_nodes += sim.j_nodes[j]

    def finished(self, j: int) -> None:
        sim = self._sim
        s = sim.j_start[j]
        _remove(self.r_lim, sim.j_limit[j])
        _remove(self.r_wait, s - sim.j_submit[j])
        _remove(self.r_start, s)
        self.r_nodes -= sim.j_nodes[j]


def _remove(a: list[int], x: int) -> None:
    i = bisect_left(a, x)
    if i == len(a) or a[i] != x:  # the hooks pair up; never expected
        raise RuntimeError(f"queue statistics lost value {x}")
    del a[i]


_POS: dict[int, tuple[tuple[int, int, float], ...]] = {}


def _pos(n: int) -> tuple[tuple[int, int, float], ...]:
    """(lo, hi, frac) of each percentile of ``n`` values, as :func:`_percentiles` computes them."""
    r = _POS.get(n)
    if r is None:
        pos = (n - 1) * _Q
        lo = np.floor(pos).astype(np.intp)
        hi = np.minimum(lo + 1, n - 1)
        r = _POS[n] = tuple((int(a), int(b), float(f)) for a, b, f in zip(lo, hi, pos - lo))
    return r


def snapshot(sim: Simulator) -> np.ndarray:
    """The 44-vector of the partition now (columns 34-41 left 0: set by :func:`history`).
    Read from the simulator's :class:`QueueStats` (started on the first snapshot of a
    history); equal, value for value, to :func:`snapshot_direct`."""
    st = sim.queue_stats
    if st is None:
        st = sim.queue_stats = QueueStats(sim)
    now = sim.now
    v = [0.0] * N_FEATURES
    n = len(st.p_lim)
    if n:
        v[0] = float(n)
        v[1] = float(st.p_nodes)
        lim, sub = st.p_lim, st.p_sub
        last = n - 1
        for q, (lo, hi, f) in enumerate(_pos(n)):
            a, b = lim[lo] / 60.0, lim[hi] / 60.0
            v[2 + q] = a + (b - a) * f
            a, b = float(now - sub[last - lo]), float(now - sub[last - hi])
            v[7 + q] = a + (b - a) * f
    n = len(st.r_lim)
    if n:
        v[17] = float(n)
        v[18] = float(st.r_nodes)
        lim, wait, start = st.r_lim, st.r_wait, st.r_start
        last = n - 1
        for q, (lo, hi, f) in enumerate(_pos(n)):
            a, b = lim[lo] / 60.0, lim[hi] / 60.0
            v[19 + q] = a + (b - a) * f
            a, b = float(wait[lo]), float(wait[hi])
            v[24 + q] = a + (b - a) * f
            a, b = float(now - start[last - lo]), float(now - start[last - hi])
            v[29 + q] = a + (b - a) * f
    v[42] = float(max(sim.free, 0))  # nodes leaving service while busy make free < 0 (capacity_window_s)
    v[43] = float(sim.cap)  # nodes in service: cfg.nodes unless capacity_window_s is on
    return np.array(v, dtype=np.float64)


def probe_tuple(sim: Simulator, j: int) -> tuple[float, float, float, float]:
    """(limit min, nodes, wait s, elapsed s) of job ``j`` now; zeros before its submission."""
    now = sim.now
    sub = sim.j_submit[j]
    if sub > now:
        return (0.0, 0.0, 0.0, 0.0)
    start = sim.j_start[j]
    lim = sim.j_limit[j] / 60.0
    n = float(sim.j_nodes[j])
    if start < 0 or start > now:
        return (lim, n, float(now - sub), 0.0)
    return (lim, n, float(start - sub), float(min(now - start, sim.j_dur[j])))


def history(sim: Simulator, pred: int, succ_nodes: int, succ_limit_s: int, window: int) -> np.ndarray:
    """float32 [window, N_FEATURES]: the last ``window`` snapshots (zero rows in front when
    fewer exist) with the decision-time pred/succ tuples in columns 34-41."""
    out = np.zeros((window, N_FEATURES), dtype=np.float32)
    snaps = list(sim.snaps)[-window:]
    if snaps:
        out[window - len(snaps) :] = np.stack([s for _, s in snaps])
    out[:, PRED_COL : PRED_COL + 4] = probe_tuple(sim, pred)
    out[:, SUCC_COL : SUCC_COL + 4] = (succ_limit_s / 60.0, float(succ_nodes), 0.0, 0.0)
    return out
