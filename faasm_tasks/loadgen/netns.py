"""Load driver, client isolation: one Linux network namespace per load client (iproute2).

:class:`ClientNamespaces` makes, for a run of N clients, N namespaces ``lg<pid><x>c<i>`` (``x`` a letter per set), each
with a veth pair to the host: the host end ``lg<pid><x>h<i>`` holds ``10.A.B.(4i+1)/30``, the
namespace end ``lg<pid><x>n<i>`` holds ``10.A.B.(4i+2)/30``, with the namespace's loopback up
and its default route via the host end. Every address of the host is then reachable from
every namespace (the host answers for its own addresses on any interface); nothing is
forwarded beyond the host (no ``ip_forward``, no NAT), so a namespace reaches no outside
network. ``A.B`` is a /24 inside 10.200.0.0 .. 10.254.255.0 that no interface of the host
uses, picked from the run's pid.

Everything made is removed by :meth:`ClientNamespaces.close` (the ``with`` block's end, an
error, a :class:`~stepkit.pool.Terminated` raised by SIGTERM in the main thread), and, for a
run whose ``with`` block cannot end (a driver thread still running when the interpreter
exits), by an ``atexit`` hook over every set still open. Where no ``finally`` runs (SIGKILL,
the OOM killer) a :class:`stepkit.procs.Guard` started before anything is made runs
``python -m faasm_tasks.loadgen.netns remove TAG N`` (:func:`remove`: kill what runs in the
namespaces, delete the links and namespaces) once the process is gone; :meth:`close`
disarms it. The client processes inside are the caller's to stop first (a namespace with a
process inside lives on after ``ip netns del``, unnamed).

Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and ``ip``; :func:`netns_unavailable` says why
not, in one sentence, without leaving anything behind.
"""

from __future__ import annotations

import atexit
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from stepkit.procs import Guard

PREFIX = "lg"  # every name this module makes starts so (then the pid)
MAX_CLIENTS = 63  # /30 per client inside one /24

_OPEN: set[ClientNamespaces] = set()
_SEQ = itertools.count()
_LOCK = threading.Lock()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    exe = shutil.which("ip")
    if exe is None:
        raise NetnsError("iproute2's ip command is not installed (apt-get install -y iproute2)")
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip() or f'exit status {r.returncode}'}")
    return r


class NetnsError(RuntimeError):
    """A network namespace could not be made (the message says which command and why)."""


def netns_unavailable() -> str | None:
    """None where this process can make network namespaces, else why not (one sentence)."""
    name = f"{PREFIX}{os.getpid()}probe"
    try:
        _ip("netns", "add", name)
    except NetnsError as exc:
        return f"cannot create a network namespace ({exc}); run as root, or use --client-isolation process"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run ip ({exc})"
    _ip("netns", "del", name, check=False)
    return None


def _used_24s() -> set[tuple[int, int]]:
    out = _ip("-o", "-4", "addr", "show").stdout
    used = set()
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = ipaddress.ip_interface(parts[parts.index("inet") + 1])
            o = addr.ip.packed
            if o[0] == 10:
                used.add((o[1], o[2]))
    return used


class ClientNamespaces:
    """N network namespaces with a veth pair each to the host (see the module's docstring)."""

    def __init__(self, n: int):
        if not 1 <= n <= MAX_CLIENTS:
            raise ValueError(f"clients in namespaces: 1..{MAX_CLIENTS}, not {n}")
        self.n = n
        self.tag = f"{PREFIX}{os.getpid()}{chr(97 + next(_SEQ) % 26)}"
        self.names = [f"{self.tag}c{i}" for i in range(n)]
        self.host_links = [f"{self.tag}h{i}" for i in range(n)]
        self.ns_links = [f"{self.tag}n{i}" for i in range(n)]
        self.base: tuple[int, int] | None = None
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), in the order made
        self.closed = False
        self._guard: Guard | None = None

    # addresses
    def host_address(self, i: int) -> str:
        """The host end of client ``i``'s veth (its namespace's gateway)."""
        a, b = self.base
        return f"10.{a}.{b}.{4 * i + 1}"

    def client_address(self, i: int) -> str:
        a, b = self.base
        return f"10.{a}.{b}.{4 * i + 2}"

    @property
    def endpoint_address(self) -> str:
        """A host address every namespace reaches: where a host endpoint is bound for the clients."""
        return self.host_address(0)

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a command inside client ``i``'s namespace."""
        return [shutil.which("ip") or "ip", "netns", "exec", self.names[i]]

    # lifecycle
    def open(self) -> ClientNamespaces:
        with _LOCK:
            _OPEN.add(self)
        try:
            root = str(Path(__file__).resolve().parents[2])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
            self._guard = Guard(
                [sys.executable, "-m", "faasm_tasks.loadgen.netns", "remove", self.tag, str(self.n)],
                f"load-client network namespaces {self.tag}*",
                env=env,
            )
            used = _used_24s()
            start = os.getpid() % (55 * 256)
            for k in range(55 * 256):
                c = (start + k) % (55 * 256)
                cand = (200 + c // 256, c % 256)
                if cand not in used:
                    self.base = cand
                    break
            else:
                raise NetnsError("no free 10.x.y.0/24 for the client namespaces")
            for i in range(self.n):
                ns, h, c = self.names[i], self.host_links[i], self.ns_links[i]
                _ip("netns", "add", ns)
                self._made.append(("netns", ns))
                _ip("link", "add", h, "type", "veth", "peer", "name", c)
                self._made.append(("link", h))
                _ip("link", "set", c, "netns", ns)
                _ip("addr", "add", f"{self.host_address(i)}/30", "dev", h)
                _ip("link", "set", h, "up")
                _ip("-n", ns, "addr", "add", f"{self.client_address(i)}/30", "dev", c)
                _ip("-n", ns, "link", "set", c, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "route", "add", "default", "via", self.host_address(i))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> list[str]:
        """Remove what was made (links first, then namespaces); returns what could not be removed."""
        left = []
        for kind, name in reversed(self._made):
            if kind == "link":
                r = _ip("link", "del", name, check=False)
                if r.returncode != 0 and "Cannot find device" not in r.stderr:
                    left.append(f"link {name}: {r.stderr.strip()}")
        for kind, name in reversed(self._made):
            if kind == "netns":
                r = _ip("netns", "del", name, check=False)
                if r.returncode != 0 and "No such file" not in r.stderr:
                    left.append(f"netns {name}: {r.stderr.strip()}")
        self._made.clear()
        self.closed = True
        if self._guard is not None:
            self._guard.disarm()
            self._guard = None
        with _LOCK:
            _OPEN.discard(self)
        return left

    def __enter__(self) -> ClientNamespaces:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> list[dict[str, str]]:
        return [
            {"netns": self.names[i], "address": self.client_address(i), "gateway": self.host_address(i)}
            for i in range(self.n)
        ]


def leftovers(tag: str) -> list[str]:
    """Namespaces and links whose names start with ``tag`` (a test's check that nothing is left)."""
    ns = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line.strip()]
    links = [line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link").stdout.splitlines() if ":" in line]
    return sorted(n for n in ns + links if n.startswith(tag))


def remove(tag: str, n: int) -> list[str]:
    """What a guard does for a set whose process died: kill what runs in namespaces
    ``<tag>c<i>``, delete links ``<tag>h<i>`` and the namespaces; returns what is left."""
    for i in range(n):
        r = _ip("netns", "pids", f"{tag}c{i}", check=False)
        for pid in r.stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for i in range(n):
        _ip("link", "del", f"{tag}h{i}", check=False)
        _ip("netns", "del", f"{tag}c{i}", check=False)
    return leftovers(tag)


@atexit.register
def _close_all() -> None:
    with _LOCK:
        sets = list(_OPEN)
    for s in sets:
        s.close()


if __name__ == "__main__":  # the guard's clean-up: python -m faasm_tasks.loadgen.netns remove TAG N
    if len(sys.argv) != 4 or sys.argv[1] != "remove" or not sys.argv[2].startswith(PREFIX):
        sys.exit("usage: python -m faasm_tasks.loadgen.netns remove TAG N")
    left = remove(sys.argv[2], int(sys.argv[3]))
    if left:
        print(f"left: {', '.join(left)}", file=sys.stderr)
    sys.exit(1 if left else 0)
