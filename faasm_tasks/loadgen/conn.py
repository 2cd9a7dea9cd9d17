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
            except (TimeoutError, OSError) as exc:
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
        except TimeoutError:
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
        return {
            "hist": self.hist.encode().decode(),
            "lag": self.lag.encode().decode(),
            "errors": self.errors,
            "ok": self.ok,
            "all": self.all,
            "scheduled": self.scheduled,
            "sent": self.sent,
            "late": self.late,
            "last_done": self.last_done,
            "attempted": self.attempted,
            "warmup_attempted": self.warmup_attempted,
            "warmup_ok": self.warmup_ok,
            "last_errors": self.last_errors,
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "start_lag_s": None if self.first_start is None else self.first_start - self.t0,
            "extended_s": max(0.0, self.last_start - self.end),
        }


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
        return head[i : head.find(b"\r\n", i)].strip()

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


class _Conn:
    """One keep-alive connection of an :class:`OpenLoop`: its socket and state, the slot it
    serves and when its request went out, the reply read so far, the request bytes a short
    send left. What its loop's connections share (poller, idle list, counters) is the loop's,
    ``lp``."""

    __slots__ = ("lp", "sock", "fd", "state", "sched", "sent_at", "deadline", "retry_at", "buf", "outbuf")

    def __init__(self, lp: OpenLoop):
        self.lp = lp
        self.sock: socket.socket | None = None
        self.fd = -1
        self.state = _DOWN
        self.sched = 0.0  # BUSY: the scheduled time of the slot being served (latency counts from it)
        self.sent_at = 0.0  # BUSY: when its request was sent (the timeout counts from there)
        self.deadline = 0.0  # CONNECTING: the connect deadline
        self.retry_at = 0.0  # DOWN: reconnect from then on
        self.buf = b""  # BUSY: the reply so far
        self.outbuf = b""  # BUSY: what a short send left of the request

    # -- the connection
    def connect(self, now: float) -> None:
        lp = self.lp
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = s.connect_ex((lp.host, lp.port))
        self.sock, self.fd = s, s.fileno()
        lp.by_fd[self.fd] = self
        if err == 0:
            self.state = _IDLE
            lp.poller.register(self.fd, _IN)
            lp.idle.append(self)
        elif err in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            self.state, self.deadline = _CONNECTING, now + lp.timeout
            lp.poller.register(self.fd, _OUT | _IN)
        else:
            self.connect_failed(now)

    def connect_done(self, ev: int) -> None:
        """The poller's event on a connect in progress: established (idle) or failed."""
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err or ev & _ERR and not ev & _OUT:
            self.connect_failed(time.monotonic())
        else:
            self.state = _IDLE
            self.lp.poller.modify(self.fd, _IN)
            self.lp.idle.append(self)

    def connect_failed(self, now: float) -> None:
        lp = self.lp
        self.close()
        self.retry_at = now + min(0.05, lp.timeout)
        if lp.record_from <= now < lp.end:
            lp.errors["connect"] += 1

    def close(self) -> None:
        s = self.sock
        if s is not None:
            self.lp.by_fd.pop(self.fd, None)
            self.lp.poller.unregister(self.fd)
            s.close()
        self.sock, self.fd, self.state, self.buf, self.outbuf = None, -1, _DOWN, b"", b""

    def fail(self, kind: str) -> None:
        """The request in flight is lost: counted as ``kind`` (a measured slot's), and the connection closed."""
        if self.sched >= self.lp.record_from:
            self.lp.errors[kind] += 1
        self.close()

    def check(self, now: float) -> None:
        """Housekeeping: a request past its timeout, a connect past its deadline, a reconnect due."""
        lp = self.lp
        st = self.state
        if st == _BUSY and now - self.sent_at > lp.timeout:
            self.fail("timeout")
            self.retry_at = now
        elif st == _CONNECTING and now > self.deadline:
            self.connect_failed(now)
        if self.state == _DOWN and now >= self.retry_at and now < lp.end:
            self.connect(now)

    # -- a request
    def send(self, req: bytes, s0: float, now: float) -> bool:
        """Send slot ``s0``'s request (BUSY from now on). False: the server had dropped this idle
        connection (now closed, to reconnect); the slot was not taken."""
        try:
            k = self.sock.send(req)
        except BlockingIOError:
            k = 0
        except OSError:
            self.close()
            return False
        self.state, self.sched, self.sent_at = _BUSY, s0, now
        if k < len(req):
            self.outbuf = req[k:]
            self.lp.poller.modify(self.fd, _IN | _OUT)
        return True

    def on_event(self, ev: int) -> None:
        """One poller event: a connect concluded, room to send the rest, or bytes (or the end) to read."""
        if self.state == _CONNECTING:
            self.connect_done(ev)
            return
        if ev & _OUT and self.outbuf and not self.flush():
            return
        if ev & (_IN | _ERR):
            self.read()

    def flush(self) -> bool:
        """Send more of what a short send left; False: the connection failed (closed)."""
        try:
            k = self.sock.send(self.outbuf)
            self.outbuf = self.outbuf[k:]
            if not self.outbuf:
                self.lp.poller.modify(self.fd, _IN)
        except BlockingIOError:
            pass
        except OSError:
            self.fail("read")
            return False
        return True

    def read(self) -> None:
        """Read what arrived; a complete reply concludes the request in flight."""
        try:
            data = self.sock.recv(262144)
        except BlockingIOError:
            return
        except OSError:
            data = None
        t = time.monotonic()
        lp = self.lp
        if self.state != _BUSY:  # idle: the server closed it (or sent junk); reconnect quietly
            if not data:
                lp.idle.remove(self)
                self.close()
                self.retry_at = t
            return
        if data == lp.last_resp and not self.buf:  # the last keep-alive 200's very bytes: no parsing
            self.completed(200, True, t)
            return
        eof = not data
        buf = self.buf + data if data else self.buf
        try:
            r = parse_response(buf, eof)
        except BadReply:
            self.fail("read")
            self.retry_at = t
            return
        if r is None:
            if eof:
                self.fail("read")
                self.retry_at = t
            else:
                self.buf = buf
            return
        self.buf = b""
        consumed, status, keep = r
        keep = keep and not eof
        if consumed == len(buf) and status == 200 and keep:
            lp.last_resp = buf
        self.completed(status, keep, t)

    def completed(self, status: int, keep: bool, now: float) -> None:
        """The reply to the request in flight: counted (a measured slot's), latency from its slot's
        scheduled time; then idle again, or reconnected where the server closes."""
        lp = self.lp
        s0 = self.sched
        if s0 >= lp.record_from:
            lp.all += 1
            if 200 <= status < 300:
                lp.ok += 1
                lp.lat_us.append(int((now - s0) * 1e6))
            else:
                lp.errors["non2xx"] += 1
            if now > lp.last_done:
                lp.last_done = now
        if keep:
            self.state = _IDLE
            lp.idle.append(self)
        else:  # the server closes after each reply: open the next connection right away
            self.close()
            if now < lp.end:
                self.connect(now)


class OpenLoop:
    """One process's share of an open-loop run on non-blocking sockets.

    Global slot ``j`` is scheduled at ``t0 + j / rate`` and belongs to process
    ``j % processes``. Each pass of the loop releases every slot that is due, sends each on
    an idle keep-alive connection (pre-built request bytes, one ``send`` each), then
    polls for replies until the next slot is due. A slot waiting for a free connection
    waits in a queue; its latency still counts from its scheduled time. Each connection is
    a :class:`_Conn`; this loop holds what they share and the counters."""

    def __init__(self, spec: LoadSpec, index: int, t0: float, n_conns: int, watch_parent: bool = False):
        self.spec, self.index, self.t0, self.n = spec, index, t0, n_conns
        self.host, self.port, self.req = request_bytes(spec)
        self.timeout = spec.timeout_s
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
        # shared by the connections while it runs
        self.poller: _Poller | None = None
        self.by_fd: dict[int, _Conn] = {}
        self.idle: list[_Conn] = []  # connected, nothing in flight
        self.pending: deque[float] = deque()  # released slots (their scheduled times) waiting for an idle connection
        self.starved_upto = -1.0  # every queued slot up to this one found no idle connection
        self.last_resp = b""  # the last complete keep-alive 200: identical bytes need no parsing

    def run(self) -> None:
        mono, pending, by_fd = time.monotonic, self.pending, self.by_fd
        rate, t0, stride, total, end = self.spec.rate, self.t0, self.spec.processes, self.total, self.end
        poller = self.poller = _Poller()
        conns = [_Conn(self) for _ in range(self.n)]
        j = self.index  # this process's next slot
        next_sched = t0 + j / rate if j < total else math.inf
        now = mono()
        for c in conns:  # open every connection before the first slot
            c.connect(now)
        next_scan, hard_stop = 0.0, end + self.timeout + 1.0
        while True:
            now = mono()
            # 1. release every slot that is due; past the window, drop queued slots that are
            #    already late (never sent: missed); a slot due just before the end still goes
            while next_sched <= now:
                pending.append(next_sched)
                j += stride
                next_sched = t0 + j / rate if j < total else math.inf
            if now >= end:
                while pending and now - pending[0] > LATE_S:
                    pending.popleft()
            # 2. send due slots on idle connections
            if pending:
                self._send_due(now)
            # 3. housekeeping every 10 ms: timeouts, reconnects, parent alive
            if now >= next_scan:
                next_scan = now + 0.01
                self._housekeeping(conns, now)
            if now >= end and not any(c.state == _BUSY for c in conns) or now >= hard_stop:
                break
            # 4. wait for replies until the next slot is due
            wake = min(next_sched, next_scan) if next_sched < end and not pending else next_scan
            for fd, ev in poller.poll(max(0.0, wake - now)):
                c = by_fd.get(fd)
                if c is not None:
                    c.on_event(ev)
        for c in conns:
            if c.state == _BUSY:
                c.fail("timeout")
            c.close()
        poller.close()
        self._fill_histograms()

    def _send_due(self, now: float) -> None:
        """Send queued slots on idle connections, recording each measured slot's send lag."""
        pending, idle, req, record_from = self.pending, self.idle, self.req, self.record_from
        while pending and idle:
            c = idle.pop()
            s0 = pending.popleft()
            if not c.send(req, s0, now):  # the server dropped an idle connection: reconnect, keep the slot
                pending.appendleft(s0)
                continue
            if s0 >= record_from:
                self.sent += 1
                d = now - s0
                if d > LATE_S:
                    self.late += 1
                    if s0 <= self.starved_upto:
                        self.late_no_conn += 1
                self.lag_us.append(int(d * 1e6))
        if pending:
            self.starved_upto = pending[-1]

    def _housekeeping(self, conns: list[_Conn], now: float) -> None:
        for c in conns:
            c.check(now)
        if self.parent is not None and os.getppid() != self.parent:
            raise SystemExit("load driver parent exited")

    def _fill_histograms(self) -> None:
        for values, hist in ((self.lat_us, self.hist), (self.lag_us, self.lag)):
            for v, k in Counter(values).items():
                hist.record_value(max(LOWEST_US, min(HIGHEST_US, v)), k)
            del values[:]

    def result(self) -> dict[str, Any]:
        return {
            "hist": self.hist.encode().decode(),
            "lag": self.lag.encode().decode(),
            "errors": self.errors,
            "ok": self.ok,
            "all": self.all,
            "scheduled": self.scheduled,
            "sent": self.sent,
            "late": self.late,
            "late_no_conn": self.late_no_conn,
            "last_done": self.last_done,
            "attempted": self.sent,
        }
