"""runc: the binary, a state root's containers (list, remove), a container's OCI spec, its
OOM kills, and :class:`Container`, one native container serving calls over the framing
protocol of ``host_native.c``.

A container is told everything it needs (its id, bundle folder, root filesystem, limits and
the host answering its requests) by the pool that starts it (``native.py``), so this module
knows nothing of the pool and the pool imports it, not the other way round."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from typing import Any

import numpy as np

from .common import Call, chain_msg
from .state import Host

log = logging.getLogger("faasm_tasks.runtimes")


def runc_binary() -> str | None:
    return os.environ.get("FAASM_RUNC") or shutil.which("runc")


def runc_list(root: str) -> list[dict[str, Any]]:
    """The containers in a runc state root (empty when there is none)."""
    exe = runc_binary()
    if not exe or not os.path.isdir(root):
        return []
    out = subprocess.run([exe, "--root", root, "list", "--format", "json"], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return []
    return json.loads(out.stdout or "null") or []


def runc_remove(root: str, cid: str) -> str:
    exe = runc_binary() or "runc"
    subprocess.run([exe, "--root", root, "kill", cid, "KILL"], capture_output=True, timeout=30)
    r = subprocess.run([exe, "--root", root, "delete", "--force", cid], capture_output=True, text=True, timeout=30)
    return "deleted" if r.returncode == 0 else f"delete failed: {r.stderr.strip()[:200]}"


CGROUP_PARENT = "faasm_tasks"


def oom_kills(cid: str) -> int:
    """How many times the OOM killer struck in container ``cid``'s memory cgroup (v1 or v2);
    0 when its cgroup is gone or unreadable."""
    for path in (
        f"/sys/fs/cgroup/memory/{CGROUP_PARENT}/{cid}/memory.oom_control",
        f"/sys/fs/cgroup/{CGROUP_PARENT}/{cid}/memory.events",
    ):
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == "oom_kill" and int(v) > 0:
                        return int(v)
        except (OSError, ValueError):
            continue
    return 0


def container_config(cid: str, rootfs: str, memory_limit: int, env: dict[str, str]) -> dict[str, Any]:
    """An OCI runtime spec: the static binary as pid 1 of its own namespaces, read-only root
    with nothing else in it, no capabilities, the memory limit in its cgroup."""
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["/fn"],
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "noNewPrivileges": True,
            "capabilities": {"bounding": [], "effective": [], "permitted": [], "ambient": []},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 64, "soft": 64}],
        },
        "root": {"path": rootfs, "readonly": True},
        "hostname": cid[:63],
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {
                "destination": "/dev",
                "type": "tmpfs",
                "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
            },
        ],
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "cgroupsPath": f"/{CGROUP_PARENT}/{cid}",
            "resources": {
                "memory": {"limit": memory_limit, "swap": memory_limit},
                "devices": [{"allow": False, "access": "rwm"}],
            },
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def _read_frame(f) -> tuple[int, bytes]:
    hdr = f.read(5)
    if len(hdr) < 5:
        raise EOFError("container closed its output")
    n = struct.unpack("<I", hdr[1:])[0]
    data = f.read(n) if n else b""
    if len(data) < n:
        raise EOFError("container closed its output mid-frame")
    return hdr[0], data


def _frame(op: str, payload: bytes) -> bytes:
    return struct.pack("<BI", ord(op), len(payload)) + payload


class Container:
    """``runc run`` of container ``cid`` (the binary ``runc``, state root ``root``) from a new
    bundle ``bundle`` whose root filesystem is ``rootfs``; ``host`` answers its requests."""

    def __init__(
        self,
        cid: str,
        module: str,
        *,
        runc: str,
        root: str,
        bundle: str,
        rootfs: str,
        memory_limit: int,
        env: dict[str, str],
        host: Host,
    ):
        self.id, self.module = cid, module
        self.root, self.memory_limit, self.host = root, memory_limit, host
        os.makedirs(bundle, exist_ok=True)
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as f:
            json.dump(container_config(cid, rootfs, memory_limit, env), f)
        self.bundle = bundle
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [runc, "--root", root, "run", "--keep", "--bundle", bundle, cid],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.start_s = time.perf_counter() - t0
        self.calls = 0
        self.timed_out = False
        self.gone = False

    def call(self, call: Call, timeout_s: float) -> tuple[bool, str]:
        """Serve the container's host requests until it reports the call done."""
        host = self.host
        timer = threading.Timer(timeout_s, self._timeout)
        timer.daemon = True
        timer.start()
        w, r = self.proc.stdin, self.proc.stdout
        try:
            w.write(_frame("C", struct.pack("<i", call.index) + call.input))
            w.flush()
            while True:
                op, data = _read_frame(r)
                op = chr(op)
                if op == "D":
                    self.calls += 1
                    rc = struct.unpack("<i", data[:4])[0]
                    out = data[4:].decode(errors="replace")
                    return rc == 0, (out if rc == 0 else out or f"function returned {rc}")
                status, body, size = 0, b"", 0
                if op in "rf":
                    mx = struct.unpack("<i", data[:4])[0]
                    name = data[4:].decode(errors="replace")
                    val = host.tier.read(f"{call.user}_{name}") if op == "r" else host.read_file(name)
                    status = -1 if val is None else len(val)
                    body = b"" if val is None else val[: max(0, mx)]
                elif op == "w":
                    kl = struct.unpack("<i", data[:4])[0]
                    host.tier.write(f"{call.user}_{data[4 : 4 + kl].decode()}", data[4 + kl :])
                elif op == "a":
                    kl = struct.unpack("<i", data[:4])[0]
                    k = data[4 : 4 + kl].decode()
                    n = struct.unpack("<i", data[4 + kl : 8 + kl])[0]
                    off = 8 + kl
                    idx = np.frombuffer(data[off : off + 4 * n], dtype="<i4")
                    vals = np.frombuffer(data[off + 4 * n : off + 12 * n], dtype="<f8")
                    host.tier.add_f64(f"{call.user}_{k}", idx, vals)
                elif op == "c":
                    index = struct.unpack("<i", data[:4])[0]
                    try:
                        status = host.chain(chain_msg(call, index, data[4:]))
                    except Exception as exc:  # noqa: BLE001
                        log.warning("chain failed: %s", exc)
                        status = -1
                elif op == "W":
                    cid, mx = struct.unpack("<ii", data[:8])
                    ok, out = host.await_call(cid, host.call_timeout_s)
                    full = out.encode()
                    status, size, body = (0 if ok else 1), len(full), full[: max(0, mx)]
                else:
                    raise EOFError(f"unknown request {op!r} from the container")
                w.write(_frame("R", struct.pack("<ii", status, size) + body))
                w.flush()
        except (EOFError, BrokenPipeError, OSError) as exc:
            return False, self._death_reason(exc, timeout_s)
        finally:
            timer.cancel()

    def _timeout(self) -> None:
        self.timed_out = True
        self.kill()

    def _death_reason(self, exc: Exception, timeout_s: float) -> str:
        if self.timed_out:
            self.kill()
            return f"native container {self.id} killed after the call's {timeout_s:g} s limit"
        try:
            rc = self.proc.wait(timeout=10)  # runc exits with its container's status
        except subprocess.TimeoutExpired:
            rc = None
        oom = oom_kills(self.id)  # read before the container (and its cgroup) is deleted
        self.kill()
        err = (self.proc.stderr.read() or b"").decode(errors="replace").strip()[-300:] if self.proc.stderr else ""
        if oom:
            return (
                f"native container {self.id} killed by the OOM killer: over its "
                f"{self.memory_limit >> 20} MiB memory limit"
            )
        if rc is not None and rc > 128:
            sig = rc - 128
            name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig)
            return f"native function crashed ({name}) in container {self.id}" + (f": {err}" if err else "")
        return f"native container {self.id} ended mid-call (exit {rc}, {exc})" + (f": {err}" if err else "")

    def kill(self) -> None:
        if self.gone:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        runc_remove(self.root, self.id)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.gone = True
        shutil.rmtree(self.bundle, ignore_errors=True)
