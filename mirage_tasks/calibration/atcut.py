"""The log as it stood at the cut: what every fitted part of the wait predictor may read.

The wait predictor's fitted parts (the simulator's configuration searched by ``calibrate``, the
quantile model's training labels, the guard's folds and the bound's start offsets) are
fitted on the calibration period ``[a, cut)`` and then answer for jobs submitted from ``cut`` on.
A job submitted before the cut may still be waiting or running at the cut: its real wait and
run time become known only later, while the scored jobs are already being answered. Fitting on
them would let the answers read outcomes that were not known yet (delaying a start after the
cut would change an earlier answer).

:func:`as_known` returns the log as a site would have exported it at the cut, each job's
unknown outcome censored:

* jobs submitted at or after the cut are not in it;
* a job not started before the cut (``real_start >= cut``) is *wait-censored*: its wait is "at
  least ``cut - submit``", so its start is recorded as the cut, and its run time is unknown, so it
  runs for its requested time (what the scheduler itself assumes of a job);
* a job started but not ended by the cut (``real_start + duration > cut``) is *run-censored*: it
  runs for its requested time (at least the time it had run by the cut);
* a recorded priority is known only for a job that had started (an exported priority reads the
  job's wait);
* a job that never ran (:class:`~mirage_tasks.sim.workload.NeverRan`) and had left by the cut stays
  one; one that left after the cut was, at the cut, a pending job like any other (its leaving was
  not known yet): it is wait-censored as above.

Everything before the cut is unchanged (busy nodes, per-user concurrency, every start and end
before the cut); nothing after it is read. How each fitted part treats a censored wait:

* the simulator's search (``calibrate``) replays the censored jobs (they hold their place in the
  queue) but scores only the jobs whose wait was known at the cut (as the guard, below);
* the quantile model is trained on ``min(wait, cut - submit)``: the ``q`` quantile of a wait
  censored at a known point ``c`` is ``min(Q_q, c)``, so the labels are exact wherever the
  quantile lies below the censoring point (all but the jobs submitted in the last hours);
* the guard judges only the jobs whose wait was known at the cut (its folds' models, fitted on
  the months before each fold, see the waits as known at the fold's start): a censored job's
  error is unknown for any prediction past ``c``, and counting it "as far as the cut shows"
  rewarded candidates that predict long waits (on a busy log the guard picked the requested-time
  plan, worse than zero wait out of sample); leaving them out drops the longest waits, which
  favours the smaller predictions, zero wait first, the guard's safe side;
* the bound's split-conformal offset counts a censored job as a miss (its score as infinite):
  conservative, and exact for every bound that ran out before the cut.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def as_known(wl: Any, cut: int) -> tuple[Any, np.ndarray]:
    """(the workload ``wl`` as it stood at ``cut``, wait-censored mask over its jobs); see the
    module docstring. A new :class:`~mirage_tasks.sim.workload.Workload`; ``wl`` is not changed."""
    from ..sim.workload import Workload

    n = int(np.searchsorted(wl.submit, cut, "left"))  # sorted by submission
    nr = wl.never_ran
    m = int(np.searchsorted(nr.submit, cut, "left"))
    gone = np.flatnonzero(nr.leave[:m] <= cut)
    late = np.flatnonzero(nr.leave[:m] > cut)  # pending at the cut: its leaving was not known
    # the main jobs and the late ones, by submission (a late one after the jobs of its second)
    order = np.lexsort((np.r_[np.arange(n), n + late], np.r_[wl.submit[:n], nr.submit[late]]))

    def cat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([np.asarray(a[:n]), np.asarray(b[late])])[order]

    sub = cat(wl.submit, nr.submit).astype(np.int64)
    st = cat(wl.real_start, np.full(len(nr), cut, dtype=np.int64)).astype(np.int64)
    lim = cat(wl.limit, nr.limit).astype(np.int64)
    dur = cat(wl.duration, nr.limit).astype(np.int64)
    waiting = st >= cut
    running = ~waiting & (st + dur > cut)
    st2 = np.where(waiting, np.int64(cut), st)
    dur2 = np.where(waiting | running, np.maximum(lim, np.maximum(cut - st2, 1)), dur).astype(np.int64)
    prio = np.where(waiting, np.nan, cat(wl.priority, nr.priority).astype(np.float64))
    out = Workload(
        job_id=cat(wl.job_id, nr.job_id),
        submit=sub,
        real_start=st2,
        real_end=st2 + dur2,
        duration=dur2,
        limit=lim,
        nodes=cat(wl.nodes, nr.nodes),
        user=cat(wl.user, nr.user),
        priority=prio,
        dropped=dict(wl.dropped),
        node_equiv=cat(wl.node_equiv, nr.node_equiv).astype(np.float64),
        never_ran=nr.take(gone),
        limit_fill=dict(wl.limit_fill),
    )
    h = hashlib.sha256(b"as-known-at-cut")
    for x in (
        out.submit,
        out.real_start,
        out.duration,
        out.limit,
        out.nodes,
        out.user,
        np.nan_to_num(out.priority, nan=-1),
    ):
        h.update(np.ascontiguousarray(x).tobytes())
    out.fingerprint = h.hexdigest()
    return out, waiting
