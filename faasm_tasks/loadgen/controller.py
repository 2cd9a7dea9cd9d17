"""Load driver, several clients: one controller starts N load clients together and merges them.

``spec.clients = N > 1`` (:func:`~.driver.run_load` hands such a spec here): the controller

1. sends the target single requests until one is answered 2xx (``ready_timeout_s``, as one
   client would; the clients themselves skip it);
2. starts N clients, each ``python -m faasm_tasks.loadgen client`` speaking JSON lines over
   its stdin/stdout: on this host as plain processes (``client_isolation="process"``) or each
   inside a network namespace of its own (``"netns"``, :mod:`.netns`: own interface, own
   address, own socket tables), or on other hosts (``client_hosts``: the same command
   started by ``client_command``, ``ssh`` by default);
3. gives each client its share (:func:`client_spec`): 1/N of the open-loop rate, its share of
   the connections and processes (at least one each) and of ``min_requests``; client ``i``'s
   slots are offset by ``i / rate``, so together the clients keep the one-client schedule
   (slot ``j`` at ``t0 + j / rate``), dealt round-robin to the clients;
4. waits until every client has checked that it can connect to the endpoint and has started
   its driver processes (the barrier), then sends all of them one start instant on the wall
   clock (``time.time()``; each client turns it into its own monotonic clock, so clients on
   other hosts need synchronised clocks, e.g. NTP/PTP, to within the slot spacing);
5. collects each client's summary and merges them (:func:`~.driver.combine`: the latency
   and send-lag HdrHistograms added, counters summed, the window the longest client's): the
   merged figures under the usual keys, each client's under ``clients_detail``.

A client that fails, dies or misses a deadline fails the run, and every client is stopped;
SIGTERM (the step's :class:`~stepkit.pool.Terminated`) and any error stop the clients and
remove the namespaces before the exception goes on. A client exits when its stdin closes
(the controller is gone) and, on this host, when the controller dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit, urlunsplit

from .driver import await_ready, combine, not_ready_summary, run_load as run_one
from .measure import ERROR_KINDS
from .netns import ClientNamespaces, NetnsError, netns_unavailable
from .spec import CLIENT_ISOLATION, LoadSpec

#: the per-client figures kept in ``clients_detail``
CLIENT_FIGURES = (
    "requests_ok",
    "requests_all",
    "throughput_ok",
    "rate",
    "scheduled",
    "sent",
    "missed",
    "late",
    "schedule_lag_fraction",
    "p50_us",
    "p99_us",
    "send_lag_p50_us",
    "send_lag_p99_us",
    "send_lag_max_us",
    "errors",
    "driver_cpu_s",
    "measured_duration_s",
    "start_lag_s",
)
_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding faasm_tasks


def _split(n: int, parts: int, i: int) -> int:
    return n // parts + (1 if i < n % parts else 0)


def client_spec(spec: LoadSpec, i: int) -> tuple[LoadSpec, float]:
    """Client ``i``'s spec (its share of the load, one client, no readiness probe) and its
    start offset in seconds from the shared start instant."""
    n = spec.clients
    conns = _split(spec.connections, n, i)
    procs = max(1, min(conns, _split(spec.processes, n, i)))
    sub = replace(
        spec,
        clients=1,
        client_hosts=(),
        connections=conns,
        processes=procs,
        rate=spec.rate / n if spec.mode == "open" else spec.rate,
        min_requests=math.ceil(spec.min_requests / n) if spec.min_requests else 0,
        ready_timeout_s=0.0,
        seed=spec.seed * 1000 + i,
    )
    return sub, (i / spec.rate if spec.mode == "open" else 0.0)


def spec_to_json(spec: LoadSpec) -> dict[str, Any]:
    d = asdict(spec)
    d["body"] = base64.b64encode(spec.body).decode()
    d["client_hosts"] = list(spec.client_hosts)
    return d


def spec_from_json(d: dict[str, Any]) -> LoadSpec:
    d = dict(d)
    d["body"] = base64.b64decode(d["body"])
    return LoadSpec(**d)


def merge_client_summaries(spec: LoadSpec, parts: list[dict[str, Any]], wall0: float, readiness, m0: float):
    """The run's summary from its clients' summaries (histograms merged, counters summed)."""
    results = []
    for s in parts:
        results.append(
            {
                "hist": s["histogram"],
                "lag": s["send_lag_histogram"],
                "errors": {k: s["errors"].get(k, 0) for k in ERROR_KINDS},
                "ok": s["requests_ok"],
                "all": s["requests_all"],
                "scheduled": s.get("scheduled", 0),
                "sent": s.get("sent", 0),
                "late": s.get("late", 0),
                "late_no_conn": s.get("late_waiting_for_connection", 0),
                "attempted": s.get("attempted", 0),
                "warmup_attempted": s.get("warmup_attempted", 0),
                "warmup_ok": s.get("warmup_ok", 0),
                "last_errors": s.get("last_errors") or {},
                "statuses": s.get("statuses") or {},
                "start_lag_s": s.get("start_lag_s"),
                "extended_s": s.get("window_extended_s", 0.0),
                "cpu_s": s.get("driver_cpu_s", 0.0),
                "scheduling": ", ".join(s.get("scheduling") or ["normal"]),
                # on a clock whose start instant is 0: the end of the client's measured window
                "last_done": spec.warmup_s + s["measured_duration_s"],
            }
        )
    return combine(spec, results, 0.0, wall0, readiness, m0)


# ---------------------------------------------------------------- the client side
def _send(out: TextIO, msg: dict[str, Any]) -> None:
    out.write(json.dumps(msg) + "\n")
    out.flush()


def client_main(inp: TextIO, out: TextIO) -> int:
    """One load client: the protocol of the module's docstring over ``inp``/``out``."""
    first = inp.readline()
    if not first:
        return 2
    msg = json.loads(first)
    spec, offset, index = spec_from_json(msg["spec"]), float(msg["offset_s"]), int(msg["index"])
    u = urlsplit(spec.url)
    where = f"client {index} ({socket.gethostname()}, pid {os.getpid()})"
    try:
        socket.create_connection((u.hostname, u.port or 80), timeout=min(spec.timeout_s, 10.0)).close()
    except OSError as exc:
        _send(out, {"error": f"{where} cannot connect to {u.hostname}:{u.port or 80}: {exc}"})
        return 1

    def start_at() -> tuple[float, float]:
        _send(out, {"started": os.getpid(), "host": socket.gethostname()})
        line = inp.readline()
        if not line:
            raise SystemExit("the controller closed the client's input before the start")
        wall = float(json.loads(line)["start_wall"]) + offset
        # from here on, the controller closing our input (it is gone) ends this client
        threading.Thread(target=_exit_on_eof, args=(inp,), daemon=True).start()
        return time.monotonic() + (wall - time.time()), wall

    try:
        summary = run_one(spec, start_at=start_at)
    except Exception as exc:  # noqa: BLE001 - reported to the controller
        _send(out, {"error": f"{where}: {type(exc).__name__}: {exc}"})
        return 1
    _send(out, {"result": summary})
    return 0


def _exit_on_eof(inp: TextIO) -> None:
    while inp.readline():
        pass
    os._exit(3)


# ---------------------------------------------------------------- the controller side
def _pdeathsig() -> None:
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Client:
    def __init__(self, index: int, cmd: list[str], where: dict[str, Any], local: bool):
        self.index, self.cmd, self.where = index, cmd, where
        self.err = tempfile.TemporaryFile()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            text=True,
            env=env if local else None,
            preexec_fn=_pdeathsig,
        )
        self.buf = ""

    def send(self, msg: dict[str, Any]) -> None:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()

    def stderr_tail(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-1500:].strip()

    def stop(self) -> None:
        p = self.proc
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        for f in (p.stdin, p.stdout):
            with contextlib.suppress(OSError):
                f.close()
        self.err.close()


def _collect(clients: list[_Client], key: str, deadline: float, what: str) -> dict[int, dict[str, Any]]:
    """One message with ``key`` from every client, by ``deadline``; an error, a death or the
    deadline fails the run (RuntimeError naming the client)."""
    got: dict[int, dict[str, Any]] = {}
    sel = selectors.DefaultSelector()
    for c in clients:
        sel.register(c.proc.stdout, selectors.EVENT_READ, c)
    try:
        while len(got) < len(clients):
            left = deadline - time.monotonic()
            if left <= 0:
                late = [c.index for c in clients if c.index not in got]
                raise RuntimeError(f"load client(s) {late} did not {what} in time")
            for k, _ in sel.select(timeout=min(left, 1.0)):
                c: _Client = k.data
                line = c.proc.stdout.readline()
                if not line:
                    sel.unregister(c.proc.stdout)
                    code = c.proc.wait(timeout=5)
                    raise RuntimeError(
                        f"load client {c.index} ({' '.join(c.cmd[:4])} ...) exited ({code}) before it could {what}: "
                        f"{c.stderr_tail() or 'no output'}"
                    )
                msg = json.loads(line)
                if "error" in msg:
                    raise RuntimeError(f"load client {c.index} failed: {msg['error']}")
                if key in msg:
                    got[c.index] = msg
                    sel.unregister(c.proc.stdout)
    finally:
        sel.close()
    return got


def _for_netns(spec: LoadSpec, ns: ClientNamespaces) -> LoadSpec:
    """A loopback endpoint seen from the namespaces: the host's veth address (the endpoint must
    listen there or on 0.0.0.0); the request keeps its Host header."""
    u = urlsplit(spec.url)
    if u.hostname not in ("localhost",) and not (u.hostname or "").startswith("127."):
        return spec
    netloc = f"{ns.endpoint_address}:{u.port or 80}"
    headers = {"Host": u.netloc, **spec.headers}
    return replace(spec, url=urlunsplit(u._replace(netloc=netloc)), headers=headers)


def run_load(spec: LoadSpec, start_delay_s: float = 0.3) -> dict[str, Any]:
    """Run the load and return the summary (with the encoded histogram): this process drives it
    (:func:`~.driver.run_load`) or, with ``spec.clients > 1``, N clients (:func:`run_clients`)."""
    if spec.clients > 1:
        return run_clients(spec, start_delay_s=start_delay_s)
    return run_one(spec, start_delay_s=start_delay_s)


def run_clients(spec: LoadSpec, start_delay_s: float = 0.3, namespaces: ClientNamespaces | None = None):
    """Run ``spec`` as ``spec.clients`` load clients (see the module's docstring); the summary
    as :func:`~.driver.run_load`'s, plus ``clients_detail``, ``client_isolation``."""
    m0 = time.monotonic()
    readiness = None
    if spec.ready_timeout_s > 0:
        readiness = await_ready(spec)
        if not readiness["ready"]:
            return not_ready_summary(spec, readiness, time.monotonic() - m0)
    n = spec.clients
    iso = CLIENT_ISOLATION[spec.client_isolation]
    own_ns = None
    clients: list[_Client] = []
    try:
        if spec.client_hosts:
            isolation = "hosts"
        elif iso.netns:
            isolation = spec.client_isolation
            if namespaces is None:
                why = netns_unavailable()
                if why:
                    raise NetnsError(f"{n} load clients in network namespaces: {why}")
                own_ns = namespaces = ClientNamespaces(n).open()
            elif namespaces.n < n:
                raise ValueError(f"{namespaces.n} namespaces for {n} clients")
        else:
            isolation = spec.client_isolation
        target = _for_netns(spec, namespaces) if iso.netns and not spec.client_hosts else spec
        for i in range(n):
            sub, offset = client_spec(target, i)
            if spec.client_hosts:
                host = spec.client_hosts[i]
                cmd = shlex.split(spec.client_command.format(host=shlex.quote(host), python=sys.executable))
                where, local = {"host": host}, False
            else:
                cmd = [sys.executable, "-m", "faasm_tasks.loadgen", "client"]
                where, local = {"host": socket.gethostname()}, True
                if iso.netns:
                    cmd = namespaces.exec_prefix(i) + cmd
                    where = {**where, **namespaces.describe()[i]}
            c = _Client(i, cmd, where, local)
            clients.append(c)
            c.send({"spec": spec_to_json(sub), "offset_s": offset, "index": i})
        try:
            _collect(clients, "started", time.monotonic() + spec.start_timeout_s, "start")
        except RuntimeError as exc:
            if target is spec or "cannot connect" not in str(exc):
                raise
            raise RuntimeError(
                f"{exc} (from the clients' network namespaces {spec.url} is {target.url}: the endpoint must "
                f"listen on 0.0.0.0 or {namespaces.endpoint_address}, or use client isolation 'process')"
            ) from None
        wall0 = time.time() + start_delay_s
        for c in clients:
            c.send({"start_wall": wall0})
        deadline = time.monotonic() + start_delay_s + spec.warmup_s + spec.duration_s + spec.max_extra_s
        got = _collect(clients, "result", deadline + spec.timeout_s + 30, "report its result")
    finally:
        for c in clients:
            c.stop()
        if own_ns is not None:
            left = own_ns.close()
            if left:
                raise NetnsError("could not remove: " + "; ".join(left))
    parts = [got[i]["result"] for i in range(n)]
    out = merge_client_summaries(spec, parts, wall0, readiness, m0)
    out.update(
        clients=n,
        client_isolation=isolation,
        clients_detail=[
            {"index": i, **clients[i].where, **{k: parts[i].get(k) for k in CLIENT_FIGURES}} for i in range(n)
        ],
        client_histograms=[p["histogram"] for p in parts],
    )
    return out
