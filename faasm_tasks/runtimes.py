"""The local target's two systems: the C functions (faasm_tasks/functions) as WebAssembly on
wasmtime (``wasm``: Faaslets) and as native static binaries in runc containers (``native``).

Each worker process hosts one runtime. A call names a module (a workload's, :func:`faasm_tasks.workloads.modules`) and an index
(``faasm_main(index)``); the function reaches state, shared files and other calls through
the host interface of ``faasm.h``:

* ``wasm``: one :class:`WasmRuntime` per worker, the runtime process of its Faaslets. Each
  module is compiled once and the machine code cached on disk (``Module.serialize``, as
  Faasm's codegen step), each call runs in an instance: a fresh one on a cold start, an idle
  one reused when warm. Instances share the worker's state region (:class:`LocalTier`, Faasm's
  local tier), synchronised with Redis (its global tier): reads come from the region, writes
  and element-wise adds go to both, ``pull_state`` refreshes the region. Memory per instance
  is bounded (store limits), a call past its deadline is interrupted (epochs), a trap fails
  that call only (the instance is dropped).
* ``native``: one :class:`NativeRuntime` per worker, a pool of containers started with
  ``runc run`` (read-only root holding the static binary only, its own pid, mount, network,
  ipc and uts namespaces, a memory cgroup with the limit). A container serves one call at a
  time over its stdin/stdout (the protocol in ``host_native.c``); its state reads and writes
  are copies in and out of Redis (:class:`GlobalTier`), as the seed's native containers do.
  A cold start creates a container; a call past its deadline or a crash kills it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import workloads

log = logging.getLogger(__name__)
HERE = os.path.dirname(os.path.abspath(__file__))
#: the package's builds (``make functions``); ``FAASM_FUNCTIONS_BUILD_DIR`` names another folder
BUILD_DIR = os.environ.get("FAASM_FUNCTIONS_BUILD_DIR") or os.path.join(HERE, "functions", "build")
# demo functions (tests) pick their index by name; the workloads' modules are the registry's
DEMO_INDEX = {"echo": 0, "sleep": 1, "fail": 2, "noop": 3, "trap": 4, "loop": 5, "alloc": 6}
SYSTEMS = ("wasm", "native")


class CallFailed(Exception):
    """The call failed; the message is the reason (the ``FAILED:`` payload)."""


def resolve(msg: dict[str, Any]) -> tuple[str, str, int]:
    """(state user, module, index) of an invocation message."""
    user, func = msg.get("user", ""), msg.get("function", "")
    if msg.get("python"):
        user, func = msg.get("py_user") or user, msg.get("py_func") or func
    index = int(msg.get("index", 0) or 0)
    if user == "demo" and func in DEMO_INDEX:
        return user, "demo", DEMO_INDEX[func]
    modules = workloads.modules()  # a kind registered after import (a plug-in's) counts too
    if (user, func) not in modules:
        raise CallFailed(f"no such function {user}/{func}")
    return user, modules[(user, func)], index


def _build_path(system: str, module: str, build_dir: str = BUILD_DIR) -> str:
    """The build of ``module``: in ``FAASM_FUNCTIONS_BUILD_DIRS`` (a plug-in kind's builds)
    when there, else in ``build_dir``."""
    rel = os.path.join("wasm", f"{module}.wasm") if system == "wasm" else os.path.join("native", module)
    for d in filter(None, os.environ.get("FAASM_FUNCTIONS_BUILD_DIRS", "").split(os.pathsep)):
        if os.path.isfile(os.path.join(d, rel)):
            return os.path.join(d, rel)
    return os.path.join(build_dir, rel)


def artefact(system: str, module: str, build_dir: str = BUILD_DIR) -> str:
    path = _build_path(system, module, build_dir)
    if not os.path.isfile(path):
        raise CallFailed(f"function build {path} missing: run `make functions`")
    return path


def build_problems(system: str, build_dir: str = BUILD_DIR) -> list[str]:
    """Why the functions cannot run on ``system``: each missing build of a workload's module,
    and each ``.wasm`` that is not a WebAssembly module (by its magic number), naming the file."""
    out = []
    for module in sorted(set(workloads.modules().values())):
        path = _build_path(system, module, build_dir)
        if not os.path.isfile(path):
            out.append(f"{path} missing")
            continue
        if system == "wasm":
            with open(path, "rb") as f:
                head = f.read(8)
            if head[:4] != b"\0asm":
                out.append(f"{path} is not a WebAssembly module (it starts {head[:4]!r}, not b'\\x00asm')")
    return out


# ------------------------------------------------------------------ state tiers
# Element-wise float64 adds on a Redis string, atomic (a script runs alone): Hogwild's update.
ADD_F64 = """
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local k = struct.unpack('<i4', ARGV[2], i * 4 + 1)
  local v = struct.unpack('<d', ARGV[3], i * 8 + 1)
  local cur = redis.call('GETRANGE', KEYS[1], k * 8, k * 8 + 7)
  local c = 0
  if #cur == 8 then c = struct.unpack('<d', cur) end
  redis.call('SETRANGE', KEYS[1], k * 8, struct.pack('<d', c + v))
end
return n
"""


class GlobalTier:
    """State in Redis only: every read is a copy out of it, every write a copy into it."""

    def __init__(self, r):
        self.r = r
        self._add = r.register_script(ADD_F64)

    def read(self, key: str) -> bytes | None:
        return self.r.get(key)

    def write(self, key: str, data: bytes) -> None:
        self.r.set(key, data)

    def add_f64(self, key: str, idx: np.ndarray, vals: np.ndarray) -> None:
        if len(idx):
            self._add(keys=[key], args=[len(idx), idx.astype("<i4").tobytes(), vals.astype("<f8").tobytes()])

    def pull(self, key: str) -> None:
        pass


class LocalTier(GlobalTier):
    """The worker's state region shared by its instances (Faasm's local tier) over Redis."""

    def __init__(self, r):
        super().__init__(r)
        self.region: dict[str, bytearray] = {}
        self.lock = threading.Lock()

    def read(self, key: str) -> bytes | None:
        with self.lock:
            val = self.region.get(key)
        if val is None:
            self.pull(key)
            with self.lock:
                val = self.region.get(key)
        return val

    def write(self, key: str, data: bytes) -> None:
        with self.lock:
            self.region[key] = bytearray(data)
        super().write(key, data)

    def add_f64(self, key: str, idx: np.ndarray, vals: np.ndarray) -> None:
        with self.lock:
            val = self.region.get(key)
            if val is not None and len(idx) and int(idx.max()) * 8 + 8 <= len(val):
                np.add.at(np.frombuffer(val, dtype="<f8"), idx, vals)  # in place: the instances see it
        super().add_f64(key, idx, vals)

    def pull(self, key: str) -> None:
        val = self.r.get(key)
        with self.lock:
            if val is None:
                self.region.pop(key, None)
            else:
                self.region[key] = bytearray(val)

    def clear(self) -> None:
        with self.lock:
            self.region.clear()


@dataclass
class Host:
    """What the host interface needs from the worker: state, shared files, chaining."""

    tier: GlobalTier
    shared_dir: str
    chain: Callable[[dict[str, Any]], int]
    await_call: Callable[[int, float], tuple[bool, str]]
    call_timeout_s: float = 600.0

    def read_file(self, path: str) -> bytes | None:
        full = os.path.realpath(os.path.join(self.shared_dir, path.lstrip("/")))
        if not full.startswith(os.path.realpath(self.shared_dir) + os.sep):
            return None
        try:
            with open(full, "rb") as f:
                return f.read()
        except OSError:
            return None


@dataclass
class Call:
    user: str
    module: str
    index: int
    input: bytes
    msg: dict[str, Any]
    output: bytes = b""
    awaited: dict[int, str] = field(default_factory=dict)


def _chain_msg(call: Call, index: int, data: bytes) -> dict[str, Any]:
    keep = ("user", "function", "python", "py_user", "py_func")
    out = {k: call.msg[k] for k in keep if k in call.msg}
    out.update({"index": index, "input_data": data.decode(errors="replace")})
    return out


# ------------------------------------------------------------------ wasm
EPOCH_TICK_S = 0.01


def _wasmtime_version() -> str:
    from importlib.metadata import version

    return version("wasmtime")


WASMTIME_VERSION = ""


class WasmRuntime:
    """The Faaslets of one worker: wasmtime instances of the compiled modules."""

    system = "wasm"

    def __init__(self, host: Host, cache_dir: str, memory_limit_mb: int = 512, build_dir: str = BUILD_DIR):
        import wasmtime

        global WASMTIME_VERSION
        WASMTIME_VERSION = WASMTIME_VERSION or _wasmtime_version()
        self.wt = wasmtime
        self.host = host
        self.build_dir = build_dir
        self.cache_dir = cache_dir
        self.memory_limit = int(memory_limit_mb) << 20
        cfg = wasmtime.Config()
        cfg.epoch_interruption = True
        self.engine = wasmtime.Engine(cfg)
        self.modules: dict[str, Any] = {}
        self.idle: dict[str, list[Any]] = {}
        self.lock = threading.Lock()
        self.local = threading.local()
        self.linker = wasmtime.Linker(self.engine)
        self.linker.define_wasi()
        self._define_host()
        self.stats = {"compiled": 0, "cache_loaded": 0, "cold": 0, "warm": 0}
        self._stop = threading.Event()
        threading.Thread(target=self._ticker, daemon=True, name="epoch").start()

    def _ticker(self) -> None:
        while not self._stop.wait(EPOCH_TICK_S):
            self.engine.increment_epoch()

    # -- the module, compiled once; the machine code cached on disk keyed by the module's hash
    def module(self, name: str):
        with self.lock:
            if name in self.modules:
                return self.modules[name]
            path = artefact("wasm", name, self.build_dir)
            with open(path, "rb") as f:
                wasm = f.read()
            tag = hashlib.sha256(wasm).hexdigest()[:16]
            cached = os.path.join(self.cache_dir, f"{name}-{tag}-wasmtime{WASMTIME_VERSION}.cwasm")
            mod = None
            if os.path.isfile(cached):
                try:
                    mod = self.wt.Module.deserialize_file(self.engine, cached)
                    self.stats["cache_loaded"] += 1
                except self.wt.WasmtimeError as exc:
                    log.warning("compiled cache %s unusable (%s): compiling", cached, exc)
            if mod is None:
                try:
                    mod = self.wt.Module(self.engine, wasm)
                except self.wt.WasmtimeError as exc:
                    raise CallFailed(f"{path} is not a valid WebAssembly module ({str(exc).splitlines()[0]}): "
                                     "rebuild it with `make functions`") from None
                self.stats["compiled"] += 1
                os.makedirs(self.cache_dir, exist_ok=True)
                tmp = f"{cached}.tmp-{os.getpid()}"
                with open(tmp, "wb") as f:
                    f.write(mod.serialize())
                os.replace(tmp, cached)
            self.modules[name] = mod
            return mod

    def instantiate(self, name: str):
        """A fresh instance (a cold start): its own store, memory limit and WASI context."""
        wt = self.wt
        mod = self.module(name)
        store = wt.Store(self.engine)
        store.set_limits(memory_size=self.memory_limit)
        store.set_wasi(wt.WasiConfig())
        store.set_epoch_deadline(1 << 40)
        inst = self.linker.instantiate(store, mod)
        exports = inst.exports(store)
        if "_initialize" in exports:
            exports["_initialize"](store)
        return {"store": store, "main": exports["faasm_main"], "memory": exports["memory"], "module": name}

    # -- host functions (the current call is per thread: an instance serves one call at a time)
    def _define_host(self) -> None:
        wt = self.wt
        i32 = wt.ValType.i32()

        def mem(caller):
            return caller.get("memory")

        def cstr(caller, ptr: int) -> str:
            m = mem(caller)
            raw = m.read(caller, ptr, min(ptr + 1024, m.data_len(caller)))
            return bytes(raw.split(b"\0", 1)[0]).decode(errors="replace")

        def copy_out(caller, data: bytes | None, ptr: int, length: int) -> int:
            if data is None:
                return -1
            if ptr and length > 0:
                mem(caller).write(caller, data[:length], ptr)
            return len(data)

        def cur() -> Call:
            return self.local.call

        def key(caller, ptr) -> str:
            return f"{cur().user}_{cstr(caller, ptr)}"

        def f_input(caller, ptr, length):
            return copy_out(caller, cur().input, ptr, length)

        def f_output(caller, ptr, length):
            cur().output = bytes(mem(caller).read(caller, ptr, ptr + length))

        def f_read_state(caller, kptr, ptr, length):
            return copy_out(caller, self.host.tier.read(key(caller, kptr)), ptr, length)

        def f_write_state(caller, kptr, ptr, length):
            self.host.tier.write(key(caller, kptr), bytes(mem(caller).read(caller, ptr, ptr + length)))

        def f_add(caller, kptr, iptr, vptr, n):
            m = mem(caller)
            idx = np.frombuffer(bytes(m.read(caller, iptr, iptr + 4 * n)), dtype="<i4")
            vals = np.frombuffer(bytes(m.read(caller, vptr, vptr + 8 * n)), dtype="<f8")
            self.host.tier.add_f64(key(caller, kptr), idx, vals)

        def f_pull(caller, kptr):
            self.host.tier.pull(key(caller, kptr))

        def f_chain(caller, index, ptr, length):
            data = bytes(mem(caller).read(caller, ptr, ptr + length))
            try:
                return self.host.chain(_chain_msg(cur(), index, data))
            except Exception as exc:  # noqa: BLE001 - the function sees a failed chain
                log.warning("chain failed: %s", exc)
                return -1

        def f_await(caller, cid, ptr, length, out_len_ptr):
            ok, out = self.host.await_call(cid, self.host.call_timeout_s)
            data = out.encode()
            copy_out(caller, data, ptr, length)
            if out_len_ptr:
                mem(caller).write(caller, struct.pack("<i", len(data)), out_len_ptr)
            return 0 if ok else 1

        def f_read_file(caller, pptr, ptr, length):
            return copy_out(caller, self.host.read_file(cstr(caller, pptr)), ptr, length)

        defs = {"input": ([i32, i32], [i32], f_input), "output": ([i32, i32], [], f_output),
                "read_state": ([i32, i32, i32], [i32], f_read_state),
                "write_state": ([i32, i32, i32], [], f_write_state),
                "add_state_f64": ([i32, i32, i32, i32], [], f_add), "pull_state": ([i32], [], f_pull),
                "chain": ([i32, i32, i32], [i32], f_chain), "await": ([i32, i32, i32, i32], [i32], f_await),
                "read_file": ([i32, i32, i32], [i32], f_read_file)}
        for name, (params, results, fn) in defs.items():
            self.linker.define_func("faasm", name, wt.FuncType(params, results), fn, access_caller=True)

    def acquire(self, module: str, cold: bool = False):
        """An instance for a call: an idle one when warm, else a fresh one (a cold start)."""
        inst = None
        if not cold:
            with self.lock:
                pool = self.idle.get(module) or []
                inst = pool.pop() if pool else None
        if inst is None:
            inst = self.instantiate(module)
            self.stats["cold"] += 1
        else:
            self.stats["warm"] += 1
        return inst

    def release(self, inst) -> None:
        with self.lock:
            self.idle.setdefault(inst["module"], []).append(inst)

    def run(self, inst, call: Call) -> tuple[bool, str, bool]:
        """(ok, output, instance still usable): a trap or an interrupt spends the instance."""
        timeout = self.host.call_timeout_s
        inst["store"].set_epoch_deadline(max(1, int(timeout / EPOCH_TICK_S)))
        self.local.call = call
        try:
            rc = inst["main"](inst["store"], call.index)
        except (self.wt.Trap, self.wt.WasmtimeError) as exc:
            lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
            why = [ln for ln in lines if "trap" in ln.lower() and "backtrace" not in ln.lower()]
            text = (why or lines or [type(exc).__name__])[-1]
            if "interrupt" in str(exc):
                return False, f"wasm trap: interrupted after the call's {timeout:g} s limit ({text})", False
            return False, (text if text.startswith("wasm trap") else f"wasm trap: {text}"), False
        finally:
            self.local.call = None
        out = call.output.decode(errors="replace")
        return (rc == 0), (out if rc == 0 else out or f"function returned {rc}"), True

    def execute(self, msg: dict[str, Any], cold: bool = False) -> tuple[bool, str]:
        user, module, index = resolve(msg)
        call = Call(user, module, index, (msg.get("input_data") or "").encode(), msg)
        inst = self.acquire(module, cold)
        ok, out, usable = self.run(inst, call)
        if usable:
            self.release(inst)  # a trapped instance is dropped, the worker lives on
        return ok, out

    def flush(self) -> None:
        """Faasm's flush: idle instances dropped, the local tier emptied (compiled code kept)."""
        with self.lock:
            self.idle.clear()
        if isinstance(self.host.tier, LocalTier):
            self.host.tier.clear()

    def warm_up(self, modules: list[str]) -> None:
        for m in modules:
            self.module(m)

    def close(self) -> None:
        self._stop.set()
        self.flush()


# ------------------------------------------------------------------ native (runc)
def runc_binary() -> str | None:
    return os.environ.get("FAASM_RUNC") or shutil.which("runc")


def runc_list(root: str) -> list[dict[str, Any]]:
    """The containers in a runc state root (empty when there is none)."""
    exe = runc_binary()
    if not exe or not os.path.isdir(root):
        return []
    out = subprocess.run([exe, "--root", root, "list", "--format", "json"], capture_output=True, text=True,
                         timeout=30)
    if out.returncode != 0:
        return []
    return json.loads(out.stdout or "null") or []


def runc_remove(root: str, cid: str) -> str:
    exe = runc_binary() or "runc"
    subprocess.run([exe, "--root", root, "kill", cid, "KILL"], capture_output=True, timeout=30)
    r = subprocess.run([exe, "--root", root, "delete", "--force", cid], capture_output=True, text=True, timeout=30)
    return "deleted" if r.returncode == 0 else f"delete failed: {r.stderr.strip()[:200]}"


CGROUP_PARENT = "faasm_tasks"


def container_config(cid: str, rootfs: str, memory_limit: int, env: dict[str, str]) -> dict[str, Any]:
    """An OCI runtime spec: the static binary as pid 1 of its own namespaces, read-only root
    with nothing else in it, no capabilities, the memory limit in its cgroup."""
    return {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/fn"],
                    "env": [f"{k}={v}" for k, v in env.items()], "cwd": "/", "noNewPrivileges": True,
                    "capabilities": {"bounding": [], "effective": [], "permitted": [], "ambient": []},
                    "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 64, "soft": 64}]},
        "root": {"path": rootfs, "readonly": True},
        "hostname": cid[:63],
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                    "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
                  "cgroupsPath": f"/{CGROUP_PARENT}/{cid}",
                  "resources": {"memory": {"limit": memory_limit, "swap": memory_limit},
                                "devices": [{"allow": False, "access": "rwm"}]},
                  "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
                  "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]},
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
    def __init__(self, rt: "NativeRuntime", module: str):
        self.rt, self.module = rt, module
        with rt.lock:
            rt.seq += 1
            n = rt.seq
        self.id = f"{rt.prefix}-{os.getpid()}-{n}"
        bundle = os.path.join(rt.bundles, self.id)
        os.makedirs(bundle, exist_ok=True)
        with open(os.path.join(bundle, "config.json"), "w", encoding="utf-8") as f:
            json.dump(container_config(self.id, rt.rootfs(module), rt.memory_limit, rt.env), f)
        self.bundle = bundle
        t0 = time.perf_counter()
        self.proc = subprocess.Popen([rt.runc, "--root", rt.root, "run", "--keep", "--bundle", bundle, self.id],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.start_s = time.perf_counter() - t0
        self.calls = 0
        self.timed_out = False
        self._gone = False

    def call(self, call: Call, timeout_s: float) -> tuple[bool, str]:
        """Serve the container's host requests until it reports the call done."""
        host = self.rt.host
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
                    body = b"" if val is None else val[:max(0, mx)]
                elif op == "w":
                    kl = struct.unpack("<i", data[:4])[0]
                    host.tier.write(f"{call.user}_{data[4:4 + kl].decode()}", data[4 + kl:])
                elif op == "a":
                    kl = struct.unpack("<i", data[:4])[0]
                    k = data[4:4 + kl].decode()
                    n = struct.unpack("<i", data[4 + kl:8 + kl])[0]
                    off = 8 + kl
                    idx = np.frombuffer(data[off:off + 4 * n], dtype="<i4")
                    vals = np.frombuffer(data[off + 4 * n:off + 12 * n], dtype="<f8")
                    host.tier.add_f64(f"{call.user}_{k}", idx, vals)
                elif op == "c":
                    index = struct.unpack("<i", data[:4])[0]
                    try:
                        status = host.chain(_chain_msg(call, index, data[4:]))
                    except Exception as exc:  # noqa: BLE001
                        log.warning("chain failed: %s", exc)
                        status = -1
                elif op == "W":
                    cid, mx = struct.unpack("<ii", data[:8])
                    ok, out = host.await_call(cid, host.call_timeout_s)
                    full = out.encode()
                    status, size, body = (0 if ok else 1), len(full), full[:max(0, mx)]
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
        oom = self.rt.oom_kills(self.id)  # read before the container (and its cgroup) is deleted
        self.kill()
        err = (self.proc.stderr.read() or b"").decode(errors="replace").strip()[-300:] if self.proc.stderr else ""
        if oom:
            return (f"native container {self.id} killed by the OOM killer: over its "
                    f"{self.rt.memory_limit >> 20} MiB memory limit")
        if rc is not None and rc > 128:
            sig = rc - 128
            name = signal.Signals(sig).name if sig in signal.Signals.__members__.values() else str(sig)
            return f"native function crashed ({name}) in container {self.id}" + (f": {err}" if err else "")
        return f"native container {self.id} ended mid-call (exit {rc}, {exc})" + (f": {err}" if err else "")

    def kill(self) -> None:
        if self._gone:
            return
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        runc_remove(self.rt.root, self.id)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._gone = True
        shutil.rmtree(self.bundle, ignore_errors=True)


class NativeRuntime:
    """The native containers of one worker."""

    system = "native"

    def __init__(self, host: Host, run_dir: str, label: str, memory_limit_mb: int = 512,
                 build_dir: str = BUILD_DIR, max_containers: int = 96):
        exe = runc_binary()
        if not exe:
            raise RuntimeError("runc not found: apt-get install -y runc (make system-deps)")
        if os.geteuid() != 0:
            raise RuntimeError("the native system starts runc containers, which needs root here "
                               f"(running as uid {os.geteuid()}); use --system wasm")
        self.runc = exe
        self.host = host
        self.build_dir = build_dir
        self.root = os.path.join(run_dir, "runc")  # runc's state root: one per run
        self.bundles = os.path.join(run_dir, "bundles")
        self.prefix = "ft" + hashlib.sha256(label.encode()).hexdigest()[:10]
        self.memory_limit = int(memory_limit_mb) << 20
        self.env = {"FAASM_TASKS_RUN": label, "FAASM_TASKS_ROLE": "container", "PATH": "/"}
        self.lock = threading.Lock()
        self.idle: dict[str, list[Container]] = {}
        self.all: dict[str, Container] = {}
        self.seq = 0
        self.max_containers = max_containers
        self.stats = {"cold": 0, "warm": 0}
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.makedirs(self.bundles, mode=0o700, exist_ok=True)

    def rootfs(self, module: str) -> str:
        """``<run>/rootfs/<module>/fn``: the static binary and nothing else (copied once)."""
        path = os.path.join(os.path.dirname(self.bundles), "rootfs", module)
        fn = os.path.join(path, "fn")
        src = artefact("native", module, self.build_dir)
        with self.lock:
            if not os.path.isfile(fn) or os.path.getmtime(fn) < os.path.getmtime(src):
                os.makedirs(path, exist_ok=True)
                tmp = f"{fn}.tmp-{os.getpid()}"
                shutil.copy2(src, tmp)
                os.replace(tmp, fn)
        return path

    def oom_kills(self, cid: str) -> int:
        for path in (f"/sys/fs/cgroup/memory/{CGROUP_PARENT}/{cid}/memory.oom_control",
                     f"/sys/fs/cgroup/{CGROUP_PARENT}/{cid}/memory.events"):
            try:
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        k, _, v = line.partition(" ")
                        if k == "oom_kill" and int(v) > 0:
                            return int(v)
            except (OSError, ValueError):
                continue
        return 0

    def start(self, module: str) -> Container:
        with self.lock:
            if len(self.all) >= self.max_containers:
                raise CallFailed(f"no container available: this worker already runs {len(self.all)}")
        c = Container(self, module)
        with self.lock:
            self.all[c.id] = c
        return c

    def execute(self, msg: dict[str, Any], cold: bool = False) -> tuple[bool, str]:
        user, module, index = resolve(msg)
        call = Call(user, module, index, (msg.get("input_data") or "").encode(), msg)
        c = None
        with self.lock:
            pool = self.idle.setdefault(module, [])
            if cold and pool:  # a cold start replaces an idle container with a new one
                old = pool.pop()
                self.all.pop(old.id, None)
            else:
                old = None
            if not cold and pool:
                c = pool.pop()
        if old is not None:
            old.kill()
        if c is None:
            c = self.start(module)
            self.stats["cold"] += 1
        else:
            self.stats["warm"] += 1
        ok, out = c.call(call, self.host.call_timeout_s)
        if c._gone:
            with self.lock:
                self.all.pop(c.id, None)
        else:
            with self.lock:
                self.idle[module].append(c)
        return ok, out

    def flush(self) -> None:
        with self.lock:
            idle = [c for pool in self.idle.values() for c in pool]
            self.idle.clear()
            for c in idle:
                self.all.pop(c.id, None)
        for c in idle:
            c.kill()

    def warm_up(self, modules: list[str]) -> None:
        for m in modules:
            self.rootfs(m)

    def close(self) -> None:
        with self.lock:
            everything = list(self.all.values())
            self.all.clear()
            self.idle.clear()
        for c in everything:
            c.kill()


# ------------------------------------------------------------------ in-process calls
class InProcess:
    """One runtime whose chained calls run on a thread pool of this process instead of going
    back through a worker's HTTP port (bench/faasm_local.py, tests)."""

    def __init__(self, system: str, r, work_dir: str, build_dir: str = BUILD_DIR, label: str = "",
                 memory_limit_mb: int = 512, call_timeout_s: float = 600.0, threads: int = 96):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(threads)
        self.futures: dict[int, Any] = {}
        self.lock = threading.Lock()
        self.n = 0
        os.makedirs(os.path.join(work_dir, "shared"), exist_ok=True)
        tier = LocalTier(r) if system == "wasm" else GlobalTier(r)
        self.host = Host(tier, os.path.join(work_dir, "shared"), self.chain, self.await_call, call_timeout_s)
        if system == "wasm":
            self.rt: Any = WasmRuntime(self.host, os.path.join(work_dir, "codegen"), memory_limit_mb, build_dir)
        else:
            self.rt = NativeRuntime(self.host, os.path.join(work_dir, "native"), label or f"inprocess-{os.getpid()}",
                                    memory_limit_mb, build_dir)

    def chain(self, msg: dict[str, Any]) -> int:
        with self.lock:
            self.n += 1
            cid = self.n
            self.futures[cid] = self.pool.submit(self.rt.execute, msg)
        return cid

    def await_call(self, cid: int, timeout: float) -> tuple[bool, str]:
        fut = self.futures.pop(cid, None)
        if fut is None:
            return False, f"unknown call {cid}"
        try:
            return fut.result(timeout)
        except Exception as exc:  # noqa: BLE001 - a failed chained call
            return False, f"{type(exc).__name__}: {exc}"

    def call(self, user: str, function: str, input_data: str = "", cold: bool = False, **kw) -> tuple[bool, str]:
        return self.rt.execute({"user": user, "function": function, "input_data": input_data, **kw}, cold=cold)

    def close(self) -> None:
        self.rt.close()
        self.pool.shutdown(wait=True)
