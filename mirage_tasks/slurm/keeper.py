"""The service keeper: keep a chain of batch jobs alive on a Slurm cluster.

A service runs as a chain of jobs of ``node`` nodes and a ``service_s`` limit each. The
keeper submits (or adopts) the first one, then for every link: watches the running
predecessor, reads the live queue every ``step_s`` (``squeue`` + ``sinfo``), keeps the last
``window`` snapshots (:func:`mirage_tasks.sim.features.snapshot` on a
:class:`~mirage_tasks.slurm.queue.LiveView`: the same 44 features the simulator recorded
for training), and submits the successor when its decision rule says so (``policy``, one of
:data:`DECISION_RULES`, the keeper's rows of :mod:`mirage_tasks.sim.decision_rules`):

* ``model``: the trained model's calibrated rule (:meth:`DecisionFunction.decide`) on the
  history, asked every step once the predecessor runs, within the span before its end that the
  model's training probes covered (``decide_within_s``: 24 h for ``--probe-spacing end`` data),
  or only at the first reading at or past each of its probes' times (``decide_at_s``);
* ``reactive``: at the predecessor's end;
* ``avg``: at predecessor end minus the mean wait of the last 100 job starts the keeper saw
  (start - submit of the running jobs, as the queue showed them) when the predecessor
  started;
* ``avg-cal``: the calibrated average (protocol v2's reference): at the first instant where
  that mean wait minus the time left to the predecessor's end reaches ``avg_offset_h``, the
  threshold :func:`~mirage_tasks.evaluation.rules.calibrate_avg` chose on training
  samples (None: never early, as ``reactive``);
* ``wait-pred`` and ``guarantee``: the wait predictor asked every step for a successor submitted
  now (:mod:`.livewait`: its inputs from the same queue reading); ``wait-pred`` submits once the
  predicted start falls at or after the predecessor's end, ``guarantee`` once waiting for the
  next step would leave less slack than the predictor's upper bound;
* ``guarantee-cal``: guarantee's test with a conformal margin (``guarantee_margin_h``, chosen on
  training samples so that at most a stated share of them is interrupted), asked at the first
  reading at or past each of those samples' probe times (``guarantee_at_s``), the slack taken at
  the next of them: the decisions the margin was calibrated for;

and never later than the predecessor's end. Each decision (wait or submit) is one JSON line
with its inputs (queue counts, idle nodes, predecessor state and end, the mean wait, the
model's output). Signed interruption per link = successor start - predecessor end.

Refusals: the keeper only ever cancels job ids it submitted itself in this run (``cancel``
raises otherwise), and with ``stop_chain=False`` it cancels nothing at all; it never changes
other users' jobs, priorities or the cluster's settings.

Time: with a compressed local cluster (``scale`` = factor) every duration the model sees is
multiplied back to trace seconds, so the features match training; on a real cluster
``scale`` is 1.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sim import decision_rules as dr, features
from . import livewait
from .asking import asks
from .queue import RUNNING_STATES, LiveView, QJob, run_client, sinfo_nodes, squeue

log = logging.getLogger(__name__)

#: the keeper's decision rules (``keep-service --policy``), from the registry (:mod:`mirage_tasks.sim.decision_rules`)
DECISION_RULES = dr.KEEPER_RULES


class RefusedError(RuntimeError):
    pass


@dataclass
class Link:
    pred: str
    pred_submit: float
    pred_start: float | None = None
    succ: str | None = None
    succ_submit: float | None = None
    succ_start: float | None = None
    forced: bool = False
    model_output: float = float("nan")
    n_decisions: int = 0
    asked_at: set = field(default_factory=set)  # the decide-at times (trace s before the end) already asked


def limit_minutes(service_s: float, scale: float = 1.0) -> int:
    """The Slurm time limit (whole minutes, at least one) of a service job of ``service_s`` trace
    seconds on a cluster compressed ``scale`` times."""
    return max(1, math.ceil(service_s / scale / 60))


def sbatch_args(
    job_name: str,
    node: int,
    limit_min: int,
    *,
    nice: int = 0,
    partition: str | None = None,
    account: str | None = None,
) -> list[str]:
    """The ``sbatch`` command line of one service job: ``node`` whole nodes for ``limit_min``
    minutes, running a sleep of its whole limit (what the keeper submits, and what an approval of
    a run shows before it is allowed to)."""
    args = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        "-N",
        str(node),
        "--exclusive",
        f"--time={limit_min}",
        "--output=/dev/null",
        "--chdir=/tmp",
        f"--wrap=exec sleep {limit_min * 60}",
    ]
    if nice:
        args.insert(2, f"--nice={int(nice)}")
    if partition:
        args.insert(2, f"--partition={partition}")
    if account:
        args.insert(2, f"--account={account}")
    return args


@dataclass
class Keeper:
    env: dict[str, str]
    policy: str
    node: int
    service_s: float  # trace seconds (the limit of each job)
    scale: float = 1.0  # trace seconds per real second
    step_s: float = 600.0  # trace seconds between snapshots / decisions
    window: int = 144
    links: int = 1
    decide: Callable[[np.ndarray], tuple[bool, float]] | None = None
    avg_offset_h: float | None = None  # avg-cal's calibrated threshold (h); None: never early
    decide_within_s: float | None = None  # policy model: asked only this many trace s before the end (None: always)
    decide_at_s: tuple[float, ...] | None = None  # policy model: asked only at these trace s before the end
    waitpred: Any = None  # the wait predictor (:func:`.livewait.load`), policies wait-pred, guarantee(-cal)
    wait_cfg: Any = None  # the configuration whose priority weights its plans use
    guarantee_margin_h: float | None = None  # guarantee-cal's calibrated margin (h); None: never early
    guarantee_at_s: tuple[float, ...] | None = None  # guarantee-cal: asked at these trace s before the end
    trace_clock: tuple[float, float] | None = None  # (a real instant, its trace time); None: real time is trace time
    tag: str = "svc"
    chain: int = 0  # which of a session's chains of this policy (results and log lines say it)
    nice: int = 0
    partition: str | None = None
    account: str | None = None
    log_path: str | None = None
    stop_chain: bool = False
    submitted: set[str] = field(default_factory=set)
    on_submit: Callable[[str], None] | None = None  # told each job id right after sbatch (the step announces it)
    snaps: deque = field(default_factory=lambda: deque(maxlen=144))
    waits: dict[str, float] = field(default_factory=dict)  # job -> start - submit (real s), as seen
    starts: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if self.policy not in DECISION_RULES:
            raise ValueError(f"policy must be one of {DECISION_RULES}, got {self.policy!r}")
        if self.policy == dr.MODEL and self.decide is None:
            raise ValueError("policy 'model' needs a model")
        if self.policy in livewait.WAIT_RULES and (self.waitpred is None or self.wait_cfg is None):
            raise ValueError(f"policy {self.policy!r} needs a wait predictor and its configuration")
        if self.policy == dr.GUARANTEE_CAL and not self.guarantee_at_s:
            raise ValueError("policy 'guarantee-cal' needs its calibration probes' times (guarantee_at_s)")
        if self.avg_offset_h is not None and not math.isfinite(self.avg_offset_h):
            raise ValueError(f"avg_offset_h must be finite or None (never early), got {self.avg_offset_h!r}")
        self.snaps = deque(maxlen=self.window)
        self.origin = self.clock()
        self.limit_min = limit_minutes(self.service_s, self.scale)
        self.run_s = self.limit_min * 60  # each service job runs its whole limit (real s)
        from .queue import Progress

        self.progress = Progress(f"keeper {self.policy}" + (f" chain {self.chain}" if self.chain else ""))

    def _asks(self, link: Link, left_s: float) -> bool:
        """Whether the model is asked at a reading with ``left_s`` trace seconds to the predecessor's
        end (:func:`asks`)."""
        return asks(left_s, self.decide_within_s, self.decide_at_s, link.asked_at)

    # ------------------------------------------------------------------ slurm
    def _log(self, rec: dict) -> None:
        rec = {"t": round(self.clock(), 3), "policy": self.policy, "chain": self.chain, **rec}
        if self.log_path:
            with open(self.log_path, "a") as fh:
                fh.write(json.dumps(rec, default=float) + "\n")

    def submit(self, what: str) -> str:
        args = sbatch_args(
            f"{self.tag}-{what}",
            self.node,
            self.limit_min,
            nice=self.nice,
            partition=self.partition,
            account=self.account,
        )
        jid = run_client(args, self.env).strip().split(";")[0]
        self.submitted.add(jid)
        if self.on_submit is not None:
            self.on_submit(jid)
        self._log({"event": "submitted", "job": jid, "what": what})
        return jid

    def cancel(self, jid: str) -> None:
        if jid not in self.submitted:
            raise RefusedError(f"refusing to cancel job {jid}: this keeper did not submit it")
        run_client(["scancel", jid], self.env)
        self._log({"event": "cancelled", "job": jid})

    def read(self) -> tuple[list[QJob], dict[str, int]]:
        jobs = squeue(self.env, self.partition)
        nodes = sinfo_nodes(self.env, self.partition)
        for q in jobs:
            if q.state in RUNNING_STATES and q.start is not None and q.submit is not None:
                if q.job_id not in self.starts:
                    self.starts[q.job_id] = q.start
                    self.waits[q.job_id] = q.start - q.submit
        return jobs, nodes

    def avg_due(self, pend: float, avg_trace_s: float | None) -> float | None:
        """The real instant ``avg`` or ``avg-cal`` submits at (None: not before the predecessor's
        end): ``avg`` at the end minus the mean wait, ``avg-cal`` where the mean wait minus the time
        left reaches the calibrated offset (the end minus (mean wait - offset))."""
        if self.policy == dr.AVG:
            return pend - (avg_trace_s or 0.0) / self.scale
        if self.policy == dr.AVG_CAL and self.avg_offset_h is not None:
            lead = (avg_trace_s or 0.0) - self.avg_offset_h * 3600.0
            return pend - lead / self.scale if lead > 0 else None
        return None

    def avg_wait_trace_s(self) -> float:
        last = sorted(self.starts, key=lambda j: self.starts[j])[-100:]
        return float(np.mean([self.waits[j] for j in last])) * self.scale if last else 0.0

    def wait_answer(self, jobs: list[QJob], nodes: dict[str, int], now: float) -> dict[str, float]:
        """The wait predictor's answer for a successor submitted now (trace seconds)."""
        clock = self.trace_clock or ((self.origin, self.origin) if self.scale != 1 else (0.0, 0.0))
        recent = [self.waits[j] * self.scale for j in sorted(self.starts, key=lambda j: self.starts[j])]
        row = livewait.live_row(
            self.waitpred,
            self.wait_cfg,
            jobs,
            nodes,
            now,
            self.scale,
            clock,
            recent,
            self.node,
            self.limit_min * 60 * self.scale,
        )
        return self.waitpred.answer(row)

    # ------------------------------------------------------------------ features
    def snapshot(self, jobs: list[QJob], nodes: dict[str, int], now: float) -> np.ndarray:
        view = LiveView(jobs, nodes, now=now, scale=self.scale, origin=self.origin)
        return features.snapshot_direct(view)

    def history(self, pred: QJob | None, pred_submit: float, now: float) -> np.ndarray:
        out = np.zeros((self.window, features.N_FEATURES), dtype=np.float32)
        snaps = list(self.snaps)[-self.window :]
        if snaps:
            out[self.window - len(snaps) :] = np.stack(snaps)
        lim = self.limit_min * 60 * self.scale / 60.0
        if pred is not None and pred.start is not None and pred.state in RUNNING_STATES:
            tup = (
                lim,
                float(self.node),
                (pred.start - pred_submit) * self.scale,
                min(now - pred.start, self.run_s) * self.scale,
            )
        else:
            tup = (lim, float(self.node), (now - pred_submit) * self.scale, 0.0)
        out[:, features.PRED_COL : features.PRED_COL + 4] = tup
        out[:, features.SUCC_COL : features.SUCC_COL + 4] = (lim, float(self.node), 0.0, 0.0)
        return out

    # ------------------------------------------------------------------ the loop
    def run(self, first: str | None = None, deadline_s: float | None = None) -> list[dict]:
        """Keep the chain for ``links`` successions; returns one result per link. ``first``: a job
        of this chain already in the queue (submitted by an earlier try of the same task), adopted
        as the first predecessor instead of submitting one."""
        t_end = self.clock() + deadline_s if deadline_s is not None else math.inf  # None: no limit of its own
        step_real = self.step_s / self.scale
        if first is not None:
            self.submitted.add(first)  # this task's own job: it may cancel it (--stop-chain)
            self._log({"event": "adopted", "job": first})
        pred = first or self.submit("0")
        pred_submit = self.clock()
        results = []
        for k in range(self.links):
            link = Link(pred=pred, pred_submit=pred_submit)
            avg_at_start = None
            next_tick = self.clock()
            while link.succ is None:
                if self.clock() > t_end:
                    raise TimeoutError(f"link {k}: no successor decision before the deadline")
                now = self.clock()
                due = link.pred_start + self.run_s if link.pred_start is not None else None
                if due is not None and now >= due - 0.5:  # the end: submit first, no queue reading before it
                    # (on a loaded machine squeue and sinfo took seconds, at x180 a tenth of a trace hour)
                    link.forced = True
                    link.succ = self.submit(str(k + 1))
                    link.succ_submit = self.clock()
                    self._log(
                        {
                            "event": "decision",
                            "link": k,
                            "submit": True,
                            "why": "predecessor end",
                            "model_output": float("nan"),
                            "inputs": {"pred": pred, "pred_end": due, "read_before": False},
                        }
                    )
                    break
                jobs, nodes = self.read()
                by_id = {q.job_id: q for q in jobs}
                p = by_id.get(pred)
                if p is not None and p.submit is not None and link.pred_submit == pred_submit:
                    link.pred_submit = pred_submit = min(pred_submit, p.submit)
                if p is not None and p.state in RUNNING_STATES and p.start is not None and link.pred_start is None:
                    link.pred_start = p.start
                    avg_at_start = self.avg_wait_trace_s()
                    self._log(
                        {"event": "pred_started", "job": pred, "start": p.start, "avg_wait_trace_s": avg_at_start}
                    )
                if p is None and link.pred_start is None:
                    raise RuntimeError(f"predecessor {pred} left the queue without being seen running")
                if now >= next_tick:
                    self.snaps.append(self.snapshot(jobs, nodes, now))
                    next_tick += step_real
                pend = link.pred_start + self.run_s if link.pred_start is not None else None
                inputs = {
                    "pending": sum(1 for q in jobs if q.state not in RUNNING_STATES),
                    "running": sum(1 for q in jobs if q.state in RUNNING_STATES),
                    "idle_nodes": nodes["idle"],
                    "pred": pred,
                    "pred_state": p.state if p else "ended",
                    "pred_end": pend,
                    "avg_wait_trace_s": avg_at_start,
                }
                submit, why, raw = False, "", float("nan")
                if pend is not None and now >= pend - 0.5:
                    submit, why = True, "predecessor end"
                    link.forced = True
                elif pend is not None and self.policy in (dr.AVG, dr.AVG_CAL):
                    due = self.avg_due(pend, avg_at_start)
                    if due is not None and now >= due:
                        submit, why = True, f"{self.policy} wait before the end"
                elif (
                    pend is not None
                    and self.policy in livewait.WAIT_RULES
                    and (
                        nxt := livewait.next_decision_s(
                            self.policy, (pend - now) * self.scale, self.step_s, self.guarantee_at_s, link.asked_at
                        )
                    )
                    is not None
                ):
                    ans = self.wait_answer(jobs, nodes, now)
                    submit = livewait.decide(self.policy, ans, (pend - now) * self.scale, nxt, self.guarantee_margin_h)
                    raw = ans["wp_wait_s" if self.policy == dr.WAIT_PRED else "wp_bound_s"] / 3600.0
                    inputs.update(wp_wait_h=ans["wp_wait_s"] / 3600.0, wp_bound_h=ans["wp_bound_s"] / 3600.0)
                    link.n_decisions += 1
                    why = self.policy if submit else ""
                elif pend is not None and self.policy == dr.MODEL and self._asks(link, (pend - now) * self.scale):
                    submit, raw = self.decide(self.history(p, pred_submit, now))
                    link.n_decisions += 1
                    why = "model" if submit else ""
                self._log(
                    {
                        "event": "decision",
                        "link": k,
                        "submit": submit,
                        "why": why,
                        "model_output": raw,
                        "inputs": inputs,
                    }
                )
                self.progress.maybe(
                    "link %d of %d: predecessor %s %s, %s pending, %s running, %s idle nodes",
                    k + 1,
                    self.links,
                    pred,
                    inputs["pred_state"],
                    inputs["pending"],
                    inputs["running"],
                    inputs["idle_nodes"],
                )
                if submit:
                    link.model_output = raw
                    link.succ = self.submit(str(k + 1))
                    link.succ_submit = self.clock()
                    break
                # next look: the next snapshot, the avg time or the predecessor's end, whichever first
                wake = next_tick
                if pend is not None:
                    wake = min(wake, pend)
                    due = self.avg_due(pend, avg_at_start) if avg_at_start is not None else None
                    if due is not None and due > now:
                        wake = min(wake, due)
                if link.pred_start is None:
                    wake = min(wake, now + min(step_real, 1.0))
                self.sleep(max(0.05, wake - self.clock()))
            while link.succ_start is None:
                if self.clock() > t_end:
                    raise TimeoutError(f"link {k}: successor {link.succ} did not start before the deadline")
                jobs, nodes = self.read()
                q = {j.job_id: j for j in jobs}.get(link.succ)
                if q is not None and q.state in RUNNING_STATES and q.start is not None:
                    link.succ_start = q.start
                    break
                self.progress.maybe(
                    "link %d of %d: successor %s %s",
                    k + 1,
                    self.links,
                    link.succ,
                    q.state if q is not None else "not in the queue",
                )
                now = self.clock()
                if now >= next_tick:
                    self.snaps.append(self.snapshot(jobs, nodes, now))
                    next_tick += step_real
                self.sleep(min(1.0, step_real))
            pend = link.pred_start + self.run_s
            signed = (link.succ_start - pend) * self.scale / 3600
            res = {
                "link": k,
                "policy": self.policy,
                "chain": self.chain,
                "pred": link.pred,
                "succ": link.succ,
                "pred_submit": link.pred_submit,
                "pred_start": link.pred_start,
                "pred_end": pend,
                "succ_submit": link.succ_submit,
                "succ_start": link.succ_start,
                "decision_lead_trace_h": (pend - link.succ_submit) * self.scale / 3600,
                "signed_interruption_h": signed,
                "interruption_h": max(signed, 0.0),
                "overlap_h": max(-signed, 0.0) + 0.0,
                "wasted_node_h": self.node * max(-signed, 0.0) + 0.0,
                "forced": link.forced,
                "model_output": link.model_output,
                "n_decisions": link.n_decisions,
            }
            self._log({"event": "link_done", **res})
            results.append(res)
            pred, pred_submit = link.succ, link.succ_submit
        if self.stop_chain:
            self.cancel(pred)
        return results


def model_decider(uri: str) -> tuple[Callable[[np.ndarray], tuple[bool, float]], dict[str, Any]]:
    """(decide(history) -> (submit, raw output), model config) of a trained model."""
    from ..models.loader import load_model

    fn = load_model(uri, device="cpu")
    if fn.window != 144 and fn.window < 1:
        raise ValueError(f"{uri}: odd window {fn.window}")
    from ..calibration import atprobe

    if atprobe.uses_features(fn.feature_names):
        raise ValueError(
            f"{uri}: trained with the wait predictor's channels (merge --waitpred-features), which the "
            "keeper does not compute; use --policy wait-pred or guarantee with --waitpred for the "
            "predictor on a live queue"
        )
    if list(fn.feature_names) != list(features.FEATURE_NAMES):
        raise ValueError(
            f"{uri}: the model was trained on other features ({len(fn.feature_names)}), "
            f"the keeper builds {len(features.FEATURE_NAMES)}"
        )

    def decide(hist: np.ndarray) -> tuple[bool, float]:
        d = fn.decide(hist[None])
        return bool(d.submit[0]), float(d.raw[0])

    from ..sim.probes import trained_offsets_s, trained_span_s

    sp = (fn.config.get("data") or {}).get("sample_params")
    return decide, {
        "window": fn.window,
        "kind": fn.kind,
        "decision": fn.decision_rule,
        "trained_span_s": trained_span_s(sp),
        "trained_offsets_s": trained_offsets_s(sp),
    }


def env_for(conf: str | None) -> dict[str, str]:
    env = os.environ.copy()
    if conf:
        env["SLURM_CONF"] = conf
    return env
