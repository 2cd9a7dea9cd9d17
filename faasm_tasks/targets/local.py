"""The embedded target: redis-server, an upload server and N workers on 127.0.0.1.

Everything it starts carries the run label in its environment and is written to the
spawn journal before it starts (see :mod:`faasm_tasks.procs`), then recorded in
``<state-dir>/<run-id>/local/state.json`` (pid, start time, port, command, log), so
``deploy``, ``run`` and ``teardown`` can be separate processes. ``teardown`` and
``verify-clean`` find the run's processes by the label too, so a killed deploy, a lost or
truncated state file or a sampler nobody recorded cannot hide anything. A pid is only
signalled when it still is this run's process (start time, command line, label).

Each worker is the runtime of the plan's system (:mod:`faasm_tasks.runtimes`): ``wasm`` runs
the C functions as wasmtime instances in the worker process, ``native`` runs their static
builds in runc containers the worker starts (state root ``<run>/local/runc``); teardown also
removes every container left in that root, verify-clean reports any.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

import psutil
import redis
import requests

from stepkit import StepError
from stepkit.pool import Terminated
from stepkit.procs import deferred_sigterm as sigterm_deferred

from .. import procs, runtimes
from ..procs import default_state_root  # re-exported (common.py, tests)
from .base import Endpoints, Target

log = logging.getLogger(__name__)
STATE_FILE = "state.json"
ROLES = ("redis", "upload", "worker")


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
        raise StepError(
            "redis-server not found: install Debian's redis-server "
            "(apt-get install -y redis-server) or set FAASM_REDIS_SERVER"
        )
    return exe


class LocalTarget(Target):
    name = "local"

    def __init__(self, state_root: str, run_id: str):
        self.state_root = os.path.abspath(state_root)
        self.dir = os.path.join(self.state_root, run_id, "local")
        self.run_id = run_id
        self.label = procs.run_label(self.state_root, run_id)
        self.state_problem: str | None = None
        self.results: str | None = None  # results root: the record is mirrored under <results>/_state/<run>/
        self.recovered_from: str | None = None  # the storage record load() used, when there was no state file
        self.started: list[dict[str, Any]] = []  # what this object (this step) started: stop_started() stops it

    @classmethod
    def from_args(cls, args) -> LocalTarget:
        t = cls(getattr(args, "state_dir", None) or default_state_root(), args.run_id)
        t.results = getattr(args, "results", None)
        return t

    # ---------------------------------------------------------------- state file
    @property
    def runc_root(self) -> str:
        return os.path.join(self.dir, "runc")

    @property
    def state_path(self) -> str:
        return os.path.join(self.dir, STATE_FILE)

    def load(self) -> dict[str, Any] | None:
        """The state file, or None when it is missing or unreadable (``state_problem`` says which)."""
        self.state_problem = None
        try:
            with open(self.state_path, encoding="utf-8") as f:
                st = json.load(f)
        except FileNotFoundError:
            st = self._from_storage()
            if st is None:
                return None
        except (OSError, ValueError) as exc:
            self.state_problem = f"state file unreadable ({type(exc).__name__}: {exc})"
            return None
        if not isinstance(st, dict) or not isinstance(st.get("procs"), list):
            self.state_problem = "state file is not a deployment record"
            return None
        return st

    def record_uri(self) -> str | None:
        """``<results>/_state/<run id>/local-target.json``: the record mirrored to storage."""
        if not self.results:
            return None
        from stepkit import storage

        return storage.join(self.results, "_state", self.run_id, "local-target.json")

    def _from_storage(self) -> dict[str, Any] | None:
        """The deployment record from storage when this process has no local state file (a step
        in a fresh process, or with another ``--state-dir``): usable only on the host that runs
        the processes; ``state_problem`` says why not otherwise."""
        uri = self.record_uri()
        self.state_problem = "no state file"
        if uri is None:
            return None
        from stepkit import storage

        try:
            st = storage.read_json(uri)
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - storage trouble: as if there were no record
            self.state_problem = f"no state file; the record in storage is unreadable ({type(exc).__name__}: {exc})"
            return None
        host = st.get("host") if isinstance(st, dict) else None
        if host != socket.gethostname():
            self.state_problem = f"no state file; the record in storage ({uri}) is from host {host!r}"
            return None
        self.recovered_from = uri
        if st.get("label"):  # the processes carry the deploying step's run label (its state root)
            self.label = str(st["label"])
        log.info("local target record recovered from %s", uri)
        return st

    def save(self, st: dict[str, Any]) -> None:
        procs.run_dir(self.state_root, self.run_id, "local")
        tmp = self.state_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(st, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)
        if self.results:  # recoverable from storage too (which host, which processes and ports)
            try:
                from stepkit import storage

                storage.write_json(
                    storage.join(self.results, "_state", self.run_id, "local-target.json"),
                    {**st, "host": socket.gethostname(), "state_file": self.state_path, "label": self.label},
                )
            except Exception as exc:  # noqa: BLE001 - the local record is authoritative for the processes
                log.warning("could not mirror the local target record to storage: %s", exc)

    def _require(self) -> dict[str, Any]:
        st = self.load()
        if not st or st.get("status") != "deployed":
            why = f" ({self.state_problem})" if self.state_problem else ""
            raise StepError(f"local target for run {self.run_id} is not deployed (no live state in {self.dir}){why}")
        return st

    # ---------------------------------------------------------------- processes
    def _alive(self, rec: dict[str, Any]) -> bool:
        return procs.is_ours(rec, self.label) is not None

    def _spawn(self, role: str, cmd: list[str], port: int, into: list[dict[str, Any]]) -> dict[str, Any]:
        logs = os.path.join(procs.run_dir(self.state_root, self.run_id, "local"), "logs")
        os.makedirs(logs, mode=0o700, exist_ok=True)
        logfile = os.path.join(logs, f"{role}-{port}-{int(time.time() * 1000)}.log")
        # recorded before it starts: whatever kills this step from here on leaves a trace
        procs.journal_append(
            self.dir,
            {"event": "starting", "role": role, "port": port, "cmd": cmd, "label": self.label, "t": time.time()},
        )
        # a SIGTERM waits until the process is started AND in this step's records (``into`` and
        # ``self.started``), so the step's clean-up stops exactly what it started
        with sigterm_deferred(), open(logfile, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
                env=self._env(role),
            )
            procs.fault("spawned")  # test hook: a deploy killed between starting a process and recording it
            rec = {
                "role": role,
                "pid": proc.pid,
                "port": port,
                "cmd": cmd,
                "log": logfile,
                "create_time": psutil.Process(proc.pid).create_time(),
            }
            into.append(rec)
            self.started.append(rec)
            procs.journal_append(self.dir, {"event": "started", **rec})
        log.info("started %s pid %d on 127.0.0.1:%d", role, proc.pid, port)
        return rec

    def stop_started(self, timeout_s: float = 10.0) -> str:
        """Stop the processes this object started (its own records, nothing found by label),
        and say truthfully what became of them: the message a terminated step prints."""
        if not self.started:
            return "it had started no process"
        report = self._stop(list(self.started), timeout_s)
        survived = [r for r in report if r.get("result") == "SURVIVED SIGKILL"]
        st = self.load()
        if (
            st
            and st.get("status") == "deployed"
            and {r.get("pid") for r in st["procs"]} <= {r["pid"] for r in self.started}
        ):
            st["status"] = "failed"  # its processes are gone: a retried deploy starts afresh
            self.save(st)
        self.started = [r for r in self.started if procs.is_ours(r, self.label) is not None]
        roles = ", ".join(f"{r.get('role')} pid {r.get('pid')}" for r in report)
        if survived or self.started:
            return (
                f"it could NOT stop every process it started ({roles}; still running: "
                + ", ".join(f"{r.get('role')} pid {r.get('pid')}" for r in self.started)
                + "): run teardown"
            )
        return f"the {len(report)} process(es) it started were stopped ({roles})"

    def _env(self, role: str) -> dict[str, str]:
        env = procs.labelled_env(self.label, role)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.setdefault("OMP_NUM_THREADS", "1")
        env.pop(procs.FAULT_ENV, None)
        return env

    def _worker_cmd(self, st: dict[str, Any]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "faasm_tasks.local_server",
            "worker",
            "--port",
            str(st["invoke_port"]),
            "--redis-url",
            st["redis_url"],
            "--shared-dir",
            st["shared_dir"],
            "--system",
            st.get("system") or "wasm",
            "--run-dir",
            self.dir,
            "--memory-limit-mb",
            str(st.get("memory_limit_mb", 512)),
            "--call-timeout-s",
            str(st.get("call_timeout_s", 600)),
        ]

    def _stop(self, recs: list[dict[str, Any]], timeout_s: float) -> list[dict[str, Any]]:
        """Stop the recorded processes that still are this run's; report the others as gone."""
        live, report = [], []
        for rec in recs:
            p = procs.is_ours(rec, self.label)
            if p is None:
                report.append({"pid": rec.get("pid"), "role": rec.get("role"), "result": "already gone"})
            else:
                live.append(p)
        return report + procs.stop(live, self.label, timeout_s)

    def run_processes(self) -> list[psutil.Process]:
        """This run's live processes, found by label (no state file needed)."""
        return procs.find_labelled(self.label)

    def health(self) -> str | None:
        """None while every recorded process of the deployment lives, else what died."""
        st = self.load()
        if not st:
            return f"local deployment of run {self.run_id} is gone ({self.state_problem})"
        dead = [r for r in st["procs"] if not self._alive(r)]
        if not dead:
            return None
        return f"{len(dead)} process(es) died: " + ", ".join(f"{r['role']} pid {r['pid']}" for r in dead[:5])

    # ---------------------------------------------------------------- interface
    def deploy(self, plan) -> dict[str, Any]:
        problems = runtimes.build_problems(plan.system)
        if problems:  # every worker would start and fail at its first call (or at wait-ready)
            raise StepError(
                f"the {plan.system} functions are not built: {'; '.join(problems[:4])}: run `make functions` first"
            )
        st = self.load()
        n = int(plan.deployment["worker_replicas"])
        if st and st.get("status") == "deployed":
            alive = [r for r in st["procs"] if self._alive(r)]
            if len(alive) == len(st["procs"]) and st["workers"] == n:
                return {"status": "already deployed", "workers": n, "state": self.state_path}
            raise StepError(
                f"a different or broken local deployment exists for run {self.run_id} "
                f"({len(alive)}/{len(st['procs'])} processes alive, {st['workers']} workers); "
                "run teardown first"
            )
        leftovers = [p for p in self.run_processes() if procs.describe(p).get("role") in ROLES]
        if leftovers:
            raise StepError(
                f"{len(leftovers)} process(es) of run {self.run_id} are still running "
                f"(pids {', '.join(str(p.pid) for p in leftovers[:8])}); run teardown first"
            )
        procs.run_dir(self.state_root, self.run_id, "local")
        shared = os.path.join(self.dir, "shared")
        funcs = os.path.join(self.dir, "functions")
        rdir = os.path.join(self.dir, "redis")
        for d in (shared, funcs, rdir):
            os.makedirs(d, exist_ok=True)
        st = {
            "status": "deploying",
            "run_id": self.run_id,
            "experiment": plan.name,
            "system": plan.system,
            "workers": n,
            "procs": [],
            "shared_dir": shared,
            "functions_dir": funcs,
            "redis_dir": rdir,
            "memory_limit_mb": int(plan.params.get("memory_limit_mb", 512)),
            "call_timeout_s": float(
                plan.params.get("call_timeout_s") or (plan.experiment.get("driver") or {}).get("call_timeout_s") or 600
            ),
            "started": time.time(),
        }
        try:
            rport = free_port()
            st["redis_port"], st["redis_url"] = rport, f"redis://127.0.0.1:{rport}"
            self.save(st)
            self._spawn(
                "redis",
                [
                    redis_binary(),
                    "--port",
                    str(rport),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    rdir,
                    "--protected-mode",
                    "yes",
                    "--maxclients",
                    "10000",
                    # redis rewrites its title over its environment:
                    # the run label goes into the title instead
                    "--proc-title-template",
                    "{title} {listen-addr} " + procs.title_tokens(self.label, "redis"),
                ],
                rport,
                into=st["procs"],
            )
            self.save(st)
            self._wait_redis(st, 15)
            uport = free_port()
            st["upload_port"] = uport
            self._spawn(
                "upload",
                [
                    sys.executable,
                    "-m",
                    "faasm_tasks.local_server",
                    "upload",
                    "--port",
                    str(uport),
                    "--redis-url",
                    st["redis_url"],
                    "--shared-dir",
                    shared,
                    "--functions-dir",
                    funcs,
                ],
                uport,
                into=st["procs"],
            )
            st["invoke_port"] = free_port()
            self.save(st)
            for _ in range(n):
                self._spawn("worker", self._worker_cmd(st), st["invoke_port"], into=st["procs"])
                self.save(st)
            st["status"] = "deployed"
            self.save(st)
        except BaseException as exc:
            # a deploy that did not finish (a SIGTERM at any point, redis not answering, ...) stops
            # what it started, from its own records, and says what became of them
            try:
                with sigterm_deferred():  # a SIGTERM now waits for the clean-up, then ends the step
                    exc.cleanup = self.stop_started()  # type: ignore[attr-defined]
                    st["status"] = "failed"
                    st["stopped_by_deploy"] = exc.cleanup  # type: ignore[attr-defined]
                    self.save(st)
            except Terminated as late:
                late.cleanup = getattr(exc, "cleanup", None)  # type: ignore[attr-defined]
                raise late from exc
            raise
        return {
            "status": "deployed",
            "workers": n,
            "invoke_port": st["invoke_port"],
            "upload_port": st["upload_port"],
            "redis_port": st["redis_port"],
            "state": self.state_path,
        }

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
        dead = [r for r in st["procs"] if not self._alive(r)]
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
                    return {
                        "ready": True,
                        "workers": seen,
                        "waited_s": round(timeout_s - (deadline - time.monotonic()), 3),
                    }
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
        self.save(st)
        for _ in range(st["workers"]):
            self._spawn("worker", self._worker_cmd(st), st["invoke_port"], into=st["procs"])
            self.save(st)
        ready = self.wait_ready(timeout_s)
        return {"restarted": len(stopped), **ready}

    def endpoints(self) -> Endpoints:
        st = self._require()
        return Endpoints(
            f"http://127.0.0.1:{st['invoke_port']}/",
            f"http://127.0.0.1:{st['upload_port']}",
            extra={"redis_url": st["redis_url"], "shared_dir": st["shared_dir"]},
        )

    def flush_queue(self) -> int:
        st = self._require()
        q = redis.Redis.from_url(st["redis_url"], db=0)
        n = int(q.dbsize())
        q.flushdb()
        # flushing drops the workers' registrations; put the live ones back
        for r in st["procs"]:
            if r["role"] == "worker" and self._alive(r):
                q.sadd("available_workers", f"{r['pid']}@127.0.0.1:{r['port']}")
        return n

    def delete_state_keys(self, patterns: list[str]) -> int:
        st = self._require()
        return _delete_patterns(redis.Redis.from_url(st["redis_url"], db=1), patterns)

    def teardown(self, run_state_keys: list[str], timeout_s: float, full: bool = True) -> dict[str, Any]:
        """Stop everything of the run: what the state file and the journal list (when it
        still is this run's process) and whatever carries the run label. Needs no state
        file, no catalogue; the run's Redis is private and unpersisted, so stopping it
        removes every key (it is flushed first when reachable)."""
        st = self.load()
        report: dict[str, Any] = {"state": self.state_path, "label": self.label}
        if self.state_problem:
            report["state_problem"] = self.state_problem
        recs = list(st["procs"]) if st else []
        recs += procs.journal_read(self.dir)
        if st and st.get("redis_url"):
            rrec = [r for r in st["procs"] if r["role"] == "redis"]
            if rrec and self._alive(rrec[0]):
                try:
                    rq = redis.Redis.from_url(st["redis_url"], db=0, socket_timeout=2)
                    rs = redis.Redis.from_url(st["redis_url"], db=1, socket_timeout=2)
                    report["queue_keys_flushed"] = int(rq.dbsize())
                    rq.flushdb()
                    report["state_keys_deleted"] = _delete_patterns(rs, run_state_keys)
                    report["state_keys_left_flushed"] = int(rs.dbsize())
                    rs.flushdb()
                except redis.RedisError as exc:
                    report["redis_error"] = str(exc)
        found: dict[int, psutil.Process] = {}
        for rec in recs:
            p = procs.is_ours(rec, self.label)
            if p is not None:
                found[p.pid] = p
        unrecorded = [p for p in self.run_processes() if p.pid not in found]
        report["found_by_label_only"] = [procs.describe(p) for p in unrecorded]
        for p in unrecorded:
            found[p.pid] = p
        roles = {pid: procs.describe(p).get("role") for pid, p in found.items()}
        # containers (pid 1 of their namespaces: SIGTERM does not end them) go through runc below
        first = [p for p in found.values() if roles[p.pid] not in ("redis", "container")]
        last = [p for p in found.values() if roles[p.pid] == "redis"]
        report["processes"] = procs.stop(first, self.label, timeout_s)
        # native containers a killed worker left behind: removed from the run's runc root
        report["containers"] = {
            c.get("id"): runtimes.runc_remove(self.runc_root, c["id"])
            for c in runtimes.runc_list(self.runc_root)
            if c.get("id")
        }
        left_containers = [p for p in found.values() if roles[p.pid] == "container"]
        report["processes"] += procs.stop(left_containers, self.label, timeout_s) + procs.stop(
            last, self.label, timeout_s
        )
        left = self.run_processes()
        if left:
            report["incomplete"] = [f"{d.get('role')} pid {d['pid']} survived" for d in map(procs.describe, left)]
        new = st or {"procs": [], "run_id": self.run_id, "rebuilt_by_teardown": True}
        new["status"] = "torn_down"
        new["torn_down"] = time.time()
        try:
            self.save(new)
        except (OSError, StepError) as exc:
            report["state_save_error"] = str(exc)
        return report

    def verify_clean(self, run_state_keys: list[str]) -> dict[str, Any]:
        """What is left of the run, found independently of the state file: processes with the
        run label (billing sampler and load driver included) and their listening ports, the
        ports the state file and the journal recorded, a Redis still answering, Redis files."""
        st = self.load()
        problems = []
        left = self.run_processes()
        for d in map(procs.describe, left):
            problems.append(
                f"{d.get('role', '?')} pid {d['pid']} still running"
                + (f", listening on {d['listening']}" if d.get("listening") else "")
            )
        for c in runtimes.runc_list(self.runc_root):
            problems.append(
                f"native container {c.get('id')} ({c.get('status')}, pid {c.get('pid')}) left in {self.runc_root}"
            )
        recs = (st["procs"] if st else []) + procs.journal_read(self.dir)
        ports = sorted({int(r["port"]) for r in recs if isinstance(r.get("port"), int)})
        for port in ports:
            if port_in_use(port):
                problems.append(f"127.0.0.1:{port} (a port of this run) still accepting connections")
        rdir = (st or {}).get("redis_dir") or os.path.join(self.dir, "redis")
        rdb = [f for f in os.listdir(rdir) if f.endswith((".rdb", ".aof"))] if os.path.isdir(rdir) else []
        if rdb:
            problems.append(f"redis persistence files left: {rdb}")
        if st and st.get("redis_url"):
            try:
                n = redis.Redis.from_url(st["redis_url"], socket_timeout=0.5, socket_connect_timeout=0.5).dbsize()
                problems.append(f"redis at {st['redis_url']} still answering ({n} keys in db 0)")
            except redis.RedisError:
                pass
        return {
            "clean": not problems,
            "problems": problems,
            "label": self.label,
            "ports_checked": ports,
            "processes_found": len(left),
            "status": (st or {}).get("status"),
            "state_problem": self.state_problem,
        }

    def describe(self) -> dict[str, Any]:
        st = self.load() or {}
        return {
            "target": "local",
            "workers": st.get("workers"),
            "images": {},
            "redis_server": _redis_version(),
            "system": st.get("system"),
            "note": "C functions on one host: wasm = wasmtime instances per worker process, "
            "native = static binaries in runc containers",
        }


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
            n += int(r.delete(*keys[i : i + 500]))
    return n
