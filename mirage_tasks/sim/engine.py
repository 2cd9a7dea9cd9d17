"""An event-driven simulator of one Slurm-like partition.

State: interchangeable nodes, a pending queue, running jobs (ending at their replayed run
time), future submissions. The clock jumps from event to event; nothing happens between
events. At one instant ``t`` the order is fixed:

1. jobs whose run ends at ``t`` release their nodes;
2. jobs submitted at ``t`` join the queue;
3. if 1 or 2 changed anything, the *main scheduler* runs: pending jobs in priority
   order start while they fit (and their user, and the trace's jobs together, are under
   the QOS limits: ``max_*_per_user``, ``grp_jobs``, ``grp_nodes``); it stops at the
   first job that does not fit (Slurm's strict priority order within a partition);
4. if ``t`` is a multiple of ``bf_interval_s`` and anything changed since the last
   pass, a *backfill pass* runs (below);
5. if a history is being recorded and ``t`` is a multiple of its step, a snapshot is
   taken (see :mod:`mirage_tasks.features`);
6. jobs submitted with :meth:`Simulator.submit_now` (the probe successor) join after
   all of that, followed by a main-scheduler pass; the next backfill pass is at the next
   multiple of ``bf_interval_s``.

Backfill pass: a free-node profile over time is built from the running jobs' *planned*
ends (start + time limit, rounded up to ``bf_resolution_s``). Pending jobs are examined
in priority order (at most ``bf_max_job_test``; jobs of users at their limit are skipped,
as Slurm skips jobs held by QOS limits). Each gets the earliest start where its nodes fit
for its planned run time; if that is now, it starts. Otherwise it gets a reservation
(the nodes are taken from the profile) when the backfill policy allows one and the start
lies within ``bf_window_s``: ``conservative`` reserves for every examined job, ``easy`` only
for the first job that cannot start (so later jobs may start now only if they do not
delay it). ``named`` is ``conservative`` on named nodes (:mod:`.named`: each job's nodes
chosen as Slurm's select/linear does, reservations holding those nodes). ``none`` disables
backfill. The policies are objects declared in
:mod:`.policies` (``BackfillPolicy.passes`` and ``reservations``, ``PriorityPolicy.static``),
resolved once per simulator.

A pass is skipped when no job ended or arrived since the previous one: the running set,
the queue and the profile are then unchanged and the pass could start nothing new. (The
one exception, a change in priority order when a job's age factor reaches its cap, is
ignored; it is re-evaluated at the next event.) The pass also stops as soon as no node is
free now, since later reservations cannot start anything. Those two rules make a pass
cost nothing most of the time.

Shortcuts with identical results (``Simulator.fast``; ``tests/mirage/test_sim_fastpath.py``
compares both paths on ls6 windows): reservations only take nodes away and a pass only
blocks more users, so only *candidates* (unblocked jobs no larger than the free nodes) can
start. A pass without a candidate is skipped; a pass stops after its last candidate, and as
soon as the profile has fewer free nodes than the smallest candidate somewhere in
``[now, now + the shortest candidate's planned run)``. Started jobs leave the queue by
bisection instead of a rebuild.

Nodes in service (``capacity_window_s`` > 0): the partition's size changes over time to
the schedule :func:`~mirage_tasks.sim.workload.capacity_schedule` reads from the trace's
past (a quantile of its busy nodes over the preceding window, re-read every
``capacity_step_s``). A change is an event: nodes leaving service while busy drain (``free``
goes negative until enough running jobs end); the scheduler plans with the nodes in service
now and does not know future changes. Off, the schedule is empty and nothing changes.

Short partition (``short_partition_limit_s`` > 0): jobs with a time limit up to that many
seconds keep their own strict priority order in step 3 (Slurm orders and blocks per
partition; ls6's development and small queues share the gpu-a100 nodes): a job that does
not fit blocks only lower-priority jobs of its own partition. Backfill passes are unchanged.

Inferred holds (``holds="inferred"``): a trace job whose predecessor
:func:`~mirage_tasks.sim.workload.infer_holds` names (a dependency or array throttle read
from the trace, see there) is not queued at its submission while that predecessor has not
ended in the simulation; it joins the queue when the predecessor's simulated run ends (step
1), and its age counts from then (Slurm's age factor counts from eligibility). The pairing is
input; the timing is simulated. A predecessor outside the episode (ended before it, or too
big for the partition) holds nothing. Off (default) every job is eligible at submission.

Fair share (``priority="multifactor"`` with ``weight_fairshare`` > 0, see :mod:`.fairshare`):
every ``fs_calc_period_s`` (an event, as Slurm's PriorityCalcPeriod) the users' decayed usage is
re-read and each queued job's priority gets its user's new fair-share term; the queue is
re-sorted and, when its order changed, the main scheduler runs and the next backfill pass is
due. A job joining the queue gets the factors of the last re-read. Off, no such event exists.

Jobs that never ran (:class:`~mirage_tasks.sim.workload.NeverRan`: cancelled while pending) join the
queue at their submission like any job and leave it when the log says they left (an event, before
that instant's submissions); they are never started: the schedulers pass over them as over a job
held by a QOS limit. They count in the queue (its length, the plans of a predictor asked while
they wait) and are never scored (their tag is :data:`NEVER_RAN_TAG`).

``tick_s`` > 0 reproduces a fixed-step clock (the reference's one-minute ticks): submit
times are rounded up and run times down to the tick (at least one tick).

Everything is deterministic: ties in priority go to the earlier submit, then the lower
job index. ``fork()`` copies the compact state, so probes can branch from a shared prefix.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from stepkit import StepError

from .config import SimConfig
from .fairshare import FairShare
from .named import NamedNodes
from .policies import PriorityPolicy, backfill_policy, priority_policy
from .workload import Workload, capacity_schedule, workload_holds

INF = float("inf")
AVG_WAIT_JOBS = 100  # the reference's baseline_avg_num: mean start wait of the last 100 started jobs
#: the tag of a job that never ran (it is no workload index, nor a probe job's tag)
NEVER_RAN_TAG = -4


class Simulator:
    """One partition. Build with :meth:`from_workload` (or add jobs by hand in tests)."""

    #: Shortcuts that give identical results (see the module docstring; tests compare both
    #: paths on a real trace). False runs the plain algorithm.
    fast = True

    def __init__(self, cfg: SimConfig, t0: int):
        self.cfg = cfg
        # the policies (.policies), resolved once: the loops read these attributes only
        self.backfill_policy = bp = backfill_policy(cfg.backfill)
        self.priority_policy = pp = priority_policy(cfg.priority)
        # a policy that keeps the base class's static (always 0) costs no call per job
        self._static = None if type(pp).static is PriorityPolicy.static else pp.static
        self.bf_passes = bp.passes  # backfill passes run at all
        self.bf_reservations = bp.reservations(cfg)  # reservations one pass may make
        # any limit on trace jobs (per user, or the QOS's group limits): checked only then
        self.limits = bool(cfg.max_jobs_per_user or cfg.max_nodes_per_user or cfg.grp_jobs or cfg.grp_nodes)
        # fair share (.fairshare): the ledger, and the next re-read of usage (INF: none)
        # (FairShareSimulator keeps them; this class never pays for them)
        self.fs: FairShare | None = None
        self.next_calc = INF
        self.now = int(t0)
        self.t0 = int(t0)
        # per-job tables (index = local job id)
        self.j_submit: list[int] = []
        self.j_elig: list[int] = []  # eligible since (submit, or its inferred predecessor's end): age
        self.j_pred: list[int] = []  # inferred predecessor (local id) or -1 (cfg.holds)
        self.j_dur: list[int] = []
        self.j_limit: list[int] = []
        self.j_plan: list[int] = []
        self.j_nodes: list[int] = []
        self.j_user: list[int] = []
        self.j_static: list[float] = []
        self.j_tag: list[int] = []  # workload index, or negative for probe jobs
        self.j_start: list[int] = []  # -1 while not started
        self.j_bf: list[bool] = []  # started by a backfill pass ahead of a higher-priority job
        self.j_leave: list[int] = []  # when a job that never ran leaves the queue; -1: it runs
        self.leave_heap: list[tuple[int, int]] = []  # (leave time, job) of the queued ones
        # dynamic state
        self.free = int(cfg.nodes)
        self.cap = int(cfg.nodes)  # nodes in service now (cfg.capacity_*: varies with time)
        self.cap_sched: tuple[tuple[int, int], ...] = ()  # (time, nodes in service), sorted
        self.cap_ptr = 0
        self.running: dict[int, int] = {}  # job -> end time
        self.end_heap: list[tuple[int, int]] = []
        self.queue: list[tuple[float, int, int]] = []  # (order key, submit, job), best first
        self.psize: dict[int, int] = {}  # node count -> pending jobs of that size
        self.min_sub = INF  # oldest pending submit (for the age cap)
        self.future: list[tuple[int, int]] = []  # (submit, job), sorted; consumed from fptr
        self.fptr = 0
        self.held: dict[int, list[int]] = {}  # predecessor -> submitted jobs waiting for its end
        self.urun: dict[int, int] = {}
        self.unodes: dict[int, int] = {}
        self.grun = 0  # running trace jobs and their nodes (the QOS's group limits)
        self.gnodes = 0
        self.waits: deque[int] = deque(maxlen=AVG_WAIT_JOBS)
        self.dirty = True
        self.dropped_too_big = 0
        # history recording (features)
        self.snap_fn: Callable[[Simulator], np.ndarray] | None = None
        self.snap_step = 600
        self.next_snap = INF
        self.snaps: deque[tuple[int, np.ndarray]] = deque(maxlen=144)
        # sorted statistics of the queue and running set for features.snapshot, kept by the
        # hooks below while a history is recorded (None otherwise: no cost)
        self.queue_stats = None
        self.n_events = 0
        self.n_bf_passes = 0

    # ------------------------------------------------------------------ building
    @classmethod
    def from_workload(
        cls, wl: Workload, cfg: SimConfig, t0: int, t1: int, static_default: float | None = None
    ) -> Simulator:
        """An episode: jobs submitted in ``[t0, t1]`` plus, with ``cfg.warm_start``, the
        trace's running jobs (kept on their nodes until their replayed end) and pending
        jobs (queued with their real submit time) at ``t0``."""
        sim = cls(cfg, t0)
        if sim.fs is not None:
            sim.fs = FairShare.for_workload(wl, cfg, t0)
        waiting: list[int] = []
        sim.static_default = _static_default(wl, cfg) if static_default is None else static_default
        tick = cfg.tick_s
        if cfg.capacity_window_s > 0:
            # at most 60 days past the window: a drain past that ends on a whole partition
            sim.cap_sched = capacity_schedule(
                wl, cfg.nodes, cfg.capacity_window_s, cfg.capacity_quantile, cfg.capacity_step_s, t0, t1 + 60 * 86400
            )
        if cfg.warm_start:
            running, pending = wl.active_at(t0)
            # recent waits: the last AVG_WAIT_JOBS jobs that started (in the trace) by t0
            started = np.flatnonzero(wl.real_start[: int(np.searchsorted(wl.submit, t0, "left"))] <= t0)
            if len(started):
                rs = wl.real_start[started]
                last = started[np.lexsort((started, rs))][-AVG_WAIT_JOBS:]
                sim.waits.extend(int(w) for w in (wl.real_start[last] - wl.submit[last]))
            for i in running[np.lexsort((running, wl.real_start[running]))]:
                j = sim._add_from(wl, int(i), int(wl.submit[i]), tick=0)
                if j < 0:
                    continue
                if sim.j_nodes[j] <= sim.free:  # (the whole partition: nodes out of service drain below)
                    sim._start(j, False, when=int(wl.real_start[i]), record_wait=False)
                else:  # the configured cluster is smaller than the trace's busy set
                    sim._enqueue(j)
            for i in pending:
                j = sim._add_from(wl, int(i), int(wl.submit[i]), tick=0)
                if j >= 0:
                    waiting.append(j)
        for i in wl.window(t0, t1):
            j = sim._add_from(wl, int(i), int(wl.submit[i]), tick=tick)
            if j >= 0:
                sim.future.append((sim.j_submit[j], j))
        nr = wl.never_ran
        if len(nr):  # queued from their submission until they left (warm start: those queued at t0)
            first = 0 if cfg.warm_start else int(np.searchsorted(nr.submit, t0, "left"))
            last = int(np.searchsorted(nr.submit, t1, "right"))
            sel = np.arange(first, last)
            sel = sel[(nr.leave[sel] > t0) & (nr.leave[sel] > nr.submit[sel]) & (nr.nodes[sel] <= cfg.nodes)]
            for i in sel.tolist():
                sub, leave = int(nr.submit[i]), int(nr.leave[i])
                static = 0.0 if sim._static is None else sim.static_default
                j = sim.add_leaving_job(sub, leave, int(nr.limit[i]), int(nr.nodes[i]), int(nr.user[i]), static)
                if sub < t0:
                    waiting.append(j)
                else:
                    sim.future.append((sim.j_submit[j], j))
        sim.future.sort()
        if cfg.holds == "inferred":
            pred = workload_holds(wl, cfg.holds_tolerance_s)
            local = {t: j for j, t in enumerate(sim.j_tag) if t >= 0}
            for j, t in enumerate(sim.j_tag):
                p = int(pred[t]) if t >= 0 else -1
                if p >= 0 and p in local:
                    sim.j_pred[j] = local[p]
        for j in waiting:  # the warm start's pending jobs (queue order does not depend on arrival order)
            sim._arrive(j)
        sim._apply_capacity()
        if sim.queue:
            sim._strict()
            sim.dirty = True
            if sim.bf_passes and t0 % cfg.bf_interval_s == 0:
                sim._backfill()
        return sim

    def _add_from(self, wl: Workload, i: int, submit: int, tick: int) -> int:
        cfg = self.cfg
        nodes = int(wl.nodes[i])
        if nodes > cfg.nodes:
            self.dropped_too_big += 1
            return -1
        static = 0.0 if self._static is None else self._static(cfg, wl, i, self.static_default)
        return self.add_job(
            submit, int(wl.duration[i]), int(wl.limit[i]), nodes, int(wl.user[i]), static, tag=i, tick=tick
        )

    def add_job(
        self,
        submit: int,
        duration: int,
        limit: int,
        nodes: int,
        user: int = -1,
        static: float = 0.0,
        tag: int = -1,
        tick: int | None = None,
    ) -> int:
        """Register a job (not yet queued); returns its local id. Callers queue it with
        :meth:`schedule_submit` or :meth:`submit_now`; :meth:`from_workload` does it for
        trace jobs."""
        cfg = self.cfg
        tick = cfg.tick_s if tick is None else tick
        duration = max(1, min(int(duration), int(limit)))
        if tick:
            submit = -(-submit // tick) * tick
            duration = max(tick, duration // tick * tick)
        res = cfg.bf_resolution_s
        j = len(self.j_submit)
        self.j_submit.append(int(submit))
        self.j_elig.append(int(submit))
        self.j_pred.append(-1)
        self.j_dur.append(duration)
        self.j_limit.append(int(limit))
        self.j_plan.append(max(duration, -(-int(limit) // res) * res))
        self.j_nodes.append(int(nodes))
        self.j_user.append(int(user))
        self.j_static.append(static + cfg.weight_size * nodes / cfg.nodes)
        self.j_tag.append(tag)
        self.j_start.append(-1)
        self.j_bf.append(False)
        self.j_leave.append(-1)
        return j

    def add_leaving_job(
        self, submit: int, leave: int, limit: int, nodes: int, user: int = -1, static: float = 0.0
    ) -> int:
        """Register a job that never runs: queued from ``submit`` (with :meth:`schedule_submit`, or
        :meth:`from_workload`) until ``leave``, passed over by the schedulers meanwhile."""
        j = self.add_job(submit, limit, limit, nodes, user, static, tag=NEVER_RAN_TAG)
        self.j_leave[j] = max(int(leave), self.j_submit[j] + 1)
        self.limits = True  # the schedulers ask _user_blocked, which passes over it
        return j

    def add_probe_job(self, submit: int, duration: int, nodes: int, tag: int) -> int:
        """A service job (pred/succ): no user limits, the default static priority."""
        if nodes > self.cfg.nodes:
            raise StepError(f"probe job of {nodes} nodes does not fit a {self.cfg.nodes}-node cluster")
        return self.add_job(
            submit, duration, duration, nodes, user=-1, static=getattr(self, "static_default", 0.0), tag=tag, tick=0
        )

    def schedule_submit(self, j: int) -> None:
        """Queue job ``j`` at its submit time, among that instant's trace submissions."""
        t = self.j_submit[j]
        if t < self.now:
            raise ValueError("cannot schedule a submission in the past")
        bisect.insort(self.future, (t, j), lo=self.fptr)

    def submit_now(self, j: int) -> None:
        """Submit job ``j`` at the current instant, after its other events (step 6)."""
        self.j_submit[j] = self.j_elig[j] = self.now
        self._enqueue(j)
        self._strict()
        self.dirty = True

    def _apply_capacity(self) -> bool:
        """Take the capacity changes due by now; True when the nodes in service changed.
        Nodes taken out of service while busy drain: ``free`` goes negative until enough
        running jobs end."""
        sched = self.cap_sched
        p = self.cap_ptr
        cap = self.cap
        while p < len(sched) and sched[p][0] <= self.now:
            cap = sched[p][1]
            p += 1
        self.cap_ptr = p
        if cap == self.cap:
            return False
        self.free += cap - self.cap
        self.cap = cap
        return True

    def hold_nodes(self, k: int, until: int) -> None:
        """Keep ``k`` nodes out of service until ``until`` (trace s), from before the first job:
        nodes that join later (a keeper session's late nodes, drained until its chains start)."""
        if self.running or self.cap_sched or not 0 < k < self.cap:
            raise ValueError(
                f"hold_nodes({k}): only before any job runs, without a capacity schedule, "
                f"and fewer than the {self.cap} nodes"
            )
        self.free -= int(k)
        self.cap -= int(k)
        self.cap_sched = ((int(until), self.cap + int(k)),)
        self.cap_ptr = 0

    # ------------------------------------------------------------------ history
    def record_history(self, fn: Callable[[Simulator], np.ndarray], start: int, step: int, window: int) -> None:
        """Take ``fn(self)`` at every multiple of ``step`` from ``start`` on; keep ``window``."""
        self.snap_fn = fn
        self.snap_step = int(step)
        first = -(-max(int(start), self.now) // step) * step
        self.snaps = deque(maxlen=int(window))
        self.queue_stats = None  # (re)built from the state by the first snapshot
        if first == self.now:  # the current instant is already processed: take it now
            self.snaps.append((first, fn(self)))
            first += step
        self.next_snap = first

    def stop_history(self) -> None:
        self.snap_fn = None
        self.next_snap = INF
        self.queue_stats = None

    # ------------------------------------------------------------------ running
    def run_until(self, t_stop: float, until_started: int = -1) -> None:
        """Process every event at times <= ``t_stop`` (or until job ``until_started``
        has started); the clock then reads ``t_stop`` (or that start time)."""
        cfg = self.cfg
        interval = cfg.bf_interval_s
        do_bf = self.bf_passes
        future = self.future
        heap = self.end_heap
        start = self.j_start
        sched = self.cap_sched
        n_sched = len(sched)
        calc = self.next_calc  # the next fair-share re-read (INF without fair share)
        while True:
            if until_started >= 0 and start[until_started] >= 0:
                return
            t = future[self.fptr][0] if self.fptr < len(future) else INF
            if heap and heap[0][0] < t:
                t = heap[0][0]
            if self.leave_heap and self.leave_heap[0][0] < t:
                t = self.leave_heap[0][0]
            if self.cap_ptr < n_sched and sched[self.cap_ptr][0] < t:
                t = sched[self.cap_ptr][0]
            if self.dirty and do_bf and self.queue:
                g = (self.now // interval + 1) * interval
                if g < t:
                    t = g
            if self.next_snap < t:
                t = self.next_snap
            if calc < t:
                t = calc
            if t > t_stop:
                break
            if t == INF:
                if until_started >= 0:
                    raise RuntimeError(f"job {until_started} can never start (no events left)")
                break
            self.now = now = int(t)
            self.n_events += 1
            changed = False
            while heap and heap[0][0] <= now:
                _, j = heapq.heappop(heap)
                self._finish(j)
                changed = True
            while self.leave_heap and self.leave_heap[0][0] <= now:
                self._leave(heapq.heappop(self.leave_heap)[1])
                changed = True
            n_future = len(future)
            while self.fptr < n_future and future[self.fptr][0] <= now:
                self._arrive(future[self.fptr][1])
                self.fptr += 1
                changed = True
            if self.cap_ptr < n_sched and sched[self.cap_ptr][0] <= now and self._apply_capacity():
                changed = True
            if now == calc:
                if self._recalc():
                    changed = True
                calc = self.next_calc
            if changed:
                self.dirty = True
                if self.queue:
                    self._strict()
            if self.dirty and do_bf and now % interval == 0:
                if self.queue:
                    self._backfill()
                self.dirty = False
            if now == self.next_snap:
                self.snaps.append((now, self.snap_fn(self)))
                self.next_snap = now + self.snap_step
        if t_stop != INF and t_stop > self.now:
            self.now = int(t_stop)

    def run_until_started(self, j: int) -> int:
        self.run_until(INF, until_started=j)
        return self.j_start[j]

    def drain(self) -> None:
        """Run until every known job has started (the queue is empty and nothing is due), and every
        job that never runs has left."""
        leave = self.j_leave
        while self.queue or self.fptr < len(self.future) or self.held:
            target = next((k[2] for k in reversed(self.queue) if leave[k[2]] < 0), -1)
            if target < 0:
                target = next((f[1] for f in reversed(self.future[self.fptr :]) if leave[f[1]] < 0), -1)
            if target < 0 and self.held:  # only jobs held by running predecessors are left
                target = next(iter(self.held.values()))[0]
            if target < 0:  # only jobs that never run: until the last has left
                last = max([leave[k[2]] for k in self.queue] + [leave[f[1]] for f in self.future[self.fptr :]])
                self.run_until(last)
                continue
            self.run_until(INF, until_started=target)

    # ------------------------------------------------------------------ scheduling
    @property
    def pending(self) -> list[int]:
        """Pending job ids (in submit-adjusted priority order)."""
        return [k[2] for k in self.queue]

    def _arrive(self, j: int) -> None:
        """Job ``j`` is submitted now: queued, or held while its inferred predecessor has not
        ended in the simulation (not started, or running)."""
        if self.j_leave[j] >= 0:  # never runs: queued until it leaves
            heapq.heappush(self.leave_heap, (self.j_leave[j], j))
            self._enqueue(j)
            return
        p = self.j_pred[j]
        if p >= 0 and (self.j_start[p] < 0 or p in self.running):
            self.held.setdefault(p, []).append(j)
        else:
            self._enqueue(j)

    def _enqueue(self, j: int) -> None:
        """Add job ``j`` to the queue. The order key ``-(static - rate * submit)`` ranks jobs
        exactly as their priority at any time while no pending job has reached the age cap
        (every age term grows at the same rate); :meth:`_order` re-sorts when one has."""
        cfg = self.cfg
        sub = self.j_elig[j]
        key = -(self.j_static[j] - cfg.weight_age / cfg.max_age_s * sub)
        bisect.insort(self.queue, (key, sub, j))
        if self.queue_stats is not None:
            self.queue_stats.enqueued(j)
        n = self.j_nodes[j]
        self.psize[n] = self.psize.get(n, 0) + 1
        if sub < self.min_sub:
            self.min_sub = sub

    def _leave(self, j: int) -> None:
        """Job ``j``, which never runs, leaves the queue now."""
        q = self.queue
        sub = self.j_elig[j]
        rate = self.cfg.weight_age / self.cfg.max_age_s
        i = bisect.bisect_left(q, (-(self.j_static[j] - rate * sub), sub, j))
        if i >= len(q) or q[i][2] != j:
            i = next(k for k, e in enumerate(q) if e[2] == j)
        del q[i]
        if self.queue_stats is not None:
            self.queue_stats.dequeued(j)
        n = self.j_nodes[j]
        c = self.psize[n] - 1
        if c:
            self.psize[n] = c
        else:
            del self.psize[n]
        if sub <= self.min_sub:
            self.min_sub = min((k[1] for k in q), default=INF)

    def _drop_started(self, started: list[int] | None = None) -> None:
        """Remove started jobs from the queue: by bisection when the caller names them
        (queue keys are unique), else by a full rebuild."""
        st = self.j_start
        nodes = self.j_nodes
        qs = self.queue_stats
        if started is None or not self.fast:
            if qs is not None:
                for k in self.queue:
                    if st[k[2]] >= 0:
                        qs.dequeued(k[2])
            self.queue = q = [k for k in self.queue if st[k[2]] < 0]
            ps: dict[int, int] = {}
            for k in q:
                n = nodes[k[2]]
                ps[n] = ps.get(n, 0) + 1
            self.psize = ps
            self.min_sub = min((k[1] for k in q), default=INF)
            return
        q = self.queue
        ps = self.psize
        sub = self.j_elig
        static = self.j_static
        rate = self.cfg.weight_age / self.cfg.max_age_s
        oldest = False
        for j in started:
            s = sub[j]
            i = bisect.bisect_left(q, (-(static[j] - rate * s), s, j))
            if q[i][2] != j:  # keys are recomputed as _enqueue made them; never expected
                raise RuntimeError(f"queue key of job {j} not found")
            del q[i]
            if qs is not None:
                qs.dequeued(j)
            n = nodes[j]
            c = ps[n] - 1
            if c:
                ps[n] = c
            else:
                del ps[n]
            if s <= self.min_sub:
                oldest = True
        if oldest:
            self.min_sub = min((k[1] for k in q), default=INF)

    def _order(self) -> Iterable[int]:
        cfg = self.cfg
        now = self.now
        if not cfg.age_cap or now - self.min_sub <= cfg.max_age_s:
            return (k[2] for k in self.queue)
        sub = self.j_elig
        st = self.j_static
        rate = cfg.weight_age / cfg.max_age_s
        cap = cfg.max_age_s
        keys = [(-(st[j] + rate * min(now - sub[j], cap)), sub[j], j) for _, _, j in self.queue]
        keys.sort()
        return [k[2] for k in keys]

    def _recalc(self) -> bool:
        """Slurm's PriorityCalcPeriod: usage and fair-share factors re-read now; the queued
        jobs' priorities (and the queue's keys) follow. True when the queue order changed."""
        fs = self.fs
        fs.recalc(self.now)
        self.next_calc = fs.next
        if not self.queue:
            return False
        fixed = fs.fixed
        st = self.j_static
        users = self.j_user
        rate = self.cfg.weight_age / self.cfg.max_age_s
        old = self.queue
        new = []
        for _, sub, j in old:
            st[j] = p = fixed[j] + fs.term(users[j])
            new.append((-(p - rate * sub), sub, j))
        new.sort()
        self.queue = new
        return any(a[2] != b[2] for a, b in zip(old, new))

    def __new__(cls, cfg: SimConfig | None = None, t0: int | None = None):
        """A :class:`FairShareSimulator` when the configuration's priority keeps fair share, with
        :class:`~.named.NamedNodes` mixed in when its backfill policy names nodes (no arguments,
        as copy and pickle call it: the class asked for)."""
        if cls is Simulator and cfg is not None:
            fair = priority_policy(cfg.priority).fair_share(cfg)
            named = backfill_policy(cfg.backfill).named_nodes
            cls = _CLASSES[fair, named]
        return object.__new__(cls)

    def _user_blocked(self, j: int) -> bool:
        if self.j_leave[j] >= 0:  # never runs
            return True
        u = self.j_user[j]
        if u < 0:
            return False
        cfg = self.cfg
        if cfg.grp_jobs and self.grun >= cfg.grp_jobs:
            return True
        if cfg.grp_nodes and self.gnodes and self.gnodes + self.j_nodes[j] > cfg.grp_nodes:
            return True
        if cfg.max_jobs_per_user and self.urun.get(u, 0) >= cfg.max_jobs_per_user:
            return True
        if cfg.max_nodes_per_user:
            used = self.unodes.get(u, 0)  # a job larger than the limit may run alone
            if used and used + self.j_nodes[j] > cfg.max_nodes_per_user:
                return True
        return False

    def _start(self, j: int, backfilled: bool, when: int | None = None, record_wait: bool = True) -> None:
        t = self.now if when is None else when
        self.j_start[j] = t
        self.j_bf[j] = backfilled
        n = self.j_nodes[j]
        self.free -= n
        end = t + self.j_dur[j]
        self.running[j] = end
        heapq.heappush(self.end_heap, (end, j))
        u = self.j_user[j]
        if u >= 0:
            self.urun[u] = self.urun.get(u, 0) + 1
            self.unodes[u] = self.unodes.get(u, 0) + n
            self.grun += 1
            self.gnodes += n
        if record_wait:
            self.waits.append(t - self.j_submit[j])
        if self.queue_stats is not None:
            self.queue_stats.started(j)

    def _finish(self, j: int) -> None:
        del self.running[j]
        if self.queue_stats is not None:
            self.queue_stats.finished(j)
        n = self.j_nodes[j]
        self.free += n
        u = self.j_user[j]
        if u >= 0:
            self.urun[u] -= 1
            self.unodes[u] -= n
            self.grun -= 1
            self.gnodes -= n
        if self.held:
            deps = self.held.pop(j, None)
            if deps:  # its dependents become eligible now (run_until then runs the scheduler)
                for d in deps:
                    self.j_elig[d] = self.now
                    self._enqueue(d)

    def _strict(self) -> None:
        if self.free <= 0 or not self.queue:
            return
        limits = self.limits
        nodes = self.j_nodes
        started: list[int] = []
        short = self.cfg.short_partition_limit_s
        if short:
            self._strict_two(short, limits, started)
            if started:
                self._drop_started(started)
            return
        for j in self._order():
            if limits and self._user_blocked(j):
                continue
            if nodes[j] > self.free:
                break
            self._start(j, False)
            started.append(j)
            if self.free <= 0:
                break
        if started:
            self._drop_started(started)

    def _strict_two(self, short: int, limits: int, started: list[int]) -> None:
        """Strict priority order within each of two partitions sharing the nodes: jobs with
        a limit of at most ``short`` seconds (a short/development partition) and the rest.
        A job that does not fit blocks only the lower-priority jobs of its own partition."""
        nodes = self.j_nodes
        lim = self.j_limit
        blocked = [False, False]
        for j in self._order():
            c = 1 if lim[j] <= short else 0
            if blocked[c] or (limits and self._user_blocked(j)):
                continue
            if nodes[j] > self.free:
                blocked[c] = True
                if blocked[1 - c]:
                    break
                continue
            self._start(j, False)
            started.append(j)
            if self.free <= 0:
                break

    def _backfill(self) -> None:
        self.n_bf_passes += 1
        if self.free <= 0 or not self.queue:
            return
        cfg = self.cfg
        now = self.now
        nodes = self.j_nodes
        plan = self.j_plan
        limits = self.limits
        # quick exit: nothing small enough to start now
        free = self.free
        if min(self.psize) > free:
            return
        order = list(self._order())[: cfg.bf_max_job_test]
        fast = self.fast
        if fast:
            cands, blk = self._candidates(order, limits)
            if not cands:
                return
            T, F = self._profile()
            del order[cands[-1] + 1 :]  # no job after the last candidate can start in this pass
            # every candidate needs >= cn nodes on [now, now + its plan) ⊇ [now, clim): once the
            # profile has fewer somewhere there, none can start any more and the pass may stop
            cn = min(nodes[order[c]] for c in cands)
            clim = now + min(plan[order[c]] for c in cands)
        else:
            T, F = self._profile()
        window_end = now + cfg.bf_window_s
        reserve_left = self.bf_reservations
        blocked_before = False
        started = False
        started_ids: list[int] = []
        ub = self._user_blocked
        if not fast:
            blk = [limits and ub(j) for j in order] if limits else None
        need, needd = self._stop_bounds(order, blk)
        for k, j in enumerate(order):
            if need[k] > F[0]:
                break
            if limits and (blk[k] or (started and ub(j))):  # only starts block users further
                continue
            n = nodes[j]
            if n > F[0] and reserve_left <= 0:
                blocked_before = True
                continue
            d = plan[j]
            # earliest fit
            i = 0
            nT = len(T)
            s_idx = -1
            while i < nT:
                if F[i] < n:
                    i += 1
                    continue
                e = T[i] + d
                m = i + 1
                while m < nT and T[m] < e:
                    if F[m] < n:
                        break
                    m += 1
                else:
                    s_idx = i
                    break
                i = m + 1
            if s_idx < 0:  # cannot happen while n <= cluster size (profile ends with all nodes free)
                blocked_before = True
                continue
            s = T[s_idx]
            if s != now and need[k + 1] >= n and needd[k + 1] >= d:
                break  # every later job is at least as big and as long: none can start now
            if s == now:
                self._start(j, blocked_before)
                started = True
                started_ids.append(j)
            elif reserve_left > 0 and s < window_end:
                reserve_left -= 1
                blocked_before = True
            else:
                blocked_before = True
                continue
            # take n nodes from the profile on [s, s + d)
            e = s + d
            m = bisect.bisect_left(T, e, lo=s_idx)
            if m == len(T) or T[m] != e:
                T.insert(m, e)
                F.insert(m, F[m - 1])
            for q in range(s_idx, m):
                F[q] -= n
            if F[0] <= 0:
                break
            if fast and s < clim and min(F[: bisect.bisect_left(T, clim)]) < cn:
                break
        if started:
            self._drop_started(started_ids)

    def _stop_bounds(self, order: list[int], blk: list[bool] | None) -> tuple[list[int], list[int]]:
        """The pass's two stopping rules, per position ``k`` of ``order`` (``blk``: the jobs whose
        user is at a limit, skipped; None without limits). ``need[k]``: the fewest nodes any job
        from ``k`` on could start with (users only get more blocked during a pass): once that
        exceeds the nodes free now, later reservations cannot change anything. ``needd[k]``: the
        shortest planned run among them: a job (n, d) that cannot start now proves that no later
        job with >= n nodes and >= d run time can (a pass only takes nodes away), so when that
        covers every later job the pass may stop."""
        nodes = self.j_nodes
        plan = self.j_plan
        big = 1 << 60
        nq = len(order)
        need = [big] * (nq + 1)
        needd = [big] * (nq + 1)
        for k in range(nq - 1, -1, -1):
            if blk is not None and blk[k]:
                need[k], needd[k] = need[k + 1], needd[k + 1]
            else:
                j = order[k]
                n = nodes[j]
                d = plan[j]
                need[k] = n if n < need[k + 1] else need[k + 1]
                needd[k] = d if d < needd[k + 1] else needd[k + 1]
        return need, needd

    def _profile(self) -> tuple[list[int], list[int]]:
        """Free nodes over time from the running jobs' planned ends: ``T[i]`` breakpoints
        (``T[0]`` = now), ``F[i]`` free nodes on ``[T[i], T[i+1])``."""
        now = self.now
        nodes = self.j_nodes
        plan = self.j_plan
        ends: dict[int, int] = {}
        st = self.j_start
        for j in self.running:
            e = st[j] + plan[j]
            if e <= now:
                e = now + 1  # overran its plan (cannot happen: run time <= limit <= plan)
            ends[e] = ends.get(e, 0) + nodes[j]
        T = [now]
        F = [self.free]
        acc = self.free
        for e in sorted(ends):
            acc += ends[e]
            T.append(e)
            F.append(acc)
        return T, F

    def _candidates(self, order: list[int], limits: int) -> tuple[list[int], list[bool] | None]:
        """(positions, blocked): the positions in ``order`` of the jobs that could start now
        on the unreserved profile, and whether each job's user is at its limit (None without
        limits). The unreserved profile never has fewer free nodes than now (running jobs
        only end), so a job can start now on it iff it fits the free nodes and its user is
        under the limits. A pass only removes nodes from the profile and only blocks more
        users, so no other job can start in this pass: the pass may stop after the last
        candidate, or be skipped when there is none."""
        free = self.free
        nodes = self.j_nodes
        blk: list[bool] | None = None
        if limits:  # _user_blocked, inlined
            users = self.j_user
            mj = self.cfg.max_jobs_per_user
            mn = self.cfg.max_nodes_per_user
            urun = self.urun
            unodes = self.unodes
            cfg = self.cfg
            gj, gn = cfg.grp_jobs, cfg.grp_nodes
            g_all = bool(gj and self.grun >= gj)  # the group's running jobs: every trace job waits
            gused = self.gnodes
            leave = self.j_leave
            blk = []
            for j in order:
                u = users[j]
                b = leave[j] >= 0  # never runs
                if u >= 0 and not b:
                    if g_all or (gn and gused and gused + nodes[j] > gn):
                        b = True
                    elif mj and urun.get(u, 0) >= mj:
                        b = True
                    elif mn:
                        used = unodes.get(u, 0)
                        b = bool(used and used + nodes[j] > mn)
                blk.append(b)
            return [k for k, j in enumerate(order) if nodes[j] <= free and not blk[k]], blk
        return [k for k, j in enumerate(order) if nodes[j] <= free], None

    # ------------------------------------------------------------------ forking & queries
    def fork(self) -> Simulator:
        """An independent copy of the whole state (cheap: flat lists and small dicts)."""
        c = object.__new__(type(self))
        d = self.__dict__
        nd = c.__dict__
        for k, v in d.items():
            if isinstance(v, list):
                nd[k] = v.copy()
            elif isinstance(v, dict):
                nd[k] = v.copy()
            elif isinstance(v, deque):
                nd[k] = deque(v, maxlen=v.maxlen)
            else:
                nd[k] = v
        c.held = {p: v.copy() for p, v in self.held.items()}
        if self.fs is not None:
            c.fs = self.fs.copy()
        if self.queue_stats is not None:
            c.queue_stats = self.queue_stats.copy(c)
        return c

    def avg_wait_s(self) -> float:
        """Mean start wait (s) of the last 100 jobs that started; 0 when none."""
        return float(sum(self.waits) / len(self.waits)) if self.waits else 0.0

    def queue_len(self) -> int:
        return len(self.queue)


def _static_default(wl: Workload, cfg: SimConfig) -> float:
    """Static priority of jobs without a recorded priority (and of probe jobs): the
    priority policy's (the median static part over the trace in ``trace`` mode, else 0)."""
    return priority_policy(cfg.priority).default_static(wl, cfg)


class FairShareSimulator(Simulator):
    """The simulator with Slurm's fair share (:mod:`.fairshare`): the ledger follows every
    start and end, a job joining the queue gets its user's fair-share term, and every
    ``fs_calc_period_s`` :meth:`Simulator._recalc` re-reads usage and re-sorts the queue.
    :class:`Simulator` builds one itself when the configuration asks for fair share."""

    def __init__(self, cfg: SimConfig, t0: int):
        super().__init__(cfg, t0)
        # no past usage here; from_workload replaces it with the trace's past (warm start)
        self.fs = FairShare(0, cfg.fs_halflife_s, cfg.fs_calc_period_s, cfg.weight_fairshare, t0)
        self.next_calc = self.fs.next

    def add_job(
        self,
        submit: int,
        duration: int,
        limit: int,
        nodes: int,
        user: int = -1,
        static: float = 0.0,
        tag: int = -1,
        tick: int | None = None,
    ) -> int:
        j = super().add_job(submit, duration, limit, nodes, user, static, tag, tick)
        fs = self.fs
        fs.fixed.append(self.j_static[j])  # the fair-share term is added when it joins the queue
        if user >= 0:  # dense user ids: every id below the largest has an association
            fs.users = max(fs.users, int(user) + 1)
        return j

    def _enqueue(self, j: int) -> None:
        fs = self.fs
        self.j_static[j] = fs.fixed[j] + fs.term(self.j_user[j])
        super()._enqueue(j)

    def _start(self, j: int, backfilled: bool, when: int | None = None, record_wait: bool = True) -> None:
        super()._start(j, backfilled, when, record_wait)
        self.fs.start(j, self.j_user[j], self.j_nodes[j], self.j_start[j])

    def _finish(self, j: int) -> None:
        super()._finish(j)
        self.fs.finish(j, self.now)


class NamedSimulator(NamedNodes, Simulator):
    """The simulator on named nodes (:mod:`.named`)."""


class NamedFairShareSimulator(NamedNodes, FairShareSimulator):
    """Fair share on named nodes."""


_CLASSES = {
    (False, False): Simulator,
    (True, False): FairShareSimulator,
    (False, True): NamedSimulator,
    (True, True): NamedFairShareSimulator,
}
