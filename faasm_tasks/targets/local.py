"""The embedded target: redis-server, an upload server and N workers on 127.0.0.1.

Everything it starts is recorded in ``<state-dir>/<run-id>/local/state.json`` (pid,
process start time, port, command, log), so ``deploy``, ``run`` and ``teardown`` can be
separate processes. A pid is only signalled when its recorded start time still matches,
so a recycled pid is never touched. Results are tagged ``target=local``: they exercise
the pipeline with Python workloads, not Faasm.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import psutil
import redis
import requests

from stepkit import StepError

from .base import Endpoints, Target

log = logging.getLogger(__name__)
STATE_FILE = "state.json"


def default_state_root() -> str:
    import tempfile

    return os.environ.get("FAASM_TASKS_STATE_DIR") or os.path.join(tempfile.gettempdir(), "faasm_tasks")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def redis_binary() -> str:
    exe = os.environ.get("FAASM_REDIS_SERVER") or shutil.which("redis-server")
    if not exe:
        raise StepError("redis-server not found: install Debian's redis-server "
                        "(apt-get install -y redis-server) or set FAASM_REDIS_SERVER")
    return exe


def _reap(pid: int) -> None:
    """Collect an exited child of this process (tests deploy in-process), ignore others."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def _alive(rec: dict[str, Any]) -> bool:
    _reap(rec["pid"])
    try:
        p = psutil.Process(rec["pid"])
        return abs(p.create_time() - rec["create_time"]) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class LocalTarget(Target):
    name = "local"

    def __init__(self, state_root: str, run_id: str):
        self.dir = os.path.join(os.path.abspath(state_root), run_id, "local")
        self.run_id = run_id

    @classmethod
    def from_args(cls, args) -> "LocalTarget":
        return cls(getattr(args, "state_dir", None) or default_state_root(), args.run_id)

    # ---------------------------------------------------------------- state file
    @property
    def state_path(self) -> str:
        return os.path.join(self.dir, STATE_FILE)

    def load(self) -> dict[str, Any] | None:
        try:
            with open(self.state_path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def save(self, st: dict[str, Any]) -> None:
        os.makedirs(self.dir, exist_ok=True)
        tmp = self.state_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(st, f, indent=2, sort_keys=True)
        os.replace(tmp, self.state_path)

    def _require(self) -> dict[str, Any]:
        st = self.load()
        if not st or st.get("status") != "deployed":
            raise StepError(f"local target for run {self.run_id} is not deployed (no live state in {self.dir})")
        return st

    # ---------------------------------------------------------------- processes
    def _spawn(self, role: str, cmd: list[str], port: int) -> dict[str, Any]:
        logs = os.path.join(self.dir, "logs")
        os.makedirs(logs, exist_ok=True)
        logfile = os.path.join(logs, f"{role}-{port}-{int(time.time() * 1000)}.log")
        with open(logfile, "ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, close_fds=True, env=self._env())
        rec = {"role": role, "pid": proc.pid, "port": port, "cmd": cmd, "log": logfile,
               "create_time": psutil.Process(proc.pid).create_time()}
        log.info("started %s pid %d on 127.0.0.1:%d", role, proc.pid, port)
        return rec

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        return env

    def _worker_cmd(self, st: dict[str, Any]) -> list[str]:
        return [sys.executable, "-m", "faasm_tasks.local_server", "worker", "--port", str(st["invoke_port"]),
                "--redis-url", st["redis_url"], "--shared-dir", st["shared_dir"],
                "--cold-start-delay-ms", str(st["cold_start_delay_ms"])]

    @staticmethod
    def _stop(recs: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        """SIGTERM, wait, then SIGKILL whatever is left. Returns what each process did."""
        report = []
        live = []
        for rec in recs:
            if _alive(rec):
                try:
                    os.kill(rec["pid"], signal.SIGTERM)
                    live.append(rec)
                except ProcessLookupError:
                    pass
            else:
                report.append({"pid": rec["pid"], "role": rec["role"], "result": "already gone"})
        deadline = time.monotonic() + timeout_s
        while live and time.monotonic() < deadline:
            live_now = []
            for rec in live:
                if _alive(rec):
                    live_now.append(rec)
                else:
                    report.append({"pid": rec["pid"], "role": rec["role"], "result": "terminated"})
            live = live_now
            time.sleep(0.05)
        for rec in live:
            try:
                os.kill(rec["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            psutil.wait_procs([psutil.Process(rec["pid"])], timeout=5) if psutil.pid_exists(rec["pid"]) else None
            report.append({"pid": rec["pid"], "role": rec["role"], "result": "killed"})
        return report

    # ---------------------------------------------------------------- interface
    def deploy(self, plan) -> dict[str, Any]:
        st = self.load()
        n = int(plan.deployment["worker_replicas"])
        if st and st.get("status") == "deployed":
            alive = [r for r in st["procs"] if _alive(r)]
            if len(alive) == len(st["procs"]) and st["workers"] == n:
                return {"status": "already deployed", "workers": n, "state": self.state_path}
            raise StepError(f"a different or broken local deployment exists for run {self.run_id} "
                            f"({len(alive)}/{len(st['procs'])} processes alive, {st['workers']} workers); "
                            "run teardown first")
        os.makedirs(self.dir, exist_ok=True)
        shared = os.path.join(self.dir, "shared")
        funcs = os.path.join(self.dir, "functions")
        rdir = os.path.join(self.dir, "redis")
        for d in (shared, funcs, rdir):
            os.makedirs(d, exist_ok=True)
        st = {"status": "deploying", "run_id": self.run_id, "experiment": plan.name, "system": plan.system,
              "workers": n, "procs": [], "shared_dir": shared, "functions_dir": funcs, "redis_dir": rdir,
              "cold_start_delay_ms": float(plan.params.get("cold_start_delay_ms", 800)),
              "started": time.time()}
        try:
            rport = free_port()
            st["redis_port"], st["redis_url"] = rport, f"redis://127.0.0.1:{rport}"
            st["procs"].append(self._spawn("redis", [redis_binary(), "--port", str(rport), "--bind", "127.0.0.1",
                                                     "--save", "", "--appendonly", "no", "--dir", rdir,
                                                     "--protected-mode", "yes", "--maxclients", "10000"], rport))
            self.save(st)
            self._wait_redis(st, 15)
            uport = free_port()
            st["upload_port"] = uport
            st["procs"].append(self._spawn("upload", [sys.executable, "-m", "faasm_tasks.local_server", "upload",
                                                      "--port", str(uport), "--redis-url", st["redis_url"],
                                                      "--shared-dir", shared, "--functions-dir", funcs], uport))
            st["invoke_port"] = free_port()
            for _ in range(n):
                st["procs"].append(self._spawn("worker", self._worker_cmd(st), st["invoke_port"]))
            st["status"] = "deployed"
            self.save(st)
        except BaseException:
            st["status"] = "failed"
            self.save(st)
            raise
        return {"status": "deployed", "workers": n, "invoke_port": st["invoke_port"],
                "upload_port": st["upload_port"], "redis_port": st["redis_port"], "state": self.state_path}

    def _wait_redis(self, st: dict[str, Any], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(st["redis_url"], socket_timeout=1).ping()
                return
            except redis.RedisError as exc:
                last = exc
            self._check_procs(st)
            time.sleep(0.05)
        raise StepError(f"redis-server not answering after {timeout_s}s: {last}")

    def _check_procs(self, st: dict[str, Any]) -> None:
        dead = [r for r in st["procs"] if not _alive(r)]
        if dead:
            tails = []
            for r in dead[:3]:
                try:
                    with open(r["log"], "rb") as f:
                        tails.append(f"{r['role']} pid {r['pid']}: " + f.read()[-600:].decode(errors="replace"))
                except OSError:
                    tails.append(f"{r['role']} pid {r['pid']}: no log")
            raise StepError(f"{len(dead)} local process(es) died: " + " | ".join(tails))

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        st = self._require()
        deadline = time.monotonic() + timeout_s
        q = redis.Redis.from_url(st["redis_url"], db=0, socket_timeout=2)
        seen, last = 0, "not checked"
        while time.monotonic() < deadline:
            self._check_procs(st)
            try:
                seen = int(q.scard("available_workers"))
                up = requests.get(f"http://127.0.0.1:{st['upload_port']}/ping", timeout=2)
                wk = requests.get(f"http://127.0.0.1:{st['invoke_port']}/ping", timeout=2)
                if seen >= st["workers"] and up.ok and wk.ok:
                    return {"ready": True, "workers": seen, "waited_s": round(timeout_s - (deadline - time.monotonic()), 3)}
                last = f"{seen}/{st['workers']} workers registered"
            except (redis.RedisError, requests.RequestException) as exc:
                last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
        raise StepError(f"local target not ready after {timeout_s}s: {last}")

    def soft_restart(self, timeout_s: float) -> dict[str, Any]:
        st = self._require()
        workers = [r for r in st["procs"] if r["role"] == "worker"]
        stopped = self._stop(workers, timeout_s=10)
        redis.Redis.from_url(st["redis_url"], db=0).flushdb()
        st["procs"] = [r for r in st["procs"] if r["role"] != "worker"]
        for _ in range(st["workers"]):
            st["procs"].append(self._spawn("worker", self._worker_cmd(st), st["invoke_port"]))
        self.save(st)
        ready = self.wait_ready(timeout_s)
        return {"restarted": len(stopped), **ready}

    def endpoints(self) -> Endpoints:
        st = self._require()
        return Endpoints(f"http://127.0.0.1:{st['invoke_port']}/", f"http://127.0.0.1:{st['upload_port']}",
                         extra={"redis_url": st["redis_url"], "shared_dir": st["shared_dir"]})

    def flush_queue(self) -> int:
        st = self._require()
        q = redis.Redis.from_url(st["redis_url"], db=0)
        n = int(q.dbsize())
        q.flushdb()
        # flushing drops the workers' registrations; put the live ones back
        for r in st["procs"]:
            if r["role"] == "worker" and _alive(r):
                q.sadd("available_workers", f"{r['pid']}@127.0.0.1:{r['port']}")
        return n

    def delete_state_keys(self, patterns: list[str]) -> int:
        st = self._require()
        return _delete_patterns(redis.Redis.from_url(st["redis_url"], db=1), patterns)

    def teardown(self, run_state_keys: list[str], timeout_s: float, full: bool = True) -> dict[str, Any]:
        st = self.load()
        if st is None:
            return {"status": "nothing to tear down", "state": self.state_path}
        report: dict[str, Any] = {"state": self.state_path}
        rrec = [r for r in st["procs"] if r["role"] == "redis"]
        if rrec and _alive(rrec[0]):
            try:
                rq = redis.Redis.from_url(st["redis_url"], db=0, socket_timeout=2)
                rs = redis.Redis.from_url(st["redis_url"], db=1, socket_timeout=2)
                report["queue_keys_flushed"] = int(rq.dbsize())
                rq.flushdb()
                report["state_keys_deleted"] = _delete_patterns(rs, run_state_keys)
                report["state_keys_left"] = int(rs.dbsize())
            except redis.RedisError as exc:
                report["redis_error"] = str(exc)
        others = [r for r in st["procs"] if r["role"] != "redis"]
        report["processes"] = self._stop(others, timeout_s) + self._stop(rrec, timeout_s)
        st["status"] = "torn_down"
        st["torn_down"] = time.time()
        self.save(st)
        return report

    def verify_clean(self, run_state_keys: list[str]) -> dict[str, Any]:
        st = self.load()
        if st is None:
            return {"clean": True, "problems": [], "note": "no local deployment recorded"}
        problems = []
        for r in st["procs"]:
            if _alive(r):
                problems.append(f"{r['role']} pid {r['pid']} still running")
        ports = sorted({r["port"] for r in st["procs"]})
        for port in ports:
            if port_in_use(port):
                problems.append(f"127.0.0.1:{port} still accepting connections")
        rdb = [f for f in os.listdir(st["redis_dir"]) if f.endswith((".rdb", ".aof"))] if os.path.isdir(
            st["redis_dir"]) else []
        if rdb:
            problems.append(f"redis persistence files left: {rdb}")
        try:
            redis.Redis.from_url(st["redis_url"], socket_timeout=0.5, socket_connect_timeout=0.5).ping()
            problems.append("redis still answering (its keys are not gone)")
        except redis.RedisError:
            pass
        return {"clean": not problems, "problems": problems, "ports_checked": ports,
                "pids_checked": [r["pid"] for r in st["procs"]], "status": st.get("status")}

    def describe(self) -> dict[str, Any]:
        st = self.load() or {}
        return {"target": "local", "workers": st.get("workers"), "images": {},
                "redis_server": _redis_version(), "note": "Python workloads; exercises the pipeline, not Faasm"}


def _redis_version() -> str | None:
    try:
        out = subprocess.run([redis_binary(), "--version"], capture_output=True, text=True, timeout=5)
        return out.stdout.strip()
    except (StepError, OSError, subprocess.SubprocessError):
        return None


def _delete_patterns(r: redis.Redis, patterns: list[str]) -> int:
    n = 0
    for pat in patterns:
        keys = list(r.scan_iter(match=pat, count=1000)) if any(c in pat for c in "*?[") else [pat]
        for i in range(0, len(keys), 500):
            n += int(r.delete(*keys[i:i + 500]))
    return n
