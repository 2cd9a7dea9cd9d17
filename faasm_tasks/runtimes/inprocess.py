"""In-process calls: :class:`InProcess`, one runtime whose chained calls run on a thread pool."""

from __future__ import annotations

import os
import threading
from typing import Any

from .common import BUILD_DIR
from .native import NativeRuntime
from .state import GlobalTier, Host, LocalTier
from .wasm import WasmRuntime


class InProcess:
    """One runtime whose chained calls run on a thread pool of this process instead of going
    back through a worker's HTTP port (bench/faasm_local.py, tests)."""

    def __init__(
        self,
        system: str,
        r,
        work_dir: str,
        build_dir: str = BUILD_DIR,
        label: str = "",
        memory_limit_mb: int = 512,
        call_timeout_s: float = 600.0,
        threads: int = 96,
    ):
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
            self.rt = NativeRuntime(
                self.host,
                os.path.join(work_dir, "native"),
                label or f"inprocess-{os.getpid()}",
                memory_limit_mb,
                build_dir,
            )

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
