"""The processes of one run: private state folder, run label, spawn journal, safe signalling.

Every process a run starts (redis-server, the upload server, workers, the billing
sampler, the load driver's forks) carries the run label in its environment
(``FAASM_TASKS_RUN=<run id>:<hash of the state root>``), so the run's processes are found
by scanning the process table (:func:`find_labelled`), with or without a state file.
Each spawn is also written to ``spawns.jsonl`` *before* the process is started and again
with its pid and start time after, so a step killed between ``Popen`` and saving its
state still leaves a trace (the label is the one that cannot be lost).

A pid is only signalled when it still is the process this run started: the same start
time and command line as recorded, and this run's label in its environment
(:func:`is_ours`). A state file that lists someone else's pid is therefore harmless.

State lives in a private per-user folder (:func:`private_dir`: created mode 0700, and an
existing one must belong to this user and be closed to group and others).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import stat
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import psutil

from stepkit import StepError

log = logging.getLogger(__name__)
LABEL_ENV = "FAASM_TASKS_RUN"
ROLE_ENV = "FAASM_TASKS_ROLE"
FAULT_ENV = "FAASM_TASKS_FAULT"  # fault injection for tests: "<point>:<n>" kills this process at the n-th hit
JOURNAL = "spawns.jsonl"


# ------------------------------------------------------------------ private state folder
def default_state_root() -> str:
    """``$FAASM_TASKS_STATE_DIR``, else ``$XDG_RUNTIME_DIR/faasm_tasks``, else ``<tmp>/faasm_tasks-<uid>``."""
    if os.environ.get("FAASM_TASKS_STATE_DIR"):
        return os.environ["FAASM_TASKS_STATE_DIR"]
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "faasm_tasks")
    return os.path.join(tempfile.gettempdir(), f"faasm_tasks-{os.getuid()}")


def private_dir(path: str) -> str:
    """Create ``path`` (and missing parents) mode 0700, or check an existing one: a
    directory (not a link), owned by this user, no access for group or others."""
    path = os.path.abspath(path)
    try:
        os.makedirs(path, mode=0o700, exist_ok=False)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise StepError(f"state folder {path} is not a directory (a link or a file): refusing to use it")
    if st.st_uid != os.getuid():
        raise StepError(
            f"state folder {path} belongs to uid {st.st_uid}, not to this user ({os.getuid()}): "
            "refusing to use it (set --state-dir or FAASM_TASKS_STATE_DIR to a private folder)"
        )
    if st.st_mode & 0o077:
        raise StepError(
            f"state folder {path} has mode {stat.S_IMODE(st.st_mode):o}; it must be private (0700): chmod 700 {path}"
        )
    return path


def run_dir(state_root: str, run_id: str, *parts: str) -> str:
    """``<state root>/<run id>/<parts>``; the root is checked private, the rest made 0700."""
    path = private_dir(state_root)
    for p in (run_id, *parts):
        path = os.path.join(path, p)
        os.makedirs(path, mode=0o700, exist_ok=True)
    return path


# ------------------------------------------------------------------ label and environment
def run_label(state_root: str, run_id: str) -> str:
    """The label of a run: its id and a hash of its state root (two roots never collide)."""
    digest = hashlib.sha256(os.path.realpath(os.path.abspath(state_root)).encode()).hexdigest()[:12]
    return f"{run_id}:{digest}"


def labelled_env(label: str, role: str, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env[LABEL_ENV] = label
    env[ROLE_ENV] = role
    return env


def fault(point: str) -> None:
    """Fault injection for the kill-at-every-stage tests: ``FAASM_TASKS_FAULT=<point>:<n>``
    SIGKILLs this process at the n-th time it reaches ``point``; ``<point>:<n>:TERM`` sends it
    a SIGTERM there instead (once: the step's clean-up must then run). Unset: does nothing."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec.startswith(point + ":"):
        return
    counts = fault.__dict__.setdefault("counts", {})
    counts[point] = counts.get(point, 0) + 1
    _, n, *how = spec.split(":")
    if counts[point] == int(n) and how == ["TERM"]:
        os.kill(os.getpid(), signal.SIGTERM)
    elif counts[point] >= int(n) and not how:
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------ journal
def journal_append(dirpath: str, entry: dict[str, Any]) -> None:
    """One JSON line, flushed and fsynced (a killed step leaves whole lines behind it)."""
    os.makedirs(dirpath, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(dirpath, JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def journal_read(dirpath: str) -> list[dict[str, Any]]:
    """Spawned processes of the journal (pid known), torn lines skipped."""
    out = []
    try:
        with open(os.path.join(dirpath, JOURNAL), encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if isinstance(d, dict) and isinstance(d.get("pid"), int):
                    out.append(d)
    except OSError:
        pass
    return out


# ------------------------------------------------------------------ identity
def _reap(pid: int) -> None:
    """Collect an exited child of this process (tests deploy in-process), ignore others."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


TITLE_LABEL = "faasm-run="  # in the process title of programs that overwrite their environment (redis-server)
TITLE_ROLE = "faasm-role="


def title_tokens(label: str, role: str) -> str:
    """What a program that rewrites its process title (redis-server's ``proc-title-template``)
    puts in it, since rewriting the title clobbers ``/proc/<pid>/environ``."""
    return f"{TITLE_LABEL}{label} {TITLE_ROLE}{role}"


def _title(p: psutil.Process, prefix: str) -> str | None:
    try:
        for tok in " ".join(p.cmdline()).split():
            if tok.startswith(prefix):
                return tok[len(prefix) :]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        pass
    return None


def _tag(p: psutil.Process, env_name: str, title_prefix: str) -> str | None:
    """A process's tag: from its environment, else from its title (environments can be unreadable)."""
    try:
        env = p.environ().get(env_name)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        env = None
    return env or _title(p, title_prefix)


def _label_of(p: psutil.Process) -> str | None:
    return _tag(p, LABEL_ENV, TITLE_LABEL)


def role_of(p: psutil.Process) -> str | None:
    return _tag(p, ROLE_ENV, TITLE_ROLE)


def _live(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _protected() -> set[int]:
    """This process and its ancestors: never signalled, never reported."""
    me = psutil.Process()
    return {me.pid, *(p.pid for p in me.parents())}


#: How far two readings of one process's start time may differ. psutil derives it from the
#: boot time in /proc/stat (btime), which the kernel recomputes from the wall clock: when the
#: clock is stepped or slewed, a start time read in another process (deploy records it, run
#: checks it) can differ by a whole second. The pid, this run's label and the command line
#: still identify the process; the start time only guards against a reused pid.
START_TOLERANCE_S = 1.5


def same_start(p: psutil.Process, recorded: float) -> bool:
    """Whether ``p`` started when a record (perhaps read in another process) says it did."""
    return abs(p.create_time() - float(recorded)) < START_TOLERANCE_S


def is_ours(rec: dict[str, Any], label: str) -> psutil.Process | None:
    """The live process of a record when it is the one this run started: same start time,
    same command line (when recorded) and this run's label in its environment."""
    pid = rec.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        return None
    _reap(pid)
    try:
        p = psutil.Process(pid)
        if "create_time" in rec and not same_start(p, rec["create_time"]):
            return None
        if _label_of(p) != label or not _live(p) or p.uids().real != os.getuid():
            return None
        if rec.get("cmd") and p.cmdline() != list(rec["cmd"]) and _title(p, TITLE_LABEL) != label:
            return None
        return p
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError, TypeError):
        return None


def find_labelled(label: str) -> list[psutil.Process]:
    """Every live process of this user carrying ``label`` (this process and its ancestors excluded)."""
    skip, uid, out = _protected(), os.getuid(), []
    for p in psutil.process_iter(["pid", "uids", "status"]):
        try:
            if p.pid in skip or p.info["uids"] is None or p.info["uids"].real != uid:
                continue
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                _reap(p.pid)
                continue
            if _label_of(p) == label:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def describe(p: psutil.Process) -> dict[str, Any]:
    d: dict[str, Any] = {"pid": p.pid}
    try:
        d["role"] = role_of(p) or "?"
        d["cmd"] = " ".join(p.cmdline())[:200]
        d["listening"] = sorted(
            {c.laddr.port for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}
        )
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        pass
    return d


def stop(procs: Iterable[psutil.Process], label: str, timeout_s: float) -> list[dict[str, Any]]:
    """SIGTERM, wait up to ``timeout_s``, SIGKILL what is left. The label is checked again
    right before each signal, so a pid reused meanwhile is never touched."""
    report: list[dict[str, Any]] = []
    skip = _protected()
    todo = {p.pid: p for p in procs if p.pid not in skip}
    for pid, p in list(todo.items()):
        d = describe(p)
        try:
            if _label_of(p) != label or not _live(p):
                report.append({**d, "result": "already gone"})
                del todo[pid]
                continue
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            report.append({**d, "result": "already gone"})
            del todo[pid]
            continue
        todo[pid] = p
        p._faasm_desc = d  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while todo and time.monotonic() < deadline:
        for pid, p in list(todo.items()):
            _reap(pid)
            if not _live(p):
                report.append({**p._faasm_desc, "result": "terminated"})  # type: ignore[attr-defined]
                del todo[pid]
        if todo:
            time.sleep(0.05)
    for p in todo.values():
        try:
            if _label_of(p) == label and _live(p):
                p.kill()
        except psutil.NoSuchProcess:
            pass
    for pid, p in todo.items():
        try:
            p.wait(timeout=5)
        except (psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
            pass
        _reap(pid)
        report.append({**p._faasm_desc, "result": "killed" if not _live(p) else "SURVIVED SIGKILL"})  # type: ignore[attr-defined]
    return report


def label_self(label: str, role: str) -> None:
    """Make this step and every process it starts (the load driver's forks too) carry the run
    label, so teardown and verify-clean find them even when this step is killed. The kernel
    shows a process's environment as it was at exec time, so the CLI re-executes itself once
    with the label; when called in-process, only children given ``os.environ`` get it."""
    import sys

    if os.environ.get(LABEL_ENV) == label:
        return
    main = sys.argv[0] if sys.argv else ""
    if main.endswith(os.path.join("faasm_tasks", "__main__.py")):
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, "-m", "faasm_tasks", *sys.argv[1:]], labelled_env(label, role))
    os.environ.update(labelled_env(label, role, base={}))
