"""Load driver for the latency and throughput experiments.

Two modes over persistent HTTP/1.1 connections, spread over ``processes`` OS processes
(the "threads" of wrk) so that more than one core sends:

* ``closed`` (asyncio): the paper's wrk set-up. Each connection waits a random 0..D ms,
  sends, waits for the response. Latency = response time of that request.
* ``open``: constant offered rate, free of coordinated omission. Slot ``j`` is
  *scheduled* at ``t0 + j / rate``; slots are dealt round-robin to processes. Each process
  runs one loop on non-blocking sockets (epoll, else poll): it releases every slot that
  is due, sends each at once on an idle keep-alive connection (the request bytes are built
  once), and waits for replies until the next slot is due. Latency is measured from the
  scheduled time, not the actual send, so a stalled server or busy connections show up
  as latency. The driver also records its own send lag (send minus scheduled time), how
  many requests it sent more than 5 ms late (and how many of those had waited for a free
  connection) and how many it never sent; ``schedule_lag_fraction`` = (late + never
  sent) / scheduled.

On a machine shared with busy processes, lateness comes from the kernel scheduler: a
driver process waking for its next slot waits for someone else's time slice. Hence
``slice_us`` (a short EEVDF slice under the normal policy, default) and ``rt_priority``
(SCHED_FIFO, opt-in, needs root or CAP_SYS_NICE).

Latencies are microseconds in an HdrHistogram (1 us .. 1 h, 3 significant digits).
Errors are counted by kind: ``connect``, ``timeout`` (from the send), ``read`` (reset,
bad reply) and ``non2xx``. Throughput is reported for successful and for all responses,
divided by ``measured_duration_s`` (the window, lengthened by replies that arrive after
it; ``throughput_basis`` says so); ``duration_s`` stays the nominal window.

Start-up is judged by conditions, not fixed windows (a loaded machine stretches every
step of it): with ``ready_timeout_s`` the driver first sends single requests until one is
answered 2xx (the target has imported and warmed its function), waiting as long as that
first reply takes, up to the deadline; a target that never answers yields a summary with
``ready: False`` and no window at all. Forked driver processes report that they have
started before the start time ``t0`` is fixed (``start_timeout_s`` bounds that). In
closed mode ``min_requests`` lengthens the window, by at most ``max_extra_s``, until that
many requests were concluded in it. Every summary carries the counters that explain a
point without a success (``attempted``, ``sent``, errors by kind with the last error of
each, warm-up requests, the driver's start lag, ``elapsed_s``); :func:`explain_no_success`
turns them into one sentence.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import math
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import random
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter, deque
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
    # > 0: run the driver processes under SCHED_FIFO at this priority (1..99; needs root or
    # CAP_SYS_NICE), so that on a busy machine other processes cannot delay a send by a
    # scheduler time slice. 0: the normal time-sharing policy. Refused -> normal, recorded.
    rt_priority: int = 0
    # Under the normal policy: ask the kernel for this scheduler time slice (us) for the driver
    # processes (Linux >= 6.12 EEVDF; unprivileged; ignored by older kernels). A short slice
    # lets a driver waking from epoll preempt a busy neighbour sooner. 0: the kernel default.
    slice_us: int = 100
    # > 0: before the window, send one request at a time until one is answered 2xx, waiting
    # up to this many seconds in all (each reply may take that long): the target is warm
    # (imports done, first call served) before anything is measured. Never answered: the
    # summary says ``ready: False`` and holds what the probe got; no window is run.
    ready_timeout_s: float = 0.0
    # forked driver processes must report that they have started within this many seconds
    start_timeout_s: float = 60.0
    # closed mode: the window goes on past ``duration_s`` until this many requests were
    # concluded in it (answered or failed), for at most ``max_extra_s`` more seconds
    min_requests: int = 0
    max_extra_s: float = 0.0

    def __post_init__(self):
        if self.mode not in ("closed", "open"):
            raise ValueError(f"mode must be closed or open, not {self.mode!r}")
        if self.mode == "open" and self.rate <= 0:
            raise ValueError("open mode needs rate > 0")
        if self.connections < 1 or self.processes < 1 or self.duration_s <= 0 or self.timeout_s <= 0:
            raise ValueError("connections, processes, duration and timeout must be positive")
        self.processes = min(self.processes, self.connections)
        if self.slice_us and not 100 <= self.slice_us <= 100_000:
            raise ValueError("slice_us must be 0 (kernel default) or 100..100000")
        if not 0 <= self.rt_priority <= 99:
            raise ValueError("rt_priority must be 0 (normal scheduling) or 1..99 (SCHED_FIFO)")
        if self.ready_timeout_s < 0 or self.start_timeout_s <= 0 or self.min_requests < 0 or self.max_extra_s < 0:
            raise ValueError("ready_timeout_s, min_requests and max_extra_s must be >= 0, start_timeout_s > 0")


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
        self.last_errors: dict[str, str] = {}  # the last error of each kind, as text
        self.statuses: Counter[int] = Counter()  # non-2xx statuses in the window
        self.ok = self.all = self.scheduled = self.sent = self.late = 0
        self.attempted = 0  # requests started in the window (a failed connect counts)
        self.warmup_attempted = self.warmup_ok = 0
        self.rng = random.Random(spec.seed * 1000 + index)
        self.record_from = t0 + spec.warmup_s
        self.end = self.record_from + spec.duration_s
        # min_requests: this process's share of them; the window may run on until hard_end
        n = _share(spec, index)
        self.min_share = math.ceil(spec.min_requests * n / spec.connections) if spec.min_requests else 0
        self.hard_end = self.end + (spec.max_extra_s if self.min_share else 0.0)
        self.last_done = 0.0
        self.first_start: float | None = None  # when this process's first request started
        self.last_start = 0.0

    def _concluded(self) -> int:
        return self.all + self.errors["connect"] + self.errors["timeout"] + self.errors["read"]

    def _error(self, kind: str, record: bool, detail: str) -> None:
        if record:
            self.errors[kind] += 1
            self.last_errors[kind] = detail[:200]

    async def _connect(self):
        return await asyncio.wait_for(asyncio.open_connection(self.host, self.port), self.spec.timeout_s)

    async def _one(self, conn, t_ref: float, record: bool):
        """Send one request on ``conn`` (connecting if needed); returns the connection to reuse."""
        spec = self.spec
        if record:
            self.attempted += 1
        else:
            self.warmup_attempted += 1
        if conn is None:
            try:
                conn = await self._connect()
            except (OSError, asyncio.TimeoutError) as exc:
                self._error("connect", record, f"{self.host}:{self.port}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(min(0.05, spec.timeout_s))
                return None
        reader, writer = conn
        try:
            writer.write(self.req)
            if record:
                self.sent += 1
            async with asyncio.timeout(spec.timeout_s):  # cheaper than wait_for (no extra task)
                status, keep = await _read_response(reader)
        except asyncio.TimeoutError:
            self._error("timeout", record, f"no reply within {spec.timeout_s:g} s")
            writer.close()
            return None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, _BadReply, ValueError) as exc:
            self._error("read", record, f"{type(exc).__name__}: {exc}")
            writer.close()
            return None
        done = time.monotonic()
        if record:
            self.all += 1
            self.last_done = max(self.last_done, done)
            if 200 <= status < 300:
                self.ok += 1
                self.hist.record_value(max(LOWEST_US, int((done - t_ref) * 1e6)))
            else:
                self.errors["non2xx"] += 1
                self.statuses[status] += 1
        elif 200 <= status < 300:
            self.warmup_ok += 1
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
            # the window ends at its nominal end once this process concluded its share of
            # min_requests, else at the latest at hard_end
            if start >= self.end and (self._concluded() >= self.min_share or start >= self.hard_end):
                break
            if self.first_start is None:
                self.first_start = start
            self.last_start = max(self.last_start, start)
            conn = await self._one(conn, start, start >= self.record_from)
        if conn:
            conn[1].close()

    async def main(self, watch_parent: bool = False):
        conns = asyncio.gather(*[self.closed_conn() for _ in range(_share(self.spec, self.index))])
        if not watch_parent:
            await conns
            return
        parent = os.getppid()
        while not conns.done():  # a child exits when its parent is gone
            await asyncio.wait([conns], timeout=0.1)
            if os.getppid() != parent:
                conns.cancel()
                raise SystemExit("load driver parent exited")
        await conns

    def result(self) -> dict[str, Any]:
        return {"hist": self.hist.encode().decode(), "lag": self.lag.encode().decode(), "errors": self.errors,
                "ok": self.ok, "all": self.all, "scheduled": self.scheduled, "sent": self.sent,
                "late": self.late, "last_done": self.last_done, "attempted": self.attempted,
                "warmup_attempted": self.warmup_attempted, "warmup_ok": self.warmup_ok,
                "last_errors": self.last_errors, "statuses": {str(k): v for k, v in self.statuses.items()},
                "start_lag_s": None if self.first_start is None else self.first_start - self.t0,
                "extended_s": max(0.0, self.last_start - self.end)}


def _slot_range(spec: LoadSpec) -> tuple[int, int]:
    """Open loop: slot j is at t0 + j / rate; measured slots are [first, total)."""
    first = math.ceil(spec.warmup_s * spec.rate - 1e-9)
    total = math.ceil((spec.warmup_s + spec.duration_s) * spec.rate - 1e-9)
    return first, total


def _count_mod(lo: int, hi: int, p: int, r: int) -> int:
    """How many j in [lo, hi) have j % p == r."""
    def below(x: int) -> int:  # j in [0, x)
        return (x - r + p - 1) // p if x > r else 0
    return max(0, below(hi) - below(lo))


def _share(spec: LoadSpec, index: int) -> int:
    return spec.connections // spec.processes + (1 if index < spec.connections % spec.processes else 0)

# ---------------------------------------------------------------- open loop: raw sockets
_IN, _OUT, _ERR = select.POLLIN, select.POLLOUT, select.POLLERR | select.POLLHUP
_DOWN, _CONNECTING, _IDLE, _BUSY = 0, 1, 2, 3


class _Poller:
    """epoll where there is one (Linux), else poll(2); the same event bits in both."""

    def __init__(self):
        self._ep = select.epoll() if hasattr(select, "epoll") else None
        self._p = self._ep or select.poll()

    def register(self, fd: int, mask: int) -> None:
        self._p.register(fd, mask)

    def modify(self, fd: int, mask: int) -> None:
        self._p.modify(fd, mask)

    def unregister(self, fd: int) -> None:
        try:
            self._p.unregister(fd)
        except (OSError, KeyError, ValueError):
            pass

    def poll(self, timeout_s: float) -> list[tuple[int, int]]:
        if self._ep is not None:
            return self._ep.poll(timeout_s)
        return self._p.poll(int(timeout_s * 1000 + 0.999))

    def close(self) -> None:
        if self._ep is not None:
            self._ep.close()


def parse_response(buf: bytes, eof: bool = False) -> tuple[int, int, bool] | None:
    """Parse one HTTP/1.x response at the start of ``buf``.

    Returns ``(consumed, status, keep_alive)`` or None when more bytes are needed
    (with ``eof`` a body delimited by the connection close is complete). Raises
    ``_BadReply`` on a malformed response."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 65536:
            raise _BadReply("response head over 64 KiB")
        if eof:
            raise _BadReply("connection closed inside the response head")
        return None
    if not buf.startswith(b"HTTP/1."):
        raise _BadReply(f"bad status line {buf[:40]!r}")
    try:
        status = int(buf[9:12])
    except ValueError:
        raise _BadReply(f"bad status line {buf[:40]!r}") from None
    head = buf[:end].lower() + b"\r\n"

    def value(name: bytes) -> bytes | None:
        i = head.find(b"\r\n" + name + b":")
        if i < 0:
            return None
        i += len(name) + 3
        return head[i:head.find(b"\r\n", i)].strip()

    close = head.startswith(b"http/1.0")
    v = value(b"connection")
    if v is not None:
        close = v == b"close" or (close and v != b"keep-alive")
    pos = end + 4
    te = value(b"transfer-encoding")
    if te is not None and b"chunked" in te:
        while True:  # chunks, then trailers up to an empty line
            j = buf.find(b"\r\n", pos)
            if j < 0:
                break
            try:
                size = int(buf[pos:j].split(b";")[0].strip(), 16)
            except ValueError:
                raise _BadReply("bad chunk size") from None
            if size:
                pos = j + 2 + size + 2
                if pos > len(buf):
                    break
                continue
            pos = j + 2
            while True:
                k = buf.find(b"\r\n", pos)
                if k < 0:
                    break
                if k == pos:
                    return k + 2, status, not close
                pos = k + 2
            break
        if eof:
            raise _BadReply("connection closed inside a chunked body")
        return None
    cl = value(b"content-length")
    if cl is not None:
        try:
            length = int(cl)
        except ValueError:
            raise _BadReply("bad Content-Length") from None
    elif status in (204, 304) or 100 <= status < 200:
        length = 0
    else:  # body ends when the server closes
        return (len(buf), status, False) if eof else None
    if len(buf) < pos + length:
        if eof:
            raise _BadReply("connection closed inside the body")
        return None
    return pos + length, status, not close


class _OpenLoop:
    """One process's share of an open-loop run on non-blocking sockets.

    Global slot ``j`` is scheduled at ``t0 + j / rate`` and belongs to process
    ``j % processes``. Each pass of the loop releases every slot that is due, sends each on
    an idle keep-alive connection (pre-built request bytes, one ``send`` each), then
    polls for replies until the next slot is due. A slot waiting for a free connection
    waits in a queue; its latency still counts from its scheduled time."""

    def __init__(self, spec: LoadSpec, index: int, t0: float, n_conns: int, watch_parent: bool = False):
        self.spec, self.index, self.t0, self.n = spec, index, t0, n_conns
        self.host, self.port, self.req = _request_bytes(spec)
        self.hist, self.lag = new_hist(), new_hist()
        # raw values in us (8 bytes each), added to the histograms after the run (cheaper in the loop)
        self.lat_us = array("q")
        self.lag_us = array("q")
        self.errors = dict.fromkeys(ERROR_KINDS, 0)
        self.ok = self.all = self.sent = self.late = 0
        self.late_no_conn = 0  # late sends whose slot had waited for a free connection
        # Slots [first, total) are measured: the first at or after the warm-up, the last
        # before the window's end. ``record_from`` is slot ``first``'s own time (the same
        # expression), so "sched >= record_from" and "j >= first" always agree.
        self.first, self.total = _slot_range(spec)
        self.record_from = t0 + self.first / spec.rate
        self.end = t0 + spec.warmup_s + spec.duration_s
        p = spec.processes
        self.scheduled = _count_mod(self.first, self.total, p, index)
        self.last_done = 0.0
        self.parent = os.getppid() if watch_parent else None  # a child exits when its parent is gone

    def run(self) -> None:
        spec, n, req, mono = self.spec, self.n, self.req, time.monotonic
        hist_rec, lag_rec = self.lat_us.append, self.lag_us.append
        last_resp = [b""]  # the last complete keep-alive response: identical bytes need no parsing
        errors, record_from, end, timeout = self.errors, self.record_from, self.end, spec.timeout_s
        poller = _Poller()
        socks: list[socket.socket | None] = [None] * n
        state = [_DOWN] * n
        sched = [0.0] * n  # BUSY: the slot being served; CONNECTING: the connect deadline
        sent_at = [0.0] * n  # BUSY: when its request was sent (the timeout counts from there)
        bufs = [b""] * n
        outbuf = [b""] * n
        retry_at = [0.0] * n
        fd2c: dict[int, int] = {}
        idle: list[int] = []
        pending: deque[float] = deque()
        starved_upto = -1.0  # every queued slot up to this one found no idle connection
        rate, t0, stride, total = spec.rate, self.t0, spec.processes, self.total
        j = self.index  # this process's next slot
        next_sched = t0 + j / rate if j < total else float("inf")

        def close(c: int) -> None:
            s = socks[c]
            if s is not None:
                fd2c.pop(s.fileno(), None)
                poller.unregister(s.fileno())
                s.close()
            socks[c], state[c], bufs[c], outbuf[c] = None, _DOWN, b"", b""

        def connect(c: int, now: float) -> None:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            err = s.connect_ex((self.host, self.port))
            socks[c] = s
            fd2c[s.fileno()] = c
            if err == 0:
                state[c] = _IDLE
                poller.register(s.fileno(), _IN)
                idle.append(c)
            elif err in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
                state[c], sched[c] = _CONNECTING, now + timeout
                poller.register(s.fileno(), _OUT | _IN)
            else:
                connect_failed(c, now)

        def connect_failed(c: int, now: float) -> None:
            close(c)
            retry_at[c] = now + min(0.05, timeout)
            if record_from <= now < end:
                errors["connect"] += 1

        def fail(c: int, kind: str) -> None:  # a request in flight on c is lost
            if sched[c] >= record_from:
                errors[kind] += 1
            close(c)

        def completed(c: int, status: int, keep: bool, now: float) -> None:
            s0 = sched[c]
            if s0 >= record_from:
                self.all += 1
                if 200 <= status < 300:
                    self.ok += 1
                    hist_rec(int((now - s0) * 1e6))
                else:
                    errors["non2xx"] += 1
                if now > self.last_done:
                    self.last_done = now
            if keep:
                state[c] = _IDLE
                idle.append(c)
            else:  # the server closes after each reply: open the next connection right away
                close(c)
                if now < end:
                    connect(c, now)

        # open every connection before the first slot
        now = mono()
        for c in range(n):
            connect(c, now)
        next_scan = 0.0
        hard_stop = end + timeout + 1.0
        while True:
            now = mono()
            # 1. release every slot that is due; past the window, drop queued slots that are
            #    already late (never sent: missed); a slot due just before the end still goes
            while next_sched <= now:
                pending.append(next_sched)
                j += stride
                next_sched = t0 + j / rate if j < total else float("inf")
            if now >= end:
                while pending and now - pending[0] > LATE_S:
                    pending.popleft()
            # 2. send due slots on idle connections
            while pending and idle:
                c = idle.pop()
                s0 = pending.popleft()
                try:
                    k = socks[c].send(req)
                except BlockingIOError:
                    k = 0
                except OSError:  # the server dropped an idle connection: reconnect, keep the slot
                    close(c)
                    pending.appendleft(s0)
                    continue
                state[c], sched[c], sent_at[c] = _BUSY, s0, now
                if k < len(req):
                    outbuf[c] = req[k:]
                    poller.modify(socks[c].fileno(), _IN | _OUT)
                if s0 >= record_from:
                    self.sent += 1
                    d = now - s0
                    if d > LATE_S:
                        self.late += 1
                        if s0 <= starved_upto:
                            self.late_no_conn += 1
                    lag_rec(int(d * 1e6))
            if pending:
                starved_upto = pending[-1]
            # 3. housekeeping every 10 ms: timeouts, reconnects, parent alive
            if now >= next_scan:
                next_scan = now + 0.01
                for c in range(n):
                    st = state[c]
                    if st == _BUSY and now - sent_at[c] > timeout:
                        fail(c, "timeout")
                        retry_at[c] = now
                    elif st == _CONNECTING and now > sched[c]:
                        connect_failed(c, now)
                    if state[c] == _DOWN and now >= retry_at[c] and now < end:
                        connect(c, now)
                if self.parent is not None and os.getppid() != self.parent:
                    raise SystemExit("load driver parent exited")
            busy = any(st == _BUSY for st in state) if now >= end else True
            if now >= end and not busy or now >= hard_stop:
                break
            # 4. wait for replies until the next slot is due
            if next_sched < end and not pending:
                wait = max(0.0, min(next_sched, next_scan) - now)
            else:
                wait = max(0.0, next_scan - now)
            for fd, ev in poller.poll(wait):
                c = fd2c.get(fd)
                if c is None:
                    continue
                st = state[c]
                s = socks[c]
                if st == _CONNECTING:
                    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err or ev & _ERR and not ev & _OUT:
                        connect_failed(c, mono())
                    else:
                        state[c] = _IDLE
                        poller.modify(fd, _IN)
                        idle.append(c)
                    continue
                if ev & _OUT and outbuf[c]:
                    try:
                        k = s.send(outbuf[c])
                        outbuf[c] = outbuf[c][k:]
                        if not outbuf[c]:
                            poller.modify(fd, _IN)
                    except BlockingIOError:
                        pass
                    except OSError:
                        fail(c, "read")
                        continue
                if not ev & (_IN | _ERR):
                    continue
                try:
                    data = s.recv(262144)
                except BlockingIOError:
                    continue
                except OSError:
                    data = None
                t = mono()
                if st != _BUSY:  # idle: the server closed it (or sent junk); reconnect quietly
                    if not data:
                        idle.remove(c)
                        close(c)
                        retry_at[c] = t
                    continue
                if data == last_resp[0] and not bufs[c]:
                    completed(c, 200, True, t)
                    continue
                eof = not data
                buf = bufs[c] + data if data else bufs[c]
                try:
                    r = parse_response(buf, eof)
                except _BadReply:
                    fail(c, "read")
                    retry_at[c] = t
                    continue
                if r is None:
                    if eof:
                        fail(c, "read")
                        retry_at[c] = t
                    else:
                        bufs[c] = buf
                    continue
                bufs[c] = b""
                if r[0] == len(buf) and r[1] == 200 and r[2] and not eof:
                    last_resp[0] = buf
                completed(c, r[1], r[2] and not eof, t)
        for c in range(n):
            if state[c] == _BUSY:
                fail(c, "timeout")
            close(c)
        poller.close()
        for values, hist in ((self.lat_us, self.hist), (self.lag_us, self.lag)):
            for v, k in Counter(values).items():
                hist.record_value(max(LOWEST_US, min(HIGHEST_US, v)), k)
            del values[:]

    def result(self) -> dict[str, Any]:
        return {"hist": self.hist.encode().decode(), "lag": self.lag.encode().decode(), "errors": self.errors,
                "ok": self.ok, "all": self.all, "scheduled": self.scheduled, "sent": self.sent,
                "late": self.late, "late_no_conn": self.late_no_conn, "last_done": self.last_done,
                "attempted": self.sent}


_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274, "arm64": 274, "ppc64le": 355, "s390x": 345, "riscv64": 274}


def set_sched_slice(pid: int, slice_us: int) -> bool:
    """Request a time slice (``sched_setattr`` ``sched_runtime`` for SCHED_OTHER, Linux >= 6.12)
    for ``pid`` (0: this process); 0 restores the kernel default. False where unsupported."""
    import ctypes
    import platform

    nr = _SCHED_SETATTR.get(platform.machine())
    if nr is None or not sys.platform.startswith("linux"):
        return False

    class Attr(ctypes.Structure):  # struct sched_attr, SCHED_ATTR_SIZE_VER1
        _fields_ = [("size", ctypes.c_uint32), ("policy", ctypes.c_uint32), ("flags", ctypes.c_uint64),
                    ("nice", ctypes.c_int32), ("priority", ctypes.c_uint32), ("runtime", ctypes.c_uint64),
                    ("deadline", ctypes.c_uint64), ("period", ctypes.c_uint64), ("util_min", ctypes.c_uint32),
                    ("util_max", ctypes.c_uint32)]

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = Attr(size=ctypes.sizeof(Attr), policy=0, nice=os.getpriority(os.PRIO_PROCESS, pid),
                    runtime=slice_us * 1000)
        return libc.syscall(nr, pid, ctypes.byref(attr), 0) == 0
    except (OSError, AttributeError):
        return False


def _set_scheduling(rt_priority: int, slice_us: int = 0) -> tuple[str, Any]:
    """Apply the spec's scheduling policy to this process; returns (what applies, what to restore)."""
    if rt_priority <= 0 or not hasattr(os, "sched_setscheduler"):
        if slice_us and set_sched_slice(0, slice_us):
            return f"normal, {slice_us} us slice", "slice"
        return "normal", None
    try:
        old = (os.sched_getscheduler(0), os.sched_getparam(0))
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt_priority))
        return f"SCHED_FIFO {rt_priority}", old
    except (OSError, AttributeError) as exc:
        return f"normal (SCHED_FIFO {rt_priority} refused: {exc})", None


def _run_share(spec: LoadSpec, index: int, t0: float, in_child: bool) -> dict[str, Any]:
    """Run process ``index``'s share of the load; returns its counts and histograms."""
    gc_was = gc.isenabled()
    if spec.mode == "open":
        gc.disable()  # no collector pauses inside the open loop (it creates no reference cycles)
    scheduling, restore = _set_scheduling(spec.rt_priority, spec.slice_us)
    cpu0 = time.process_time()
    try:
        if spec.mode == "open":
            w: _OpenLoop | _Worker = _OpenLoop(spec, index, t0, _share(spec, index), watch_parent=in_child)
            w.run()
        else:
            if in_child:
                try:
                    import uvloop  # optional, faster event loop

                    uvloop.install()
                except ImportError:
                    pass
            w = _Worker(spec, index, t0)
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
    host, port, req = _request_bytes(spec)
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
                except socket.timeout:
                    kind, last = "timeout", "no reply before the readiness deadline"
                except (OSError, _BadReply) as exc:
                    kind, last = "read", f"{type(exc).__name__}: {exc}"
        if kind is None:
            if 200 <= status < 300:
                return {"ready": True, "attempts": attempts, "errors": errors,
                        "statuses": {str(k): v for k, v in statuses.items()},
                        "last_error": last, "waited_s": round(time.monotonic() - t_start, 3)}
            kind, last = "non2xx", f"HTTP {status}"
            statuses[status] += 1
        errors[kind] += 1
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    return {"ready": False, "attempts": attempts, "errors": errors, "statuses": {str(k): v for k, v in statuses.items()},
            "last_error": last, "waited_s": round(time.monotonic() - t_start, 3),
            "ready_timeout_s": spec.ready_timeout_s}


def _child_setup(spec: LoadSpec) -> None:
    """What a forked driver process does before it reports that it has started."""
    if spec.mode == "closed":
        try:
            import uvloop  # noqa: F401 - optional, installed in _run_share
        except ImportError:
            pass


def _proc_main(spec: LoadSpec, index: int, conn) -> None:
    """A forked driver process: set up, report that it has started, wait for the start time, run."""
    try:
        _child_setup(spec)
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


def _load_text() -> str:
    try:
        return "load average %.1f, %.1f, %.1f" % os.getloadavg()
    except OSError:
        return "load average unknown"


def _not_ready_summary(spec: LoadSpec, readiness: dict[str, Any], elapsed: float) -> dict[str, Any]:
    out = summarize(new_hist(), spec.duration_s, 0, 0, dict.fromkeys(ERROR_KINDS, 0))
    out.update(ready=False, readiness=readiness, attempted=0, sent=0, warmup_attempted=0, warmup_ok=0,
               mode=spec.mode, connections=spec.connections, processes=spec.processes, warmup_s=spec.warmup_s,
               elapsed_s=round(elapsed, 3), started=time.time(), histogram=new_hist().encode().decode(),
               host_load=_load_text())
    return out


def run_load(spec: LoadSpec, start_delay_s: float = 0.3) -> dict[str, Any]:
    """Run the load and return the summary (with the encoded histogram)."""
    m0 = time.monotonic()
    readiness = None
    if spec.ready_timeout_s > 0:
        readiness = await_ready(spec)
        if not readiness["ready"]:
            return _not_ready_summary(spec, readiness, time.monotonic() - m0)
    results = []
    if spec.processes == 1:
        t0 = time.monotonic() + start_delay_s
        wall0 = time.time() + start_delay_s
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
                    raise RuntimeError(f"the load driver never started: process(es) {pids} did not report within "
                                       f"{spec.start_timeout_s:g} s ({len(procs) - len(waiting)}/{len(procs)} "
                                       f"started; {_load_text()})")
                for parent in ready:
                    p = waiting.pop(parent)
                    try:
                        r = parent.recv()
                    except EOFError:
                        p.join(timeout=1)
                        raise RuntimeError(f"the load driver never started: process {p.pid} exited before "
                                           f"starting (exit code {p.exitcode})") from None
                    if "error" in r:
                        raise RuntimeError(f"the load driver never started: {r['error']}")
            # 2. the start time, now that all of them wait for it
            t0 = time.monotonic() + start_delay_s
            wall0 = time.time() + start_delay_s
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
                        from stepkit.pool import exit_reason  # noqa: PLC0415

                        raise RuntimeError(f"load process {i} (pid {p.pid}) died without a result: "
                                           f"{exit_reason(p.exitcode)}") from None
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
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("load process failed: " + "; ".join(errs))
    hist, lag = new_hist(), new_hist()
    errors = dict.fromkeys(ERROR_KINDS, 0)
    ok = total = scheduled = sent = late = late_no_conn = attempted = warm_att = warm_ok = 0
    last_errors: dict[str, str] = {}
    statuses: Counter[str] = Counter()
    last_done = max((r["last_done"] for r in results), default=0.0)
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
    out.update(scheduling=sorted({r["scheduling"] for r in results}),
               # CPU time of the load processes (user + system), all of them together
               driver_cpu_s=round(cpu, 3), driver_cpu_us_per_request=round(cpu / total * 1e6, 1) if total else None)
    out.update(mode=spec.mode, connections=spec.connections, processes=spec.processes,
               warmup_s=spec.warmup_s, started=wall0, histogram=hist.encode().decode())
    # what explains a point without a success (explain_no_success)
    out.update(ready=True, readiness=readiness, attempted=attempted, sent=sent, warmup_attempted=warm_att,
               warmup_ok=warm_ok, last_errors=last_errors, statuses=dict(statuses),
               start_lag_s=round(max(lags), 3) if lags else None, timeout_s=spec.timeout_s,
               elapsed_s=round(time.monotonic() - m0, 3), host_load=_load_text())
    if spec.mode == "open":
        missed = max(0, scheduled - sent)
        out.update(rate=spec.rate, scheduled=scheduled, sent=sent, missed=missed, late=late,
                   late_threshold_ms=LATE_S * 1000,
                   # late sends whose slot found every connection busy (the server, not the
                   # driver's own clock, held them back); the rest the driver itself was late for
                   late_waiting_for_connection=late_no_conn,
                   # requests never sent in the window or sent > 5 ms after their slot
                   schedule_lag_fraction=(missed + late) / scheduled if scheduled else 0.0,
                   send_lag_p50_us=lag.get_value_at_percentile(50) if sent else None,
                   send_lag_p99_us=lag.get_value_at_percentile(99) if sent else None,
                   send_lag_max_us=lag.get_max_value() if sent else None)
    else:
        extended = max((r.get("extended_s", 0.0) for r in results), default=0.0)
        out.update(max_delay_ms=spec.max_delay_ms, min_requests=spec.min_requests,
                   window_extended_s=round(extended, 3))
    return out


def counters_text(s: dict[str, Any]) -> str:
    e = s.get("errors") or {}
    return (f"attempted {s.get('attempted', '?')}, sent {s.get('sent', '?')}, responses {s.get('requests_all', 0)}, "
            f"connect errors {e.get('connect', 0)}, timeouts {e.get('timeout', 0)}, read errors {e.get('read', 0)}, "
            f"non-2xx {e.get('non2xx', 0)}, elapsed {float(s.get('elapsed_s') or 0):.1f} s")


def explain_no_success(s: dict[str, Any]) -> str:
    """One sentence on why a load summary has no successful response, with its counters."""
    counters = f"[{counters_text(s)}; {s.get('host_load', _load_text())}]"
    e = s.get("errors") or {}
    last = s.get("last_errors") or {}
    if s.get("ready") is False:
        r = s.get("readiness") or {}
        re_ = r.get("errors") or {}
        got = ", ".join(f"{v} {k}" for k, v in re_.items() if v) or "nothing"
        return (f"the target never answered 2xx before the window: {r.get('attempts', 0)} readiness request(s) in "
                f"{r.get('waited_s', 0):g} s (deadline {r.get('ready_timeout_s', 0):g} s) got {got} "
                f"(last: {r.get('last_error') or '-'}); no load was sent {counters}")
    # wrk's summary has no "attempted": what it concluded stands in
    attempted = int(s["attempted"] if "attempted" in s else (s.get("requests_all") or 0) + (s.get("errors_total") or 0))
    window = f"{float(s.get('duration_s') or 0):g} s"
    if attempted == 0:
        if s.get("mode") == "open":
            why = (f"{s.get('scheduled', 0)} slot(s) were scheduled and none was sent (the driver fell behind "
                   "its schedule)")
        else:
            lag, span = s.get("start_lag_s"), float(s.get("warmup_s") or 0) + float(s.get("duration_s") or 0)
            if lag is None or lag >= span:
                why = ("the driver started after the window had closed" if lag is not None
                       else "the driver never sent a request") + (f" (start lag {lag:.1f} s)" if lag is not None else "")
            else:
                why = (f"the warm-up's request(s) ({s.get('warmup_attempted', 0)} started, {s.get('warmup_ok', 0)} "
                       "answered 2xx) were still in flight when the window closed")
        return f"zero requests sent in the {window} measurement window: {why} {counters}"
    failed = sum(int(e.get(k, 0)) for k in ERROR_KINDS)
    if e.get("connect", 0) and e.get("connect") == failed and not s.get("requests_all"):
        return f"no connection: all {e['connect']} connect attempt(s) failed (last: {last.get('connect', '-')}) {counters}"
    if e.get("timeout", 0) and e.get("timeout") == failed:
        return (f"all {e['timeout']} request(s) timed out (no reply within {float(s.get('timeout_s') or 0):g} s) "
                f"{counters}")
    if e.get("read", 0) and e.get("read") == failed:
        return f"all {e['read']} request(s) failed reading the reply (last: {last.get('read', '-')}) {counters}"
    if e.get("non2xx", 0) and e.get("non2xx") == failed:
        sts = ", ".join(f"HTTP {k} x{v}" for k, v in sorted((s.get("statuses") or {}).items())) or "statuses unrecorded"
        return f"all {e['non2xx']} repl(ies) were non-2xx ({sts}) {counters}"
    if failed:
        kinds = ", ".join(f"{k}: {last[k]}" for k in ERROR_KINDS if k in last)
        return f"no successful responses: every request failed ({kinds or 'mixed errors'}) {counters}"
    return f"no successful responses: {attempted} request(s) started and none concluded in the window {counters}"


def summarize(hist: HdrHistogram, duration_s: float, ok: int, total: int, errors: dict[str, int]) -> dict[str, Any]:
    n = hist.get_total_count()
    pct = (lambda p: hist.get_value_at_percentile(p) if n else None)  # noqa: E731
    return {
        "unit": "us", "duration_s": duration_s, "measured_duration_s": duration_s, "requests_ok": ok, "requests_all": total,
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
                 f"DURATION={int(s.get('measured_duration_s', s['duration_s']) * 1e6)}", f"REQUESTS={s['requests_all']}",
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


def _fifo_preexec(rt_priority: int):
    """wrk under the spec's SCHED_FIFO priority, like this driver's own processes (None: unchanged)."""
    if rt_priority <= 0 or not hasattr(os, "sched_setscheduler"):
        return None

    def preexec():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt_priority))
        except OSError:
            pass  # refused: wrk runs under the normal policy
    return preexec


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
            out = _not_ready_summary(spec, readiness, time.monotonic() - t0)
            out.pop("histogram")
            return out, "", script
    duration = int(max(1, round(spec.duration_s)))
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
        path = f.name
    try:
        cmd = [exe, f"-t{threads or spec.processes}", f"-c{spec.connections}", f"-d{duration}s",
               f"--timeout={int(max(1, spec.timeout_s))}s", "-s", path, spec.url]
        if spec.warmup_s > 0:
            warm = [*cmd[:3], f"-d{int(max(1, round(spec.warmup_s)))}s", *cmd[4:]]
            subprocess.run(warm, capture_output=True, text=True, timeout=spec.warmup_s + 60,
                           preexec_fn=_fifo_preexec(spec.rt_priority))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration + spec.timeout_s + 60,
                              preexec_fn=_fifo_preexec(spec.rt_priority))
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
