"""Load driver, scheduling: what to send when (the load spec, open-loop slots dealt to
processes) and the OS scheduling of the driver processes (EEVDF slice, SCHED_FIFO)."""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Isolation:
    """How load clients on one host are kept apart."""

    netns: bool  # each client in a network namespace of its own (:mod:`.netns`)
    help: str


#: ``LoadSpec.client_isolation``: the one registry of its names
CLIENT_ISOLATION = {
    "netns": Isolation(True, "each client in its own network namespace with its own address (needs root)"),
    "process": Isolation(False, "each client a plain process on this host's network"),
}


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
    # Load clients (:mod:`.controller`): > 1 runs that many clients, each driving 1/clients of
    # the rate over its share of the connections, started together by one controller that
    # merges their histograms. 1: this process drives it all (no controller).
    clients: int = 1
    # how the clients on this host are kept apart: a key of CLIENT_ISOLATION
    client_isolation: str = "netns"
    # clients on other hosts, one per host (their count is ``clients``), each started with
    # ``client_command`` (``{host}`` replaced); empty: the clients run on this host
    client_hosts: tuple[str, ...] = ()
    client_command: str = "ssh -o BatchMode=yes {host} python3 -m faasm_tasks.loadgen client"

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
        self.client_hosts = tuple(self.client_hosts)
        if self.client_hosts and self.clients == 1:
            self.clients = len(self.client_hosts)
        if self.clients < 1 or (self.client_hosts and self.clients != len(self.client_hosts)):
            raise ValueError(
                f"clients must be >= 1 and, with client_hosts, their number ({self.clients} clients, "
                f"{len(self.client_hosts)} hosts)"
            )
        if self.clients > self.connections:
            raise ValueError(f"clients ({self.clients}) need a connection each; connections is {self.connections}")
        if self.client_isolation not in CLIENT_ISOLATION:
            raise ValueError(
                f"client_isolation must be one of {', '.join(CLIENT_ISOLATION)}, not {self.client_isolation!r}"
            )
        if self.client_hosts and "{host}" not in self.client_command:
            raise ValueError("client_command must name {host}")
        if self.ready_timeout_s < 0 or self.start_timeout_s <= 0 or self.min_requests < 0 or self.max_extra_s < 0:
            raise ValueError("ready_timeout_s, min_requests and max_extra_s must be >= 0, start_timeout_s > 0")


def slot_range(spec: LoadSpec) -> tuple[int, int]:
    """Open loop: slot j is at t0 + j / rate; measured slots are [first, total)."""
    first = math.ceil(spec.warmup_s * spec.rate - 1e-9)
    total = math.ceil((spec.warmup_s + spec.duration_s) * spec.rate - 1e-9)
    return first, total


def count_mod(lo: int, hi: int, p: int, r: int) -> int:
    """How many j in [lo, hi) have j % p == r."""

    def below(x: int) -> int:  # j in [0, x)
        return (x - r + p - 1) // p if x > r else 0

    return max(0, below(hi) - below(lo))


def share(spec: LoadSpec, index: int) -> int:
    return spec.connections // spec.processes + (1 if index < spec.connections % spec.processes else 0)


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
        _fields_ = [
            ("size", ctypes.c_uint32),
            ("policy", ctypes.c_uint32),
            ("flags", ctypes.c_uint64),
            ("nice", ctypes.c_int32),
            ("priority", ctypes.c_uint32),
            ("runtime", ctypes.c_uint64),
            ("deadline", ctypes.c_uint64),
            ("period", ctypes.c_uint64),
            ("util_min", ctypes.c_uint32),
            ("util_max", ctypes.c_uint32),
        ]

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        attr = Attr(
            size=ctypes.sizeof(Attr), policy=0, nice=os.getpriority(os.PRIO_PROCESS, pid), runtime=slice_us * 1000
        )
        return libc.syscall(nr, pid, ctypes.byref(attr), 0) == 0
    except (OSError, AttributeError):
        return False


def set_scheduling(rt_priority: int, slice_us: int = 0) -> tuple[str, Any]:
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


def fifo_preexec(rt_priority: int):
    """wrk under the spec's SCHED_FIFO priority, like this driver's own processes (None: unchanged)."""
    if rt_priority <= 0 or not hasattr(os, "sched_setscheduler"):
        return None

    def preexec():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt_priority))
        except OSError:
            pass  # refused: wrk runs under the normal policy

    return preexec
