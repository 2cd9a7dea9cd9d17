"""Load driver for the latency and throughput experiments.

Two modes, both over persistent HTTP/1.1 connections driven by asyncio, spread over
``processes`` OS processes (the "threads" of wrk) so that more than one core sends:

* ``closed``: the paper's wrk set-up. Each connection waits a random 0..D ms, sends,
  waits for the response. Latency = response time of that request.
* ``open``: constant offered rate, free of coordinated omission. Request ``i`` is
  *scheduled* at ``t0 + i / rate`` (slots dealt round-robin to processes; in a process
  a dispatcher releases each slot on time and any idle connection sends it); latency is
  measured from the scheduled time, not the actual send, so a stalled server or busy
  connections show up as latency. The driver also records
  its own send lag, how many requests it sent more than 5 ms late and how many it never
  sent; ``schedule_lag_fraction`` = (late + never sent) / scheduled.

Latencies are microseconds in an HdrHistogram (1 us .. 1 h, 3 significant digits).
Errors are counted by kind: ``connect``, ``timeout``, ``read`` (reset, bad reply) and
``non2xx``. Throughput is reported for successful and for all responses.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hdrh.histogram import HdrHistogram

LOWEST_US, HIGHEST_US, SIGFIG = 1, 3_600_000_000, 3
LATE_S = 0.005  # open loop: a request sent more than 5 ms after its slot counts as late
ERROR_KINDS = ("connect", "timeout", "read", "non2xx")


def new_hist() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGFIG)


@dataclass
class LoadSpec:
    url: str
    mode: str = "closed"  # closed | open
    connections: int = 1
    processes: int = 1
    duration_s: float = 10.0
    warmup_s: float = 0.0
    timeout_s: float = 5.0
    max_delay_ms: float = 0.0  # closed mode: random think time before each request
    rate: float = 0.0  # open mode: total requests per second
    method: str = "POST"
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        if self.mode not in ("closed", "open"):
            raise ValueError(f"mode must be closed or open, not {self.mode!r}")
        if self.mode == "open" and self.rate <= 0:
            raise ValueError("open mode needs rate > 0")
        if self.connections < 1 or self.processes < 1 or self.duration_s <= 0 or self.timeout_s <= 0:
            raise ValueError("connections, processes, duration and timeout must be positive")
        self.processes = min(self.processes, self.connections)


def _request_bytes(spec: LoadSpec) -> tuple[str, int, bytes]:
    u = urlsplit(spec.url)
    if u.scheme != "http":
        raise ValueError("only http:// URLs are supported")
    host, port = u.hostname or "127.0.0.1", u.port or 80
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    headers = {"Host": f"{host}:{port}", "User-Agent": "faasm-tasks-load", "Connection": "keep-alive"}
    headers.update(spec.headers)
    if spec.body or spec.method in ("POST", "PUT"):
        headers["Content-Length"] = str(len(spec.body))
    head = f"{spec.method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return host, port, head.encode("latin-1") + spec.body


class _BadReply(Exception):
    pass


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; returns (status, keep_alive)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise _BadReply(f"bad status line {lines[0][:80]!r}")
    status = int(parts[1])
    length, chunked, close = None, False, parts[0] == b"HTTP/1.0"
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            length = int(v.strip())
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
        elif k == b"connection":
            close = v.strip().lower() == b"close"
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    elif length is None and status not in (204, 304) and close:
        await reader.read()
    return status, not close


class _Worker:
    """One process's share of the load."""

    def __init__(self, spec: LoadSpec, index: int, t0: float):
        self.spec, self.index, self.t0 = spec, index, t0
        self.host, self.port, self.req = _request_bytes(spec)
        self.hist = new_hist()  # latency of 2xx responses, us
        self.lag = new_hist()  # open mode: actual send minus scheduled send, us
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.ok = self.all = self.scheduled = self.sent = self.late = 0
        self.rng = random.Random(spec.seed * 1000 + index)
        self.record_from = t0 + spec.warmup_s
        self.end = self.record_from + spec.duration_s

    async def _connect(self):
        return await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.spec.timeout_s)

    async def _one(self, conn, t_ref: float, record: bool):
        """Send one request on ``conn`` (connecting if needed); returns the connection to reuse."""
        spec = self.spec
        if conn is None:
            try:
                conn = await self._connect()
            except (OSError, asyncio.TimeoutError):
                if record:
                    self.errors["connect"] += 1
                await asyncio.sleep(min(0.05, spec.timeout_s))
                return None
        reader, writer = conn
        try:
            writer.write(self.req)
            async with asyncio.timeout(spec.timeout_s):  # cheaper than wait_for (no extra task)
                status, keep = await _read_response(reader)
        except asyncio.TimeoutError:
            if record:
                self.errors["timeout"] += 1
            writer.close()
            return None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _BadReply, ValueError):
            if record:
                self.errors["read"] += 1
            writer.close()
            return None
        done = time.monotonic()
        if record:
            self.all += 1
            if 200 <= status < 300:
                self.ok += 1
                self.hist.record_value(max(LOWEST_US, int((done - t_ref) * 1e6)))
            else:
                self.errors["non2xx"] += 1
        if not keep:
            writer.close()
            return None
        return conn

    async def closed_conn(self):
        spec, conn = self.spec, None
        await asyncio.sleep(max(0.0, self.t0 - time.monotonic()))
        while True:
            if spec.max_delay_ms > 0:
                await asyncio.sleep(self.rng.uniform(0, spec.max_delay_ms) / 1000.0)
            start = time.monotonic()
            if start >= self.end:
                break
            conn = await self._one(conn, start, start >= self.record_from)
        if conn:
            conn[1].close()

    async def open_dispatch(self, queue: asyncio.Queue, n_conns: int, interval: float):
        """Release this process's slots (j = index, index + P, ...) at ``t0 + j * interval``."""
        j, stride = self.index, self.spec.processes
        while True:
            sched = self.t0 + j * interval
            if sched >= self.end:
                break
            now = time.monotonic()
            if now < sched:
                await asyncio.sleep(sched - now)
            queue.put_nowait(sched)
            j += stride
        for _ in range(n_conns):
            queue.put_nowait(None)

    async def open_conn(self, queue: asyncio.Queue):
        """Take the next due slot from the shared queue; any idle connection sends it."""
        conn = None
        while True:
            sched = await queue.get()
            if sched is None:
                break
            now = time.monotonic()
            if now >= self.end:  # could not send this one in time: it counts as missed
                continue
            record = sched >= self.record_from
            if record:
                self.sent += 1
                self.late += (now - sched) > LATE_S
                self.lag.record_value(max(LOWEST_US, int((now - sched) * 1e6)))
            conn = await self._one(conn, sched, record)
        if conn:
            conn[1].close()

    async def main(self):
        spec = self.spec
        share = spec.connections // spec.processes + (1 if self.index < spec.connections % spec.processes else 0)
        if spec.mode == "closed":
            tasks = [self.closed_conn() for _ in range(share)]
        else:
            # Global slot j belongs to process j % P; within a process a dispatcher releases
            # each slot on time into a queue and whichever connection is idle sends it.
            interval = 1.0 / spec.rate
            queue: asyncio.Queue = asyncio.Queue()
            tasks = [self.open_dispatch(queue, share, interval)] + [self.open_conn(queue) for _ in range(share)]
            first = int(spec.warmup_s * spec.rate)
            total = int((spec.warmup_s + spec.duration_s) * spec.rate)
            self.scheduled = sum(1 for j in range(first, total) if j % spec.processes == self.index)
        await asyncio.gather(*tasks)

    def result(self) -> dict[str, Any]:
        return {"hist": self.hist.encode().decode(), "lag": self.lag.encode().decode(), "errors": self.errors,
                "ok": self.ok, "all": self.all, "scheduled": self.scheduled, "sent": self.sent,
                "late": self.late}


def _proc_main(spec: LoadSpec, index: int, t0: float, conn) -> None:
    try:
        try:
            import uvloop  # optional, faster event loop

            uvloop.install()
        except ImportError:
            pass
        w = _Worker(spec, index, t0)
        asyncio.run(w.main())
        conn.send(w.result())
    except BaseException as exc:  # noqa: BLE001 - report to the parent
        conn.send({"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


def run_load(spec: LoadSpec, start_delay_s: float = 0.3) -> dict[str, Any]:
    """Run the load and return the summary (with the encoded histogram)."""
    t0 = time.monotonic() + start_delay_s
    deadline = t0 + spec.warmup_s + spec.duration_s + spec.timeout_s + 30
    wall0 = time.time() + start_delay_s
    results = []
    if spec.processes == 1:
        w = _Worker(spec, 0, t0)
        asyncio.run(w.main())
        results.append(w.result())
    else:
        ctx = mp.get_context("fork")
        procs = []
        for i in range(spec.processes):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_proc_main, args=(spec, i, t0, child), daemon=True)
            p.start()
            child.close()
            procs.append((p, parent))
        try:
            for p, parent in procs:
                left = max(0.1, deadline - time.monotonic())
                if not parent.poll(left):
                    raise RuntimeError(f"load process {p.pid} did not report within its deadline")
                results.append(parent.recv())
        finally:
            for p, _ in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
                    p.join(timeout=5)
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("load process failed: " + "; ".join(errs))
    hist, lag = new_hist(), new_hist()
    errors = dict.fromkeys(ERROR_KINDS, 0)
    ok = total = scheduled = sent = late = 0
    for r in results:
        hist.decode_and_add(r["hist"])
        lag.decode_and_add(r["lag"])
        for k in ERROR_KINDS:
            errors[k] += r["errors"][k]
        ok += r["ok"]
        total += r["all"]
        scheduled += r["scheduled"]
        sent += r["sent"]
        late += r["late"]
    out = summarize(hist, spec.duration_s, ok, total, errors)
    out.update(mode=spec.mode, connections=spec.connections, processes=spec.processes,
               warmup_s=spec.warmup_s, started=wall0, histogram=hist.encode().decode())
    if spec.mode == "open":
        missed = max(0, scheduled - sent)
        out.update(rate=spec.rate, scheduled=scheduled, sent=sent, missed=missed, late=late,
                   late_threshold_ms=LATE_S * 1000,
                   # requests never sent in the window or sent > 5 ms after their slot
                   schedule_lag_fraction=(missed + late) / scheduled if scheduled else 0.0,
                   send_lag_p50_us=lag.get_value_at_percentile(50) if sent else None,
                   send_lag_p99_us=lag.get_value_at_percentile(99) if sent else None,
                   send_lag_max_us=lag.get_max_value() if sent else None)
    else:
        out.update(max_delay_ms=spec.max_delay_ms)
    return out


def summarize(hist: HdrHistogram, duration_s: float, ok: int, total: int, errors: dict[str, int]) -> dict[str, Any]:
    n = hist.get_total_count()
    pct = (lambda p: hist.get_value_at_percentile(p) if n else None)  # noqa: E731
    return {
        "unit": "us", "duration_s": duration_s, "requests_ok": ok, "requests_all": total,
        "throughput_ok": ok / duration_s, "throughput_all": total / duration_s,
        "errors": dict(errors), "errors_total": sum(errors.values()),
        "min_us": hist.get_min_value() if n else None, "max_us": hist.get_max_value() if n else None,
        "mean_us": hist.get_mean_value() if n else None, "stddev_us": hist.get_stddev() if n else None,
        "p10_us": pct(10), "p50_us": pct(50), "p90_us": pct(90), "p99_us": pct(99), "p999_us": pct(99.9),
        # the seed's LATENCIES list: entry 0 is the literal 0, then p1 .. p99
        "latencies_us": [0] + [pct(p) for p in range(1, 100)] if n else [],
    }


def latency_txt(s: dict[str, Any]) -> str:
    """The seed's ``latency.txt`` lines, plus the error counts it used to drop."""
    if not s.get("latencies_us"):
        lines = ["REQUESTS=0"]
    else:
        lines = [f"MIN={s['min_us']}", f"MAX={s['max_us']}", f"STDDEV={s['stddev_us']:.2f}",
                 f"DURATION={int(s['duration_s'] * 1e6)}", f"REQUESTS={s['requests_all']}",
                 f"MEDIAN={s['p50_us']}", f"90TH={s['p90_us']}", f"10TH={s['p10_us']}",
                 "LATENCIES=" + ",".join(str(v) for v in s["latencies_us"])]
    lines += [f"ERRORS_{k.upper()}={v}" for k, v in s.get("errors", {}).items()]
    return "\n".join(lines) + "\n"


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
    return WRK_LUA.format(method=spec.method, body=_lua_str(spec.body.decode("utf-8")) if spec.body else "nil",
                          headers=headers, delay=int(spec.max_delay_ms))


def wrk_available() -> str | None:
    return os.environ.get("FAASM_WRK") or shutil.which("wrk")


def parse_wrk(stdout: str, duration_s: float) -> dict[str, Any]:
    """Parse the ``FAASM_WRK`` lines of the generated script (and wrk's own summary)."""
    kv: dict[str, str] = {}
    for line in stdout.splitlines():
        if line.startswith("FAASM_WRK "):
            for tok in line[len("FAASM_WRK "):].split(" "):
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    kv[k] = v
    if "LATENCIES" not in kv:
        raise ValueError("wrk output has no FAASM_WRK summary (did the script run?)")
    lat = [int(float(x)) for x in kv["LATENCIES"].split(",")]
    total = int(kv["REQUESTS"])
    errors = {"connect": int(kv.get("connect", 0)), "timeout": int(kv.get("timeout", 0)),
              "read": int(kv.get("read", 0)) + int(kv.get("write", 0)), "non2xx": int(kv.get("status", 0))}
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", stdout)
    if m:
        errors["non2xx"] = max(errors["non2xx"], int(m.group(1)))
    ok = total - errors["non2xx"]
    return {"unit": "us", "source": "wrk", "duration_s": duration_s, "requests_all": total, "requests_ok": ok,
            "throughput_all": total / duration_s, "throughput_ok": ok / duration_s,
            "errors": errors, "errors_total": sum(errors.values()),
            "min_us": int(kv["MIN"]), "max_us": int(kv["MAX"]), "mean_us": float(kv["MEAN"]),
            "stddev_us": float(kv["STDDEV"]), "p10_us": lat[10], "p50_us": lat[50], "p90_us": lat[90],
            "p99_us": lat[99], "p999_us": int(kv.get("P999", lat[99])), "latencies_us": lat,
            "wrk_duration_us": int(kv["DURATION"])}


def run_wrk(spec: LoadSpec, threads: int | None = None) -> tuple[dict[str, Any], str, str]:
    """Run wrk with a generated script. Returns (summary, stdout, script)."""
    exe = wrk_available()
    if not exe:
        raise FileNotFoundError("wrk is not installed (apt-get install -y wrk)")
    script = wrk_script(spec)
    duration = int(max(1, round(spec.duration_s)))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        cmd = [exe, f"-t{threads or spec.processes}", f"-c{spec.connections}", f"-d{duration}s",
               f"--timeout={int(max(1, spec.timeout_s))}s", "-s", path, spec.url]
        if spec.warmup_s > 0:
            warm = [*cmd[:3], f"-d{int(max(1, round(spec.warmup_s)))}s", *cmd[4:]]
            subprocess.run(warm, capture_output=True, text=True, timeout=spec.warmup_s + 60)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + spec.timeout_s + 60)
    finally:
        os.unlink(path)
    out = proc.stdout + ("\n[stderr]\n" + proc.stderr if proc.stderr else "")
    if proc.returncode != 0:
        raise RuntimeError(f"wrk exited {proc.returncode}: {out[-2000:]}")
    return parse_wrk(proc.stdout, duration), out, script


def spec_dict(spec: LoadSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["body"] = spec.body.decode("utf-8", errors="replace")
    return d
