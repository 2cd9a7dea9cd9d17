"""``python -m mirage_tasks keep-service``: keep a service alive on a Slurm cluster.

Runs the service keeper (:mod:`mirage_tasks.slurm.keeper`) for ``--links`` successions of a
chain of ``--node``-node jobs of ``--service-hours`` each, with one or more policies
(``--policy model,reactive,avg``: one chain per policy, side by side on the same cluster).

Against a real cluster: ``SLURM_CONF`` (or ``--slurm-conf``) names it, ``--factor 1``,
``--partition``/``--account`` say where and as whom; the keeper submits as the user it runs
as and cancels only what it submitted (with ``--stop-chain``; otherwise nothing).

The measurement mode (local Slurm): ``--slurm-root DIR`` starts a local cluster from the
cluster config at ``--factor`` and ``--background-from``/``--background-to`` replay that
trace window on it (time-compressed) while the chains run; afterwards the simulator
predicts each chain from the same background (:mod:`mirage_tasks.slurm.keeper_sim`), and
the result rows hold the real and the predicted interruption side by side.

Outputs: ``links.parquet`` (one row per link and policy, real and simulated),
``decisions.jsonl`` (every decision with its inputs), ``keeper.json``, ``keeper.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import threading
import time

from stepkit import Step, StepError

from .. import __version__
from ..data.schema import parse_time, read_trace
from ..data.times import hours_to_s
from ..sim.config import add_config_arguments, config_from_args


#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {"node": (1, 100_000), "service_hours": (1 / 60, 24 * 366), "links": (1, 10_000), "factor": (1e-3, 1e6),
          "step_s": (1, 86400), "nice": (-2_147_483_645, 2_147_483_645), "deadline_s": (1, 366 * 86400)}

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="model", help="model, reactive, avg or a comma list (one chain each)")
    p.add_argument("--model", default=None, help="trained model (train output URI); needed by policy model")
    p.add_argument("--node", type=int, default=1, help="nodes of each service job")
    p.add_argument("--service-hours", type=float, default=48.0, help="time limit (= run time) of each job, hours")
    p.add_argument("--links", type=int, default=1, help="successions to keep")
    p.add_argument("--factor", type=float, default=1.0, help="time compression of the cluster (1 = a real cluster)")
    p.add_argument("--step-s", type=float, default=600.0, help="trace seconds between queue readings (600)")
    p.add_argument("--nice", type=int, default=None,
                   help="sbatch --nice for the service jobs (negative needs Slurm operator rights); default: 0, "
                        "or minus the trace's median recorded priority when a background is replayed")
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--slurm-conf", default=None, help="slurm.conf of the cluster (default: $SLURM_CONF)")
    p.add_argument("--slurm-root", default=None, help="start a local Slurm here for the run, stop it after")
    p.add_argument("--accounting", action="store_true",
                   help="the cluster keeps accounts (with --slurm-root: start slurmdbd on a local MariaDB with one "
                        "account per trace user; the background's jobs name their user's account, the service "
                        "account 'service' unless --account; the simulator's prediction keeps the users)")
    p.add_argument("--trace", default=None, help="normalised trace for the background replay")
    p.add_argument("--background-from", default=None, help="replay the trace from here (ISO) while keeping")
    p.add_argument("--background-to", default=None, help="... to here (exclusive)")
    p.add_argument("--deadline-s", type=float, default=7200.0, help="real seconds before the keeper gives up")
    p.add_argument("--stop-chain", action="store_true", help="cancel the chain's last job at the end")
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import pandas as pd

    from ..slurm import keeper as kp
    from ..slurm.conf import SERVICE_ACCOUNT

    policies = [x.strip() for x in args.policy.split(",") if x.strip()]
    bad = [x for x in policies if x not in kp.POLICIES]
    if bad or not policies:
        raise StepError(f"--policy {args.policy!r}: choose from {kp.POLICIES}")
    if "model" in policies and not args.model:
        raise StepError("--policy model needs --model URI (a train output; mirage_service's param model), "
                        "or --policy reactive or avg")
    if args.node < 1 or args.links < 1 or not args.factor > 0 or not args.service_hours > 0 or not args.step_s > 0:
        raise StepError("--node and --links must be >= 1; --factor, --service-hours and --step-s > 0")
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
        if args.trace:
            wl = Workload.from_frame(df, cfg.procs_per_node or None)
        if bg:
            from ..data.times import window_outside_trace

            b0, b1 = parse_time(args.background_from, "--background-from"), parse_time(args.background_to,
                                                                                          "--background-to")
            if df.empty:
                raise StepError(f"{args.trace}: the trace holds no jobs")
            why = window_outside_trace(df["submit"].min(), df["submit"].max(), b0, b1,
                                       "--background-from/--background-to", args.trace)
            if why:
                raise StepError(why)
    params = {k: v for k, v in vars(args).items() if k not in ("func", "log_level")
              and not (k == "accounting" and not v)}  # off: the keys of earlier runs stay as they were
    step = Step("keep-service", args.out, __version__, params, inputs=[x for x in (args.trace, args.model) if x])
    if step.skip():
        return 0
    decide, model_info = (None, None)
    if "model" in policies:
        try:
            decide, model_info = kp.model_decider(args.model)
        except ValueError as exc:
            raise StepError(str(exc)) from None
    service_s = hours_to_s(args.service_hours)
    nice = args.nice
    if nice is None:
        nice = -int(round(float(np.nanmedian(wl.priority)))) if (bg and cfg.priority == "trace") else 0
    bg_plan = None
    if bg:
        from ..slurm import replay

        b0, b1 = parse_time(args.background_from, "--background-from"), parse_time(args.background_to,
                                                                                      "--background-to")
        t0 = int(b0.timestamp())
        bg_plan = replay.plan(wl, cfg, t0, int(b1.timestamp()), args.factor)
    cluster = None
    if args.slurm_root:
        from ..slurm.cluster import start_local

        from ..slurm.replay import users_of

        users, unknown = users_of(bg_plan)
        cluster = start_local(args.slurm_root, cfg, args.factor, accounting=args.accounting, users=users,
                              unknown=unknown)
        env, jobcomp = cluster.env(), cluster.paths.jobcomp
    else:
        conf = args.slurm_conf or os.environ.get("SLURM_CONF")
        if not conf:
            raise StepError("no cluster: set SLURM_CONF, pass --slurm-conf, or --slurm-root for a local one")
        env, jobcomp = kp.env_for(conf), None
    dec_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"keeper-{os.getpid()}.jsonl")
    if os.path.exists(dec_path):
        os.unlink(dec_path)
    load0 = open("/proc/loadavg").read().split()[:3]
    t_cpu = time.process_time()
    results: dict[str, list[dict]] = {}
    errors: dict[str, str] = {}
    bg_out = bg_facts = None
    stop = threading.Event()
    bg_ids: dict[int, str] = {}
    keepers: dict = {}

    def _nap(seconds: float) -> None:  # a keeper's sleep: it ends at once when the step stops
        if stop.wait(seconds):
            raise _Stopped("the step is stopping")

    bg_thread = None
    try:
        if bg:
            jobs = bg_plan
            box: dict = {}

            def _bg() -> None:
                try:
                    box["out"] = replay.run(jobs, env, jobcomp, args.factor, t0, tag="bg", drain_s=0.0, stop=stop,
                                            submitted=bg_ids, accounts=args.accounting)
                except Exception as exc:  # reported below
                    box["error"] = repr(exc)

            bg_thread = threading.Thread(target=_bg, daemon=True)
            bg_thread.start()
            while not jobs.empty and "out" not in box and "error" not in box:  # warm set submitted first
                time.sleep(0.5)
                if _submitted_warm(env, int((jobs["kind"] != "window").sum() - jobs["too_big"].sum())):
                    break
        keepers = {p: kp.Keeper(env=env, policy=p, node=args.node, service_s=service_s, scale=args.factor,
                                step_s=args.step_s, links=args.links, decide=decide if p == "model" else None,
                                tag=f"svc-{p}", nice=nice, partition=args.partition,
                                account=args.account or (SERVICE_ACCOUNT if args.accounting else None),
                                log_path=dec_path, stop_chain=args.stop_chain, sleep=_nap) for p in policies}

        def _keep(p: str) -> None:
            try:
                results[p] = keepers[p].run(deadline_s=args.deadline_s)
            except _Stopped:
                pass
            except Exception as exc:
                errors[p] = repr(exc)

        threads = [threading.Thread(target=_keep, args=(p,), daemon=True) for p in policies]
        for p, t in zip(policies, threads):
            keepers[p].thread = t
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if bg_thread is not None:
            stop.set()
            bg_thread.join(timeout=120)
            if "error" in box:
                errors["background"] = box["error"]
            else:
                bg_out, bg_facts = box.get("out", (None, None))
    except BaseException:  # SIGTERM (Terminated) or a failure: stop the keepers and what this run submitted
        stop.set()
        until = time.monotonic() + 5.0  # a keeper in a nap ends at once, one in a client call soon after
        for t in [*threads_of(keepers), *([bg_thread] if bg_thread is not None else [])]:
            t.join(timeout=max(0.0, until - time.monotonic()))
        from ..slurm.replay import cancel_ours

        cancel_ours(bg_ids.values(), env)  # the background replay's jobs: always this run's own
        if args.stop_chain or cluster is not None:  # on a real cluster the chain is cancelled only if asked
            cancel_ours([j for k in keepers.values() for j in k.submitted], env)
        raise
    finally:
        stop.set()
        if cluster is not None:
            cluster.stop()
    if errors and not results:
        raise StepError(f"keep-service failed: {errors}")
    rows = [r for p in policies for r in results.get(p, [])]
    frame = pd.DataFrame(rows)
    if bg_out is not None and len(frame):
        from ..slurm.keeper_sim import predict

        origin = bg_facts["origin_epoch"]
        sims = []
        for r in rows:
            if r["link"] != 0:
                continue
            ps_t = t0 + (r["pred_submit"] - origin) * args.factor
            limit_s = int(math.ceil(service_s / args.factor / 60) * 60 * args.factor)
            sims.append({"policy": r["policy"], "link": 0,
                         **predict(bg_out, cfg, args.factor, ps_t, args.node, limit_s, r["policy"], -nice,
                                   decide if r["policy"] == "model" else None, int(args.step_s),
                                   accounting=args.accounting)})
        frame = frame.merge(pd.DataFrame(sims).drop(columns=[]), on=["policy", "link"], how="left")
    facts = {"loadavg_start": load0, "loadavg_end": open("/proc/loadavg").read().split()[:3],
             "cpu_s": round(time.process_time() - t_cpu, 2), "errors": errors, "nice": nice, "model": model_info,
             "background": bg_facts}
    step.write_json("keeper.json", {**params, "facts": facts, "links": json.loads(frame.to_json(orient="records"))})
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    step.write_bytes("links.parquet", buf.getvalue())
    step.write_bytes("decisions.jsonl", open(dec_path, "rb").read() if os.path.exists(dec_path) else b"")
    step.write_bytes("keeper.md", _markdown(frame, args, facts).encode())
    for r in frame.to_dict("records"):
        print(f"keep-service {r['policy']} link {r['link']}: interruption {r['signed_interruption_h']:+.2f} h "
              f"(simulator {r.get('sim_signed_interruption_h', float('nan')):+.2f} h), wasted "
              f"{r['wasted_node_h']:.2f} node-h", flush=True)
    step.commit(summary={"links": len(frame), "errors": errors})
    return 0 if not errors else 1


class _Stopped(BaseException):
    """Ends a keeper's thread when the step stops (not an error of the keeper)."""


def threads_of(keepers: dict) -> list:
    return [t for k in keepers.values() if (t := getattr(k, "thread", None)) is not None]


def _submitted_warm(env: dict, n: int) -> bool:
    from ..slurm.queue import squeue

    try:
        return sum(1 for q in squeue(env) if q.name == "bg") >= n
    except Exception:
        return False


def _markdown(frame, args, facts) -> str:
    lines = [f"# Service keeper: policies {args.policy}, {args.node} node(s), {args.service_hours:g} h jobs, "
             f"x{args.factor:g}", "",
             "| policy | link | signed interruption (h) | wasted node-h | decision lead (h) | forced | simulator: signed (h) "
             "| simulator: wasted node-h |", "|---|---|---|---|---|---|---|---|"]
    for r in frame.to_dict("records"):
        sim = r.get("sim_signed_interruption_h", float("nan"))
        simw = r.get("sim_wasted_node_h", float("nan"))
        lines.append(f"| {r['policy']} | {r['link']} | {r['signed_interruption_h']:+.2f} | {r['wasted_node_h']:.2f} | "
                     f"{r['decision_lead_trace_h']:.2f} | {r['forced']} | {sim:+.2f} | {simw:.2f} |")
    lines += ["", f"load {facts['loadavg_start']} -> {facts['loadavg_end']}, keeper CPU {facts['cpu_s']} s, "
              f"errors {facts['errors'] or 'none'}", ""]
    return "\n".join(lines)
