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

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .engine import Simulator

PCTS = (0, 25, 50, 75, 100)
_Q = np.array(PCTS, dtype=np.float64) / 100.0


def _p(prefix: str) -> list[str]:
    return [f"{prefix}_p{q}" for q in PCTS]


FEATURE_NAMES: list[str] = (
    ["pending_count", "pending_nodes"] + _p("pending_limit_min") + _p("pending_wait_s") + _p("pending_runtime_s")
    + ["running_count", "running_nodes"] + _p("running_limit_min") + _p("running_wait_s") + _p("running_elapsed_s")
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


def snapshot(sim: Simulator) -> np.ndarray:
    """The 44-vector of the partition now (columns 34-41 left 0: set by :func:`history`)."""
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
    v[43] = sim.cap           # nodes in service: cfg.nodes unless capacity_window_s is on
    return v


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
        out[window - len(snaps):] = np.stack([s for _, s in snaps])
    out[:, PRED_COL:PRED_COL + 4] = probe_tuple(sim, pred)
    out[:, SUCC_COL:SUCC_COL + 4] = (succ_limit_s / 60.0, float(succ_nodes), 0.0, 0.0)
    return out
