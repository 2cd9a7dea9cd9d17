"""Run an experiment's points against a deployed target.

Each point and repeat gets ``.../<params>/repeat-<r>/attempt-<k>/``. For load points
the load mode, the driver and (open loop) the offered rate are part of the parameters,
so a rerun at another ``--rate`` is a new point. A point whose latest attempt succeeded
is skipped (so a retried task resumes where it failed) unless ``--rerun`` asks for new
attempts. A failing point is recorded as ``failed`` with what it produced; a load point
whose numbers cannot be trusted (offered rate not reached, too many late or unsent
requests, too few requests for its percentiles: ``results.judge_load``) is recorded
``invalid`` with the reasons. The run goes on to the next point; the step exits 1 if any
point failed or is invalid, which fails the DAG run.

Never hangs: every wait of a point is bounded by :func:`point_budget`, derived from the
point itself (its duration for load points, its epochs or matrix size for calls), and
while a call is polled the target's liveness is checked at every poll, so a dead worker
fails the point within about one poll interval.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import traceback
from typing import Any

import numpy as np

from stepkit import StepError

from .. import billing, procs
from ..clients import UploadClient, make_invoker, service_name
from ..catalogue import replicas_for
from ..common import add_common, add_replicas, load_plan, parse_set, record_state_keys, run_date
from ..data import expected_product, matrix_objects_from_s3, upload_matrices, upload_state_once
from ..loadgen import (LoadSpec, counters_text, explain_no_success, latency_txt, run_load, run_wrk, spec_dict,
                       wrk_available)
from ..results import Attempt, judge_load, latest_record, point_prefix, write_op_report
from ..targets import get_target

log = logging.getLogger(__name__)


def add_arguments(p):
    add_common(p, experiment=True, experiment_required=True)
    p.add_argument("--rerun", action="store_true", help="new attempts even for points that already succeeded")
    p.add_argument("--repeats", type=int, help="override the catalogue's repeat count")
    p.add_argument("--only", action="append", default=[], help="run only points matching key=value (repeatable)")
    p.add_argument("--set", action="append", default=[], help="parameter override key=value")
    p.add_argument("--driver", choices=["builtin", "wrk"], default="builtin", help="load generator for load points")
    p.add_argument("--mode", choices=["closed", "open"], help="override the load mode")
    p.add_argument("--rate", type=float, help="open mode: offered requests/s")
    p.add_argument("--threads", type=int, help="load-driver processes (override the catalogue's threads)")
    p.add_argument("--no-billing", action="store_true")
    add_replicas(p)
    p.add_argument("--matrix-source", choices=["auto", "generate", "s3"], default="auto",
                   help="matrix data per size: s3 (the per-size archives upload-data put in the data bucket; "
                        "auto on knative) or generate (from the seed; auto on the local target)")
    p.add_argument("--bucket", help="data bucket (default from the catalogue, faasm-data)")
    p.add_argument("--s3-endpoint-url", help="S3 endpoint of the data bucket (e.g. a MinIO or moto server)")
    p.add_argument("--ready-timeout", type=float, default=900.0,
                   help="--replicas per-point: seconds to wait for each redeployment to be ready")
    p.add_argument("--keep-billing", action="store_true", help="local target: leave the sampler running for collect to stop "
                        "(knative: the billing DaemonSet runs until collect)")
    p.add_argument("--no-restart", action="store_true", help="skip the soft restarts between points")
    p.add_argument("--verify", choices=["auto", "yes", "no"], default="auto",
                   help="check the matrix product (auto: on the local target for sizes <= 1000)")
    p.add_argument("--max-late-fraction", type=float, default=0.01,
                   help="open loop: a point with a larger share of requests late (> 5 ms) or never sent "
                        "is invalid (default 0.01)")
    p.add_argument("--min-requests", type=int, default=100,
                   help="a load point with fewer successful requests is invalid (p99 needs 100; default 100)")
    p.add_argument("--call-timeout", type=float,
                   help="seconds a call point may take (default: derived from the point, see point_budget)")

# Per-unit budgets of call points (generous: the bound exists so nothing waits an hour for a dead call).
EPOCH_BUDGET_S = 120.0      # one SGD epoch (the ATC'20 runs take seconds to a minute per epoch)
MATMUL_BUDGET_S = 60.0      # per (matrix_size / 1000) ** 3 of a chained multiplication
STARTUP_BUDGET_S = 60.0     # scheduling, cold starts, the first poll
READY_TIMEOUT_S = 120.0     # load points: the first 2xx reply (a cold target imports its libraries first)


def extra_window_s(duration_s: float) -> float:
    """Load points (closed loop): how much longer the window may run to reach ``--min-requests``."""
    return min(60.0, max(10.0, float(duration_s)))


def point_budget(plan, point: dict[str, Any], override: float | None = None) -> float:
    """Seconds a point may take, from the point itself, capped by the catalogue's
    ``call_timeout_s``: load points: readiness deadline + warm-up + duration + its possible
    extension (``extra_window_s``) + request timeout + 10 % + 15 s + the driver's start deadline;
    SGD: 60 s + 120 s per epoch; matrix multiplication: 60 s + 60 s * (size / 1000)^3."""
    drv, wl = plan.driver, plan.experiment["workload"]
    if override:
        return float(override)
    if wl == "inference":
        dur = float(point["duration_s"])
        return (float(drv.get("ready_timeout_s", READY_TIMEOUT_S)) + float(drv.get("warmup_s", 10)) + dur
                + extra_window_s(dur) + float(drv.get("timeout_s", 5)) + 0.1 * dur + 15.0 + 60.0)
    if wl == "sgd":
        est = STARTUP_BUDGET_S + EPOCH_BUDGET_S * int(point.get("epochs", 20))
    elif wl == "matmul":
        est = STARTUP_BUDGET_S + MATMUL_BUDGET_S * (int(point["matrix_size"]) / 1000.0) ** 3
    else:
        est = float(drv.get("call_timeout_s", 3600))
    return min(float(drv.get("call_timeout_s", 3600)), est)


def _label_self(label: str) -> None:
    """Make this step and every process it starts (the load driver's forks too) carry the run
    label, so teardown and verify-clean find them even when this step is killed. The kernel
    shows a process's environment as it was at exec time, so the CLI re-executes itself once
    with the label; when called in-process, only children given ``os.environ`` get it."""
    import sys

    if os.environ.get(procs.LABEL_ENV) == label:
        return
    main = sys.argv[0] if sys.argv else ""
    if main.endswith(os.path.join("faasm_tasks", "__main__.py")):
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "faasm_tasks", *sys.argv[1:]],
                  procs.labelled_env(label, "run"))
    os.environ.update(procs.labelled_env(label, "run", base={}))


def _point_key(args, plan, point: dict[str, Any]) -> dict[str, Any]:
    """The point's parameters plus, for load points, what decides the measurement: mode,
    driver and (open loop) offered rate. They name the folder, so reruns differ by them."""
    if plan.experiment["workload"] != "inference":
        return dict(point)
    mode = args.mode or plan.driver.get("mode", "closed")
    key = {**point, "mode": mode, "driver": args.driver}
    if mode == "open":
        key["rate"] = float(args.rate or plan.driver.get("rate", 0) or 0)
    return key


def _matches(point: dict[str, Any], only: dict[str, Any]) -> bool:
    return all(str(point.get(k)) == str(v) for k, v in only.items())


def run(args) -> int:
    date = run_date(args)
    plan = load_plan(args, parse_set(args.set))
    record_state_keys(args, plan)  # what teardown deletes, without reading the catalogue
    only = parse_set(args.only)
    points = [p for p in plan.points if _matches(p, only)]
    if not points:
        raise StepError(f"no point of {plan.name}/{plan.system} matches {only}")
    if plan.experiment["workload"] == "inference":
        mode = args.mode or plan.driver.get("mode", "closed")
        if mode == "open" and not (args.rate or plan.driver.get("rate")):
            raise StepError("open-loop mode needs --rate (requests per second)")
    _label_self(procs.run_label(args.state_dir, args.run_id))
    target = get_target(args.target, args)
    ep = target.endpoints()
    if args.protocol:
        ep.protocol = args.protocol
    info = target.describe()
    invoker = make_invoker(ep)
    upload = UploadClient(ep.upload_url)
    repeats = args.repeats or plan.repeats
    use_billing = plan.experiment.get("billing", False) and not args.no_billing
    sampler = None
    if use_billing and args.target == "local":  # knative: the run's billing DaemonSet samples every node
        state_file = getattr(target, "state_path", None)
        sampler = billing.start_sampler(args.state_dir, args.run_id, state_file=state_file)
        if sampler.get("ready") is False:  # the points run; collect says which windows have no samples
            print(f"run: billing sampler not sampling: {sampler.get('problem')}", flush=True)
        # the handle is recoverable from storage (host, pid, start time, samples file)
        from stepkit import storage  # noqa: PLC0415

        storage.write_json(storage.join(args.results, "_state", args.run_id, f"billing-sampler-{sampler.get('pid')}.json"),
                           {**{k: v for k, v in sampler.items() if k != "cmd"}, "host": socket.gethostname()})
    results = []
    deployed: dict[str, Any] | None = None  # what this step last deployed (per-point replicas)

    def health() -> str | None:
        """What broke under the point: the target, or the billing sampler this step started."""
        problem = target.health()
        if problem is None and sampler is not None and sampler.get("pid"):
            problem = billing.sampler_problem(sampler)
        return problem

    try:
        for i, point in enumerate(points):
            point = _point_key(args, plan, point)
            for rep in range(repeats):
                prefix = point_prefix(args.results, date, args.run_id, plan.name, plan.system, point, rep)
                prev = latest_record(prefix)
                if prev and prev["status"] == "succeeded" and not args.rerun:
                    print(f"run: skip {prefix} (attempt {prev['attempt']} succeeded)", flush=True)
                    results.append({"prefix": prefix, "status": "skipped"})
                    continue
                if args.replicas == "per-point" and plan.experiment.get("replicas_from") and args.target != "local":
                    want = replicas_for(plan, point)
                    if want != deployed:  # the manual: deploy N replicas, then run with N workers
                        print(f"run: redeploying with {want}", flush=True)
                        plan.deployment = want
                        target.deploy(plan)
                        target.wait_ready(args.ready_timeout)
                        deployed = want
                results.append(_run_point(args, plan, target, ep, invoker, upload, info, point, rep, prefix,
                                          first=(i == 0 and rep == 0), date=date, health=health))
    finally:
        if sampler and not args.keep_billing:
            billing.stop_sampler(args.state_dir, args.run_id)
    failed = [r for r in results if r["status"] == "failed"]
    invalid = [r for r in results if r["status"] == "invalid"]
    write_op_report(args.results, date, args.run_id, "run", {"experiment": plan.name, "system": plan.system,
                                                             "target": args.target, "points": results})
    print(f"run: {len(results) - len(failed) - len(invalid)} ok/skipped, {len(failed)} failed, "
          f"{len(invalid)} invalid", flush=True)
    if _STUCK:
        # a load driver overran its bound and cannot be joined: leave now (teardown stops its forks)
        logging.shutdown()
        os._exit(1)
    return 1 if failed or invalid else 0


_STUCK: list[str] = []


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


def _run_point(args, plan, target, ep, invoker, upload, info, point, rep, prefix, first, date,
               health=None) -> dict[str, Any]:
    """One attempt of one point; ``health()`` (default: the target's) says what broke under it."""
    health = health or target.health
    base = {"run_id": args.run_id, "date": date, "experiment": plan.name, "system": plan.system,
            "target": args.target, "protocol": ep.protocol, "params": point, "repeat": rep,
            "images": info.get("images", {}), "target_info": info}
    att = Attempt(prefix, base)
    print(f"run: {plan.name}/{plan.system} {point} repeat {rep} -> {att.uri}", flush=True)
    t_start = time.time()
    budget = point_budget(plan, point, args.call_timeout)
    billing_wanted = bool(plan.experiment.get("billing", False) and not args.no_billing)
    invalid: list[str] = []
    try:
        prep = _between_points(args, plan, target, first, budget)
        wl = plan.experiment["workload"]
        if wl == "inference":
            ok, metrics, err, invalid = _load_point(args, plan, target, ep, att, point, budget, health)
        else:
            ok, metrics, err = _call_point(args, plan, target, invoker, upload, att, point, budget, health)
        failed_calls = 0 if ok else 1
        metrics["between_points"] = prep
        metrics["budget_s"] = round(budget, 1)
        metrics["window"] = {"start": t_start, "end": time.time()}
        metrics["billing_wanted"] = billing_wanted  # collect: a window without samples is then said so
        att.finish(ok, err, metrics, failed_calls, invalid_reasons=invalid)
    except Exception as exc:  # noqa: BLE001 - keep partial results, mark the attempt failed
        tb = traceback.format_exc()
        try:
            att.write_text("error.txt", tb)
        except Exception:  # noqa: BLE001
            pass
        att.finish(False, f"{type(exc).__name__}: {exc}", {"window": {"start": t_start, "end": time.time()},
                                                           "billing_wanted": billing_wanted}, 1)
        log.error("point failed: %s", tb)
        ok, err = False, str(exc)
    status = att.record["status"]
    err = att.record["outcome"].get("error")
    print(f"run:   {status}" + (f": {err}" if err else ""), flush=True)
    return {"prefix": prefix, "attempt": att.record["attempt"], "status": status}


def _call_point(args, plan, target, invoker, upload, att, point, budget,
                health=None) -> tuple[bool, dict[str, Any], str | None]:
    exp, drv = plan.experiment, plan.driver
    wl = exp["workload"]
    kw: dict[str, Any] = {"system": plan.system, "timeout_s": budget, "check": health or target.health,
                          "poll_interval_s": min(drv.get("poll_interval_ms", 1000) / 1000.0, 2.0)}
    metrics: dict[str, Any] = {}
    if wl == "sgd":
        epochs = int(point.get("epochs", 20))
        input_data = f"{int(point['n_workers'])} {int(point['sync_interval'])}" + (f" {epochs}" if epochs != 20 else "")
        res = invoker.call(exp["user"], exp["function"], input_data, **kw)
    elif wl == "matmul":
        size, splits = int(point["matrix_size"]), int(point.get("splits", 2))
        source = args.matrix_source if args.matrix_source != "auto" else (
            "generate" if args.target == "local" else "s3")
        user = exp["data"].get("state_user", "python")
        if source == "s3":
            bucket = args.bucket or (exp["data"].get("s3") or {}).get("bucket") or "faasm-data"
            objs = matrix_objects_from_s3(plan, size, bucket, args.s3_endpoint_url)
            metrics["uploads"] = [upload_state_once(upload, user, k, v)["action"] for k, v in objs.items()]
        else:
            metrics["uploads"] = [u["action"] for u in upload_matrices(
                upload, user, size, splits, int(exp["data"].get("seed", 42)))]
        target.delete_state_keys(list(exp.get("run_state_keys", [])))
        res = invoker.call("python", exp["function"], "", python=True, py_user="python",
                           py_func=exp["function"], **kw)
        verify = args.verify == "yes" or (args.verify == "auto" and args.target == "local" and size <= 1000)
        if res.ok and verify:
            raw = upload.get_state("python", "result_matrix")
            got = np.frombuffer(raw or b"", dtype=np.float32)
            want = expected_product(size, splits, int(exp["data"].get("seed", 42)))
            if got.size != want.size:
                res.ok, res.status, res.error = False, "failed", f"result_matrix has {got.size} values, want {want.size}"
            else:
                err = float(np.max(np.abs(got.reshape(want.shape) - want) / (np.abs(want) + 1.0)))
                metrics["verify_max_rel_err"] = err
                if err > 1e-3:
                    res.ok, res.status, res.error = False, "failed", f"wrong product (max rel err {err:.3g})"
    else:
        raise StepError(f"workload {wl} is not a call workload")
    att.write_text("calls.jsonl", json.dumps(res.to_dict(), default=str) + "\n")
    att.write_text("output.txt", res.output)  # the full status payload, never just "SUCCESS"
    att.write_text("RUN_TIME.log", f"{res.elapsed_s * 1000:.3f}ms")
    metrics.update(run_time_ms=round(res.elapsed_s * 1000, 3), call_status=res.status, call_id=res.call_id)
    if wl == "sgd" and res.ok:
        body = res.output.split(":", 1)[1] if res.output.startswith("SUCCESS") else res.output
        losses = [float(ln.split()[1]) for ln in body.strip().splitlines() if len(ln.split()) == 2]
        metrics.update(epochs=len(losses), final_loss=losses[-1] if losses else None, losses=losses)
    return res.ok, metrics, res.error


def _bounded(fn, budget: float, what: str):
    """``fn()`` in a daemon thread, waited for at most ``budget`` seconds."""
    box: dict[str, Any] = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    th = threading.Thread(target=go, name=what, daemon=True)
    th.start()
    th.join(budget)
    if th.is_alive():
        _STUCK.append(what)
        raise StepError(f"{what} did not finish within its {budget:.0f} s bound")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _load_point(args, plan, target, ep, att, point, budget,
                health=None) -> tuple[bool, dict[str, Any], str | None, list[str]]:
    exp, drv = plan.experiment, plan.driver
    threads = args.threads or drv.get("threads", 1)
    threads = (os.cpu_count() or 1) if threads == "auto" else int(threads)
    body = json.dumps({"user": exp["user"], "function": exp["function"],
                       "cold_start_interval": str(point.get("cold_start_interval", 0))}).encode()
    host = ep.host_for(service_name(plan.system, exp["user"], exp["function"]))
    mode = args.mode or drv.get("mode", "closed")
    spec = LoadSpec(url=ep.invoke_url, mode=mode, connections=int(drv["connections"]), processes=threads,
                    duration_s=float(point["duration_s"]), warmup_s=float(drv.get("warmup_s", 10)),
                    timeout_s=float(drv["timeout_s"]), max_delay_ms=float(point.get("max_delay_ms", 0)),
                    rate=float(args.rate or drv.get("rate", 0) or 0), body=body,
                    headers={"Host": host, "Content-Type": "application/json"},
                    # start-up by conditions: the first 2xx reply, then the window; a closed-loop
                    # window runs on (bounded) until --min-requests were concluded in it
                    ready_timeout_s=float(drv.get("ready_timeout_s", READY_TIMEOUT_S)), start_timeout_s=60.0,
                    min_requests=int(args.min_requests), max_extra_s=extra_window_s(float(point["duration_s"])))
    att.write_json("load_spec.json", spec_dict(spec))
    if args.driver == "wrk":
        if not wrk_available():
            raise StepError("--driver wrk but wrk is not installed (apt-get install -y wrk)")
        summary, stdout, script = _bounded(lambda: run_wrk(spec, threads), budget, "wrk")
        att.write_text("wrk_stdout.txt", stdout)  # wrk's error counts live here
        att.write_text("tflite_bench.lua", script)
    else:
        summary = _bounded(lambda: run_load(spec), budget, "load driver")
        att.write_text("histogram.hdr", summary.pop("histogram") + "\n")
    att.write_json("latency.json", summary)
    att.write_text("latency.txt", latency_txt(summary))
    metrics = {k: summary.get(k) for k in ("requests_ok", "requests_all", "throughput_ok", "throughput_all",
                                           "p50_us", "p99_us", "p999_us", "max_us", "errors", "errors_total",
                                           "schedule_lag_fraction", "rate", "scheduled", "sent", "missed",
                                           "late")}
    metrics.update({k: summary.get(k) for k in ("attempted", "ready", "elapsed_s", "window_extended_s")})
    problem = (health or target.health)()
    if problem:
        return False, metrics, f"the target broke during the point: {problem} [{counters_text(summary)}]", []
    if summary.get("ready") is False or (
            summary["requests_ok"] == 0 and (summary.get("errors_total") or spec.mode == "closed")):
        return False, metrics, explain_no_success(summary), []
    # an open-loop driver that sent nothing in the window (too far behind) is invalid, not failed
    invalid = judge_load(summary, spec.mode, spec.rate, max_late_fraction=args.max_late_fraction,
                         min_requests=args.min_requests)
    return True, metrics, None, invalid
