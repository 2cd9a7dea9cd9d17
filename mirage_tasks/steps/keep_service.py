"""``python -m mirage_tasks keep-service``: keep a service alive on a Slurm cluster.

Runs the service keeper (:mod:`mirage_tasks.slurm.keeper`) for ``--links`` successions of a
chain of ``--node``-node jobs of ``--service-hours`` each, with one or more policies
(``--policy model,reactive,avg,avg-cal``: one chain each, side by side on the same cluster, so
the policies are paired on it).

Against a real cluster: ``SLURM_CONF`` (or ``--slurm-conf``) names it, ``--factor 1``,
``--partition``/``--account`` say where and as whom; the keeper submits as the user it runs
as and cancels only what it submitted (with ``--stop-chain``; otherwise nothing).

The measurement mode (a local Slurm of the run's own, a trace window replayed on it as the
background, the simulator's prediction beside each chain, several chains per policy) is the
lab's ``python -m lab keeper-slurm``: its flags and this step's, and it runs this step's
:func:`run` with its :class:`Measurement`.

Outputs: ``links.parquet`` (one row per link, chain and policy), ``decisions.jsonl`` (every
decision with its inputs), ``keeper.json`` (with ``summary``: per policy, the mean interruption,
interrupted share, waste and objective with intervals, and the paired difference to reactive
and avg, :mod:`mirage_tasks.slurm.keeper_stats`), ``keeper.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time
from typing import Any, Protocol

from stepkit import Step, StepError
from stepkit.external import announce, parse_ids

from .. import __version__
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
    "guarantee_level": (1e-6, 0.999999),
    "nice": (-2_147_483_645, 2_147_483_645),
    "deadline_s": (1, 366 * 86400),
}


class Measurement(Protocol):
    """What the lab's measurement mode (``python -m lab keeper-slurm``) adds to a run: a cluster
    of its own with a background, and what it measured. :func:`run` calls, in order: ``check``
    (its flags, before anything is read; sets ``cfg``, ``meta``), ``params`` (its keys of the
    step's parameters), ``start`` (the cluster: ``(env, jobcomp)``), ``session`` (the session,
    given the product's keyword arguments), ``finish`` (after the chains), ``stop`` (always),
    ``facts`` and ``write`` (its outputs)."""

    cfg: Any  # the cluster configuration (a SimConfig), or None
    meta: Any  # the background trace's metadata, or None
    accounting: bool  # the cluster keeps accounts
    inputs: list[str]  # its input URIs (the trace)

    def check(self, args: argparse.Namespace, policies: list[str]) -> None: ...
    def params(self, params: dict) -> None: ...
    def default_nice(self, args: argparse.Namespace) -> int: ...
    def start(self, args: argparse.Namespace) -> tuple[dict[str, str], str | None]: ...
    def session(self, **kwargs: Any) -> Any: ...
    def finish(self, session: Any) -> None: ...
    def stop(self) -> None: ...
    def facts(self, session: Any) -> dict: ...
    def write(self, step: Step, session: Any) -> None: ...


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
    p.add_argument("--factor", type=float, default=1.0, help="time compression of the cluster (1 = a real cluster)")
    p.add_argument("--step-s", type=float, default=600.0, help="trace seconds between queue readings (600)")
    p.add_argument(
        "--nice",
        type=int,
        default=None,
        help="sbatch --nice for the service jobs (negative needs Slurm operator rights); default: 0 "
        "(keeper-slurm with a background: minus the trace's median recorded priority)",
    )
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--slurm-conf", default=None, help="slurm.conf of the cluster (default: $SLURM_CONF)")
    p.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="real seconds before the keeper gives up on a decision or a start; default: no limit of its own "
        "(a real chain of 48 h jobs runs for days: the task's timeout and the DAG's deadline alert watch it)",
    )
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


def run(args: argparse.Namespace, measure: Measurement | None = None) -> int:
    """The step; ``measure`` is the lab's measurement mode (:class:`Measurement`), or None."""
    from ..slurm import keeper as kp

    policies = [x.strip() for x in args.policy.split(",") if x.strip()]
    bad = [x for x in policies if x not in kp.DECISION_RULES]
    if bad or not policies:
        raise StepError(f"--policy {args.policy!r}: choose from {kp.DECISION_RULES}")
    if len(set(policies)) < len(policies):
        raise StepError(
            f"--policy {args.policy!r} names a decision rule twice (one chain per rule; more chains of one "
            "rule: the measurement mode's --chains)"
        )
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
    if measure is not None:
        measure.check(args, policies)
    else:  # a Slurm client retries a missing slurm.conf for 60 s per call: refuse it at once
        from ..slurm.queue import check_conf

        check_conf(args.slurm_conf, "--slurm-conf")
    cfg, meta = (measure.cfg, measure.meta) if measure is not None else (None, None)
    decide, model_info, decide_at = None, None, "grid"
    if dr.MODEL in policies:  # before the parameters: --decide-at auto resolves on the model's probes
        try:
            decide, model_info = kp.model_decider(args.model)
            decide_at = resolve_decide_at(args.decide_at, model_info.get("trained_offsets_s"), args.model)
        except ValueError as exc:
            raise StepError(str(exc)) from None
    params = {k: v for k, v in vars(args).items() if k not in ("func", "log_level")}
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
    if measure is not None:
        measure.params(params)
    step = Step(
        "keep-service",
        args.out,
        __version__,
        params,
        inputs=[
            x
            for x in (
                *(measure.inputs if measure is not None else ()),
                args.model,
                args.avg_cal_samples,
                args.waitpred,
                args.guarantee_samples,
            )
            if x
        ],
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
        from ..slurm.conf import sim_config

        if cfg is None:
            cfg = config_from_args(args, None)
        wait = {
            "waitpred": livewait.load(args.waitpred, meta.timezone if meta is not None else "UTC"),
            "wait_cfg": sim_config(cfg, args.factor, measure is not None and measure.accounting),
        }
    service_s = hours_to_s(args.service_hours)
    nice = args.nice
    if nice is None:
        nice = measure.default_nice(args) if measure is not None else 0
    if measure is not None:
        env, jobcomp = measure.start(args)
    else:
        env, jobcomp = kp.env_for(args.slurm_conf or os.environ.get("SLURM_CONF")), None
    adopt = adopted_chains(parse_ids(args.adopt_jobs, "--adopt-jobs"), env, args.partition) if measure is None else {}
    if args.adopt_jobs and measure is not None:
        log.info("--adopt-jobs %s: a cluster started by this run, the earlier jobs ended with theirs", args.adopt_jobs)
    dec_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"keeper-{os.getpid()}.jsonl")
    if os.path.exists(dec_path):
        os.unlink(dec_path)
    load0 = open("/proc/loadavg").read().split()[:3]
    t_cpu, t_wall = time.process_time(), time.monotonic()
    from ..slurm.session import Session, markdown

    keeper = {
        "node": args.node,
        "service_s": service_s,
        "scale": args.factor,
        "step_s": args.step_s,
        "links": args.links,
        "nice": nice,
        "partition": args.partition,
        "account": args.account,
        "log_path": dec_path,
        "stop_chain": args.stop_chain,
        # a real cluster's jobs outlive this process: announced, so a retry of the task adopts them
        "on_submit": (lambda jid: announce("slurm", [jid])) if measure is None else None,
        "decide_within_s": (model_info or {}).get("trained_span_s") if args.decide_within == "trained" else None,
        "decide_at_s": (model_info or {}).get("trained_offsets_s") if decide_at == "probes" else None,
        "avg_offset_h": None if avg_cal is None else avg_cal["threshold"],
        "guarantee_margin_h": None if gcal is None else gcal["threshold"],
        "guarantee_at_s": None if gcal is None else tuple(gcal["at_s"]),
        **(wait or {}),
    }
    common = {"env": env, "jobcomp": jobcomp, "policies": policies, "decide": decide, "keeper": keeper}
    session = measure.session(**common) if measure is not None else Session(**common, adopt=adopt)
    try:
        session.run(args.deadline_s)
        if measure is not None:
            measure.finish(session)
    finally:
        if measure is not None:
            measure.stop()
    wall_s, cpu_s = time.monotonic() - t_wall, time.process_time() - t_cpu
    errors = session.errors
    if errors and not session.results:
        raise StepError(f"keep-service failed: {errors}")
    frame = session.links(cfg, args.factor, service_s, args.node, nice, int(args.step_s))
    facts = {
        "loadavg_start": load0,
        "loadavg_end": open("/proc/loadavg").read().split()[:3],
        "cpu_s": round(cpu_s, 2),
        "wall_s": round(wall_s, 1),
        "errors": errors,
        "nice": nice,
        "model": model_info,
        "avg_cal": avg_cal,
        "guarantee_cal": gcal,
        "waitpred": None
        if wait is None
        else {"uri": args.waitpred, "pick": wait["waitpred"].pick, "level": wait["waitpred"].level},
        **(measure.facts(session) if measure is not None else {}),
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
    if measure is not None:
        measure.write(step, session)
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
    daemons_cpu_s = facts.get("daemons_cpu_s")
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
