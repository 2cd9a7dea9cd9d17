"""The wait predictor asked by the service keeper on a live queue (protocol v2's
``wait-pred`` and ``guarantee`` rules on a real Slurm).

At a decision the keeper asks: "if I submit the successor now, when will it start?" The inputs are
the ones the predictor was fitted on (:data:`mirage_tasks.calibration.atsubmit.FEATURES`),
computed by the same code (:func:`~mirage_tasks.calibration.atsubmit.queue_row`) from one reading
of ``squeue``/``sinfo``: the running jobs (start, time limit, nodes), the pending ones
(submission, limit, nodes, job-id order), the waits of the latest starts the keeper saw, the
successor's request. Times are in trace seconds (``scale`` trace seconds per real second, as the
model's features: :class:`~mirage_tasks.slurm.queue.LiveView`); the calendar columns come from
trace time (``trace_clock``: a real instant and the trace instant it stands for).

What it cannot know and so does not use: each job's run-time estimate from its user's history
(a live queue shows the request; every estimate is the request, on both sides:
:class:`~mirage_tasks.calibration.atprobe.WaitAtProbe` with ``estimates=None``, which the
simulator's prediction of the same chain uses too), and fair-share terms (not read from
``sshare``). The bound is the calibration period's split-conformal one, as in the probe replay.

Rules (decided at every keeper step, ``D`` = trace time left to the predecessor's end, ``step``
the time to the next decision):

* ``wait-pred``: submit when the predicted wait ``w >= D`` (the start predicted at or after the end);
* ``guarantee``: submit when the bound ``b >= D - step`` (waiting for the next decision would leave
  less slack than the bound at the predictor's level, e.g. 90 %: an interruption at most about
  10 % of the time if the bound holds).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..calibration import atsubmit
from ..sim import decision_rules as dr
from .asking import asks
from .queue import PENDING_STATES, RUNNING_STATES, QJob

#: the keeper's decision rules that ask the wait predictor (the registry's, :mod:`mirage_tasks.sim.decision_rules`)
WAIT_RULES = dr.KEEPER_WAIT_RULES


def live_row(
    wp: Any,
    cfg: Any,
    jobs: list[QJob],
    nodes_info: dict[str, int],
    now: float,
    scale: float,
    trace_clock: tuple[float, float],
    recent_trace_s: list[float],
    node: int,
    limit_s: float,
) -> dict:
    """The predictor's completed input row for a ``node`` x ``limit_s`` (trace s) request at real
    instant ``now``, from one queue reading (``trace_clock`` = (real instant, its trace time))."""
    real0, trace0 = trace_clock

    def tr(x: float) -> float:
        return trace0 + (x - real0) * scale

    t = int(round(tr(now)))
    run = [q for q in jobs if q.state in RUNNING_STATES and q.start is not None]
    pend = [q for q in jobs if q.state in PENDING_STATES]
    r_lim = np.array([(q.limit_s or 0) * scale for q in run], dtype=np.float64)
    p_lim = np.array([(q.limit_s or 0) * scale for q in pend], dtype=np.float64)
    order = np.array([int(q.job_id) if q.job_id.isdigit() else i for i, q in enumerate(pend)], dtype=np.int64)
    C = float(nodes_info.get("total", 0) - nodes_info.get("down", 0))
    row = atsubmit.queue_row(
        t,
        C,
        atsubmit.priority_weights(cfg),
        np.array([tr(q.start) for q in run], dtype=np.float64),
        r_lim,
        r_lim,
        np.array([q.nodes for q in run], dtype=np.float64),
        np.array([tr(q.submit if q.submit is not None else now) for q in pend], dtype=np.float64),
        p_lim,
        p_lim,
        np.array([q.nodes for q in pend], dtype=np.float64),
        np.argsort(np.argsort(order)),
        float(node),
        float(limit_s),
        float(limit_s),
        list(recent_trace_s)[-atsubmit.RECENT_N :],
        None,
    )
    return wp.finish(row, t, node, int(limit_s))


def next_decision_s(
    policy: str, left_s: float, step_s: float, at_s: tuple[float, ...] | None, asked: set
) -> float | None:
    """Trace seconds from now to the rule's next decision when it is asked at a reading with
    ``left_s`` to the predecessor's end, None when it is not asked there. ``wait-pred`` and
    ``guarantee`` are asked every step; ``guarantee-cal`` only at the first reading at or past each
    of its calibration probes' times ``at_s`` (:func:`.asking.asks`; ``asked`` keeps the link's
    times asked), its next decision the next of them (or the end): the decisions its margin was
    calibrated for."""
    if policy != dr.GUARANTEE_CAL:
        return step_s
    if not asks(left_s, None, at_s, asked):
        return None
    return left_s - max([o for o in at_s if o < left_s], default=0.0)


def decide(policy: str, answer: dict[str, float], left_s: float, next_s: float, margin_h: float | None = 0.0) -> bool:
    """The rule of ``policy`` on the predictor's ``answer`` with ``left_s`` trace seconds to the
    predecessor's end and ``next_s`` to the next decision. ``guarantee-cal`` is guarantee's test
    with the conformal margin ``margin_h`` its calibration chose (the probe replay's
    ``guarantee-cal``: submit when the bound minus the time left at the next decision reaches it;
    None: never early)."""
    from ..calibration.atprobe import submits

    if policy not in WAIT_RULES:
        raise ValueError(f"not a wait-predictor policy: {policy!r}")
    return submits(policy, answer, left_s, next_s, margin_h if policy == dr.GUARANTEE_CAL else 0.0)


def load(uri: str, tz: str) -> Any:
    """The predictor of a committed ``waitpred`` output, every job's estimate its request."""
    import json

    from stepkit import storage

    from ..calibration.atprobe import DOC_FILE, MODEL_FILE, WaitAtProbe
    from ..data.artifacts import require_input

    require_input(uri, "--waitpred")
    try:
        raw = storage.read_bytes(storage.join(uri, MODEL_FILE))
    except FileNotFoundError as exc:
        from stepkit import StepError

        raise StepError(f"--waitpred {uri}: no {MODEL_FILE} (an output of an older waitpred): rerun waitpred") from exc
    return WaitAtProbe(raw, json.loads(storage.read_bytes(storage.join(uri, DOC_FILE))), None, tz)
