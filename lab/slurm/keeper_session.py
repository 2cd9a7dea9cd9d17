"""The keeping session of the measurement mode (``python -m lab keeper-slurm``): the product's
chains (:class:`mirage_tasks.slurm.session.Session`) over a background trace replay
(:func:`lab.slurm.replay.run`, in a thread of its own) on a local cluster, then the
simulator's prediction for each chain from the same background
(:func:`lab.slurm.keeper_sim.predict`).

Stopping: as the product's session, and every job the background replay submitted is cancelled
too.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from mirage_tasks.sim import decision_rules as dr
from mirage_tasks.slurm.queue import cancel_ours
from mirage_tasks.slurm.session import Session, Stopped


@dataclass
class MeasuredSession(Session):
    """The chains and their background. ``late_nodes`` (node names of a cluster this session owns)
    are drained before the background is submitted and resumed when chain 0 starts, once its
    predecessors are queued: capacity added for the chains does not serve the background alone
    before them; the simulator's prediction has them join at the same instant."""

    background: pd.DataFrame | None = None  # a replay plan (:func:`lab.slurm.replay.plan`), or none
    t0: int = 0  # the background window's start (trace time)
    accounting: bool = False  # the background's jobs name their users' accounts
    bg_out: pd.DataFrame | None = None
    bg_facts: dict | None = None
    recalc_epoch: float | None = None  # when slurmctld last re-read usage (a local cluster's state)
    submit_epochs: dict[str, float] | None = None  # slurmctld's logged submission instant per job id
    late_nodes: list[str] = field(default_factory=list)  # drained until chain 0 starts (a cluster this session owns)
    join_epoch: float | None = None  # when the late nodes were resumed (real epoch)

    def __post_init__(self) -> None:
        self._bg_ids: dict[int, str] = {}
        self._box: dict = {}
        self._bg_thread: threading.Thread | None = None

    def _before_keepers(self, stop: threading.Event) -> tuple[float, float] | None:
        if self.late_nodes:  # before any background job: the nodes are idle, so they drain at once
            _node_state(self.late_nodes, "DRAIN", self.env)
        if self.background is None:
            return None
        jobs, box = self.background, self._box

        def _bg() -> None:
            from lab.slurm.replay import run as replay_run

            try:
                box["out"] = replay_run(
                    jobs,
                    self.env,
                    self.jobcomp,
                    self.keeper["scale"],
                    self.t0,
                    tag="bg",
                    drain_s=0.0,
                    stop=stop,
                    submitted=self._bg_ids,
                    accounts=self.accounting,
                    hold=True,
                )
            except Exception as exc:  # noqa: BLE001 - reported below
                box["error"] = repr(exc)

        clock = (time.time(), float(self.t0))  # the replay's origin, to its start-up
        self._bg_thread = threading.Thread(target=_bg, daemon=True)
        self._bg_thread.start()
        warm = int((jobs["kind"] != "window").sum() - jobs["too_big"].sum())
        while not jobs.empty and "out" not in box and "error" not in box:  # warm set submitted first
            time.sleep(0.5)
            if _submitted_warm(self.env, warm):
                break
        return clock

    def _helpers(self, keepers: dict, nap: Callable, lock: threading.Lock) -> list[threading.Thread]:
        if not self.late_nodes:
            return []

        def _join() -> None:  # the late nodes join when chain 0 starts: once its predecessors are queued
            try:
                if self.offset_s > 0:
                    nap(self.offset_s / float(self.keeper.get("scale", 1.0)))
                first = [k for (_, c), k in keepers.items() if c == 0]
                while not all(k.submitted or not k.thread.is_alive() for k in first):
                    nap(0.2)
                _node_state(self.late_nodes, "RESUME", self.env)
                self.join_epoch = time.time()
            except Stopped:
                pass
            except Exception as exc:  # noqa: BLE001 - recorded; the keepers go on
                with lock:
                    self.errors["late nodes"] = repr(exc)

        return [threading.Thread(target=_join, daemon=True)]

    def _after_keepers(self, stop: threading.Event) -> None:
        if self._bg_thread is None:
            return
        stop.set()
        self._bg_thread.join(timeout=120)
        if "error" in self._box:
            self.errors["background"] = self._box["error"]
        else:
            self.bg_out, self.bg_facts = self._box.get("out", (None, None))

    def _own_threads(self) -> list[threading.Thread]:
        return [self._bg_thread] if self._bg_thread is not None else []

    def _cancel_own(self) -> None:
        cancel_ours(self._bg_ids.values(), self.env)  # the background replay's jobs: always this run's own

    def links(self, cfg: Any, factor: float, service_s: int, node: int, nice: int, step_s: int) -> pd.DataFrame:
        """One row per link and policy, with the simulator's prediction for each chain's first
        link beside it where a background was replayed: the chain alone re-decided by the
        simulator, in the replayed background plus the other chains' jobs as they were really
        submitted (:meth:`_service_jobs`); submission instants from slurmctld's log where
        ``submit_epochs`` has them."""
        rows = self.rows()
        frame = pd.DataFrame(rows)
        if self.bg_out is None or not len(frame):
            return frame
        from lab.slurm.keeper_sim import predict

        origin = self.bg_facts["origin_epoch"]
        recalc_t = None if self.recalc_epoch is None else self.t0 + (self.recalc_epoch - origin) * factor
        late = None
        if self.late_nodes and self.join_epoch is not None:  # (trace instant the late nodes joined, how many)
            late = (self.t0 + (self.join_epoch - origin) * factor, len(self.late_nodes))
        limit_min = int(math.ceil(service_s / factor / 60))
        limit_s = int(limit_min * 60 * factor)
        epochs = self.submit_epochs or {}

        def submitted(jid: str | None, fallback: float) -> float:  # slurmctld's instant where it logged one
            return float(epochs.get(str(jid), fallback)) if jid is not None else fallback

        sims = []
        for r in rows:
            if r["link"] != 0:
                continue
            chain = (r["policy"], r.get("chain", 0))
            others = self._service_jobs(
                rows,
                skip=chain,
                submitted=submitted,
                limit_min=limit_min,
                node=node,
                priority=-nice,
                origin=origin,
                factor=factor,
            )
            ps_t = self.t0 + (submitted(r.get("pred"), r["pred_submit"]) - origin) * factor
            sims.append(
                {
                    "policy": r["policy"],
                    "chain": chain[1],
                    "link": 0,
                    **predict(
                        pd.concat([self.bg_out, others], ignore_index=True) if len(others) else self.bg_out,
                        cfg,
                        factor,
                        ps_t,
                        node,
                        limit_s,
                        r["policy"],
                        -nice,
                        self.decide if r["policy"] == dr.MODEL else None,
                        int(step_s),
                        accounting=self.accounting,
                        recalc_t=recalc_t,
                        avg_offset_h=self.keeper.get("avg_offset_h"),
                        waitpred=self.keeper.get("waitpred"),
                        late=late,
                        decide_within_s=self.keeper.get("decide_within_s"),
                        decide_at_s=self.keeper.get("decide_at_s"),
                        guarantee_margin_h=self.keeper.get("guarantee_margin_h"),
                        guarantee_at_s=self.keeper.get("guarantee_at_s"),
                    ),
                }
            )
        if "chain" not in frame:
            frame["chain"] = 0
        return frame.merge(pd.DataFrame(sims), on=["policy", "chain", "link"], how="left")

    def _service_jobs(
        self,
        rows: list[dict],
        skip: tuple,
        submitted: Callable,
        limit_min: int,
        node: int,
        priority: float,
        origin: float,
        factor: float,
    ) -> pd.DataFrame:
        """The other chains' jobs as replayed background rows: every predecessor and successor
        they submitted, at its real submission instant, running its whole limit (each service
        job does), with the service's priority and no trace user. The simulator predicting one
        chain then sees the queue the real chain saw, the other chains' jobs in it."""
        out, seen = [], set()
        for r in rows:
            if (r["policy"], r.get("chain", 0)) == skip:
                continue
            for jid, at in ((r.get("pred"), r.get("pred_submit")), (r.get("succ"), r.get("succ_submit"))):
                if jid is None or at is None or at != at or jid in seen:
                    continue
                seen.add(jid)
                out.append(
                    {
                        "trace_job_id": f"svc:{jid}",
                        "kind": "service",
                        "slurm_id": str(jid),
                        "nodes": node,
                        "submit_t": self.t0 + (submitted(jid, at) - origin) * factor,
                        "sleep_s": float(limit_min * 60),
                        "limit_min": limit_min,
                        "priority": float(priority),
                        "too_big": False,
                    }
                )
        return pd.DataFrame(out)


def _node_state(nodes: list[str], state: str, env: dict) -> None:
    """``scontrol update`` these nodes to ``state`` (DRAIN or RESUME): only ever the late nodes of
    a cluster this session started."""
    from mirage_tasks.slurm.queue import run_client

    args = ["scontrol", "update", f"NodeName={','.join(nodes)}", f"State={state}"]
    run_client(args + (["Reason=joins when the chains start"] if state == "DRAIN" else []), env)


def _submitted_warm(env: dict, n: int) -> bool:
    from mirage_tasks.slurm.queue import squeue

    try:
        return sum(1 for q in squeue(env) if q.name == "bg") >= n
    except Exception:  # noqa: BLE001 - a queue not readable yet is not submitted; asked again
        return False
