"""Run an experiment's points against a deployed target.

Each point and repeat gets ``.../<params>/repeat-<r>/attempt-<k>/``. A point whose
latest attempt succeeded is skipped (so a retried task resumes where it failed) unless
``--rerun`` asks for new attempts. A failing point is recorded as ``failed`` with what
it produced, and the run goes on to the next point; the step exits 1 if any failed.
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from typing import Any

import numpy as np

from stepkit import StepError

from .. import billing
from ..clients import UploadClient, make_invoker, service_name
from ..common import add_common, load_plan, parse_set, run_date
from ..data import expected_product, upload_matrices
from ..loadgen import LoadSpec, latency_txt, run_load, run_wrk, spec_dict, wrk_available
from ..results import Attempt, latest_record, point_prefix, write_op_report
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
    p.add_argument("--no-billing", action="store_true")
    p.add_argument("--keep-billing", action="store_true", help="leave the sampler running for collect to stop")
    p.add_argument("--no-restart", action="store_true", help="skip the soft restarts between points")
    p.add_argument("--verify", choices=["auto", "yes", "no"], default="auto",
                   help="check the matrix product (auto: on the local target for sizes <= 1000)")


def _matches(point: dict[str, Any], only: dict[str, Any]) -> bool:
    return all(str(point.get(k)) == str(v) for k, v in only.items())


def run(args) -> int:
    date = run_date(args)
    plan = load_plan(args, parse_set(args.set))
    only = parse_set(args.only)
    points = [p for p in plan.points if _matches(p, only)]
    if not points:
        raise StepError(f"no point of {plan.name}/{plan.system} matches {only}")
    if plan.experiment["workload"] == "inference":
        mode = args.mode or plan.driver.get("mode", "closed")
        if mode == "open" and not (args.rate or plan.driver.get("rate")):
            raise StepError("open-loop mode needs --rate (requests per second)")
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
    if use_billing:
        state_file = getattr(target, "state_path", None)
        sampler = billing.start_sampler(args.state_dir, args.run_id, state_file=state_file)
    results = []
    try:
        for i, point in enumerate(points):
            for rep in range(repeats):
                prefix = point_prefix(args.results, date, args.run_id, plan.name, plan.system, point, rep)
                prev = latest_record(prefix)
                if prev and prev["status"] == "succeeded" and not args.rerun:
                    print(f"run: skip {prefix} (attempt {prev['attempt']} succeeded)", flush=True)
                    results.append({"prefix": prefix, "status": "skipped"})
                    continue
                results.append(_run_point(args, plan, target, ep, invoker, upload, info, point, rep, prefix,
                                          first=(i == 0 and rep == 0), date=date))
    finally:
        if sampler and not args.keep_billing:
            billing.stop_sampler(args.state_dir, args.run_id)
    failed = [r for r in results if r["status"] == "failed"]
    write_op_report(args.results, date, args.run_id, "run", {"experiment": plan.name, "system": plan.system,
                                                             "target": args.target, "points": results})
    print(f"run: {len(results) - len(failed)} ok/skipped, {len(failed)} failed", flush=True)
    return 1 if failed else 0


def _between_points(args, plan, target, first: bool) -> dict[str, Any]:
    bp = plan.experiment.get("between_points", {})
    done: dict[str, Any] = {}
    if bp.get("delete_state_keys"):
        done["state_keys_deleted"] = target.delete_state_keys(bp["delete_state_keys"])
    if bp.get("flush_queue"):
        done["queue_keys_flushed"] = target.flush_queue()
    if bp.get("soft_restart") and not args.no_restart and not first:
        done["soft_restart"] = target.soft_restart(timeout_s=600)
    return done


def _run_point(args, plan, target, ep, invoker, upload, info, point, rep, prefix, first, date) -> dict[str, Any]:
    base = {"run_id": args.run_id, "date": date, "experiment": plan.name, "system": plan.system,
            "target": args.target, "protocol": ep.protocol, "params": point, "repeat": rep,
            "images": info.get("images", {}), "target_info": info}
    att = Attempt(prefix, base)
    print(f"run: {plan.name}/{plan.system} {point} repeat {rep} -> {att.uri}", flush=True)
    t_start = time.time()
    try:
        prep = _between_points(args, plan, target, first)
        wl = plan.experiment["workload"]
        if wl == "inference":
            ok, metrics, err = _load_point(args, plan, ep, att, point)
            failed_calls = 0 if ok else 1
        else:
            ok, metrics, err = _call_point(args, plan, target, invoker, upload, att, point)
            failed_calls = 0 if ok else 1
        metrics["between_points"] = prep
        metrics["window"] = {"start": t_start, "end": time.time()}
        att.finish(ok, err, metrics, failed_calls)
    except Exception as exc:  # noqa: BLE001 - keep partial results, mark the attempt failed
        tb = traceback.format_exc()
        try:
            att.write_text("error.txt", tb)
        except Exception:  # noqa: BLE001
            pass
        att.finish(False, f"{type(exc).__name__}: {exc}", {"window": {"start": t_start, "end": time.time()}}, 1)
        log.error("point failed: %s", tb)
        ok, err = False, str(exc)
    status = "succeeded" if ok else "failed"
    print(f"run:   {status}" + (f": {err}" if err else ""), flush=True)
    return {"prefix": prefix, "attempt": att.record["attempt"], "status": status}


def _call_point(args, plan, target, invoker, upload, att, point) -> tuple[bool, dict[str, Any], str | None]:
    exp, drv = plan.experiment, plan.driver
    wl = exp["workload"]
    kw: dict[str, Any] = {"system": plan.system, "timeout_s": float(drv.get("call_timeout_s", 3600)),
                          "poll_interval_s": drv.get("poll_interval_ms", 1000) / 1000.0}
    metrics: dict[str, Any] = {}
    if wl == "sgd":
        epochs = int(point.get("epochs", 20))
        input_data = f"{int(point['n_workers'])} {int(point['sync_interval'])}" + (f" {epochs}" if epochs != 20 else "")
        res = invoker.call(exp["user"], exp["function"], input_data, **kw)
    elif wl == "matmul":
        size, splits = int(point["matrix_size"]), int(point.get("splits", 2))
        metrics["uploads"] = [u["action"] for u in upload_matrices(
            upload, exp["data"].get("state_user", "python"), size, splits, int(exp["data"].get("seed", 42)))]
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


def _load_point(args, plan, ep, att, point) -> tuple[bool, dict[str, Any], str | None]:
    exp, drv = plan.experiment, plan.driver
    threads = drv.get("threads", 1)
    threads = (os.cpu_count() or 1) if threads == "auto" else int(threads)
    body = json.dumps({"user": exp["user"], "function": exp["function"],
                       "cold_start_interval": str(point.get("cold_start_interval", 0))}).encode()
    host = ep.host_for(service_name(plan.system, exp["user"], exp["function"]))
    mode = args.mode or drv.get("mode", "closed")
    spec = LoadSpec(url=ep.invoke_url, mode=mode, connections=int(drv["connections"]), processes=threads,
                    duration_s=float(point["duration_s"]), warmup_s=float(drv.get("warmup_s", 10)),
                    timeout_s=float(drv["timeout_s"]), max_delay_ms=float(point.get("max_delay_ms", 0)),
                    rate=float(args.rate or drv.get("rate", 0) or 0), body=body,
                    headers={"Host": host, "Content-Type": "application/json"})
    att.write_json("load_spec.json", spec_dict(spec))
    if args.driver == "wrk":
        if not wrk_available():
            raise StepError("--driver wrk but wrk is not installed (apt-get install -y wrk)")
        summary, stdout, script = run_wrk(spec, threads)
        att.write_text("wrk_stdout.txt", stdout)  # wrk's error counts live here
        att.write_text("tflite_bench.lua", script)
    else:
        summary = run_load(spec)
        att.write_text("histogram.hdr", summary.pop("histogram") + "\n")
    att.write_json("latency.json", summary)
    att.write_text("latency.txt", latency_txt(summary))
    metrics = {k: summary.get(k) for k in ("requests_ok", "requests_all", "throughput_ok", "throughput_all",
                                           "p50_us", "p99_us", "p999_us", "max_us", "errors", "errors_total",
                                           "schedule_lag_fraction")}
    ok = summary["requests_ok"] > 0
    return ok, metrics, None if ok else f"no successful responses ({summary['errors']})"
