"""Running the load: the processes of :func:`run_load` (builtin driver) and :func:`run_wrk`."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from .conn import BadReply, ClosedLoop, OpenLoop, parse_response, request_bytes
from .measure import ERROR_KINDS, LATE_S, merge_histograms, new_hist, summarize
from .report import load_text
from .spec import LoadSpec, fifo_preexec, set_sched_slice, set_scheduling, share


def _run_share(spec: LoadSpec, index: int, t0: float, in_child: bool) -> dict[str, Any]:
    """Run process ``index``'s share of the load; returns its counts and histograms."""
    gc_was = gc.isenabled()
    if spec.mode == "open":
        gc.disable()  # no collector pauses inside the open loop (it creates no reference cycles)
    scheduling, restore = set_scheduling(spec.rt_priority, spec.slice_us)
    cpu0 = time.process_time()
    try:
        if spec.mode == "open":
            w: OpenLoop | ClosedLoop = OpenLoop(spec, index, t0, share(spec, index), watch_parent=in_child)
            w.run()
        else:
            if in_child:
                try:
                    import uvloop  # optional, faster event loop

                    uvloop.install()
                except ImportError:
                    pass
            w = ClosedLoop(spec, index, t0)
            asyncio.run(w.main(watch_parent=in_child))
        return {**w.result(), "scheduling": scheduling, "cpu_s": time.process_time() - cpu0}
    finally:
        if restore == "slice" and not in_child:
            set_sched_slice(0, 0)
        elif restore is not None and not in_child:
            os.sched_setscheduler(0, restore[0], restore[1])
        if gc_was:
            gc.enable()


def await_ready(spec: LoadSpec) -> dict[str, Any]:
    """Send one request at a time until one is answered 2xx, for at most ``ready_timeout_s``
    in all; each reply may take the rest of that time (a first call importing its libraries
    on a loaded machine is slow, not failed). Returns what happened, counters included."""
    host, port, req = request_bytes(spec)
    t_start = time.monotonic()
    deadline = t_start + spec.ready_timeout_s
    errors = dict.fromkeys(ERROR_KINDS, 0)
    statuses: Counter[int] = Counter()
    attempts, last = 0, ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        attempts += 1
        kind, status = None, 0
        try:
            sock = socket.create_connection((host, port), timeout=min(left, max(spec.timeout_s, 1.0)))
        except OSError as exc:
            kind, last = "connect", f"{host}:{port}: {type(exc).__name__}: {exc}"
        else:
            with sock:
                try:
                    sock.settimeout(max(0.05, deadline - time.monotonic()))
                    sock.sendall(req)
                    buf, r = b"", None
                    while r is None:
                        data = sock.recv(65536)
                        buf += data
                        r = parse_response(buf, eof=not data)
                    status = r[1]
                except TimeoutError:
                    kind, last = "timeout", "no reply before the readiness deadline"
                except (OSError, BadReply) as exc:
                    kind, last = "read", f"{type(exc).__name__}: {exc}"
        if kind is None:
            if 200 <= status < 300:
                return {
                    "ready": True,
                    "attempts": attempts,
                    "errors": errors,
                    "statuses": {str(k): v for k, v in statuses.items()},
                    "last_error": last,
                    "waited_s": round(time.monotonic() - t_start, 3),
                }
            kind, last = "non2xx", f"HTTP {status}"
            statuses[status] += 1
        errors[kind] += 1
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return {
        "ready": False,
        "attempts": attempts,
        "errors": errors,
        "statuses": {str(k): v for k, v in statuses.items()},
        "last_error": last,
        "waited_s": round(time.monotonic() - t_start, 3),
        "ready_timeout_s": spec.ready_timeout_s,
    }


def child_setup(spec: LoadSpec) -> None:
    """What a forked driver process does before it reports that it has started."""
    if spec.mode == "closed":
        try:
            import uvloop  # noqa: F401 - optional, installed in _run_share
        except ImportError:
            pass


def _proc_main(spec: LoadSpec, index: int, conn) -> None:
    """A forked driver process: set up, report that it has started, wait for the start time, run."""
    try:
        child_setup(spec)
        conn.send({"started": os.getpid()})
        parent = os.getppid()
        while not conn.poll(0.1):  # the parent sends t0 once every process has started
            if os.getppid() != parent:
                raise SystemExit("load driver parent exited")
        t0 = conn.recv()
        conn.send(_run_share(spec, index, t0, in_child=True))
    except (EOFError, BrokenPipeError):
        pass  # the parent is gone or gave up on this run
    except BaseException as exc:  # noqa: BLE001 - report to the parent
        try:
            conn.send({"error": f"{type(exc).__name__}: {exc}"})
        except OSError:
            pass
    finally:
        conn.close()


def not_ready_summary(spec: LoadSpec, readiness: dict[str, Any], elapsed: float) -> dict[str, Any]:
    out = summarize(new_hist(), spec.duration_s, 0, 0, dict.fromkeys(ERROR_KINDS, 0))
    out.update(
        ready=False,
        readiness=readiness,
        attempted=0,
        sent=0,
        warmup_attempted=0,
        warmup_ok=0,
        mode=spec.mode,
        connections=spec.connections,
        processes=spec.processes,
        warmup_s=spec.warmup_s,
        elapsed_s=round(elapsed, 3),
        started=time.time(),
        histogram=new_hist().encode().decode(),
        host_load=load_text(),
    )
    return out


def _start_now(start_delay_s: float):
    def start_at() -> tuple[float, float]:
        return time.monotonic() + start_delay_s, time.time() + start_delay_s

    return start_at


def run_load(
    spec: LoadSpec, start_delay_s: float = 0.3, start_at: Callable[[], tuple[float, float]] | None = None
) -> dict[str, Any]:
    """Run the load and return the summary (with the encoded histogram).

    ``start_at`` is called once every driver process has started and waits for the start;
    it returns the start instant as (``time.monotonic()``, ``time.time()``). By default that
    is ``start_delay_s`` from then; a load client of several (:mod:`.controller`) waits there
    for the controller's shared start instant. One client: ``spec.clients`` is the
    controller's (the package's ``run_load``, :mod:`.controller`)."""
    m0 = time.monotonic()
    start_at = start_at or _start_now(start_delay_s)
    readiness = None
    if spec.ready_timeout_s > 0:
        readiness = await_ready(spec)
        if not readiness["ready"]:
            return not_ready_summary(spec, readiness, time.monotonic() - m0)
    results = []
    if spec.processes == 1:
        t0, wall0 = start_at()
        results.append(_run_share(spec, 0, t0, in_child=False))
    else:
        ctx = mp.get_context("fork")
        procs = []
        for i in range(spec.processes):
            parent, child = ctx.Pipe(duplex=True)
            p = ctx.Process(target=_proc_main, args=(spec, i, child), daemon=True)
            p.start()
            child.close()
            procs.append((p, parent))
        try:
            # 1. every process reports that it has started (forks are slow on a loaded machine)
            waiting = {parent: p for p, parent in procs}
            start_deadline = time.monotonic() + spec.start_timeout_s
            while waiting:
                ready = mp_connection.wait(list(waiting), timeout=max(0.0, start_deadline - time.monotonic()))
                if not ready:
                    pids = sorted(p.pid for p in waiting.values())
                    raise RuntimeError(
                        f"the load driver never started: process(es) {pids} did not report within "
                        f"{spec.start_timeout_s:g} s ({len(procs) - len(waiting)}/{len(procs)} "
                        f"started; {load_text()})"
                    )
                for parent in ready:
                    p = waiting.pop(parent)
                    try:
                        r = parent.recv()
                    except EOFError:
                        p.join(timeout=1)
                        raise RuntimeError(
                            f"the load driver never started: process {p.pid} exited before "
                            f"starting (exit code {p.exitcode})"
                        ) from None
                    if "error" in r:
                        raise RuntimeError(f"the load driver never started: {r['error']}")
            # 2. the start time, now that all of them wait for it
            t0, wall0 = start_at()
            for _, parent in procs:
                parent.send(t0)
            deadline = t0 + spec.warmup_s + spec.duration_s + spec.max_extra_s + spec.timeout_s + 30
            waiting = {parent: (i, p) for i, (p, parent) in enumerate(procs)}
            while waiting:  # whichever reports (or dies) first, not in index order
                left = deadline - time.monotonic()
                ready = mp_connection.wait(list(waiting), timeout=max(0.0, left))
                if not ready:
                    pids = sorted(p.pid for _, p in waiting.values())
                    raise RuntimeError(f"load process(es) {pids} did not report within the deadline")
                for parent in ready:
                    i, p = waiting.pop(parent)
                    try:
                        r = parent.recv()
                    except EOFError:  # it died without a word (killed, out of memory)
                        p.join(timeout=1)
                        from stepkit.pool import exit_reason

                        raise RuntimeError(
                            f"load process {i} (pid {p.pid}) died without a result: {exit_reason(p.exitcode)}"
                        ) from None
                    if "error" in r:  # fail now; the others are stopped below
                        raise RuntimeError(f"load process failed: {r['error']}")
                    results.append(r)
        except BaseException:  # interrupted or failed: stop the other processes now, not at their end
            for p, _ in procs:
                if p.is_alive():
                    p.kill()
            raise
        finally:
            for p, parent in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
                parent.close()
    return combine(spec, results, t0, wall0, readiness, m0)


def combine(
    spec: LoadSpec, results: list[dict[str, Any]], t0: float, wall0: float, readiness: dict | None, m0: float
) -> dict[str, Any]:
    """The summary of a run from its processes' results (or its clients', :mod:`.controller`):
    histograms merged, counters summed; ``t0`` is the start instant on the clock of the
    results' ``last_done``, ``m0`` when the run began (``time.monotonic()``)."""
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("load process failed: " + "; ".join(errs))
    hist, lag = merge_histograms([r["hist"] for r in results]), merge_histograms([r["lag"] for r in results])
    errors = dict.fromkeys(ERROR_KINDS, 0)
    ok = total = scheduled = sent = late = late_no_conn = attempted = warm_att = warm_ok = 0
    last_errors: dict[str, str] = {}
    statuses: Counter[str] = Counter()
    last_done = max((r["last_done"] for r in results), default=0.0)
    for r in results:
        for k in ERROR_KINDS:
            errors[k] += r["errors"][k]
        ok += r["ok"]
        total += r["all"]
        scheduled += r["scheduled"]
        sent += r["sent"]
        late += r["late"]
        late_no_conn += r.get("late_no_conn", 0)
        attempted += r.get("attempted", 0)
        warm_att += r.get("warmup_attempted", 0)
        warm_ok += r.get("warmup_ok", 0)
        last_errors.update(r.get("last_errors", {}))
        statuses.update(r.get("statuses", {}))
    lags = [r["start_lag_s"] for r in results if r.get("start_lag_s") is not None]
    # Throughput divides by the measured window: from the first recorded slot (or send) to
    # the later of the window's end and the last recorded response (a backlog that drains
    # after the window lengthens it), never by the nominal duration alone.
    measured = max(spec.duration_s, last_done - (t0 + spec.warmup_s)) if last_done else spec.duration_s
    out = summarize(hist, measured, ok, total, errors)
    out.update(duration_s=spec.duration_s, measured_duration_s=measured, throughput_basis="measured_duration_s")
    cpu = sum(r["cpu_s"] for r in results)
    out.update(
        scheduling=sorted({r["scheduling"] for r in results}),
        # CPU time of the load processes (user + system), all of them together
        driver_cpu_s=round(cpu, 3),
        driver_cpu_us_per_request=round(cpu / total * 1e6, 1) if total else None,
    )
    out.update(
        mode=spec.mode,
        connections=spec.connections,
        processes=spec.processes,
        warmup_s=spec.warmup_s,
        started=wall0,
        histogram=hist.encode().decode(),
        # the driver's own send lag (actual minus scheduled, or intended, send), beside the latency
        send_lag_histogram=lag.encode().decode(),
        send_lag_count=lag.get_total_count(),
        send_lag_p50_us=lag.get_value_at_percentile(50) if lag.get_total_count() else None,
        send_lag_p99_us=lag.get_value_at_percentile(99) if lag.get_total_count() else None,
        send_lag_max_us=lag.get_max_value() if lag.get_total_count() else None,
    )
    # what explains a point without a success (explain_no_success)
    out.update(
        ready=True,
        readiness=readiness,
        attempted=attempted,
        sent=sent,
        warmup_attempted=warm_att,
        warmup_ok=warm_ok,
        last_errors=last_errors,
        statuses=dict(statuses),
        start_lag_s=round(max(lags), 3) if lags else None,
        timeout_s=spec.timeout_s,
        elapsed_s=round(time.monotonic() - m0, 3),
        host_load=load_text(),
    )
    if spec.mode == "open":
        missed = max(0, scheduled - sent)
        out.update(
            rate=spec.rate,
            scheduled=scheduled,
            sent=sent,
            missed=missed,
            late=late,
            late_threshold_ms=LATE_S * 1000,
            # late sends whose slot found every connection busy (the server, not the
            # driver's own clock, held them back); the rest the driver itself was late for
            late_waiting_for_connection=late_no_conn,
            # requests never sent in the window or sent > 5 ms after their slot
            schedule_lag_fraction=(missed + late) / scheduled if scheduled else 0.0,
        )
    else:
        extended = max((r.get("extended_s", 0.0) for r in results), default=0.0)
        out.update(max_delay_ms=spec.max_delay_ms, min_requests=spec.min_requests, window_extended_s=round(extended, 3))
    return out


# ---------------------------------------------------------------- wrk (optional)
WRK_LUA = """-- generated by faasm_tasks.loadgen
wrk.method = "{method}"
wrk.body = {body}
{headers}
local max_delay = {delay}
function delay()
  if max_delay > 0 then return math.random(0, max_delay) end
  return 0
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("FAASM_WRK REQUESTS=%d DURATION=%d\\n", summary.requests, summary.duration))
  io.write(string.format("FAASM_WRK ERRORS connect=%d read=%d write=%d status=%d timeout=%d\\n",
    e.connect, e.read, e.write, e.status, e.timeout))
  io.write(string.format("FAASM_WRK MIN=%d MAX=%d MEAN=%.2f STDDEV=%.2f\\n",
    latency.min, latency.max, latency.mean, latency.stdev))
  local ps = {{}}
  for p = 1, 99 do ps[#ps + 1] = tostring(latency:percentile(p)) end
  io.write("FAASM_WRK LATENCIES=0," .. table.concat(ps, ",") .. "\\n")
  io.write(string.format("FAASM_WRK P999=%d\\n", latency:percentile(99.9)))
end
"""


def _lua_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def wrk_script(spec: LoadSpec) -> str:
    headers = "\n".join(f"wrk.headers[{_lua_str(k)}] = {_lua_str(v)}" for k, v in spec.headers.items())
    return WRK_LUA.format(
        method=spec.method,
        body=_lua_str(spec.body.decode("utf-8")) if spec.body else "nil",
        headers=headers,
        delay=int(spec.max_delay_ms),
    )


def wrk_available() -> str | None:
    return os.environ.get("FAASM_WRK") or shutil.which("wrk")


def parse_wrk(stdout: str, duration_s: float) -> dict[str, Any]:
    """Parse the ``FAASM_WRK`` lines of the generated script (and wrk's own summary)."""
    kv: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("FAASM_WRK "):
            for tok in line[len("FAASM_WRK ") :].split(" "):
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    kv[k] = v
    if "LATENCIES" not in kv:
        raise ValueError("wrk output has no FAASM_WRK summary (did the script run?)")
    lat = [int(float(x)) for x in kv["LATENCIES"].split(",")]
    total = int(kv["REQUESTS"])
    errors = {
        "connect": int(kv.get("connect", 0)),
        "timeout": int(kv.get("timeout", 0)),
        "read": int(kv.get("read", 0)) + int(kv.get("write", 0)),
        "non2xx": int(kv.get("status", 0)),
    }
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", stdout)
    if m:
        errors["non2xx"] = max(errors["non2xx"], int(m.group(1)))
    ok = total - errors["non2xx"]
    return {
        "unit": "us",
        "source": "wrk",
        "duration_s": duration_s,
        "requests_all": total,
        "requests_ok": ok,
        "throughput_all": total / duration_s,
        "throughput_ok": ok / duration_s,
        "errors": errors,
        "errors_total": sum(errors.values()),
        "min_us": int(kv["MIN"]),
        "max_us": int(kv["MAX"]),
        "mean_us": float(kv["MEAN"]),
        "stddev_us": float(kv["STDDEV"]),
        "p10_us": lat[10],
        "p50_us": lat[50],
        "p90_us": lat[90],
        "p99_us": lat[99],
        "p999_us": int(kv.get("P999", lat[99])),
        "latencies_us": lat,
        "wrk_duration_us": int(kv["DURATION"]),
    }


def run_wrk(spec: LoadSpec, threads: int | None = None) -> tuple[dict[str, Any], str, str]:
    """Run wrk with a generated script. Returns (summary, stdout, script)."""
    exe = wrk_available()
    if not exe:
        raise FileNotFoundError("wrk is not installed (apt-get install -y wrk)")
    script = wrk_script(spec)
    if spec.ready_timeout_s > 0:  # the same start condition as the builtin driver: a first 2xx reply
        t0 = time.monotonic()
        readiness = await_ready(spec)
        if not readiness["ready"]:
            out = not_ready_summary(spec, readiness, time.monotonic() - t0)
            out.pop("histogram")
            return out, "", script
    duration = int(max(1, round(spec.duration_s)))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        cmd = [
            exe,
            f"-t{threads or spec.processes}",
            f"-c{spec.connections}",
            f"-d{duration}s",
            f"--timeout={int(max(1, spec.timeout_s))}s",
            "-s",
            path,
            spec.url,
        ]
        if spec.warmup_s > 0:
            warm = [*cmd[:3], f"-d{int(max(1, round(spec.warmup_s)))}s", *cmd[4:]]
            subprocess.run(
                warm,
                capture_output=True,
                text=True,
                timeout=spec.warmup_s + 60,
                preexec_fn=fifo_preexec(spec.rt_priority),
            )
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=duration + spec.timeout_s + 60,
            preexec_fn=fifo_preexec(spec.rt_priority),
        )
    finally:
        os.unlink(path)
    out = proc.stdout + ("\n[stderr]\n" + proc.stderr if proc.stderr else "")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited {proc.returncode}: {out[-2000:]}")
    return parse_wrk(proc.stdout, duration), out, script
