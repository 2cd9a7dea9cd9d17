"""``python -m lab keeper-slurm``: the service keeper measured on a local Slurm of its own.

The product's ``keep-service`` (:mod:`mirage_tasks.steps.keep_service`: its flags, its checks,
its outputs) with the measurement mode around it: ``--slurm-root DIR`` starts a local cluster from
the cluster config at ``--factor``, ``--background-from``/``--background-to`` replay that trace
window on it (time-compressed) while the chains run (``--chains`` per policy, chain ``c`` of
every policy starting ``--offset-hours + c x --stagger-hours`` after the session's start, so the
policies are paired on the chains started together); afterwards the simulator predicts each chain
from the same background (:mod:`lab.slurm.keeper_sim`), and the result rows hold the
real and the predicted interruption side by side. The campaigns (``lab.campaigns.keeper_campaign``)
run it.

Outputs: the step's (``links.parquet``, ``decisions.jsonl``, ``keeper.json``, ``keeper.md``),
the result rows with the simulator's prediction, and ``background.parquet`` (with a background:
its jobs with Slurm's times, what the simulator's predictions were given).
"""

from __future__ import annotations

import argparse
import io
import logging
from typing import Any

from mirage_tasks.data.schema import parse_time, read_trace
from mirage_tasks.data.times import hours_to_s
from mirage_tasks.sim.config import config_from_args
from mirage_tasks.steps import keep_service
from stepkit import Step, StepError

from .keeper_session import MeasuredSession

log = logging.getLogger(__name__)

BOUNDS = {
    **keep_service.BOUNDS,
    "chains": (1, 1000),
    "stagger_hours": (0, 24 * 366),
    "offset_hours": (0, 24 * 366),
    "late_nodes": (0, 100_000),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    keep_service.add_arguments(p)
    # a measurement on a compressed local cluster is over in minutes: one that has not decided in two
    # real hours is stuck, and gives up (the product's keeper has no limit of its own)
    p.set_defaults(deadline_s=7200.0)
    g = p.add_argument_group("measurement (a local Slurm of the run's own, a background replayed on it)")
    g.add_argument(
        "--chains",
        type=int,
        default=1,
        help="chains per policy (1); chain c of every policy starts c x --stagger-hours after the first, "
        "so the policies are paired on chains started together; at most policies x chains "
        "service jobs run at once, so keep that small against the cluster's nodes",
    )
    g.add_argument(
        "--stagger-hours",
        type=float,
        default=0.0,
        help="trace hours between the starts of successive chains (0: all at once)",
    )
    g.add_argument(
        "--offset-hours",
        type=float,
        default=0.0,
        help="trace hours from the session's start (the background's, with one) to the first chain's "
        "start (0): a second run over the same window with another offset keeps other links",
    )
    g.add_argument(
        "--late-nodes",
        type=int,
        default=0,
        help="with --slurm-root and --offset-hours: the local cluster's last K nodes stay drained until "
        "the first chain starts (0), so nodes added for the chains (--nodes) do not serve the "
        "background alone before the chains exist; the simulator's prediction has them join then",
    )
    g.add_argument("--slurm-root", default=None, help="start a local Slurm here for the run, stop it after")
    g.add_argument(
        "--accounting",
        action="store_true",
        help="the cluster keeps accounts (with --slurm-root: start slurmdbd on a local MariaDB with one "
        "account per trace user; the background's jobs name their user's account, the service "
        "account 'service' unless --account; the simulator's prediction keeps the users)",
    )
    g.add_argument("--trace", default=None, help="normalised trace for the background replay")
    g.add_argument("--background-from", default=None, help="replay the trace from here (ISO) while keeping")
    g.add_argument("--background-to", default=None, help="... to here (exclusive)")


class LocalMeasurement:
    """The measurement mode of one run (:class:`mirage_tasks.steps.keep_service.Measurement`)."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.accounting = bool(args.accounting)
        self.inputs = [args.trace] if args.trace else []
        self.cfg = self.meta = self.wl = None
        self.bg = args.background_from is not None or args.background_to is not None
        self.bg_plan = None
        self.t0 = 0
        self.cluster = None
        self.children0 = 0.0

    def check(self, args: argparse.Namespace, policies: list[str]) -> None:
        if args.late_nodes and not (args.slurm_root and args.offset_hours > 0):
            raise StepError(
                f"--late-nodes {args.late_nodes} needs --slurm-root (a cluster this run starts: the keeper "
                "never changes a real cluster's nodes) and --offset-hours > 0 (when the nodes join)"
            )
        if args.slurm_root:
            from lab.slurm.cluster import check_root

            check_root(args.slurm_root)
        else:  # a Slurm client retries a missing slurm.conf for 60 s per call: refuse it at once
            from mirage_tasks.slurm.queue import check_conf

            check_conf(args.slurm_conf, "--slurm-conf")
        bg = self.bg
        if bg and not (args.trace and args.background_from and args.background_to):
            raise StepError("a background replay needs --trace, --background-from and --background-to")
        if not (bg or args.slurm_root):
            return
        if not args.trace and args.cluster_config is None and args.cfg_nodes is None:
            raise StepError("--slurm-root needs the cluster config (--cluster-config or --nodes)")
        meta_nodes = df = None
        if args.trace:
            df, self.meta = read_trace(args.trace)
            meta_nodes = self.meta.machine_nodes
        cfg = self.cfg = config_from_args(args, meta_nodes)
        if args.slurm_root:
            from lab.slurm.cluster import check_local_size

            check_local_size(cfg)
            if args.late_nodes and not args.late_nodes < cfg.nodes:
                raise StepError(
                    f"--late-nodes {args.late_nodes}: the cluster has {cfg.nodes} nodes; leave at least "
                    "one in service from the start"
                )
        at_once = len(policies) * args.chains * args.node
        if at_once > cfg.nodes:
            raise StepError(
                f"--policy {args.policy} x --chains {args.chains} x --node {args.node} = {at_once} service "
                f"nodes at once, more than the cluster's {cfg.nodes}: fewer chains, a --stagger-hours, or "
                "more --nodes"
            )
        if bg and at_once > 0.1 * cfg.nodes and args.stagger_hours == 0:
            log.warning(
                "%d service nodes at once on %d: the chains take %.0f %% of the cluster from the background "
                "they are judged in (stagger them, or run fewer per window over more windows)",
                at_once,
                cfg.nodes,
                100.0 * at_once / cfg.nodes,
            )
        if args.trace:
            from mirage_tasks.sim.workload import Workload

            self.wl = Workload.from_frame(df, cfg.procs_per_node or None)
        if bg:
            from mirage_tasks.data.times import window_outside_trace

            b0, b1 = (
                parse_time(args.background_from, "--background-from"),
                parse_time(args.background_to, "--background-to"),
            )
            if df.empty:
                raise StepError(f"{args.trace}: the trace holds no jobs")
            why = window_outside_trace(
                df["submit"].min(), df["submit"].max(), b0, b1, "--background-from/--background-to", args.trace
            )
            if why:
                raise StepError(why)

    def params(self, params: dict) -> None:
        """Its flags at their defaults leave the step's parameters as before: earlier runs' keys stay."""
        for k, default in (("accounting", False), ("chains", 1), ("stagger_hours", 0), ("offset_hours", 0)):
            if params.get(k) == default:
                params.pop(k, None)
        if params.get("late_nodes") == 0:
            params.pop("late_nodes", None)

    def default_nice(self, args: argparse.Namespace) -> int:
        """Minus the trace's median recorded priority when a background is replayed, else 0."""
        import numpy as np

        if self.bg and self.cfg.priority == "trace":
            return -int(round(float(np.nanmedian(self.wl.priority))))
        return 0

    def start(self, args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
        import os

        from mirage_tasks.slurm import keeper as kp

        if self.bg:
            from lab.slurm import replay

            b0, b1 = (
                parse_time(args.background_from, "--background-from"),
                parse_time(args.background_to, "--background-to"),
            )
            self.t0 = int(b0.timestamp())
            self.bg_plan = replay.plan(self.wl, self.cfg, self.t0, int(b1.timestamp()), args.factor)
        if not args.slurm_root:
            return kp.env_for(args.slurm_conf or os.environ.get("SLURM_CONF")), None
        from lab.slurm.cluster import start_local
        from lab.slurm.replay import users_of

        users, unknown = users_of(self.bg_plan)
        self.cluster = start_local(
            args.slurm_root, self.cfg, args.factor, accounting=args.accounting, users=users, unknown=unknown
        )
        self.children0 = _children_cpu_s()
        return self.cluster.env(), self.cluster.paths.jobcomp

    def session(self, **kwargs: Any) -> MeasuredSession:
        from lab.slurm.slurmconf import SERVICE_ACCOUNT

        args, cfg = self.args, self.cfg
        if args.accounting and not args.account:
            kwargs["keeper"] = {**kwargs["keeper"], "account": SERVICE_ACCOUNT}
        return MeasuredSession(
            **kwargs,
            background=self.bg_plan,
            chains=args.chains,
            stagger_s=hours_to_s(args.stagger_hours),
            offset_s=hours_to_s(args.offset_hours),
            late_nodes=[f"n{i}" for i in range(cfg.nodes - args.late_nodes + 1, cfg.nodes + 1)]
            if args.late_nodes
            else [],
            t0=self.t0 if self.bg else 0,
            accounting=args.accounting,
            owns_cluster=self.cluster is not None,
        )

    def finish(self, session: MeasuredSession) -> None:
        cluster = self.cluster
        if cluster is None:
            return
        from lab.slurm.compare import last_recalc_epoch, precise_submits
        from mirage_tasks.slurm.queue import read_resume_log, read_submit_log

        # the phase of its fair-share re-reads, for the simulator's prediction
        session.recalc_epoch = last_recalc_epoch(cluster.paths.state)
        if session.bg_out is not None:  # slurmctld's submission instants to the ms, as replay-slurm
            session.submit_epochs = read_submit_log(cluster.paths.ctld_log)
            if session.late_nodes and session.join_epoch is not None:  # slurmctld's instant of the resume
                session.join_epoch = read_resume_log(cluster.paths.ctld_log, session.late_nodes) or session.join_epoch
            session.bg_out = precise_submits(
                session.bg_out, session.submit_epochs, session.bg_facts["origin_epoch"], session.t0, self.args.factor
            )

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()

    def facts(self, session: MeasuredSession) -> dict:
        daemons = _children_cpu_s() - self.children0 if self.cluster is not None else None
        return {
            "daemons_cpu_s": None if daemons is None else round(daemons, 2),
            "background": session.bg_facts,
            "late_nodes_joined_epoch": session.join_epoch,
        }

    def write(self, step: Step, session: MeasuredSession) -> None:
        if session.bg_out is not None:  # the background as Slurm ran it: what the simulator's predictions were given
            buf = io.BytesIO()
            session.bg_out.to_parquet(buf, index=False)
            step.write_bytes("background.parquet", buf.getvalue())


def run(args: argparse.Namespace) -> int:
    return keep_service.run(args, LocalMeasurement(args))


def _children_cpu_s() -> float:
    """User + system CPU of this process's reaped children (the local cluster's daemons, once stopped)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
