"""Helpers shared by the faasm_tasks tests (no Airflow, no cluster). Imported as a plain module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_REDIS = shutil.which(os.environ.get("FAASM_REDIS_SERVER", "redis-server")) is not None
needs_redis = pytest.mark.skipif(not HAVE_REDIS, reason="redis-server not installed (apt-get install -y redis-server)")


def _local_target_missing() -> list[str]:
    """What the local target's workers need and this machine lacks: Redis, the built functions
    (``make functions``; ``make test`` builds them) and, for the native system, runc as root."""
    build = os.path.join(ROOT, "faasm_tasks", "functions", "build")
    missing = [] if HAVE_REDIS else ["redis-server (apt-get install -y redis-server)"]
    if not all(
        os.path.isfile(os.path.join(build, sub, name))
        for sub, names in (
            ("wasm", ("sgd.wasm", "matmul.wasm", "inference.wasm", "demo.wasm")),
            ("native", ("sgd", "matmul", "inference", "demo")),
        )
        for name in names
    ):
        missing.append("the built functions (make functions: clang, lld, wasi-libc, libclang-rt-14-dev-wasm32, gcc)")
    if not (shutil.which(os.environ.get("FAASM_RUNC", "runc")) and os.geteuid() == 0):
        missing.append("runc run as root, for the native system (apt-get install -y runc)")
    return missing


LOCAL_TARGET_MISSING = _local_target_missing()
needs_local_target = pytest.mark.skipif(
    bool(LOCAL_TARGET_MISSING), reason="the local target needs " + "; ".join(LOCAL_TARGET_MISSING)
)


def cli(*args: str, state_dir: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, FAASM_TASKS_STATE_DIR=state_dir, PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "faasm_tasks", *args, "--log-level", "WARNING"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{args[0]} exited {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr[-3000:]}")
    return proc


class ScriptedServer:
    """A tiny HTTP server on 127.0.0.1 whose behaviour a test sets with ``handler(method, path, headers, body)``
    returning ``(status, body_bytes)``; ``requests`` records what arrived, ``peers`` the client
    addresses. ``host``: the address it listens on (a test of clients in network namespaces
    binds the host's address of their veths)."""

    def __init__(self, handler, host: str = "127.0.0.1"):
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.peers: set[str] = set()
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def _do(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.requests.append((method, self.path, dict(self.headers), body))
                outer.peers.add(self.client_address[0])
                status, out = handler(method, self.path, dict(self.headers), body)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a deadline test)

            def do_GET(self):
                self._do("GET")

            def do_POST(self):
                self._do("POST")

            def do_PUT(self):
                self._do("PUT")

        self.httpd = ThreadingHTTPServer((host, 0), H)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


# ------------------------------------------------------------------ package boundaries
def private_crossings(pkg_dir, modules: set[str]) -> list[str]:
    """Private names one module of a package takes from another (``from .x import _y``, ``x._y``)."""
    import ast

    crossing = []
    for path in sorted(pkg_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("faasm_tasks")):
                crossing += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, ast.Name)
                and node.value.id in modules
            ):
                crossing.append(f"{path.name}: {node.value.id}.{node.attr}")
    return crossing


def outside_reaches(pkg, name: str) -> list[str]:
    """Code in faasm_tasks/ and bench/ outside package ``pkg`` (module ``faasm_tasks.<name>``)
    that imports one of its submodules or a private name, or uses ``<name>.X`` for an X it does
    not export."""
    import ast
    from pathlib import Path

    pkg_dir = Path(pkg.__file__).parent
    found = []
    for folder in ("faasm_tasks", "bench"):
        for path in (pkg_dir.parent.parent / folder).rglob("*.py"):
            if pkg_dir in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and name in (node.module or ""):
                    if node.module.rsplit(".", 1)[-1] != name:
                        found.append(f"{path}: imports {node.module}")
                    found += [f"{path}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == name
                    and node.attr not in pkg.__all__
                ):
                    found.append(f"{path}:{node.lineno}: {name}.{node.attr} not exported")
    return found
