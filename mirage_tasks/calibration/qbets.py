"""A QBETS-style reference bound on a job's queue wait (Nurmi, Brevik, Wolski, 2007).

Beside the wait predictor's bound (:mod:`~mirage_tasks.calibration.waitpred`), this gives the
classic non-parametric one, so a reader can tell what the predictor's bound buys over a bound that
reads nothing but past waits. Per job-size class (the classes the coverage tables use,
:func:`~mirage_tasks.calibration.fidelity.node_class`), it keeps the history of the waits known so
far and answers, at a job's submission, an upper bound on the ``q`` quantile of the wait at
confidence ``c``:

* **Known at submission only.** A wait is known once its job has started. The history a job
  submitted at ``t`` is answered from holds the waits of the jobs that started strictly before
  ``t``, the same instant rule as :mod:`~mirage_tasks.calibration.atsubmit` (a job starting at its
  own submission must not see its own zero wait; at equal instants the answer comes first). Every
  job is answered online in submission order, once; nothing is fitted on a period.
* **The order statistic.** With ``n`` waits in the history, the bound is the ``k``-th smallest,
  ``k`` the least index with ``P(Binomial(n, q) < k) >= c`` (:func:`order_index`): the chance that
  fewer than ``k`` of ``n`` draws lie below the true ``q`` quantile is at least ``c``, so the
  ``k``-th smallest lies above that quantile with confidence ``c``, whatever the distribution.
  Fewer than :func:`min_history` waits (29 at ``q = 0.9``, ``c = 0.95``) admit no such ``k``;
  a class with too short a history is answered from the pooled history of all classes (kept the
  same way), and a job with no bound from either is counted as a miss (reported as ``no_bound``).
* **Change points.** A wait observed above the class's bound current at its start extends a run
  of misses; under the model a miss has probability at most ``1 - q`` and a run of ``r`` at most
  ``(1 - q) ** r``. A run reaching :func:`change_run` (the shortest with probability below
  ``1 - c``: 2 at the defaults) says the waits have moved up: the history is trimmed to the most
  recent :func:`min_history` waits (the run among them), so a bound exists at once and reads
  mostly the new regime. QBETS's run length allows for autocorrelated waits; this one uses the
  model's i.i.d. run probability, the stricter test, which resets more often on bursty logs.

Cost: one sort of the starts, then a max-heap of the ``k`` smallest waits and a min-heap of the
rest per class (the ``k``-th smallest is the max-heap's top; ``k`` grows by at most one per wait),
so O(n log n) for ``n`` jobs; a trim rebuilds the heaps from :func:`min_history` waits.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Q = 0.9
C = 0.95
POOLED = "*"
#: what the bound reads (said in the output)
READS = (
    "per job-size class, the waits of the jobs that had started before the submission (a wait is known once its "
    "job starts); the k-th smallest of the n known waits, k the least index with P(Binomial(n, q) < k) >= c; a "
    "class with too few waits for any k is answered from all classes' waits; a run of misses whose probability "
    "under the model is below 1 - c trims the history to its most recent waits (a change point)"
)


def order_index(n: int, q: float = Q, c: float = C) -> int:
    """The 1-based index ``k`` of the bound among ``n`` sorted waits: the least ``k`` with
    ``P(Binomial(n, q) < k) >= c``; 0 where no ``k <= n`` reaches ``c``."""
    return int(order_indices(n, q, c)[n])


def order_indices(n_max: int, q: float = Q, c: float = C) -> np.ndarray:
    """:func:`order_index` of every ``n`` in ``0 .. n_max`` (int64; 0: no bound)."""
    from scipy.stats import binom

    n = np.arange(n_max + 1)
    # ppf(c) is the least x with P(B <= x) >= c, i.e. k - 1; checked with the CDF itself against
    # the quantile function's rounding at the edge
    k = np.asarray(binom.ppf(c, n, q), dtype=np.float64)
    k = np.where(np.isfinite(k), k, n).astype(np.int64) + 1
    k = np.clip(k, 1, None)
    lo = binom.cdf(k - 2, n, q) >= c  # k - 1 would do too
    hi = binom.cdf(k - 1, n, q) < c  # k does not reach c
    k = k - lo.astype(np.int64) + hi.astype(np.int64)
    return np.where(k <= n, k, 0).astype(np.int64)


def min_history(q: float = Q, c: float = C) -> int:
    """The fewest waits that admit a bound: the least ``n`` with ``q ** n <= 1 - c``."""
    n = max(1, math.ceil(math.log(1 - c) / math.log(q) - 1e-12))
    while order_index(n, q, c) == 0:
        n += 1
    return n


def change_run(q: float = Q, c: float = C) -> int:
    """The shortest run of misses whose probability under the model, ``(1 - q) ** r``, is below ``1 - c``."""
    r = 1
    while (1 - q) ** r >= 1 - c:
        r += 1
    return r


@dataclass
class _History:
    """One class's known waits, in the order they became known, with the ``k``-th smallest at hand."""

    waits: deque = field(default_factory=deque)
    low: list = field(default_factory=list)  # max-heap (negated) of the k smallest
    high: list = field(default_factory=list)  # min-heap of the rest
    run: int = 0
    resets: int = 0

    def bound(self) -> float | None:
        return -self.low[0] if self.low else None

    def _balance(self, k: int) -> None:
        while len(self.low) < k and self.high:
            heapq.heappush(self.low, -heapq.heappop(self.high))
        while len(self.low) > k:
            heapq.heappush(self.high, -heapq.heappop(self.low))

    def add(self, w: float, K: np.ndarray) -> None:
        self.waits.append(w)
        if self.low and w < -self.low[0]:
            heapq.heappush(self.low, -w)
        else:
            heapq.heappush(self.high, w)
        self._balance(int(K[len(self.waits)]))

    def trim(self, keep: int, K: np.ndarray) -> None:
        while len(self.waits) > keep:
            self.waits.popleft()
        self.high = sorted(self.waits)
        self.low = []
        self._balance(int(K[len(self.waits)]))


def bounds(
    submit: np.ndarray,
    start: np.ndarray,
    groups: np.ndarray,
    q: float = Q,
    c: float = C,
    *,
    change_points: bool = True,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The bound (seconds) at every job's submission, and a summary.

    ``submit`` (ascending), ``start`` (``>= submit``) and ``groups`` (the class of each job) are
    per job. Job ``i`` is answered from the waits of the jobs with ``start < submit[i]`` only;
    NaN where neither its class nor the pooled history admits a bound. ``change_points=False``
    keeps every wait (the plain order statistic)."""
    submit = np.asarray(submit, dtype=np.float64)
    start = np.asarray(start, dtype=np.float64)
    n = len(submit)
    if n and np.any(np.diff(submit) < 0):
        raise ValueError("submit must be ascending")
    if np.any(start < submit):
        raise ValueError("a job starts before its submission")
    groups = np.asarray(groups, dtype=object)
    K = order_indices(n, q, c)
    keep = min_history(q, c)
    run_max = change_run(q, c)
    wait = start - submit
    o_st = np.argsort(start, kind="stable")
    hist: dict[Any, _History] = {}
    pooled = _History()
    out = np.full(n, np.nan)
    fallback = 0

    def observe(h: _History, w: float) -> None:
        b = h.bound()
        h.run = h.run + 1 if b is not None and w > b else 0
        h.add(w, K)
        if change_points and h.run >= run_max:
            h.trim(keep, K)
            h.run = 0
            h.resets += 1

    p = 0
    for i in range(n):
        t = submit[i]
        while p < n and start[o_st[p]] < t:
            k = int(o_st[p])
            p += 1
            g = groups[k]
            h = hist.get(g)
            if h is None:
                h = hist[g] = _History()
            observe(h, float(wait[k]))
            observe(pooled, float(wait[k]))
        h = hist.get(groups[i])
        b = h.bound() if h is not None else None
        if b is None:
            b = pooled.bound()
            fallback += b is not None
        if b is not None:
            out[i] = b
    info = {
        "q": q,
        "c": c,
        "min_history": keep,
        "change_run": run_max,
        "change_points": change_points,
        "resets": {str(g): h.resets for g, h in sorted(hist.items(), key=lambda x: str(x[0]))},
        "resets_pooled": pooled.resets,
        "answered_from_pooled": int(fallback),
        "no_bound_log": int(np.isnan(out).sum()),
    }
    return out, info


def bound_metrics(real_s: np.ndarray, bound_s: np.ndarray) -> dict[str, Any]:
    """Coverage (a job with no bound is a miss) and the bound's median beside the real waits'."""
    real_s, bound_s = np.asarray(real_s, np.float64), np.asarray(bound_s, np.float64)
    n = len(real_s)
    if n == 0:
        return {"n": 0}
    fin = np.isfinite(bound_s)
    return {
        "n": int(n),
        "coverage": float((fin & (real_s <= np.where(fin, bound_s, 0.0) + 1e-9)).mean()),
        "bound_median_h": float(np.median(bound_s[fin]) / 3600.0) if fin.any() else float("nan"),
        "real_median_h": float(np.median(real_s) / 3600.0),
        "real_p90_h": float(np.quantile(real_s, 0.9) / 3600.0),
        "no_bound": int((~fin).sum()),
    }
