"""The ``native`` system: :class:`NativeRuntime`, the pool of runc containers of one worker."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from typing import Any

from .common import BUILD_DIR, Call, CallFailed, artefact, resolve
from .runc import Container, runc_binary
from .state import Host


class NativeRuntime:
    """The native containers of one worker."""

    system = "native"

    def __init__(
        self,
        host: Host,
        run_dir: str,
        label: str,
        memory_limit_mb: int = 512,
        build_dir: str = BUILD_DIR,
        max_containers: int = 96,
    ):
        exe = runc_binary()
        if not exe:
            raise RuntimeError("runc not found: apt-get install -y runc (make system-deps)")
        if os.geteuid() != 0:
            raise RuntimeError(
                "the native system starts runc containers, which needs root here "
                f"(running as uid {os.geteuid()}); use --system wasm"
            )
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

    def start(self, module: str) -> Container:
        with self.lock:
            if len(self.all) >= self.max_containers:
                raise CallFailed(f"no container available: this worker already runs {len(self.all)}")
            self.seq += 1
            cid = f"{self.prefix}-{os.getpid()}-{self.seq}"
        c = Container(
            cid,
            module,
            runc=self.runc,
            root=self.root,
            bundle=os.path.join(self.bundles, cid),
            rootfs=self.rootfs(module),
            memory_limit=self.memory_limit,
            env=self.env,
            host=self.host,
        )
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
        if c.gone:
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
