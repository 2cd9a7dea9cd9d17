"""``python -m mirage_tasks keep-service``: keep a service alive on a Slurm cluster.

Runs the service keeper (:mod:`mirage_tasks.slurm.keeper`) for ``--links`` successions of a
chain of ``--node``-node jobs of ``--service-hours`` each, with one or more policies
(``--policy model,reactive,avg,avg-cal``: ``--chains`` chains per policy, one by default, side by side on
the same cluster; chain ``c`` of every policy starts ``--offset-hours + c x --stagger-hours`` after the
session's start, so the policies are paired on the chains started together).

Against a real cluster: ``SLURM_CONF`` (or ``--slurm-conf``) names it, ``--factor 1``,
``--partition``/``--account`` say where and as whom; the keeper submits as the user it runs
as and cancels only what it submitted (with ``--stop-chain``; otherwise nothing).

The measurement mode (local Slurm): ``--slurm-root DIR`` starts a local cluster from the
cluster config at ``--factor`` and ``--background-from``/``--background-to`` replay that
trace window on it (time-compressed) while the chains run; afterwards the simulator
predicts each chain from the same background (:mod:`mirage_tasks.slurm.keeper_sim`), and
the result rows hold the real and the predicted interruption side by side.

Outputs: ``links.parquet`` (one row per link, chain and policy, real and simulated),
``decisions.jsonl`` (every decision with its inputs), ``background.parquet`` (with a background:
its jobs with Slurm's times, what the simulator's predictions were given), ``keeper.json`` (with ``summary``: per
policy, the mean interruption, interrupted share, waste and objective with intervals, and
the paired difference to reactive and avg, :mod:`mirage_tasks.slurm.keeper_stats`),
``keeper.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time

from stepkit import Step, StepError
from stepkit.external import announce, parse_ids

from .. import __version__
from ..data.schema import parse_time, read_trace
from ..data.times import hours_to_s
from ..sim import decision_rules as dr
from ..sim.config import add_config_arguments, config_from_args
from ..sim.probes import add_ask_arguments, resolve_decide_at

log = logging.getLogger(__name__)

#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {
    "node": (1, 100_000),
    "service_hours": (1 / 60, 24 * 366),
    "links": (1, 10_000),
    "factor": (1e-3, 1e6),
    "step_s": (1, 86400),
    "chains": (1, 1000),
    "stagger_hours": (0, 24 * 366),
    "offset_hours": (0, 24 * 366),
    "late_nodes": (0, 100_000),
    "guarantee_level": (1e-6, 0.999999),
    "nice": (-2_147_483_645, 2_147_483_645),
    "deadline_s": (1, 366 * 86400),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy",
        default="model",
        help=f"the decision rule: {', '.join(dr.KEEPER_RULES)} or a comma list (one chain each)",
    )
    p.add_argument("--model", default=None, help="trained model (train output URI); needed by decision rule model")
    add_ask_arguments(p, "every queue reading once the predecessor runs")
    p.add_argument(
        "--avg-cal-samples",
        default=None,
        help="sample output URI (training probes) on which avg-cal's threshold is calibrated, as the "
        "probe replay's avg-cal (objective interruption + 0.1 x wasted node-h, ties toward never "
        "early); needed by decision rule avg-cal",
    )
    p.add_argument(
        "--waitpred",
        default=None,
        help="waitpred output URI (the wait predictor fitted on the log's calibration period), asked every "
        "step for a successor submitted now; needed by decision rules " + ", ".join(dr.KEEPER_WAIT_RULES),
    )
    p.add_argument(
        "--guarantee-samples",
        default=None,
        help="sample output URI drawn with --waitpred (the same predictor) on the months before the "
        "service's: guarantee-cal's margin is chosen on it by split conformal calibration (as the "
        "probe replay's guarantee-cal), and the rule is asked at its probes' times; needed by "
        "decision rule guarantee-cal",
    )
    p.add_argument(
        "--guarantee-level",
        type=float,
        default=0.10,
        help="guarantee-cal: the share of the calibration samples' links at most interrupted (0.10)",
    )
    p.add_argument("--node", type=int, default=1, help="nodes of each service job")
    p.add_argument("--service-hours", type=float, default=48.0, help="time limit (= run time) of each job, hours")
    p.add_argument("--links", type=int, default=1, help="successions to keep")
    p.add_argument(
        "--chains",
        type=int,
        default=1,
        help="chains per policy (1); chain c of every policy starts c x --stagger-hours after the first, "
        "so the policies are paired on chains started together; at most policies x chains "
        "service jobs run at once, so keep that small against the cluster's nodes",
    )
    p.add_argument(
        "--stagger-hours",
        type=float,
        default=0.0,
        help="trace hours between the starts of successive chains (0: all at once)",
    )
    p.add_argument(
        "--offset-hours",
        type=float,
        default=0.0,
        help="trace hours from the session's start (the background's, with one) to the first chain's "
        "start (0): a second run over the same window with another offset keeps other links",
    )
    p.add_argument(
        "--late-nodes",
        type=int,
        default=0,
        help="with --slurm-root and --offset-hours: the local cluster's last K nodes stay drained until "
        "the first chain starts (0), so nodes added for the chains (--nodes) do not serve the "
        "background alone before the chains exist; the simulator's prediction has them join then",
    )
    p.add_argument("--factor", type=float, default=1.0, help="time compression of the cluster (1 = a real cluster)")
    p.add_argument("--step-s", type=float, default=600.0, help="trace seconds between queue readings (600)")
    p.add_argument(
        "--nice",
        type=int,
        default=None,
        help="sbatch --nice for the service jobs (negative needs Slurm operator rights); default: 0, "
        "or minus the trace's median recorded priority when a background is replayed",
    )
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--slurm-conf", default=None, help="slurm.conf of the cluster (default: $SLURM_CONF)")
    p.add_argument("--slurm-root", default=None, help="start a local Slurm here for the run, stop it after")
    p.add_argument(
        "--accounting",
        action="store_true",
        help="the cluster keeps accounts (with --slurm-root: start slurmdbd on a local MariaDB with one "
        "account per trace user; the background's jobs name their user's account, the service "
        "account 'service' unless --account; the simulator's prediction keeps the users)",
    )
    p.add_argument("--trace", default=None, help="normalised trace for the background replay")
    p.add_argument("--background-from", default=None, help="replay the trace from here (ISO) while keeping")
    p.add_argument("--background-to", default=None, help="... to here (exclusive)")
    p.add_argument("--deadline-s", type=float, default=7200.0, help="real seconds before the keeper gives up")
    p.add_argument("--stop-chain", action="store_true", help="cancel the chain's last job at the end")
    p.add_argument(
        "--adopt-jobs",
        default=None,
        help="job ids an earlier try of this task submitted (comma-separated; the runner passes the ids "
        "the step announced): each chain whose job is still queued adopts its newest one instead of "
        "submitting (a real cluster; with --slurm-root they ended with that run's cluster)",
    )
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..slurm import keeper as kp
    from ..slurm.conf import SERVICE_ACCOUNT

    policies = [x.strip() for x in args.policy.split(",") if x.strip()]
    bad = [x for x in policies if x not in kp.DECISION_RULES]
    if bad or not policies:
        raise StepError(f"--policy {args.policy!r}: choose from {kp.DECISION_RULES}")
    if len(set(policies)) < len(policies):
        raise StepError(f"--policy {args.policy!r} names a decision rule twice (more chains of one rule: --chains)")
    if dr.AVG_CAL in policies and not args.avg_cal_samples:
        raise StepError("--policy avg-cal needs --avg-cal-samples URI (a sample output of the training period)")
    if dr.GUARANTEE_CAL in policies and not args.guarantee_samples:
        raise StepError("--policy guarantee-cal needs --guarantee-samples URI (a sample output drawn with --waitpred)")
    from ..slurm.livewait import WAIT_RULES

    wait_policies = [x for x in policies if x in WAIT_RULES]
    if wait_policies and not args.waitpred:
        raise StepError(f"--policy {','.join(wait_policies)} needs --waitpred URI (a waitpred output of the log)")
    if dr.MODEL in policies and not args.model:
        raise StepError(
            "--policy model needs --model URI (a train output; mirage_service's param model), "
            "or --policy reactive or avg"
        )
    if args.node < 1 or args.links < 1 or not args.factor > 0 or not args.service_hours > 0 or not args.step_s > 0:
        raise StepError("--node and --links must be >= 1; --factor, --service-hours and --step-s > 0")
    if args.late_nodes and not (args.slurm_root and args.offset_hours > 0):
        raise StepError(
            f"--late-nodes {args.late_nodes} needs --slurm-root (a cluster this run starts: the keeper "
            "never changes a real cluster's nodes) and --offset-hours > 0 (when the nodes join)"
        )
    if args.slurm_root:
        from ..slurm.cluster import check_root

        check_root(args.slurm_root)
    if not args.slurm_root:  # a Slurm client retries a missing slurm.conf for 60 s per call: refuse it at once
        from ..slurm.cluster import check_conf

        check_conf(args.slurm_conf, "--slurm-conf")
    bg = args.background_from is not None or args.background_to is not None
    if bg and not (args.trace and args.background_from and args.background_to):
        raise StepError("a background replay needs --trace, --background-from and --background-to")
    cfg = wl = meta = None
    if bg or args.slurm_root:
        if not args.trace and args.cluster_config is None and args.cfg_nodes is None:
            raise StepError("--slurm-root needs the cluster config (--cluster-config or --nodes)")
        meta_nodes = None
        if args.trace:
            from ..sim.workload import Workload

            df, meta = read_trace(args.trace)
            meta_nodes = meta.machine_nodes
        cfg = config_from_args(args, meta_nodes)
        if args.slurm_root:
            from ..slurm.cluster import check_local_size

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
            wl = Workload.from_frame(df, cfg.procs_per_node or None)
        if bg:
            from ..data.times import window_outside_trace

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
    decide, model_info, decide_at = None, None, "grid"
    if dr.MODEL in policies:  # before the parameters: --decide-at auto resolves on the model's probes
        try:
            decide, model_info = kp.model_decider(args.model)
            decide_at = resolve_decide_at(args.decide_at, model_info.get("trained_offsets_s"), args.model)
        except ValueError as exc:
            raise StepError(str(exc)) from None
    params = {
        k: v
        for k, v in vars(args).items()
        if k not in ("func", "log_level")
        and not (k == "accounting" and not v)
        and not (k == "chains" and v == 1)
        and not (k in ("stagger_hours", "offset_hours", "late_nodes") and v == 0)
    }  # at defaults: earlier runs' keys stay
    for k in ("avg_cal_samples", "waitpred", "guarantee_samples"):  # at their defaults: the keys of earlier runs stay
        if not getattr(args, k):
            params.pop(k, None)
    if dr.GUARANTEE_CAL not in policies:
        params.pop("guarantee_level", None)
    if dr.MODEL not in policies:  # no model is asked: the options change nothing
        params.pop("decide_within", None)
    params.pop("decide_at", None)
    if decide_at == "probes":  # none on the grid: the keys of earlier runs stay
        params["decide_at"] = "probes"
    step = Step(
        "keep-service",
        args.out,
        __version__,
        params,
        inputs=[x for x in (args.trace, args.model, args.avg_cal_samples, args.waitpred, args.guarantee_samples) if x],
    )
    if step.skip():
        return 0
    avg_cal = None
    if dr.AVG_CAL in policies:
        avg_cal = calibrate_avg_cal(args.avg_cal_samples, args.node)
        log.info(
            "avg-cal: threshold %s h on %d samples of %s",
            avg_cal["threshold"],
            avg_cal["n_samples"],
            args.avg_cal_samples,
        )
    gcal = None
    if dr.GUARANTEE_CAL in policies:
        gcal = calibrate_guarantee_cal(args.guarantee_samples, args.node, args.waitpred, args.guarantee_level)
        log.info(
            "guarantee-cal: margin %s h on %d samples of %s (level %g), asked at %s s before the end",
            gcal["threshold"],
            gcal["n_samples"],
            args.guarantee_samples,
            args.guarantee_level,
            gcal["at_s"],
        )
    wait = None
    if wait_policies:
        from ..slurm import livewait
        from ..slurm.compare import sim_config

        if cfg is None:
            cfg = config_from_args(args, None)
        wait = {
            "waitpred": livewait.load(args.waitpred, meta.timezone if meta is not None else "UTC"),
            "wait_cfg": sim_config(cfg, args.factor, args.accounting),
        }
    service_s = hours_to_s(args.service_hours)
    nice = args.nice
    if nice is None:
        nice = -int(round(float(np.nanmedian(wl.priority)))) if (bg and cfg.priority == "trace") else 0
    bg_plan = None
    if bg:
        from ..slurm import replay

        b0, b1 = (
            parse_time(args.background_from, "--background-from"),
            parse_time(args.background_to, "--background-to"),
        )
        t0 = int(b0.timestamp())
        bg_plan = replay.plan(wl, cfg, t0, int(b1.timestamp()), args.factor)
    cluster = None
    if args.slurm_root:
        from ..slurm.cluster import start_local
        from ..slurm.replay import users_of

        users, unknown = users_of(bg_plan)
        cluster = start_local(
            args.slurm_root, cfg, args.factor, accounting=args.accounting, users=users, unknown=unknown
        )
        env, jobcomp = cluster.env(), cluster.paths.jobcomp
    else:
        conf = args.slurm_conf or os.environ.get("SLURM_CONF")
        if not conf:
            raise StepError("no cluster: set SLURM_CONF, pass --slurm-conf, or --slurm-root for a local one")
        env, jobcomp = kp.env_for(conf), None
    adopt = adopted_chains(parse_ids(args.adopt_jobs, "--adopt-jobs"), env, args.partition) if cluster is None else {}
    if args.adopt_jobs and cluster is not None:
        log.info(
            "--adopt-jobs %s: a local cluster started by this run, the earlier jobs ended with theirs", args.adopt_jobs
        )
    dec_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"keeper-{os.getpid()}.jsonl")
    if os.path.exists(dec_path):
        os.unlink(dec_path)
    load0 = open("/proc/loadavg").read().split()[:3]
    t_cpu, t_wall = time.process_time(), time.monotonic()
    children0 = _children_cpu_s()
    from ..slurm.session import Session, markdown

    session = Session(
        env=env,
        jobcomp=jobcomp,
        policies=policies,
        decide=decide,
        background=bg_plan,
        chains=args.chains,
        stagger_s=hours_to_s(args.stagger_hours),
        offset_s=hours_to_s(args.offset_hours),
        late_nodes=[f"n{i}" for i in range(cfg.nodes - args.late_nodes + 1, cfg.nodes + 1)] if args.late_nodes else [],
        t0=t0 if bg else 0,
        accounting=args.accounting,
        owns_cluster=cluster is not None,
        adopt=adopt,
        keeper={
            "node": args.node,
            "service_s": service_s,
            "scale": args.factor,
            "step_s": args.step_s,
            "links": args.links,
            "nice": nice,
            "partition": args.partition,
            "account": args.account or (SERVICE_ACCOUNT if args.accounting else None),
            "log_path": dec_path,
            "stop_chain": args.stop_chain,
            # a real cluster's jobs outlive this process: announced, so a retry of the task adopts them
            "on_submit": (lambda jid: announce("slurm", [jid])) if cluster is None else None,
            "decide_within_s": (model_info or {}).get("trained_span_s") if args.decide_within == "trained" else None,
            "decide_at_s": (model_info or {}).get("trained_offsets_s") if decide_at == "probes" else None,
            "avg_offset_h": None if avg_cal is None else avg_cal["threshold"],
            "guarantee_margin_h": None if gcal is None else gcal["threshold"],
            "guarantee_at_s": None if gcal is None else tuple(gcal["at_s"]),
            **(wait or {}),
        },
    )
    try:
        session.run(args.deadline_s)
        if cluster is not None:  # the phase of its fair-share re-reads, for the simulator's prediction
            from ..slurm.compare import last_recalc_epoch

            session.recalc_epoch = last_recalc_epoch(cluster.paths.state)
            if session.bg_out is not None:  # slurmctld's submission instants to the ms, as replay-slurm
                from ..slurm.compare import precise_submits
                from ..slurm.queue import read_submit_log

                session.submit_epochs = read_submit_log(cluster.paths.ctld_log)
            if session.late_nodes and session.join_epoch is not None:  # slurmctld's instant of the resume
                from ..slurm.queue import read_resume_log

                session.join_epoch = read_resume_log(cluster.paths.ctld_log, session.late_nodes) or session.join_epoch
                session.bg_out = precise_submits(
                    session.bg_out, session.submit_epochs, session.bg_facts["origin_epoch"], session.t0, args.factor
                )
    finally:
        if cluster is not None:
            cluster.stop()
    wall_s, cpu_s = time.monotonic() - t_wall, time.process_time() - t_cpu
    daemons_cpu_s = _children_cpu_s() - children0 if cluster is not None else None
    errors, bg_facts = session.errors, session.bg_facts
    if errors and not session.results:
        raise StepError(f"keep-service failed: {errors}")
    frame = session.links(cfg, args.factor, service_s, args.node, nice, int(args.step_s))
    facts = {
        "loadavg_start": load0,
        "loadavg_end": open("/proc/loadavg").read().split()[:3],
        "cpu_s": round(cpu_s, 2),
        "wall_s": round(wall_s, 1),
        "daemons_cpu_s": None if daemons_cpu_s is None else round(daemons_cpu_s, 2),
        "errors": errors,
        "nice": nice,
        "model": model_info,
        "avg_cal": avg_cal,
        "guarantee_cal": gcal,
        "waitpred": None
        if wait is None
        else {"uri": args.waitpred, "pick": wait["waitpred"].pick, "level": wait["waitpred"].level},
        "background": bg_facts,
        "late_nodes_joined_epoch": session.join_epoch,
    }
    from ..slurm.keeper_stats import jsonable, summary

    step.write_json(
        "keeper.json",
        {
            **params,
            "facts": facts,
            "summary": jsonable(summary(frame, args.factor, args.node)),
            "links": json.loads(frame.to_json(orient="records")),
        },
    )
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    step.write_bytes("links.parquet", buf.getvalue())
    if session.bg_out is not None:  # the background as Slurm ran it: what the simulator's predictions were given
        buf = io.BytesIO()
        session.bg_out.to_parquet(buf, index=False)
        step.write_bytes("background.parquet", buf.getvalue())
    step.write_bytes("decisions.jsonl", open(dec_path, "rb").read() if os.path.exists(dec_path) else b"")
    step.write_bytes(
        "keeper.md", markdown(frame, args.policy, args.node, args.service_hours, args.factor, facts).encode()
    )
    for r in frame.to_dict("records"):
        print(
            f"keep-service {r['policy']} chain {r.get('chain', 0)} link {r['link']}: interruption {r['signed_interruption_h']:+.2f} h "
            f"(simulator {r.get('sim_signed_interruption_h', float('nan')):+.2f} h), wasted "
            f"{r['wasted_node_h']:.2f} node-h",
            flush=True,
        )
    print(
        f"keep-service: wall {wall_s:.0f} s, CPU {cpu_s:.1f} s (keeper, background replay and predictions)"
        + ("" if daemons_cpu_s is None else f", {daemons_cpu_s:.1f} s (the local cluster's daemons)")
        + f", load {' '.join(load0)} -> {' '.join(facts['loadavg_end'])}",
        flush=True,
    )
    step.commit(summary={"links": len(frame), "errors": errors})
    return 0 if not errors else 1


def adopted_chains(ids: list[str], env: dict[str, str], partition: str | None) -> dict[str, str]:
    """Which chain adopts which of ``ids`` (jobs an earlier try submitted): ``{chain tag: the newest
    of its jobs still in the queue}``, the tag read off the job name (``svc-<policy>[-c<c>]-<link>``).
    Jobs no longer queued have ended: their chain starts afresh."""
    if not ids:
        return {}
    from ..slurm.queue import squeue

    queued = {q.job_id: q for q in squeue(env, partition)}
    out: dict[str, str] = {}
    for jid in ids:
        q = queued.get(jid)
        if q is None:
            log.info("--adopt-jobs: job %s is no longer queued", jid)
            continue
        tag = q.name.rsplit("-", 1)[0]
        out[tag] = jid  # ids in submission order: the newest wins
    for tag, jid in out.items():
        print(f"keep-service: chain {tag} adopts job {jid} (submitted by an earlier try)", flush=True)
    return out


def _children_cpu_s() -> float:
    """User + system CPU of this process's reaped children (the local cluster's daemons, once stopped)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def calibrate_guarantee_cal(uri: str, node: int, waitpred: str, level: float) -> dict:
    """guarantee-cal's margin on a sample output drawn with the same wait predictor
    (:func:`~mirage_tasks.evaluation.rules.calibrate_conformal` on its guarantee scores: at
    most ``level`` of its links interrupted, exchangeability assumed) and the probe times it is
    asked at (the samples' end-spaced offsets); a StepError naming ``--guarantee-samples`` where the
    output is missing, of another node size, drawn without the predictor or with another one, or
    not end-spaced. The margin is None where the calibration never submits early."""
    import math

    from stepkit.step import input_fingerprint

    from ..data.artifacts import require_input
    from ..evaluation.rules import Probes, calibrate_conformal
    from ..sim.probes import trained_offsets_s

    flag = "--guarantee-samples"
    marker = require_input(uri, flag, "sample") or {}
    sp = marker.get("params") or {}
    at_s = trained_offsets_s(sp)
    if not at_s:
        raise StepError(
            f"{flag} {uri}: drawn with probe spacing {sp.get('probe_spacing')!r}; guarantee-cal is asked "
            "at fixed times before the end, so it needs end-spaced samples (sample --probe-spacing end)"
        )
    if sp.get("waitpred") != input_fingerprint(waitpred):
        raise StepError(
            f"{flag} {uri}: drawn {'without --waitpred' if not sp.get('waitpred') else 'with another wait predictor'}"
            f"; the margin is calibrated for the predictor the keeper asks (--waitpred {waitpred})"
        )
    pr = Probes(uri, with_x=False)
    nodes = pr.meta["node"].unique() if "node" in pr.meta else []
    if len(nodes) and set(int(n) for n in nodes) != {int(node)}:
        raise StepError(
            f"{flag} {uri}: probes of {sorted(int(n) for n in nodes)} node(s), the service has --node {node}"
        )
    cal = calibrate_conformal(pr.guarantee_score(), pr.y, pr.sample, level=level)
    thr = cal["threshold"]
    return {
        **{
            k: cal[k]
            for k in ("level", "n_samples", "k", "attainable", "validation_interrupted", "validation_mean_wasted_h")
        },
        "threshold": thr if math.isfinite(thr) else None,
        "at_s": [int(x) for x in at_s],
        "samples": uri,
    }


def calibrate_avg_cal(uri: str, node: int) -> dict:
    """avg-cal's threshold on a sample output's probes (:func:`~mirage_tasks.evaluation.rules.calibrate_avg`:
    the objective interruption + 0.1 x wasted node-h, ties toward never early); a StepError naming
    ``--avg-cal-samples`` where the output is missing or of another node size."""
    from ..data.artifacts import require_input
    from ..evaluation.rules import Probes, calibrate_avg
    from ..slurm.keeper_stats import W

    require_input(uri, "--avg-cal-samples", "sample")
    try:
        pr = Probes(uri, with_x=False)
    except FileNotFoundError as exc:
        raise StepError(f"--avg-cal-samples {uri}: not a sample output ({exc})") from None
    nodes = pr.meta["node"].unique() if "node" in pr.meta else []
    if len(nodes) and set(int(n) for n in nodes) != {int(node)}:
        raise StepError(
            f"--avg-cal-samples {uri}: probes of {sorted(int(n) for n in nodes)} node(s), the service has --node {node}"
        )
    cal = calibrate_avg(pr, node, W, load=False)
    return {
        "threshold": cal["threshold"],
        "never_submits_early": cal["never_submits_early"],
        "n_samples": cal["n_samples"],
        "objective": cal["chosen"]["objective"],
        "reactive_objective": cal["reactive"]["objective"],
        "samples": uri,
    }
