"""Slurm's classic fair share in the simulator (``priority="multifactor"`` with ``weight_fairshare`` > 0).

The association tree is the one ``make slurm`` would create for a trace: the root, one account
holding every trace user, one share per user, plus one association for the service whose chain
Mirage keeps (the probe jobs). For a user ``u`` (Slurm's classic algorithm, ``PriorityFlags=
NO_FAIR_TREE``; https://slurm.schedmd.com/classic_fair_share.html)::

    S_u  = 1 / (users + 1)                          normalised shares (the service is a sibling)
    UN_u = usage_u / sum of every user's usage      normalised usage
    UE_u = UN_u + (UE_account - UN_u) * S_u         effective usage; UE_account = 1 (it holds all usage)
    F_u  = 2 ** (-UE_u / S_u)                       the fair-share factor, in (0, 1]

and with no usage at all every factor is 1. A user without usage of its own, and the service
(whose usage is not modelled: its jobs are the counterfactual being scored), gets ``2 ** -1``.

Usage is node-seconds (Slurm's TRES-seconds on whole nodes, up to a constant that cancels in
``UN``), decayed with ``PriorityDecayHalfLife`` (``fs_halflife_s``): use at time ``s`` counts
``2 ** (-(t - s) / half-life)`` at time ``t``. Slurm re-reads usage and factors every
``PriorityCalcPeriod`` (``fs_calc_period_s``); so does the simulator: the factors change only at
multiples of that period (the engine re-sorts the queue then), and between two re-reads a job's
priority moves only by its age. The decayed use of each period is integrated exactly (Slurm adds a
period's use and then decays per period; the two agree to within one period's decay, 5 minutes in
7 days by default).

With ``warm_start`` an episode starts with the usage the trace's jobs accumulated before its first
instant (their real runs up to that instant, which is known then); without, from zero.

``running_lag`` (Slurm 22.05's own timing, as the comparison against a real slurmctld uses it):
the factors of a re-read count each ended job's use through its end but a running job's only
through the re-read before. slurmctld charges a running job's use to its user's association at
each re-read, and that reaches the account (whose effective usage gives the factor when the
account has one user) at the next; a job's end is charged at once. On the busy ls6 replay the
factors this gives match every fair-share term slurmctld logged (``DebugFlags=Priority``) to within
3.5 of 3000 points at each of seven re-reads; charging running jobs through the current re-read
(the default here) was off by 3-473 points.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LN2 = math.log(2.0)


class FairShare:
    """Per-user decayed usage and fair-share factors of one simulator."""

    def __init__(self, users: int, halflife_s: float, period_s: int, weight: float, t0: int):
        self.users = int(users)  # trace users with an association (the service is one more)
        self.hl = float(halflife_s)
        self.period = int(period_s)
        self.weight = float(weight)
        self.t = int(t0)  # usage is as of this instant (the last re-read)
        self.next = (int(t0) // self.period + 1) * self.period
        self.usage: dict[int, float] = {}  # user -> decayed node-seconds at self.t
        self.added: dict[int, float] = {}  # use of jobs that ended since self.t, valued at self.t
        self.acc: dict[int, list] = {}  # running job -> [user, nodes, accounted until]
        self.factor: dict[int, float] = {}  # user -> fair-share factor
        self.default = 1.0  # the factor of a user with no usage (and of the service)
        self.fixed: list[float] = []  # per local job: its priority without the fair-share term
        self.running_lag = False  # factors count running jobs through the previous re-read

    @classmethod
    def for_workload(cls, wl: Any, cfg: Any, t0: int) -> FairShare:
        """The ledger of an episode starting at ``t0`` (usage from the trace's past with a warm start)."""
        users = int(wl.user.max()) + 1 if len(wl.user) and wl.user.max() >= 0 else 0
        fs = cls(users, cfg.fs_halflife_s, cfg.fs_calc_period_s, cfg.weight_fairshare, t0)
        if cfg.warm_start:
            fs.usage = past_usage(wl, t0, fs.hl)
        fs.refresh()
        return fs

    def copy(self) -> FairShare:
        c = FairShare.__new__(FairShare)
        c.__dict__.update(self.__dict__)
        c.usage = dict(self.usage)
        c.added = dict(self.added)
        c.acc = {j: list(v) for j, v in self.acc.items()}
        c.factor = dict(self.factor)
        c.fixed = list(self.fixed)
        return c

    # ------------------------------------------------------------------ accounting
    def _use(self, nodes: int, seconds: float) -> float:
        """Decayed node-seconds, valued at the end, of ``nodes`` busy for ``seconds``."""
        return nodes * self.hl / LN2 * (1.0 - 2.0 ** (-seconds / self.hl))

    def start(self, j: int, user: int, nodes: int, t: int) -> None:
        if user >= 0:
            self.acc[j] = [user, nodes, max(int(t), self.t)]

    def finish(self, j: int, t: int) -> None:
        rec = self.acc.pop(j, None)
        if rec is None:
            return
        u, n, since = rec
        value = self._use(n, t - since) * 2.0 ** ((t - self.t) / self.hl)
        self.added[u] = self.added.get(u, 0.0) + value

    def recalc(self, now: int) -> None:
        """Slurm's periodic re-read at ``now``: decay, add the period's use, new factors."""
        d = 2.0 ** (-(now - self.t) / self.hl)
        usage = self.usage
        for u in set(usage) | set(self.added):
            usage[u] = (usage.get(u, 0.0) + self.added.get(u, 0.0)) * d
        self.added = {}
        self.t = int(now)
        self.next = self.t + self.period
        if self.running_lag:  # the factors before this period's use of the running jobs (Slurm's timing)
            self.refresh()
        for rec in self.acc.values():
            u, n, since = rec
            usage[u] = usage.get(u, 0.0) + self._use(n, now - since)
            rec[2] = now
        if not self.running_lag:
            self.refresh()

    def refresh(self) -> None:
        """The factors from the usage as of ``self.t``."""
        total = math.fsum(self.usage.values())
        if total <= 0.0:
            self.factor = {}
            self.default = 1.0
            return
        s = 1.0 / (max(self.users, len(self.usage)) + 1)
        self.factor = {u: 2.0 ** (-((v / total) + (1.0 - v / total) * s) / s) for u, v in self.usage.items()}
        self.default = 0.5

    def term(self, user: int) -> float:
        """``weight_fairshare * F`` of ``user`` now (the service and unknown users: a user without usage)."""
        return self.weight * self.factor.get(user, self.default) if user >= 0 else self.weight * self.default


def past_usage(wl: Any, t0: int, halflife_s: float) -> dict[int, float]:
    """Each trace user's decayed node-seconds at ``t0`` from the real runs before ``t0``."""
    start = np.asarray(wl.real_start, dtype=np.float64)
    end = np.asarray(wl.real_end, dtype=np.float64)
    user = np.asarray(wl.user)
    ok = (user >= 0) & (start < t0) & (end > start) & np.isfinite(start) & np.isfinite(end)
    if not ok.any():
        return {}
    s, e = start[ok], np.minimum(end[ok], t0)
    hl = float(halflife_s)
    use = wl.nodes[ok].astype(np.float64) * hl / LN2 * (2.0 ** (-(t0 - e) / hl) - 2.0 ** (-(t0 - s) / hl))
    sums = np.bincount(user[ok], weights=use)
    return {int(u): float(v) for u, v in enumerate(sums) if v > 0.0}


class RunningUsage:
    """Each user's decayed usage at any instant from starts and ends fed in time order, in O(1)
    per event and per user queried (the at-submission planner's ledger, which walks a log): with
    ``x(t) = 2^(t / half-life)`` (times relative to ``t0``), a run of ``n`` nodes over ``[s, e]``
    counts ``n * hl / ln2 * (x(e) - x(s)) / x(t)`` at ``t >= e``, and a running one ``e = t``; the
    sums of ``n * x(s)``, ``n`` and the ended runs' terms are kept per user. Re-based to the
    current instant once ``x`` grows past 2^64 (long logs, short half-lives). Exact, not re-read
    per PriorityCalcPeriod as :class:`FairShare` is (the difference is within one period)."""

    def __init__(self, users: int, halflife_s: float, weight: float, t0: int):
        self.users = int(users)
        self.hl = float(halflife_s)
        self.weight = float(weight)
        self.t0 = float(t0)
        self.done = np.zeros(max(self.users, 1))  # ended runs: n * hl/ln2 * (x(e) - x(s))
        self.run_n = np.zeros_like(self.done)  # running nodes
        self.run_xs = np.zeros_like(self.done)  # running: n * x(s)

    def _x(self, t: float) -> float:
        return 2.0 ** ((float(t) - self.t0) / self.hl)

    def _rebase(self, t: float) -> None:
        f = 1.0 / self._x(t)
        self.done *= f
        self.run_xs *= f
        self.t0 = float(t)

    def start(self, user: int, nodes: float, t: float) -> None:
        if user < 0:
            return
        if self._x(t) > 2.0**64:
            self._rebase(t)
        self.run_n[user] += nodes
        self.run_xs[user] += nodes * self._x(t)

    def end(self, user: int, nodes: float, start: float, t: float) -> None:
        if user < 0:
            return
        xs, xe = nodes * self._x(start), nodes * self._x(t)
        self.run_n[user] -= nodes
        self.run_xs[user] -= xs
        self.done[user] += self.hl / LN2 * (xe - xs)

    def usage(self, t: float) -> np.ndarray:
        """Every user's decayed node-seconds at ``t`` (not before the last event fed)."""
        x = self._x(t)
        u = (self.done + self.hl / LN2 * (self.run_n * x - self.run_xs)) / x
        return np.maximum(u, 0.0)

    def terms(self, t: float, users: np.ndarray) -> tuple[np.ndarray, float]:
        """``weight_fairshare * F`` at ``t`` for each of ``users`` (-1: a user without usage, as the
        service), and that of a user without usage: the classic factor of :class:`FairShare`."""
        users = np.asarray(users, dtype=np.int64)
        use = self.usage(t)
        total = float(use.sum())
        if total <= 0.0:
            return np.full(len(users), self.weight), self.weight
        s = 1.0 / (self.users + 1)
        un = use / total
        f = 2.0 ** (-(un + (1.0 - un) * s) / s)
        out = np.where(users >= 0, f[np.maximum(users, 0)], 0.5)
        return self.weight * out, self.weight * 0.5
