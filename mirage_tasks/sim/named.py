"""Named nodes: which nodes a job gets, and backfill reservations on specific nodes.

The engine's other backfill policies treat nodes as interchangeable: a pass plans with a
free-node *count* over time. Slurm plans with node *bitmaps*. Its backfill finds a job's
earliest start from the nodes free over the job's whole planned run, lets the select plugin
choose which of them the job gets, and reserves exactly those nodes from then on; a later
job that would run past that start may only use nodes outside the reservation, even nodes
that are idle now. On a count, the same later job starts whenever enough nodes are left
over. That difference is what ``docs/results/slurm-replay.md`` traced the remaining
disagreement with slurmctld to (an 80-node top job reserved on ``n[1-80]``, a 16-node one
on named idle nodes).

:func:`best_fit` is Slurm 22.05 ``select/linear``'s choice for whole-node jobs without a
topology (``_job_test``): the free nodes split into runs of consecutive indices; while nodes
are missing, take the first smallest run that holds all still missing, or else the first
largest run, from its lowest index. Nodes are the bits of a Python int (bit ``i``:
``n{i+1}``, Slurm's index order for ``NodeName=n[1-N]``).

:class:`NamedNodes` is mixed into the simulator when the backfill policy asks for named
nodes (``BackfillPolicy.named_nodes``): every start places the job with :func:`best_fit`
(the main scheduler among the idle nodes; a backfill start among the nodes free over its
whole planned run, as Slurm's backfill restricts the select plugin to them), every end frees
its nodes, and the backfill pass runs on free-node bitmaps. Nodes leaving service
(``capacity_window_s``) are not modelled with named nodes and are refused; nodes that join
later (:meth:`~NamedNodes.hold_nodes`, idle until then) are.
"""

from __future__ import annotations

import bisect

from stepkit import StepError


def runs(mask: int) -> list[tuple[int, int]]:
    """The runs of consecutive set bits of ``mask``: ``(lowest index, length)``, lowest first."""
    out = []
    pos = 0
    while mask:
        low = (mask & -mask).bit_length() - 1
        mask >>= low
        pos += low
        length = (mask ^ (mask + 1)).bit_length() - 1  # trailing ones
        out.append((pos, length))
        mask >>= length
        pos += length
    return out


def best_fit(mask: int, n: int) -> int:
    """The ``n`` nodes of ``mask`` that Slurm's select/linear gives a whole-node job (see the
    module docstring); 0 when ``mask`` has fewer than ``n``."""
    if n <= 0 or mask.bit_count() < n:
        return 0
    blocks = runs(mask)
    chosen = 0
    rem = n
    while rem > 0:
        best = -1
        best_len = 0
        best_ok = False
        for b, (_, length) in enumerate(blocks):
            if length == 0:
                continue
            ok = length >= rem
            if best < 0 or (ok and not best_ok) or (ok and length < best_len) or (not ok and length > best_len):
                best, best_len, best_ok = b, length, ok
        start, length = blocks[best]
        take = min(length, rem)
        chosen |= ((1 << take) - 1) << start
        rem -= take
        blocks[best] = (start, 0)
    return chosen


def node_names(mask: int) -> list[str]:
    """Slurm's names of the nodes in ``mask`` (``n1`` is bit 0)."""
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(f"n{i + 1}")
        mask >>= 1
        i += 1
    return out


def hostlist(mask: int) -> str:
    """``mask`` in Slurm's compressed notation (``n6``, ``n[1-3,5]``), as its NodeList writes it."""
    rs = runs(mask)
    if len(rs) == 1 and rs[0][1] == 1:
        return f"n{rs[0][0] + 1}"
    parts = [f"{a + 1}" if n == 1 else f"{a + 1}-{a + n}" for a, n in rs]
    return f"n[{','.join(parts)}]" if parts else ""


def parse_hostlist(text: str) -> int:
    """The bitmap of a Slurm NodeList of this cluster's nodes (``n6``, ``n[1-3,5]``)."""
    import re

    t = text.strip()
    m = re.fullmatch(r"n(\d+)", t) or re.fullmatch(r"n\[([\d,\-]+)\]", t)
    if not m:
        raise ValueError(f"not a NodeList of nodes n1..nN: {text!r}")
    mask = 0
    for part in m.group(1).split(","):
        if not re.fullmatch(r"\d+(-\d+)?", part):
            raise ValueError(f"bad node range {part!r} in NodeList {text!r}")
        a, _, b = part.partition("-")
        lo, hi = int(a), int(b or a)
        if lo < 1 or hi < lo:
            raise ValueError(f"bad node range {part!r} in NodeList {text!r}")
        mask |= ((1 << (hi - lo + 1)) - 1) << (lo - 1)
    return mask


class NamedNodes:
    """Mixin for :class:`~mirage_tasks.sim.engine.Simulator`: nodes with names (see the module
    docstring). ``idle`` is the bitmap of idle nodes, ``j_mask`` each running job's nodes."""

    def __init__(self, cfg, t0):
        super().__init__(cfg, t0)
        self.idle = (1 << int(cfg.nodes)) - 1
        self.j_mask: dict[int, int] = {}
        self._within = 0  # a backfill start's allowed nodes (0: any idle node)
        self.placed: dict[int, int] | None = None  # job -> its nodes, kept past its end when a dict
        self.late = 0  # nodes held out of service until they join (:meth:`hold_nodes`): the highest indices

    def hold_nodes(self, k: int, until: int) -> None:
        """As the engine's; the held nodes are the cluster's last ``k`` (``n{N-k+1}``..``nN``, the
        nodes ``keep-service --late-nodes`` drains), out of the idle bitmap until they join."""
        super().hold_nodes(k, until)
        n = int(self.cfg.nodes)
        self.late = ((1 << int(k)) - 1) << (n - int(k))
        self.idle &= ~self.late

    def _apply_capacity(self) -> bool:
        if self.cap_sched and not self.late:
            raise StepError(
                f"backfill {self.cfg.backfill!r} places jobs on named nodes and does not model "
                "nodes leaving service: set capacity_window_s to 0"
            )
        changed = super()._apply_capacity()
        if changed and self.late:  # held nodes only ever join
            self.idle |= self.late
            self.late = 0
        return changed

    def _start(self, j, backfilled, when=None, record_wait=True):
        pool = self._within or self.idle
        mask = best_fit(pool, self.j_nodes[j])
        if not mask:
            raise RuntimeError(f"job {j} ({self.j_nodes[j]} nodes) started with {pool.bit_count()} nodes free")
        self.idle &= ~mask
        self.j_mask[j] = mask
        if self.placed is not None:
            self.placed[j] = mask
        super()._start(j, backfilled, when, record_wait)

    def _finish(self, j):
        self.idle |= self.j_mask.pop(j)
        super()._finish(j)

    def _mask_profile(self) -> tuple[list[int], list[int]]:
        """Free nodes over time as bitmaps: ``T[i]`` breakpoints (``T[0]`` = now) and ``M[i]``
        the nodes free on ``[T[i], T[i+1])`` from the running jobs' planned ends."""
        now = self.now
        plan = self.j_plan
        st = self.j_start
        ends: dict[int, int] = {}
        for j in self.running:
            e = st[j] + plan[j]
            if e <= now:
                e = now + 1
            ends[e] = ends.get(e, 0) | self.j_mask[j]
        T = [now]
        M = [self.idle]
        acc = self.idle
        for e in sorted(ends):
            acc |= ends[e]
            T.append(e)
            M.append(acc)
        return T, M

    def _backfill(self):
        """One backfill pass on named nodes: the engine's pass (its order, limits, window and
        reservation count) with bitmaps for counts, and each job's nodes chosen by
        :func:`best_fit` among those free over its whole planned run."""
        self.n_bf_passes += 1
        if self.free <= 0 or not self.queue:
            return
        cfg = self.cfg
        now = self.now
        nodes = self.j_nodes
        plan = self.j_plan
        limits = self.limits
        if min(self.psize) > self.free:
            return
        order = list(self._order())[: cfg.bf_max_job_test]
        T, M = self._mask_profile()
        window_end = now + cfg.bf_window_s
        reserve_left = self.bf_reservations
        ub = self._user_blocked
        blk = [ub(j) for j in order] if limits else None
        # both stopping rules hold on bitmaps too (a pass only takes nodes away, and a job that
        # cannot start now proves it for every later job at least as big and as long: its nodes
        # must be free over a window that contains ours)
        need, needd = self._stop_bounds(order, blk)
        blocked_before = False
        started = False
        started_ids: list[int] = []
        for k, j in enumerate(order):
            if need[k] > M[0].bit_count():
                break
            if limits and (blk[k] or (started and ub(j))):
                continue
            n = nodes[j]
            if n > M[0].bit_count() and reserve_left <= 0:
                blocked_before = True
                continue
            d = plan[j]
            nT = len(T)
            s_idx = -1
            avail = 0
            for i in range(nT):
                if M[i].bit_count() < n:
                    continue
                e = T[i] + d
                a = M[i]
                m = i + 1
                while m < nT and T[m] < e and a.bit_count() >= n:
                    a &= M[m]
                    m += 1
                if a.bit_count() >= n:
                    s_idx, avail = i, a
                    break
            if s_idx < 0:
                blocked_before = True
                continue
            s = T[s_idx]
            if s != now and need[k + 1] >= n and needd[k + 1] >= d:
                break
            if s == now:
                self._within = avail
                try:
                    self._start(j, blocked_before)
                finally:
                    self._within = 0
                mask = self.j_mask[j]
                started = True
                started_ids.append(j)
            elif reserve_left > 0 and s < window_end:
                reserve_left -= 1
                blocked_before = True
                mask = best_fit(avail, n)
            else:
                blocked_before = True
                continue
            e = s + d
            m = bisect.bisect_left(T, e, lo=s_idx)
            if m == len(T) or T[m] != e:
                T.insert(m, e)
                M.insert(m, M[m - 1])
            keep = ~mask
            for q in range(s_idx, m):
                M[q] &= keep
            if not M[0]:
                break
        if started:
            self._drop_started(started_ids)
