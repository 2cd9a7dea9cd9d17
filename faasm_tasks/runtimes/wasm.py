"""The ``wasm`` system: :class:`WasmRuntime` (the Faaslets of one worker on wasmtime) and
:func:`wasmtime_version`."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import signal
import struct
import threading
from typing import Any

import numpy as np

from .common import BUILD_DIR, Call, CallFailed, artefact, chain_msg, resolve
from .state import Host, LocalTier

log = logging.getLogger("faasm_tasks.runtimes")
EPOCH_TICK_S = 0.01


def wasmtime_version() -> str:
    from importlib.metadata import version

    return version("wasmtime")


WASMTIME_VERSION = ""


class WasmRuntime:
    """The Faaslets of one worker: wasmtime instances of the compiled modules."""

    system = "wasm"

    def __init__(self, host: Host, cache_dir: str, memory_limit_mb: int = 512, build_dir: str = BUILD_DIR):
        import wasmtime

        global WASMTIME_VERSION
        WASMTIME_VERSION = WASMTIME_VERSION or wasmtime_version()
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
        # SIGTERM/SIGINT for the main thread only (taken here, they left a blocked main thread unaware)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
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
                    raise CallFailed(
                        f"{path} is not a valid WebAssembly module ({str(exc).splitlines()[0]}): "
                        "rebuild it with `make functions`"
                    ) from None
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
                return self.host.chain(chain_msg(cur(), index, data))
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

        defs = {
            "input": ([i32, i32], [i32], f_input),
            "output": ([i32, i32], [], f_output),
            "read_state": ([i32, i32, i32], [i32], f_read_state),
            "write_state": ([i32, i32, i32], [], f_write_state),
            "add_state_f64": ([i32, i32, i32, i32], [], f_add),
            "pull_state": ([i32], [], f_pull),
            "chain": ([i32, i32, i32], [i32], f_chain),
            "await": ([i32, i32, i32, i32], [i32], f_await),
            "read_file": ([i32, i32, i32], [i32], f_read_file),
        }
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
