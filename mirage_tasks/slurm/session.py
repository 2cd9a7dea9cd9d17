"""One keeping session on a Slurm cluster: chains of service jobs kept side by side, one per
policy (:class:`.keeper.Keeper`, each in a thread), optionally over a background trace replay
(:func:`.replay.run`, in a thread of its own), then the simulator's prediction for each chain
from the same background (:func:`.keeper_sim.predict`).

What the ``keep-service`` step runs between its checks and its outputs. Stopping: a SIGTERM or
a failure while the chains run stops every thread (a keeper's nap ends at once), cancels every
job the background replay submitted and, where asked (``stop_chain``) or on a cluster this
session owns, the chains' jobs, then re-raises.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..sim import decision_rules as dr
from . import keeper as kp
from .replay import cancel_ours


class Stopped(BaseException):
    """Ends a keeper's thread when the session stops (not an error of the keeper)."""


@dataclass
class Session:
    """The chains and their background. ``keeper`` holds the :class:`~.keeper.Keeper` keyword
    arguments every chain shares (node, service_s, scale, step_s, links, nice, partition,
    account, log_path, stop_chain); ``decide`` is the model's decision function (policy model).
    ``chains`` chains per policy; chain ``c`` of every policy starts ``c * stagger_s`` trace
    seconds after the first, the first ``offset_s`` trace seconds after the session starts (the
    chains of one index start together, so the policies are paired on them), its jobs named
    ``svc-<policy>-<link>`` (chain 0) or ``svc-<policy>-c<c>-<link>``. ``late_nodes`` (node
    names of a cluster this session owns) are drained before the background is submitted and
    resumed when chain 0 starts, once its predecessors are queued: capacity added for the chains
    does not serve the background alone before them; the simulator's prediction has them join at
    the same instant."""

    env: dict[str, str]
    jobcomp: str | None
    policies: list[str]
    keeper: dict[str, Any]
    decide: Callable | None = None
    chains: int = 1
    stagger_s: float = 0.0  # trace seconds between the starts of chains c and c + 1
    offset_s: float = 0.0  # trace seconds from the session's start to chain 0's start
    background: pd.DataFrame | None = None  # a replay plan (:func:`.replay.plan`), or none
    t0: int = 0  # the background window's start (trace time)
    accounting: bool = False  # the background's jobs name their users' accounts
    owns_cluster: bool = False  # a cluster started for this session: its chains are cancelled too
    results: dict[str, list[dict]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    bg_out: pd.DataFrame | None = None
    bg_facts: dict | None = None
    recalc_epoch: float | None = None  # when slurmctld last re-read usage (a local cluster's state)
    submit_epochs: dict[str, float] | None = None  # slurmctld's logged submission instant per job id
    late_nodes: list[str] = field(default_factory=list)  # drained until chain 0 starts (a cluster this session owns)
    join_epoch: float | None = None  # when the late nodes were resumed (real epoch)
    adopt: dict[str, str] = field(default_factory=dict)  # chain tag (svc-<policy>[-c<c>]) -> its job to adopt

    def run(self, deadline_s: float) -> None:
        """Keep every chain (each up to ``deadline_s`` real seconds); fills ``results``,
        ``errors`` and, with a background, ``bg_out``/``bg_facts``."""
        stop = threading.Event()
        bg_ids: dict[int, str] = {}
        keepers: dict[str, kp.Keeper] = {}
        box: dict = {}
        bg_thread = None

        def nap(seconds: float) -> None:  # a keeper's sleep: it ends at once when the session stops
            if stop.wait(seconds):
                raise Stopped("the session is stopping")

        try:
            if self.late_nodes:  # before any background job: the nodes are idle, so they drain at once
                _node_state(self.late_nodes, "DRAIN", self.env)
            clock = None  # a trace instant for the wait predictor's calendar: the replay's origin, to its start-up
            if self.background is not None:
                jobs = self.background
                clock = (time.time(), float(self.t0))

                def _bg() -> None:
                    from .replay import run as replay_run

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
                            submitted=bg_ids,
                            accounts=self.accounting,
                            hold=True,
                        )
                    except Exception as exc:  # noqa: BLE001 - reported below
                        box["error"] = repr(exc)

                bg_thread = threading.Thread(target=_bg, daemon=True)
                bg_thread.start()
                warm = int((jobs["kind"] != "window").sum() - jobs["too_big"].sum())
                while not jobs.empty and "out" not in box and "error" not in box:  # warm set submitted first
                    time.sleep(0.5)
                    if _submitted_warm(self.env, warm):
                        break
            extra = {"trace_clock": clock} if clock is not None else {}
            keepers = {
                (p, c): kp.Keeper(
                    env=self.env,
                    policy=p,
                    decide=self.decide if p == dr.MODEL else None,
                    tag=f"svc-{p}" + (f"-c{c}" if c else ""),
                    chain=c,
                    sleep=nap,
                    **extra,
                    **self.keeper,
                )
                for c in range(self.chains)
                for p in self.policies
            }
            scale = float(self.keeper.get("scale", 1.0))
            lock = threading.Lock()

            def _keep(p: str, c: int) -> None:
                try:
                    first = self.adopt.get(keepers[p, c].tag)
                    delay = self.offset_s + c * self.stagger_s
                    if delay > 0 and first is None:  # an adopted chain runs already
                        nap(delay / scale)
                    rows = keepers[p, c].run(first=first, deadline_s=deadline_s)
                    with lock:
                        self.results.setdefault(p, []).extend(rows)
                except Stopped:
                    pass
                except Exception as exc:  # noqa: BLE001 - recorded for this keeper; the others go on
                    with lock:
                        self.errors[p if self.chains == 1 else f"{p}[{c}]"] = repr(exc)

            def _join() -> None:  # the late nodes join when chain 0 starts: once its predecessors are queued
                try:
                    if self.offset_s > 0:
                        nap(self.offset_s / scale)
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

            threads = [threading.Thread(target=_keep, args=key, daemon=True) for key in keepers]
            for key, t in zip(keepers, threads):
                keepers[key].thread = t
            joiner = threading.Thread(target=_join, daemon=True) if self.late_nodes else None
            for t in [*threads, *([joiner] if joiner is not None else [])]:
                t.start()
            for t in threads:
                t.join()
            if joiner is not None:
                joiner.join()
            if bg_thread is not None:
                stop.set()
                bg_thread.join(timeout=120)
                if "error" in box:
                    self.errors["background"] = box["error"]
                else:
                    self.bg_out, self.bg_facts = box.get("out", (None, None))
        except BaseException:  # SIGTERM (Terminated) or a failure: stop the keepers and what this run submitted
            stop.set()
            until = time.monotonic() + 5.0  # a keeper in a nap ends at once, one in a client call soon after
            for t in [*threads_of(keepers), *([bg_thread] if bg_thread is not None else [])]:
                t.join(timeout=max(0.0, until - time.monotonic()))
            cancel_ours(bg_ids.values(), self.env)  # the background replay's jobs: always this run's own
            if self.keeper.get("stop_chain") or self.owns_cluster:  # a real cluster's chain only if asked
                cancel_ours([j for k in keepers.values() for j in k.submitted], self.env)
            raise
        finally:
            stop.set()

    def links(self, cfg: Any, factor: float, service_s: int, node: int, nice: int, step_s: int) -> pd.DataFrame:
        """One row per link and policy, with the simulator's prediction for each chain's first
        link beside it where a background was replayed: the chain alone re-decided by the
        simulator, in the replayed background plus the other chains' jobs as they were really
        submitted (:meth:`_service_jobs`); submission instants from slurmctld's log where
        ``submit_epochs`` has them."""
        rows = sorted(
            (r for p in self.policies for r in self.results.get(p, [])),
            key=lambda r: (self.policies.index(r["policy"]), r.get("chain", 0), r["link"]),
        )
        frame = pd.DataFrame(rows)
        if self.bg_out is None or not len(frame):
            return frame
        from .keeper_sim import predict

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


def threads_of(keepers: dict) -> list:
    return [t for k in keepers.values() if (t := getattr(k, "thread", None)) is not None]


def _node_state(nodes: list[str], state: str, env: dict) -> None:
    """``scontrol update`` these nodes to ``state`` (DRAIN or RESUME): only ever the late nodes of
    a cluster this session started."""
    from .queue import run_client

    args = ["scontrol", "update", f"NodeName={','.join(nodes)}", f"State={state}"]
    run_client(args + (["Reason=joins when the chains start"] if state == "DRAIN" else []), env)


def _submitted_warm(env: dict, n: int) -> bool:
    from .queue import squeue

    try:
        return sum(1 for q in squeue(env) if q.name == "bg") >= n
    except Exception:  # noqa: BLE001 - a queue not readable yet is not submitted; asked again
        return False


def markdown(frame: pd.DataFrame, policy: str, node: int, service_hours: float, factor: float, facts: dict) -> str:
    """``keeper.md``: the per-policy summary with intervals (:mod:`.keeper_stats`), then one row
    per link, the real and the simulated interruption side by side."""
    from .keeper_stats import markdown as summary_md, summary

    lines = [f"# Service keeper: policies {policy}, {node} node(s), {service_hours:g} h jobs, x{factor:g}", ""]
    lines += summary_md(summary(frame, factor, node)) + [""] if len(frame) else []
    lines += [
        "| policy | chain | link | signed interruption (h) | wasted node-h | decision lead (h) | forced "
        "| simulator: signed (h) | simulator: wasted node-h |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in frame.to_dict("records"):
        sim = r.get("sim_signed_interruption_h", float("nan"))
        simw = r.get("sim_wasted_node_h", float("nan"))
        lines.append(
            f"| {r['policy']} | {r.get('chain', 0)} | {r['link']} | {r['signed_interruption_h']:+.2f} | "
            f"{r['wasted_node_h']:.2f} | {r['decision_lead_trace_h']:.2f} | {r['forced']} | {sim:+.2f} | "
            f"{simw:.2f} |"
        )
    lines += [
        "",
        f"load {facts['loadavg_start']} -> {facts['loadavg_end']}, keeper CPU {facts['cpu_s']} s, "
        f"errors {facts['errors'] or 'none'}",
        "",
    ]
    return "\n".join(lines)
