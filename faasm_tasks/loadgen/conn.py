"""Load driver, connections: HTTP/1.1 keep-alive connections, closed loop (asyncio) and
open loop (non-blocking sockets, epoll/poll), and the response parser."""

from __future__ import annotations

import asyncio
import errno
import math
import os
import random
import select
import socket
import time
from array import array
from collections import Counter, deque
from typing import Any
from urllib.parse import urlsplit

from .measure import ERROR_KINDS, HIGHEST_US, LATE_S, LOWEST_US, new_hist
from .spec import LoadSpec, count_mod, share, slot_range


def request_bytes(spec: LoadSpec) -> tuple[str, int, bytes]:
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


class BadReply(Exception):
    pass


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one response; returns (status, keep_alive)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise BadReply(f"bad status line {lines[0][:80]!r}")
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


class ClosedLoop:
    """One process's share of the load."""

    def __init__(self, spec: LoadSpec, index: int, t0: float):
        self.spec, self.index, self.t0 = spec, index, t0
        self.host, self.port, self.req = request_bytes(spec)
        self.hist = new_hist()  # latency of 2xx responses, us
        self.lag = new_hist()  # actual send minus intended send (after the delay), us
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
        n = share(spec, index)
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
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, BadReply, ValueError) as exc:
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
            due = time.monotonic()
            if spec.max_delay_ms > 0:
                delay = self.rng.uniform(0, spec.max_delay_ms) / 1000.0
                due += delay
                await asyncio.sleep(delay)
            start = time.monotonic()
            if start >= self.record_from and start < self.end:  # the driver's own lag: its sleep overran
                self.lag.record_value(max(LOWEST_US, int((start - due) * 1e6)))
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
        conns = asyncio.gather(*[self.closed_conn() for _ in range(share(self.spec, self.index))])
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
    ``BadReply`` on a malformed response."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        if len(buf) > 65536:
            raise BadReply("response head over 64 KiB")
        if eof:
            raise BadReply("connection closed inside the response head")
        return None
    if not buf.startswith(b"HTTP/1."):
        raise BadReply(f"bad status line {buf[:40]!r}")
    try:
        status = int(buf[9:12])
    except ValueError:
        raise BadReply(f"bad status line {buf[:40]!r}") from None
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
                raise BadReply("bad chunk size") from None
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
            raise BadReply("connection closed inside a chunked body")
        return None
    cl = value(b"content-length")
    if cl is not None:
        try:
            length = int(cl)
        except ValueError:
            raise BadReply("bad Content-Length") from None
    elif status in (204, 304) or 100 <= status < 200:
        length = 0
    else:  # body ends when the server closes
        return (len(buf), status, False) if eof else None
    if len(buf) < pos + length:
        if eof:
            raise BadReply("connection closed inside the body")
        return None
    return pos + length, status, not close


class OpenLoop:
    """One process's share of an open-loop run on non-blocking sockets.

    Global slot ``j`` is scheduled at ``t0 + j / rate`` and belongs to process
    ``j % processes``. Each pass of the loop releases every slot that is due, sends each on
    an idle keep-alive connection (pre-built request bytes, one ``send`` each), then
    polls for replies until the next slot is due. A slot waiting for a free connection
    waits in a queue; its latency still counts from its scheduled time."""

    def __init__(self, spec: LoadSpec, index: int, t0: float, n_conns: int, watch_parent: bool = False):
        self.spec, self.index, self.t0, self.n = spec, index, t0, n_conns
        self.host, self.port, self.req = request_bytes(spec)
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
        self.first, self.total = slot_range(spec)
        self.record_from = t0 + self.first / spec.rate
        self.end = t0 + spec.warmup_s + spec.duration_s
        p = spec.processes
        self.scheduled = count_mod(self.first, self.total, p, index)
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
                except BadReply:
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
