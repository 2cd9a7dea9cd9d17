"""One keeping session on a Slurm cluster: chains of service jobs kept side by side, one per
policy (:class:`.keeper.Keeper`, each in a thread).

What the ``keep-service`` step runs between its checks and its outputs (and, subclassed with a
background replay and the simulator's prediction, the lab's ``keeper-slurm``). Stopping: a
SIGTERM or a failure while the chains run stops every thread (a keeper's nap ends at once) and,
where asked (``stop_chain``) or on a cluster this session owns, cancels the chains' jobs, then
re-raises.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..sim import decision_rules as dr
from . import keeper as kp
from .queue import cancel_ours


class Stopped(BaseException):
    """Ends a keeper's thread when the session stops (not an error of the keeper)."""


@dataclass
class Session:
    """The chains. ``keeper`` holds the :class:`~.keeper.Keeper` keyword arguments every chain
    shares (node, service_s, scale, step_s, links, nice, partition, account, log_path,
    stop_chain); ``decide`` is the model's decision function (policy model). ``chains`` chains
    per policy; chain ``c`` of every policy starts ``c * stagger_s`` trace seconds after the
    first, the first ``offset_s`` trace seconds after the session starts (the chains of one index
    start together, so the policies are paired on them), its jobs named ``svc-<policy>-<link>``
    (chain 0) or ``svc-<policy>-c<c>-<link>``.

    The lab's measurement session (``python -m lab keeper-slurm``: a background replayed beside
    the chains on a local cluster, the simulator's prediction beside each chain) subclasses this
    one through the hooks ``_before_keepers``, ``_helpers``, ``_after_keepers``, ``_own_threads``,
    ``_cancel_own`` and :meth:`links`; here they do nothing."""

    env: dict[str, str]
    jobcomp: str | None
    policies: list[str]
    keeper: dict[str, Any]
    decide: Callable | None = None
    chains: int = 1
    stagger_s: float = 0.0  # trace seconds between the starts of chains c and c + 1
    offset_s: float = 0.0  # trace seconds from the session's start to chain 0's start
    owns_cluster: bool = False  # a cluster started for this session: its chains are cancelled too
    results: dict[str, list[dict]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    adopt: dict[str, str] = field(default_factory=dict)  # chain tag (svc-<policy>[-c<c>]) -> its job to adopt

    def run(self, deadline_s: float | None) -> None:
        """Keep every chain (each up to ``deadline_s`` real seconds, None: no limit of its own); fills
        ``results`` and ``errors``."""
        stop = threading.Event()
        keepers: dict[str, kp.Keeper] = {}

        def nap(seconds: float) -> None:  # a keeper's sleep: it ends at once when the session stops
            if stop.wait(seconds):
                raise Stopped("the session is stopping")

        try:
            clock = self._before_keepers(stop)  # a trace instant for the wait predictor's calendar, or none
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

            threads = [threading.Thread(target=_keep, args=key, daemon=True) for key in keepers]
            for key, t in zip(keepers, threads):
                keepers[key].thread = t
            helpers = self._helpers(keepers, nap, lock)
            for t in [*threads, *helpers]:
                t.start()
            for t in [*threads, *helpers]:
                t.join()
            self._after_keepers(stop)
        except BaseException:  # SIGTERM (Terminated) or a failure: stop the keepers and what this run submitted
            stop.set()
            until = time.monotonic() + 5.0  # a keeper in a nap ends at once, one in a client call soon after
            for t in [*threads_of(keepers), *self._own_threads()]:
                t.join(timeout=max(0.0, until - time.monotonic()))
            self._cancel_own()
            if self.keeper.get("stop_chain") or self.owns_cluster:  # a real cluster's chain only if asked
                cancel_ours([j for k in keepers.values() for j in k.submitted], self.env)
            raise
        finally:
            stop.set()

    def _before_keepers(self, stop: threading.Event) -> tuple[float, float] | None:
        """Before the keepers exist: (real epoch, trace instant) of the wait predictor's calendar, or none."""
        return None

    def _helpers(self, keepers: dict, nap: Callable, lock: threading.Lock) -> list[threading.Thread]:
        """Threads (not started) that run beside the keepers and end with them."""
        return []

    def _after_keepers(self, stop: threading.Event) -> None:
        """Once every keeper has ended (not on a failure)."""

    def _own_threads(self) -> list[threading.Thread]:
        """The session's own threads besides the keepers', joined on a failure."""
        return []

    def _cancel_own(self) -> None:
        """On a failure: cancel the jobs this session submitted besides the chains'."""

    def links(self, cfg: Any, factor: float, service_s: int, node: int, nice: int, step_s: int) -> pd.DataFrame:
        """One row per link and policy, in the order of ``policies``, chain and link (the
        measurement session adds the simulator's prediction beside each chain's first link)."""
        return pd.DataFrame(self.rows())

    def rows(self) -> list[dict]:
        """The keepers' rows, in the order of ``policies``, chain and link."""
        return sorted(
            (r for p in self.policies for r in self.results.get(p, [])),
            key=lambda r: (self.policies.index(r["policy"]), r.get("chain", 0), r["link"]),
        )


def threads_of(keepers: dict) -> list:
    return [t for k in keepers.values() if (t := getattr(k, "thread", None)) is not None]


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
