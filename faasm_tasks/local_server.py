"""The local target's processes: invocation workers and the upload server.

``python -m faasm_tasks.local_server worker --port P --redis-url U ...`` serves the 2020
Knative protocol (JSON POST, ``async`` ids, ``{"status": true, "id": N}`` polls,
``{"flush": true}``) and the planner protocol (``{"http_type": "EXECUTE_BATCH", ...}``).
Several workers share one port through ``SO_REUSEPORT``, so the kernel spreads
connections over them like an ingress would. Results and status live in Redis (database
0 = queue, 1 = state; ``--state-redis-url`` puts state in a Redis of its own, database 0,
as Faasm's ``redis-queue``/``redis-state`` pair does), so any worker answers any status poll.

Each worker is the runtime of one system (``--system``, :mod:`faasm_tasks.runtimes`): ``wasm``
runs the C functions as wasmtime instances in this process, ``native`` in runc containers it
starts. A call with ``cold_start_interval`` N is a cold start on the first and every N-th call
of that function on this worker (a fresh instance / a new container), on both systems.

``python -m faasm_tasks.local_server upload --port P ...`` serves ``PUT /f``, ``/p``,
``/s`` (and ``GET /s``), ``PUT /file`` with ``FilePath``, ``GET /ping``.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from . import runtimes, workloads

log = logging.getLogger("faasm_tasks.local_server")
HTTP_TYPES = {
    1: "RESET",
    2: "FLUSH_AVAILABLE_HOSTS",
    3: "FLUSH_EXECUTORS",
    4: "FLUSH_SCHEDULING_STATE",
    5: "GET_AVAILABLE_HOSTS",
    6: "GET_CONFIG",
    7: "GET_EXEC_GRAPH",
    8: "GET_IN_FLIGHT_APPS",
    10: "EXECUTE_BATCH",
    11: "EXECUTE_BATCH_STATUS",
    12: "PRELOAD_SCHEDULING_DECISION",
    13: "SET_POLICY",
    14: "GET_POLICY",
    15: "SET_NEXT_EVICTED_VM",
}
MAX_BODY = 1 << 30
MAX_IN_FLIGHT = 512
WORKERS_SET = "available_workers"


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, addr, handler, reuse_port: bool):
        self._reuse_port = reuse_port
        super().__init__(addr, handler)

    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self._reuse_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in separate writes
    server_version = "faasm-tasks-local"
    app: WorkerApp | UploadApp

    def log_message(self, fmt, *args):  # quiet access log
        log.debug("%s " + fmt, self.address_string(), *args)

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(n) if n else b""

    def reply(self, code: int, body: bytes | str, ctype: str = "text/plain") -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.app.handle(self, "GET", b"")

    def do_PUT(self):
        self.app.handle(self, "PUT", self._body())

    def do_POST(self):
        self.app.handle(self, "POST", self._body())


def state_redis(args) -> redis.Redis:
    """The state store: ``--state-redis-url`` as given, else database 1 of ``--redis-url``."""
    if args.state_redis_url:
        return redis.Redis.from_url(args.state_redis_url)
    return redis.Redis.from_url(args.redis_url, db=1)


class WorkerApp:
    def __init__(self, args):
        self.queue = redis.Redis.from_url(args.redis_url, db=0)
        self.state = state_redis(args)
        self.port = args.port
        self.invoke_url = f"http://127.0.0.1:{args.port}/"
        self.counter_lock = threading.Lock()
        self.counts: dict[str, int] = {}
        self.in_flight = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        tier = runtimes.LocalTier(self.state) if args.system == "wasm" else runtimes.GlobalTier(self.state)
        host = runtimes.Host(tier, args.shared_dir, self._chain, self._await, call_timeout_s=args.call_timeout_s)
        run_dir = args.run_dir or os.path.join(args.shared_dir, os.pardir)
        if args.system == "wasm":
            self.runtime = runtimes.WasmRuntime(host, os.path.join(run_dir, "codegen"), args.memory_limit_mb)
        else:
            self.runtime = runtimes.NativeRuntime(
                host, run_dir, os.environ.get("FAASM_TASKS_RUN", "manual"), args.memory_limit_mb
            )
        self.name = f"{os.getpid()}@127.0.0.1:{args.port}"
        self._session = threading.local()

    # -- chaining: POST back through the shared port, await through Redis
    def _chain(self, fields: dict[str, Any]) -> int:
        import requests

        parent = getattr(self._session, "msg", {})
        msg = {k: parent[k] for k in ("user", "function", "python", "py_user", "py_func") if k in parent}
        msg.update(fields, **{"async": True})
        sess = getattr(self._session, "http", None)
        if sess is None:
            sess = self._session.http = requests.Session()
        r = sess.post(self.invoke_url, json=msg, timeout=30, headers={"Host": "faasm-worker.faasm.example.com"})
        r.raise_for_status()
        return int(r.text.strip())

    def _await(self, cid: int, timeout: float) -> tuple[bool, str]:
        deadline = time.monotonic() + timeout
        delay = 0.002
        while time.monotonic() < deadline:
            st = (self.queue.get(f"status_{cid}") or b"").decode()
            if st.startswith("SUCCESS: "):
                return True, st[len("SUCCESS: ") :]
            if st.startswith("FAILED: "):
                return False, st[len("FAILED: ") :]
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return False, f"timed out after {timeout}s awaiting call {cid}"

    def _is_cold(self, msg: dict[str, Any]) -> bool:
        """A real cold start on the first and every N-th call with ``cold_start_interval`` N."""
        if "cold_start_interval" not in msg:
            return False
        try:
            interval = max(1, int(msg["cold_start_interval"]))
        except (TypeError, ValueError):
            return False
        key = f"{msg.get('user')}/{msg.get('function')}"
        with self.counter_lock:
            n = self.counts.get(key, 0)
            self.counts[key] = n + 1
        return n % interval == 0

    def _run(self, msg: dict[str, Any], cold: bool = False) -> tuple[bool, str]:
        self._session.msg = msg
        try:
            return self.runtime.execute(msg, cold=cold)
        except runtimes.CallFailed as exc:
            return False, str(exc)
        except Exception as exc:  # a crashing function is a failed call
            log.exception("call failed")
            return False, f"{type(exc).__name__}: {exc}"

    def _run_async(self, mid: int, msg: dict[str, Any]) -> None:
        try:
            ok, out = self._run(msg)
            self.queue.set(f"status_{mid}", ("SUCCESS: " if ok else "FAILED: ") + out)
        finally:
            self.in_flight.release()

    def handle(self, h: Handler, method: str, body: bytes) -> None:
        if method == "GET":
            if h.path.startswith("/ping"):
                return h.reply(200, f"PONG {self.name}")
            return h.reply(404, "not found")
        try:
            msg = json.loads(body or b"{}")
            if not isinstance(msg, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as exc:
            return h.reply(400, f"Bad JSON: {exc}")
        if "http_type" in msg:
            return self._planner(h, msg)
        if msg.get("status"):
            st = self.queue.get(f"status_{int(msg.get('id', 0))}")
            return h.reply(200, st.decode() if st is not None else "FAILED: unknown message id")
        if msg.get("flush"):
            self.runtime.flush()
            return h.reply(200, "Flush success")
        if not msg.get("user") or not msg.get("function"):
            return h.reply(400, "Bad request: user and function are required")
        if msg.get("async"):
            if not self.in_flight.acquire(blocking=False):
                return h.reply(503, "Too many calls in flight")
            mid = int(self.queue.incr("faasm_tasks:next_id"))
            self.queue.set(f"status_{mid}", "RUNNING")
            threading.Thread(target=self._run_async, args=(mid, msg), daemon=True).start()
            return h.reply(200, str(mid))
        ok, out = self._run(msg, cold=self._is_cold(msg))
        return h.reply(200 if ok else 500, out + "\n")

    # -- planner protocol (faabric HttpMessage)
    def _planner(self, h: Handler, msg: dict[str, Any]) -> None:
        ht = msg["http_type"]
        name = HTTP_TYPES.get(ht, ht) if isinstance(ht, int) else str(ht)
        try:
            payload = json.loads(msg.get("payload") or "{}")
        except ValueError as exc:
            return h.reply(400, f"Bad payload: {exc}")
        if name == "EXECUTE_BATCH":
            return self._execute_batch(h, payload)
        if name == "EXECUTE_BATCH_STATUS":
            app = payload.get("appId")
            expected = self.queue.get(f"app_{app}")
            if expected is None:
                return h.reply(500, "App not registered in results")
            results = [json.loads(r) for r in self.queue.lrange(f"appres_{app}", 0, -1)]
            n = int(payload.get("expectedNumMessages") or expected)
            return h.reply(
                200,
                json.dumps(
                    {"appId": app, "finished": len(results) >= n, "expectedNumMessages": n, "messageResults": results}
                ),
                "application/json",
            )
        if name == "GET_AVAILABLE_HOSTS":
            hosts = sorted(m.decode() for m in self.queue.smembers(WORKERS_SET))
            return h.reply(
                200, json.dumps({"hosts": [{"ip": x, "slots": MAX_IN_FLIGHT} for x in hosts]}), "application/json"
            )
        if name in ("RESET", "FLUSH_EXECUTORS", "FLUSH_AVAILABLE_HOSTS", "FLUSH_SCHEDULING_STATE"):
            self.runtime.flush()
            return h.reply(200, "Flush sent")
        return h.reply(400, f"Unrecognised request type {name}")

    def _execute_batch(self, h: Handler, ber: dict[str, Any]) -> None:
        msgs = ber.get("messages") or []
        if not msgs:
            return h.reply(400, "Empty batch")
        app = int(ber.get("appId") or self.queue.incr("faasm_tasks:next_app"))
        self.queue.set(f"app_{app}", len(msgs))
        for m in msgs:
            if not self.in_flight.acquire(blocking=False):
                return h.reply(500, "No available hosts")
            call = {
                "user": m.get("user", ber.get("user")),
                "function": m.get("function", ber.get("function")),
                "python": m.get("python", False),
                "py_user": m.get("py_user"),
                "py_func": m.get("py_func"),
                "index": m.get("funcPtr", m.get("func_ptr", 0)),
            }
            try:
                raw = m.get("input_data") or m.get("inputData") or ""
                call["input_data"] = base64.b64decode(raw, validate=True).decode() if raw else ""
            except ValueError:
                self.in_flight.release()
                return h.reply(400, "input_data must be base64")
            mid = int(m.get("id") or self.queue.incr("faasm_tasks:next_id"))
            threading.Thread(target=self._run_batch_msg, args=(app, mid, call), daemon=True).start()
        return h.reply(
            200,
            json.dumps({"appId": app, "finished": False, "expectedNumMessages": len(msgs), "messageResults": []}),
            "application/json",
        )

    def _run_batch_msg(self, app: int, mid: int, call: dict[str, Any]) -> None:
        try:
            start = int(time.time() * 1000)
            ok, out = self._run(call)
            res = {
                "id": mid,
                "appId": app,
                "user": call["user"],
                "function": call["function"],
                "output_data": base64.b64encode(out.encode()).decode(),
                "returnValue": 0 if ok else 1,
                "start_ts": start,
                "finish_ts": int(time.time() * 1000),
            }
            self.queue.rpush(f"appres_{app}", json.dumps(res))
        finally:
            self.in_flight.release()

    def register(self) -> None:
        self.queue.sadd(WORKERS_SET, self.name)

    def unregister(self) -> None:
        try:
            self.queue.srem(WORKERS_SET, self.name)
        except redis.RedisError:
            pass


class UploadApp:
    def __init__(self, args):
        self.state = state_redis(args)
        self.root = args.shared_dir
        self.func_dir = args.functions_dir

    def _safe(self, base: str, rel: str) -> str:
        path = os.path.realpath(os.path.join(base, rel.lstrip("/")))
        if not path.startswith(os.path.realpath(base) + os.sep):
            raise ValueError(f"path escapes the store: {rel}")
        return path

    def _write(self, path: str, data: bytes) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def handle(self, h: Handler, method: str, body: bytes) -> None:
        parts = [p for p in h.path.split("?")[0].split("/") if p]
        try:
            if method == "GET" and parts == ["ping"]:
                return h.reply(200, "PONG")
            if parts and parts[0] == "s" and len(parts) == 3:
                key = f"{parts[1]}_{parts[2]}"
                if method == "PUT":
                    self.state.set(key, body)
                    return h.reply(200, "State uploaded")
                val = self.state.get(key)
                return h.reply(200, val, "application/octet-stream") if val is not None else h.reply(404, "")
            if method == "PUT" and parts and parts[0] in ("f", "p") and len(parts) == 3:
                name = "function.wasm" if parts[0] == "f" else "function.py"
                self._write(self._safe(self.func_dir, f"{parts[1]}/{parts[2]}/{name}"), body)
                return h.reply(200, "Function uploaded")
            if method == "PUT" and parts == ["file"]:
                rel = h.headers.get("FilePath")
                if not rel:
                    return h.reply(400, "Missing FilePath header")
                self._write(self._safe(self.root, rel), body)
                return h.reply(200, "File uploaded")
        except ValueError as exc:
            return h.reply(400, str(exc))
        return h.reply(404, "not found")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faasm_tasks.local_server")
    p.add_argument("role", choices=["worker", "upload"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--redis-url", required=True, help="the queue Redis (and the state Redis's server, database 1)")
    p.add_argument("--state-redis-url", help="a separate state Redis (database as in the URL)")
    p.add_argument("--shared-dir", required=True)
    p.add_argument("--functions-dir", default="")
    p.add_argument(
        "--system",
        choices=runtimes.SYSTEMS,
        default="wasm",
        help="worker: wasm (wasmtime instances in this process) or native (runc containers)",
    )
    p.add_argument("--run-dir", default="", help="worker: where the compiled-code cache / runc state go")
    p.add_argument("--memory-limit-mb", type=int, default=512, help="worker: memory per instance / container")
    p.add_argument(
        "--call-timeout-s",
        type=float,
        default=600.0,
        help="worker: a call running longer is stopped (epoch interruption / container killed)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(process)d %(levelname)s %(message)s", stream=sys.stderr
    )
    app = WorkerApp(args) if args.role == "worker" else UploadApp(args)
    handler = type("BoundHandler", (Handler,), {"app": app})
    server = Server(("127.0.0.1", args.port), handler, reuse_port=args.role == "worker")

    def stop(*_):
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if isinstance(app, WorkerApp):
        # codegen before readiness: each module compiled (or loaded from the cache) / staged
        app.runtime.warm_up(sorted(set(workloads.modules().values())))
        app.register()
    log.info("%s listening on 127.0.0.1:%d", args.role, args.port)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        if isinstance(app, WorkerApp):
            app.unregister()
            app.runtime.close()  # its containers go with it
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
