"""One benchmark point: its context, the two runners (``call`` and ``load``) and its check.

The workload's row (:mod:`faasm_tasks.workloads`) says which runner a point takes and which
hooks it calls; nothing here names a workload. A point's outcome:

* ``failed``: the call failed, the target broke, or its check (the row's ``verify``) said
  the result is wrong: such a point is recorded with the check and never averaged in;
* ``invalid``: a load point whose numbers cannot be trusted (``results.judge_load``); a load
  point whose driver send-lag p99 exceeds the plan's ``send_lag_p99_ms`` (default 5 ms) is
  marked (``metrics.send_lag_exceeded``, ``metrics.marks``), its histogram in ``send_lag.hdr``;
* ``succeeded`` otherwise, with the check recorded under ``metrics.check``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stepkit import StepError

STUCK: list[str] = []  # drivers that overran their bound and cannot be joined


@dataclass
class Request:
    """What one call sends (call runners) or the load driver's body (load runners)."""

    user: str
    function: str
    input_data: str = ""
    python: bool = False
    py_user: str | None = None
    py_func: str | None = None
    body: bytes | None = None  # load runners: the request body
    metrics: dict[str, Any] = field(default_factory=dict)  # what preparing the call did


@dataclass
class Check:
    """A point's verification: whether its result is right, and against what."""

    ok: bool
    what: str
    value: Any = None
    reference: Any = None
    bound: Any = None
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}


@dataclass
class PointContext:
    """What a point's hooks may use: the step's arguments, the plan, the target and its clients."""

    args: Any
    plan: Any
    target: Any
    endpoints: Any
    invoker: Any
    upload: Any
    health: Callable[[], str | None]
    cache: dict[Any, Any] = field(default_factory=dict)  # per run step (e.g. SGD's reference loss)

    def call(self, req: Request, budget: float):
        """One call of ``req``, polled, the target's liveness checked at every poll."""
        return self.invoker.call(
            req.user,
            req.function,
            req.input_data,
            system=self.plan.system,
            python=req.python,
            py_user=req.py_user,
            py_func=req.py_func,
            timeout_s=budget,
            check=self.health,
            poll_interval_s=min(self.plan.driver.poll_interval_ms / 1000.0, 2.0),
        )


def point_key(args, plan, point: dict[str, Any], endpoints=None) -> dict[str, Any]:
    """The point's parameters plus, for load points, what decides the measurement: mode,
    driver, (open loop) offered rate and, for more than one, the load clients (``endpoints``:
    the target's, whose client hosts count). They name the folder, so reruns differ by them."""
    if plan.workload.runner != "load":
        return dict(point)
    mode = args.mode or plan.driver.mode
    key = {**point, "mode": mode, "driver": args.driver}
    if mode == "open":
        key["rate"] = float(args.rate or plan.driver.rate)
    clients = load_clients(args, plan, endpoints)
    if clients > 1:  # one client (the default) adds nothing: earlier points keep their folders
        key["clients"] = clients
    return key


def load_clients(args, plan, endpoints=None) -> int:
    """How many load clients drive a load point: the target's client hosts (one each), else
    ``--clients``, else the catalogue's ``clients`` (default 1)."""
    hosts = (endpoints.extra.get("client_hosts") if endpoints is not None else None) or []
    return len(hosts) or int(getattr(args, "clients", None) or plan.driver.clients)


def refuse_inert(args, plan) -> None:
    """Flags that would do nothing for this plan are refused, naming them: the load flags on a
    call workload, ``--rate`` in closed loop. ``--clients`` outside 1..63 is refused too."""
    clients = getattr(args, "clients", None)
    if clients is not None and not 1 <= clients <= 63:
        raise StepError(f"--clients {clients}: load clients are 1..63")
    if plan.workload.runner == "call":
        given = [
            f
            for f, v in (
                ("--mode", args.mode),
                ("--rate", args.rate),
                ("--threads", args.threads),
                ("--driver", None if args.driver == "builtin" else args.driver),
                ("--clients", getattr(args, "clients", None)),
                ("--client-isolation", getattr(args, "client_isolation", None)),
            )
            if v is not None
        ]
        if given:
            raise StepError(
                f"{', '.join(given)}: {plan.name} is a call workload ({plan.workload.name}); "
                "these set the load driver, which it does not use"
            )
    elif args.rate and (args.mode or plan.driver.mode) == "closed":
        raise StepError(f"--rate does nothing in closed loop ({plan.name}); add --mode open")
    elif (args.mode or plan.driver.mode) == "open" and not (args.rate or plan.driver.rate):
        raise StepError("open-loop mode needs --rate (requests per second)")


def extra_window_s(duration_s: float) -> float:
    """Load points (closed loop): how much longer the window may run to reach ``--min-requests``."""
    return min(60.0, max(10.0, float(duration_s)))


def point_budget(plan, point: dict[str, Any], override: float | None = None) -> float:
    """Seconds a point may take: ``override`` or the workload's ``budget(point, driver)``."""
    return float(override) if override else float(plan.workload.hook("budget")(point, plan.driver))


def _checked(ctx: PointContext, point, res, metrics) -> tuple[bool, str | None]:
    verify = ctx.plan.workload.hook("verify")
    check = verify(ctx, point, res, metrics) if verify else None
    if check is None:
        metrics["check"] = {"ok": None, "what": "not checked"}
        return True, None
    metrics["check"] = check.as_dict()
    return check.ok, None if check.ok else f"check failed: {check.what}: {check.detail}"


def call_point(ctx: PointContext, att, point: dict[str, Any], budget: float) -> tuple[bool, dict, str | None, list]:
    wl = ctx.plan.workload
    req = wl.hook("request")(ctx, point)
    metrics: dict[str, Any] = dict(req.metrics)
    res = ctx.call(req, budget)
    att.write_text("calls.jsonl", json.dumps(res.to_dict(), default=str) + "\n")
    att.write_text("output.txt", res.output)  # the full status payload, never just "SUCCESS"
    att.write_text("RUN_TIME.log", f"{res.elapsed_s * 1000:.3f}ms")
    metrics.update(run_time_ms=round(res.elapsed_s * 1000, 3), call_status=res.status, call_id=res.call_id)
    if not res.ok:
        return False, metrics, res.error, []
    if wl.result:
        metrics.update(wl.hook("result")(ctx, point, res))
    ok, err = _checked(ctx, point, res, metrics)
    return ok, metrics, err, []


def bounded(fn, budget: float, what: str):
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
        STUCK.append(what)
        raise StepError(f"{what} did not finish within its {budget:.0f} s bound")
    if "error" in box:
        raise box["error"]
    return box["value"]


LOAD_METRICS = (
    "requests_ok",
    "requests_all",
    "throughput_ok",
    "throughput_all",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "errors",
    "errors_total",
    "schedule_lag_fraction",
    "rate",
    "scheduled",
    "sent",
    "missed",
    "late",
    "send_lag_count",
    "send_lag_p50_us",
    "send_lag_p99_us",
    "send_lag_max_us",
    "attempted",
    "ready",
    "elapsed_s",
    "window_extended_s",
    "clients",
    "client_isolation",
)


def load_point(ctx: PointContext, att, point: dict[str, Any], budget: float) -> tuple[bool, dict, str | None, list]:
    from .clients import service_name
    from .loadgen import (
        LoadSpec,
        counters_text,
        explain_no_success,
        latency_txt,
        run_load,
        run_wrk,
        spec_dict,
        wrk_available,
    )
    from .results import judge_load

    args, plan, drv = ctx.args, ctx.plan, ctx.plan.driver
    threads = int(args.threads or drv.threads)
    req = plan.workload.hook("request")(ctx, point)
    host = ctx.endpoints.host_for(service_name(plan.system, req.user, req.function))
    dur = float(point["duration_s"])
    hosts = tuple(ctx.endpoints.extra.get("client_hosts") or ())
    clients = {
        "clients": load_clients(args, plan, ctx.endpoints),
        "client_isolation": getattr(args, "client_isolation", None) or drv.client_isolation,
        "client_hosts": hosts,
    }
    if ctx.endpoints.extra.get("client_command"):
        clients["client_command"] = ctx.endpoints.extra["client_command"]
    if clients["clients"] > 1 and args.driver == "wrk":
        raise StepError(f"--driver wrk runs one client; {clients['clients']} load clients need the builtin driver")
    if clients["clients"] > drv.connections:
        raise StepError(
            f"{clients['clients']} load clients need a connection each; the driver has {drv.connections} "
            f"(the catalogue's driver.connections)"
        )
    spec = LoadSpec(
        url=ctx.endpoints.invoke_url,
        mode=args.mode or drv.mode,
        connections=drv.connections,
        processes=threads,
        duration_s=dur,
        warmup_s=drv.warmup_s,
        timeout_s=drv.timeout_s,
        max_delay_ms=float(point.get("max_delay_ms", 0)),
        rate=float(args.rate or drv.rate),
        body=req.body or b"",
        headers={"Host": host, "Content-Type": "application/json"},
        # start-up by conditions: the first 2xx reply, then the window; a closed-loop
        # window runs on (bounded) until --min-requests were concluded in it
        ready_timeout_s=drv.ready_timeout_s,
        start_timeout_s=60.0,
        min_requests=int(args.min_requests),
        max_extra_s=extra_window_s(dur),
        **clients,
    )
    att.write_json("load_spec.json", spec_dict(spec))
    if args.driver == "wrk":
        if not wrk_available():
            raise StepError("--driver wrk but wrk is not installed (apt-get install -y wrk)")
        summary, stdout, script = bounded(lambda: run_wrk(spec, threads), budget, "wrk")
        att.write_text("wrk_stdout.txt", stdout)  # wrk's error counts live here
        att.write_text("tflite_bench.lua", script)
    else:
        summary = bounded(lambda: run_load(spec), budget, "load driver")
        att.write_text("histogram.hdr", summary.pop("histogram") + "\n")
        for i, h in enumerate(summary.pop("client_histograms", [])):  # several clients: each one's
            att.write_text(f"histogram.client{i}.hdr", h + "\n")
        if summary.get("send_lag_histogram"):
            att.write_text("send_lag.hdr", summary.pop("send_lag_histogram") + "\n")
    att.write_json("latency.json", summary)
    att.write_text("latency.txt", latency_txt(summary))
    metrics = {k: summary.get(k) for k in LOAD_METRICS}
    problem = ctx.health()
    if problem:
        return False, metrics, f"the target broke during the point: {problem} [{counters_text(summary)}]", []
    if summary.get("ready") is False or (
        summary["requests_ok"] == 0 and (summary.get("errors_total") or spec.mode == "closed")
    ):
        return False, metrics, explain_no_success(summary), []
    ok, err = _checked(ctx, point, summary, metrics)
    if not ok:
        return False, metrics, err, []
    # an open-loop driver that sent nothing in the window (too far behind) is invalid, not failed
    invalid = judge_load(
        summary, spec.mode, spec.rate, max_late_fraction=args.max_late_fraction, min_requests=args.min_requests
    )
    # marked, not failed: the reader sees that the client, not the system, may have limited it
    lag99 = summary.get("send_lag_p99_us")
    metrics["send_lag_bound_ms"] = drv.send_lag_p99_ms
    metrics["send_lag_exceeded"] = bool(lag99 is not None and lag99 > drv.send_lag_p99_ms * 1000)
    if metrics["send_lag_exceeded"]:
        metrics["marks"] = [
            f"driver send lag p99 {lag99 / 1000:.1f} ms > {drv.send_lag_p99_ms:g} ms: the client, "
            "not the system, may have limited this point"
        ]
    return True, metrics, None, invalid


RUNNERS = {"call": call_point, "load": load_point}
