"""Mirage episodes: a predecessor/successor pair of service jobs on a replayed trace.

Sample ``i`` starts at ``t0``. The simulator holds the trace jobs submitted in
``[t0, t0 + workload_days]`` plus, with a warm start, the trace's running and pending jobs
at ``t0``. The predecessor (``node`` nodes, 48 h limit, runs its whole limit) is
submitted at ``t0 + warmup_days``; the successor (same shape) at a decision time ``t``.
Signed interruption = successor start - predecessor end (positive: gap, negative:
overlap).

Two front ends share :func:`build_episode` and the feature code:

* :class:`DecisionEpisode` - online: advance the clock, look at ``history()``, submit.
* :func:`simulate_sample` - offline: the probe times of one sample, each forked from a
  shared prefix (the successor cannot influence anything before its submission).

Submitting online at ``t`` is exactly the offline probe at ``t`` (tests prove it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from . import decision_rules as dr, features
from .config import SimConfig
from .engine import Simulator
from .probes import BASELINES, END_OFFSETS_MIN, PROBE_SPACINGS
from .workload import Workload

SERVICE_LIMIT_S = 48 * 3600
PRED_TAG = -2
SUCC_TAG = -3
MODES = ("default", *BASELINES)  # sample modes: training probes, or one baseline decision


@dataclass(frozen=True)
class EpisodeSpec:
    warmup_days: float = 2.0
    workload_days: float = 5.0
    window: int = 144
    step_s: int = 600
    service_s: int = SERVICE_LIMIT_S


def build_episode(
    wl: Workload, cfg: SimConfig, t0: int, node: int, spec: EpisodeSpec, record: bool = True
) -> tuple[Simulator, int]:
    """The simulator of one episode at ``t0`` with the predecessor scheduled; returns
    (sim, pred id). History recording starts one window before the predecessor's
    submission, so every decision from then on sees a full window (when the trace
    covers it)."""
    t0 = int(t0)
    t1 = t0 + int(round(spec.workload_days * 86400))
    sim = Simulator.from_workload(wl, cfg, t0, t1)
    pred_submit = t0 + int(round(spec.warmup_days * 86400))
    pred = sim.add_probe_job(pred_submit, spec.service_s, node, PRED_TAG)
    sim.schedule_submit(pred)
    if record:
        sim.record_history(features.snapshot, pred_submit - spec.window * spec.step_s, spec.step_s, spec.window)
    return sim, pred


def _decision_state(sim: Simulator) -> tuple[int, float]:
    return sim.queue_len(), sim.avg_wait_s()


class DecisionEpisode:
    """Online decision episode (RL training, online validation).

    >>> ep = DecisionEpisode(wl, cfg, t0, node=8)       # clock at the predecessor's submit
    >>> while not ep.pred_ended and policy(ep.history()) == "wait":
    ...     ep.advance(600)
    >>> ep.submit_successor()                            # runs until the successor starts
    >>> ep.result()["signed_interruption_h"]
    """

    def __init__(
        self,
        workload: Workload,
        config: SimConfig,
        sample_start_epoch: int,
        node: int,
        warmup_days: float = 2.0,
        workload_days: float = 5.0,
        window: int = 144,
        step_s: int = 600,
    ):
        self.spec = EpisodeSpec(warmup_days, workload_days, window, step_s)
        self.node = int(node)
        self.sample_start = int(sample_start_epoch)
        self.sim, self.pred = build_episode(workload, config, self.sample_start, self.node, self.spec)
        self.pred_submit = self.sim.j_submit[self.pred]
        self.sim.run_until(self.pred_submit)
        self.succ = -1
        self._decision: tuple[int, float] | None = None

    # clock and state --------------------------------------------------------
    @property
    def now(self) -> int:
        return self.sim.now

    @property
    def pred_start(self) -> int | None:
        s = self.sim.j_start[self.pred]
        return s if 0 <= s <= self.sim.now else None

    @property
    def pred_end(self) -> int | None:
        s = self.pred_start
        return None if s is None else s + self.sim.j_dur[self.pred]

    @property
    def pred_ended(self) -> bool:
        e = self.pred_end
        return e is not None and self.sim.now >= e

    @property
    def history_full(self) -> bool:
        return len(self.sim.snaps) >= self.spec.window

    @property
    def submitted(self) -> bool:
        return self.succ >= 0

    def history(self) -> np.ndarray:
        """float32 [window, F]: the features recorded if the successor were submitted now."""
        return features.history(self.sim, self.pred, self.node, self.spec.service_s, self.spec.window)

    def advance(self, seconds: float) -> None:
        """Simulate ``seconds`` forward (before the successor is submitted)."""
        if self.submitted:
            raise RuntimeError("the successor is already submitted")
        self.sim.run_until(self.sim.now + int(seconds))

    def advance_to(self, t: int) -> None:
        if self.submitted:
            raise RuntimeError("the successor is already submitted")
        self.sim.run_until(int(t))

    def submit_successor(self) -> dict:
        """Submit the successor now, simulate until it starts; returns :meth:`result`."""
        if self.submitted:
            raise RuntimeError("the successor is already submitted")
        self._decision = _decision_state(self.sim)
        self.succ = self.sim.add_probe_job(self.sim.now, self.spec.service_s, self.node, SUCC_TAG)
        self.sim.stop_history()
        self.sim.submit_now(self.succ)
        self.sim.run_until_started(self.pred)
        self.sim.run_until_started(self.succ)
        return self.result()

    def fork(self) -> DecisionEpisode:
        """An independent copy (e.g. to try several decision times from one prefix)."""
        c = DecisionEpisode.__new__(DecisionEpisode)
        c.__dict__.update(self.__dict__)
        c.sim = self.sim.fork()
        return c

    def result(self) -> dict:
        if not self.submitted:
            raise RuntimeError("submit the successor first")
        sim = self.sim
        ps = sim.j_start[self.pred]
        pe = ps + sim.j_dur[self.pred]
        ss = sim.j_start[self.succ]
        ql, aw = self._decision
        return {
            "sample_start": self.sample_start,
            "pred_submit": self.pred_submit,
            "pred_start": ps,
            "pred_end": pe,
            "succ_submit": sim.j_submit[self.succ],
            "succ_start": ss,
            "signed_interruption_h": (ss - pe) / 3600.0,
            "backfilled": bool(sim.j_bf[self.succ]),
            "queue_len": ql,
            "avg_wait_s": aw,
        }


def probe_times(
    pred_submit: int, pred_end: int, probes: int, baseline: str, avg_wait_s: float, spacing: str = "uniform"
) -> list[int]:
    """Decision times of one sample (minute-aligned, seconds dropped as the reference).

    default, ``spacing="uniform"``: ``probes`` equally spaced from pred submit + 60 s to pred
    end (inclusive; the last is the reactive baseline). default, ``spacing="end"``: pred end
    minus each of :data:`END_OFFSETS_MIN` (``probes`` is not used), minute-aligned, never
    before pred submit + 60 s, duplicates removed, sorted, the last exactly pred end.
    reactive: pred end; avg: pred end - the mean wait of the last 100 started jobs when the
    predecessor started (whole minutes), not before pred submit + 60 s."""
    lower = pred_submit + 60
    upper = pred_end
    if baseline == dr.REACTIVE:
        return [upper]
    if baseline == dr.AVG:
        t = upper - int(avg_wait_s // 60) * 60
        return [max(lower, t // 60 * 60)]
    if baseline != "default":
        raise ValueError(f"unknown baseline {baseline!r}")
    if spacing == "end":
        early = {max(lower, (upper - m * 60) // 60 * 60) for m in END_OFFSETS_MIN if m > 0}
        return sorted(t for t in early if t < upper) + [upper]
    if spacing != "uniform":
        raise ValueError(f"unknown probe spacing {spacing!r}; choose from {PROBE_SPACINGS}")
    if probes < 1:
        raise ValueError("probes must be >= 1")
    if probes == 1:
        return [upper]
    times = [int(lower + k * (upper - lower) / (probes - 1)) // 60 * 60 for k in range(probes)]
    times[-1] = upper  # the last probe is exactly the reactive baseline
    return [max(lower, t) for t in times]


@dataclass
class ProbeResult:
    history: np.ndarray  # float32 [window, F]
    meta: dict


def simulate_sample(
    wl: Workload,
    cfg: SimConfig,
    t0: int,
    node: int,
    spec: EpisodeSpec,
    probes: int = 7,
    baseline: str = "default",
    with_features: bool = True,
    spacing: str = "uniform",
    at_probe: Callable[[Simulator, int, int], dict] | None = None,
) -> list[ProbeResult]:
    """All probes of one sample: one shared prefix, one fork per probe (``spacing``: see
    :func:`probe_times`). ``at_probe``, if given, is called at each decision time with the
    simulator's state there (before the successor exists), the successor's node count and time
    limit, and returns fields added to that probe's metadata (the sampling's wait predictor,
    :mod:`mirage_tasks.calibration.atprobe`)."""
    base, pred = build_episode(wl, cfg, t0, node, spec, record=with_features)
    pred_submit = base.j_submit[pred]
    base.run_until(pred_submit)
    pre = base.fork()
    pre.stop_history()
    pred_start = pre.run_until_started(pred)
    avg_at_pred_start = pre.avg_wait_s()
    queue_at_pred_start = pre.queue_len()
    pred_end = pred_start + base.j_dur[pred]
    del pre
    out = []
    for k, t in enumerate(probe_times(pred_submit, pred_end, probes, baseline, avg_at_pred_start, spacing)):
        base.run_until(t)
        hist = features.history(base, pred, node, spec.service_s, spec.window) if with_features else None
        full = len(base.snaps) >= spec.window
        ql, aw = _decision_state(base)
        extra = at_probe(base, node, spec.service_s) if at_probe is not None else {}
        child = base.fork()
        child.stop_history()
        succ = child.add_probe_job(t, spec.service_s, node, SUCC_TAG)
        child.submit_now(succ)
        # The label comes from this probe's own simulation. A successor submitted while the
        # predecessor still waits can (rarely) move the predecessor's start: its backfill
        # reservation keeps lower-priority jobs off nodes the predecessor then gets early.
        ps = child.run_until_started(pred)
        pe = ps + child.j_dur[pred]
        ss = child.run_until_started(succ)
        out.append(
            ProbeResult(
                hist,
                {
                    "sample_start": int(t0),
                    "node": int(node),
                    "probe_index": k,
                    "probe_time": int(t),
                    "pred_submit": int(pred_submit),
                    "pred_start": int(ps),
                    "pred_end": int(pe),
                    "succ_submit": int(t),
                    "succ_start": int(ss),
                    "interruption_s": int(ss - pe),
                    "backfilled": bool(child.j_bf[succ]),
                    "queue_len": int(ql),
                    "avg_wait_s": float(aw),
                    "avg_wait_at_pred_start_s": float(avg_at_pred_start),
                    "pred_end_without_succ": int(pred_end),  # the pre-simulation's (sets the probe times)
                    "queue_len_at_pred_start": int(queue_at_pred_start),
                    "history_full": bool(full),
                    "baseline": baseline,
                    **extra,
                },
            )
        )
    return out
