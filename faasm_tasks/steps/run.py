"""Run an experiment's points against a deployed target.

Each trial, one (point, arm, repeat), gets ``.../<params>/repeat-<r>/attempt-<k>/`` (an arm
of the A/A control: ``repeat-<r>.<arm>``, :func:`faasm_tasks.order.repeat_dir`). For load
points the load mode, the driver and (open loop) the offered rate are part of the parameters,
so a rerun at another ``--rate`` is a new point.

Order: the trials run in one order shuffled with a seed (``--seed``; by default derived from
the run id, so a retry measures in the same order), not a point's repeats one after another
(:mod:`faasm_tasks.order`); the seed and the order are in the run's ``_ops`` report
(``order``) and in each attempt's record (``trial``, ``seed``). ``--aa-control`` measures the
system as two arms ``A`` and ``A'`` in the same deployment, interleaved the same way: the
day's A/A control (:func:`faasm_tasks.stats.aa_verdict`).

A trial whose latest attempt succeeded is skipped (so a retried task resumes where it failed)
unless ``--rerun`` asks for new attempts. A failing trial is recorded as ``failed`` with what
it produced; a load point whose numbers cannot be trusted (offered rate not reached, too many
late or unsent requests, too few requests for its percentiles: ``results.judge_load``) is
recorded ``invalid`` with the reasons. The run goes on to the next trial; the step exits 1 if
any trial failed or is invalid, which fails the DAG run.

Never hangs: every wait of a point is bounded by :func:`point_budget`, the workload's own
bound of the point (its duration for load points, its epochs or matrix size for calls), and
while a call is polled the target's liveness is checked at every poll, so a dead worker
fails the point within about one poll interval. The step stops (said in the report:
``trials_cut_by_budget``, ``repeats_done``) before a trial that would pass the time budget
(the experiment's, :func:`faasm_tasks.workloads.time_budget_s`, or a smaller
``--time-budget-min``), judged from the mean time of the trials so far; as the order is
shuffled, what is left out is spread over every point and arm.

What a point does is its workload's (:mod:`faasm_tasks.workloads`, :mod:`faasm_tasks.points`);
this step is the loop over the trials.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
import traceback
from typing import Any

from stepkit import StepError

from .. import billing, order, points as pts, procs, workloads
from ..catalogue import replicas_for
from ..clients import UploadClient, make_invoker
from ..common import add_common, add_replicas, load_plan, parse_set, record_state_keys, run_date
from ..loadgen import CLIENT_ISOLATION
from ..points import point_budget  # the step's bound of a point, public here too
from ..results import Attempt, latest_record, point_prefix, write_failure_report, write_op_report
from ..targets import get_target

log = logging.getLogger(__name__)


def add_arguments(p):
    add_common(p, experiment=True, experiment_required=True)
    p.add_argument("--rerun", action="store_true", help="new attempts even for points that already succeeded")
    p.add_argument("--repeats", type=int, help="override the catalogue's repeat count (per point and arm)")
    p.add_argument(
        "--seed",
        type=_seed,
        help="seed of the randomized order of the trials (default: derived from the run id, experiment and "
        "system, so a retry measures in the same order)",
    )
    p.add_argument(
        "--aa-control",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="measure the system as two arms A and A' (same deployment, interleaved): the A/A control",
    )
    p.add_argument(
        "--time-budget-min",
        type=float,
        help="minutes the step's trials may take (default and upper bound: the experiment's time budget)",
    )
    p.add_argument("--only", action="append", default=[], help="run only points matching key=value (repeatable)")
    p.add_argument("--set", action="append", default=[], help="parameter override key=value")
    p.add_argument("--driver", choices=["builtin", "wrk"], default="builtin", help="load generator for load points")
    p.add_argument("--mode", choices=["closed", "open"], help="override the load mode")
    p.add_argument("--rate", type=float, help="open mode: offered requests/s")
    p.add_argument("--threads", type=int, help="load-driver processes (override the catalogue's threads)")
    p.add_argument(
        "--clients",
        type=int,
        help="load clients started together by one controller, each driving 1/N of the rate "
        "(override the catalogue's clients, default 1; the knative target's --client-hosts sets N)",
    )
    p.add_argument(
        "--client-isolation",
        choices=list(CLIENT_ISOLATION),
        help="load clients on this host: netns (each in its own network namespace, needs root) or "
        "process (plain processes); default the catalogue's, netns",
    )
    p.add_argument("--no-billing", action="store_true")
    add_replicas(p)
    p.add_argument(
        "--matrix-source",
        choices=["auto", "generate", "s3"],
        default="auto",
        help="matrix data per size: s3 (the per-size archives upload-data put in the data bucket; "
        "auto on knative) or generate (from the seed; auto on the local target)",
    )
    p.add_argument("--bucket", help="data bucket (default from the catalogue, faasm-data)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint of the data bucket (e.g. a MinIO or moto server)")
    p.add_argument(
        "--ready-timeout",
        type=float,
        default=900.0,
        help="--replicas per-point: seconds to wait for each redeployment to be ready",
    )
    p.add_argument(
        "--keep-billing",
        action="store_true",
        help="local target: leave the sampler running for collect to stop "
        "(knative: the billing DaemonSet runs until collect)",
    )
    p.add_argument("--no-restart", action="store_true", help="skip the soft restarts between points")
    p.add_argument(
        "--verify",
        choices=["auto", "yes", "no"],
        default="auto",
        help="matrix product check: auto: every entry up to size 1000, sampled entries above; yes: every "
        "entry; no: unchecked (the other workloads' checks always run)",
    )
    p.add_argument(
        "--max-late-fraction",
        type=float,
        default=0.01,
        help="open loop: a point with a larger share of requests late (> 5 ms) or never sent is invalid (default 0.01)",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=100,
        help="a load point with fewer successful requests is invalid (p99 needs 100; default 100)",
    )
    p.add_argument(
        "--call-timeout",
        type=float,
        help="seconds a call point may take (default: derived from the point, see point_budget)",
    )


def _seed(text: str) -> int | None:
    """``--seed``: a non-negative integer, or empty (the form's empty field): the default."""
    if text.strip() in ("", "None"):
        return None
    v = int(text)
    if v < 0:
        raise ValueError("negative")
    return v


def _matches(point: dict[str, Any], only: dict[str, Any]) -> bool:
    return all(str(point.get(k)) == str(v) for k, v in only.items())


def run(args) -> int:
    """The loop over points (:func:`_run`); a run that fails before it can report its points (bad
    input, no deployment, a SIGTERM) leaves a ``run-*.json`` report with ``"failed": true``, so the
    day's summary counts the group as failed, and says truthfully what it stopped."""
    date = run_date(args)
    stopped: list[str] = []
    try:
        return _run(args, date, stopped)
    except BaseException as exc:
        if getattr(exc, "cleanup", None) is None:
            exc.cleanup = ("; ".join(stopped) if stopped else "it had started no process of its own") + (  # type: ignore[attr-defined]
                "; the deployment (workers it restarted included) is left for teardown"
            )
        write_failure_report(
            args.results,
            date,
            args.run_id,
            "run",
            exc,
            {"experiment": args.experiment, "system": args.system, "target": args.target, "cleanup": exc.cleanup},
        )  # type: ignore[attr-defined]
        raise


def _run(args, date: str, stopped: list[str]) -> int:
    plan = load_plan(args, parse_set(args.set))
    record_state_keys(args, plan)  # what teardown deletes, without reading the catalogue
    only = parse_set(args.only)
    points = [p for p in plan.points if _matches(p, only)]
    if not points:
        raise StepError(f"no point of {plan.name}/{plan.system} matches {only}")
    pts.refuse_inert(args, plan)
    # the order of the trials, drawn before anything starts (bad input: nothing to stop)
    repeats = args.repeats or plan.repeats
    if repeats < 1:
        raise StepError(f"--repeats must be at least 1, got {repeats}")
    arms: tuple[str | None, ...] = order.AA_ARMS if args.aa_control else (None,)
    # (--seed is refused when negative as it is parsed; the derived one never is)
    seed = args.seed if args.seed is not None else order.default_seed(args.run_id, plan.name, plan.system)
    budget_s, budget_note = _budget(args, plan)
    redeploy = args.replicas == "per-point" and plan.experiment.get("replicas_from") and args.target != "local"
    # a point's deployment depends on its own parameters only, not on what its folder key adds
    wants = [replicas_for(plan, p) for p in points] if redeploy else None
    blocks = [json.dumps(w, sort_keys=True) for w in wants] if wants else None
    trials = order.trials(len(points), repeats, seed, arms, blocks)
    procs.label_self(procs.run_label(args.state_dir, args.run_id), "run")
    target = get_target(args.target, args)
    ep = target.endpoints()
    # the points' folder keys: their parameters and, for load points, what decides the measurement
    # (the target's endpoints: their load client hosts count)
    keys = [pts.point_key(args, plan, p, ep) for p in points]
    if args.protocol:
        ep.protocol = args.protocol
    info = target.describe()
    sampler = billing.start_for_run(args, plan, target)

    def health() -> str | None:
        """What broke under the point: the target, or the billing sampler this step started."""
        problem = target.health()
        if problem is None and sampler is not None and sampler.get("pid"):
            problem = billing.sampler_problem(sampler)
        return problem

    ctx = pts.PointContext(args, plan, target, ep, make_invoker(ep), UploadClient(ep.upload_url), health)
    print(
        f"run: {len(trials)} trials ({len(keys)} point(s) x {len(arms)} arm(s) x {repeats} repeat(s)) in an "
        f"order randomized with seed {seed}; time budget {budget_s:.0f} s",
        flush=True,
    )
    results: list[dict[str, Any]] = []
    cut: list[order.Trial] = []
    deployed: dict[str, Any] | None = None  # what this step last deployed (per-point replicas)
    t0, measured = time.monotonic(), 0
    try:
        for n, trial in enumerate(trials):
            point = keys[trial.point]
            spent = time.monotonic() - t0
            if measured and spent + spent / measured > budget_s:
                cut = trials[n:]  # the rest of the shuffled order: spread over every point and arm
                print(
                    f"run: stopping after {n} of {len(trials)} trials: the next would pass the "
                    f"{budget_s:.0f} s time budget ({len(cut)} left out)",
                    flush=True,
                )
                break
            prefix = point_prefix(
                args.results, date, args.run_id, plan.name, plan.system, point, trial.repeat, trial.arm
            )
            prev = latest_record(prefix)
            if prev and prev["status"] == "succeeded" and not args.rerun:
                print(f"run: skip {prefix} (attempt {prev['attempt']} succeeded)", flush=True)
                results.append({"prefix": prefix, "status": "skipped", **trial.to_dict(), "trial": n})
                continue
            if wants is not None:
                want = wants[trial.point]
                if want != deployed:  # the manual: deploy N replicas, then run with N workers
                    print(f"run: redeploying with {want}", flush=True)
                    plan.deployment = want
                    target.deploy(plan)
                    target.wait_ready(args.ready_timeout)
                    deployed = want
            extra = {"trial": n, "seed": seed, **({"arm": trial.arm} if trial.arm is not None else {})}
            got = _run_point(ctx, info, point, trial.repeat, prefix, first=(measured == 0), date=date, extra=extra)
            results.append({**got, **trial.to_dict(), "trial": n})
            measured += 1
    except BaseException:
        # interrupted (a SIGTERM, a bug): the sampler goes too, even with --keep-billing (collect
        # finds it already stopped); the load driver stops its own processes as the point unwinds
        if sampler:
            res = billing.stop_sampler(args.state_dir, args.run_id)
            stopped.append(f"the billing sampler it started (pid {sampler.get('pid')}): {res.get('action')}")
        raise
    if sampler and not args.keep_billing:
        billing.stop_sampler(args.state_dir, args.run_id)
    failed = [r for r in results if r["status"] == "failed"]
    invalid = [r for r in results if r["status"] == "invalid"]
    write_op_report(
        args.results,
        date,
        args.run_id,
        "run",
        {
            "experiment": plan.name,
            "system": plan.system,
            "target": args.target,
            "points": results,
            "repeats": repeats,
            "arms": [a for a in arms if a is not None],
            "aa_control": bool(args.aa_control),
            "order": {
                "randomized": True,
                "seed": seed,
                "seed_from": "--seed" if args.seed is not None else "the run id, experiment and system",
                "blocks": "per-point deployments, shuffled" if blocks else "one",
                "trials": len(trials),
            },
            "time_budget_s": round(budget_s),
            "time_budget_note": budget_note,
            "trials_cut_by_budget": [t.to_dict() | {"params": keys[t.point]} for t in cut],
            "repeats_done": _repeats_done(results, keys, arms),
        },
    )
    print(
        f"run: {len(results) - len(failed) - len(invalid)} ok/skipped, {len(failed)} failed, {len(invalid)} invalid",
        flush=True,
    )
    if pts.STUCK:
        # a load driver overran its bound and cannot be joined: leave now (teardown stops its forks)
        logging.shutdown()
        os._exit(1)
    return 1 if failed or invalid else 0


def _between_points(args, plan, target, first: bool, budget: float) -> dict[str, Any]:
    bp = plan.experiment.get("between_points", {})
    done: dict[str, Any] = {}
    if bp.get("delete_state_keys"):
        done["state_keys_deleted"] = target.delete_state_keys(bp["delete_state_keys"])
    if bp.get("flush_queue"):
        done["queue_keys_flushed"] = target.flush_queue()
    if bp.get("soft_restart") and not args.no_restart and not first:
        done["soft_restart"] = target.soft_restart(timeout_s=min(600.0, 60.0 + budget))
    return done


def _budget(args, plan) -> tuple[float, str]:
    """The step's time budget in seconds and where it comes from: the experiment's (the DAG's
    run timeout is built from it), or ``--time-budget-min`` when that is smaller."""
    own = workloads.time_budget_s(plan.experiment)
    if args.time_budget_min is None or args.time_budget_min <= 0:
        return own, "the experiment's time budget (faasm_tasks.workloads)"
    asked = 60.0 * args.time_budget_min
    if asked > own:
        return own, (
            f"--time-budget-min {args.time_budget_min:g} is above the experiment's {own / 60:.0f} min "
            "(the DAG's run timeout): the experiment's"
        )
    return asked, f"--time-budget-min {args.time_budget_min:g}"


def _repeats_done(results: list[dict[str, Any]], keys: list[dict[str, Any]], arms) -> list[dict[str, Any]]:
    """Per point and arm: the trials that succeeded (or were skipped as succeeded) this step."""
    out = []
    for i, key in enumerate(keys):
        for arm in arms:
            mine = [r for r in results if r["point"] == i and r["arm"] == arm]
            out.append(
                {
                    "params": key,
                    "arm": arm,
                    "ok": sum(r["status"] in ("succeeded", "skipped") for r in mine),
                    "tried": len(mine),
                }
            )
    return out


def _run_point(ctx: pts.PointContext, info, point, rep, prefix, first, date, extra=None) -> dict[str, Any]:
    """One attempt of one point, by its workload's runner."""
    args, plan = ctx.args, ctx.plan
    base = {
        "run_id": args.run_id,
        "date": date,
        "experiment": plan.name,
        "system": plan.system,
        "target": args.target,
        "protocol": ctx.endpoints.protocol,
        "params": point,
        "repeat": rep,
        **(extra or {}),
        "images": info.get("images", {}),
        "target_info": info,
    }
    att = Attempt(prefix, base)
    print(f"run: {plan.name}/{plan.system} {point} repeat {rep} -> {att.uri}", flush=True)
    t_start = time.time()
    budget = point_budget(plan, point, args.call_timeout)
    billing_wanted = bool(plan.experiment.get("billing", False) and not args.no_billing)
    try:
        prep = _between_points(args, plan, ctx.target, first, budget)
        ok, metrics, err, invalid = pts.RUNNERS[plan.workload.runner](ctx, att, point, budget)
        metrics.update(
            between_points=prep,
            budget_s=round(budget, 1),
            window={"start": t_start, "end": time.time()},
            billing_wanted=billing_wanted,
        )  # collect: a window without samples is then said so
        att.finish(ok, err, metrics, 0 if ok else 1, invalid_reasons=invalid)
    except Exception as exc:  # noqa: BLE001 - keep partial results, mark the attempt failed
        tb = traceback.format_exc()
        try:
            att.write_text("error.txt", tb)
        except Exception:  # noqa: BLE001
            pass
        att.finish(
            False,
            f"{type(exc).__name__}: {exc}",
            {"window": {"start": t_start, "end": time.time()}, "billing_wanted": billing_wanted},
            1,
        )
        log.error("point failed: %s", tb)
    status, err = att.record["status"], att.record["outcome"].get("error")
    print(f"run:   {status}" + (f": {err}" if err else ""), flush=True)
    return {"prefix": prefix, "attempt": att.record["attempt"], "status": status}
