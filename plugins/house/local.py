"""``LocalStepOperator``: run ``python -m <package> <argv...>`` as a child of the worker.

The child runs in its own process group, from the code root, with the task packages
imported from the installed distribution (``pip install -e .``; nothing is put on
``PYTHONPATH``). Its stdout and stderr are copied into the task log line by line as
they arrive. A non-zero exit fails the task with the last lines of the stream that
holds the cause in the message: stderr, or stdout when the step wrote nothing to
stderr (a step printing ``failed: invoke: ConnectionError ...`` to stdout). When the task is
stopped (``execution_timeout``, a kill from the UI, any exception while waiting) the
whole process group gets SIGTERM, then SIGKILL after a grace period, so no grandchild
survives the task. Exit code 2 (the step contract's "bad input or parameters") fails
the task without retries; any other non-zero code is retried as usual.

External jobs that survive a retry: a step that submits jobs outliving its process (the
keeper's Slurm jobs) announces their ids on stdout (``house.external``); the operator keeps them in
the task's state store as they arrive and, with ``adopt_flag`` set (``--adopt-jobs``), passes them
back to a later try of the same task instance, which adopts them instead of submitting again.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from house import config as house_config
from house.argv import drop_omitted
from house.bundle import bundle_env
from house.external import EXTERNAL_IDS_KEY, EXTERNAL_PREFIX, KeptIds, announced_ids
from house.links import StepReportLink

# EXTERNAL_*: house.external's, named here as well (the local runner's callers and tests use them)
__all__ = [
    "EXIT_BAD_INPUT",
    "EXTERNAL_IDS_KEY",
    "EXTERNAL_PREFIX",
    "LocalStepOperator",
    "StepFailed",
    "StepRejected",
    "failure_tail",
]

#: Exit code of a step refusing its input or parameters (``stepkit``'s ``StepError``):
#: a retry cannot help, so the task fails at once.
EXIT_BAD_INPUT = 2


class StepFailed(AirflowException):
    """The step's process exited with a non-zero code (the task may be retried)."""

    def __init__(self, message: str, returncode: int):
        super().__init__(message)
        self.returncode = returncode


class StepRejected(StepFailed, AirflowFailException):
    """The step exited with code 2 (bad input or parameters): fail without retrying."""


class LocalStepOperator(BaseOperator):
    """Run one task-package step as a local child process.

    :param package: the task package (``python -m <package>``).
    :param argv: the step's arguments (templated; items may be XComArgs).
    :param env: extra environment variables for the child (templated).
    :param python: interpreter; default ``HOUSE_PYTHON`` or the worker's own.
    :param cwd: working directory; default ``HOUSE_CODE_ROOT``.
    :param preset: the resource preset; recorded only (a local child shares the worker).
    :param map_label: a mapped instance's label in the UI (``map_index_template=house.MAP_LABEL``
        shows it); the items of :func:`house.mapped_items` carry it beside the argv.
    """

    template_fields: Sequence[str] = ("argv", "env")
    template_fields_renderers = {"argv": "py", "env": "json"}
    operator_extra_links = (StepReportLink(),)
    ui_color = "#d8f0d8"

    def __init__(
        self,
        *,
        package: str,
        argv: Sequence[Any] | Any = (),
        env: dict[str, str] | None = None,
        python: str | None = None,
        cwd: str | None = None,
        preset: str = "cpu-small",
        stderr_tail_lines: int = house_config.STDERR_TAIL_LINES,
        kill_grace_seconds: float = house_config.KILL_GRACE_SECONDS,
        map_label: str | None = None,
        adopt_flag: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.package = package
        self.argv = argv
        self.env = env or {}
        self.python = python
        self.cwd = cwd
        self.preset = preset
        self.stderr_tail_lines = stderr_tail_lines
        self.kill_grace_seconds = kill_grace_seconds
        self.map_label = map_label
        self.adopt_flag = adopt_flag
        self._proc: subprocess.Popen | None = None
        # the ids a running step announced (set in execute: a lock in the constructor would make
        # the operator impossible to deepcopy, which Airflow does with tasks)
        self._announced: list[str] = []
        self._announced_lock: threading.Lock | None = None

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)
        self.argv = drop_omitted(self.argv)  # an empty optional flag is no argument at all

    # -- helpers ---------------------------------------------------------------------
    def command(self) -> list[str]:
        cfg = house_config.get_config()
        if isinstance(self.argv, (str, bytes)):
            raise TypeError(f"{self.task_id}: argv must be a list of arguments, not a string: {self.argv!r}")
        return [self.python or cfg.python, "-m", self.package, *(str(a) for a in self.argv)]

    def child_env(self, bundle: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        env.update({k: str(v) for k, v in self.env.items()})
        env["PYTHONUNBUFFERED"] = "1"
        # the run's bundle and version (house.bundle), recorded in the step's marker; after the
        # overrides, so an env param cannot make an output name other code than the one that ran
        env.update(bundle or {})
        # what the step may read: the storage root and HOUSE_INPUT_ROOTS, resolved now (a form's
        # value is data: stepkit.reach refuses anything else); set last, so no env override widens it
        env[house_config.INPUT_ROOTS_ENV] = ",".join(house_config.input_roots())
        return env

    def _pump(self, stream, label: str, tail: collections.deque | None) -> None:
        # SIGTERM/SIGINT for the main thread only: one taken by this thread left the main thread
        # blocked in proc.wait() unaware, so a stopped task did not stop its step (starts nothing)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self.log.info("[%s] %s", label, line)
            if label == "stdout" and line.startswith(EXTERNAL_PREFIX):
                self._note_external(line)
            if tail is not None:
                tail.append(line)
        stream.close()

    def _note_external(self, line: str) -> None:
        ids = announced_ids(line, self.log)
        if ids:
            with self._announced_lock:
                self._announced.extend(ids)

    def _persist_external(self, kept: KeptIds) -> None:
        """Keep the ids announced since the last call (``kept`` writes new ones to the store)."""
        with self._announced_lock:
            new, self._announced = self._announced, []
        kept.add(new)

    def _stop(self, proc: subprocess.Popen, reason: str) -> None:
        """SIGTERM the child's process group, SIGKILL it after the grace period."""
        if proc.poll() is not None and not _group_alive(proc.pid):
            return
        self.log.warning("stopping step process group %d (%s)", proc.pid, reason)
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace_seconds
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.05)
        self.log.warning("process group %d still alive after %.0fs; sending SIGKILL", proc.pid, self.kill_grace_seconds)
        _signal_group(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.log.error("process %d did not exit after SIGKILL", proc.pid)

    # -- Airflow hooks ---------------------------------------------------------------
    def execute(self, context: Any) -> None:
        cmd = self.command()
        self._announced, self._announced_lock = [], threading.Lock()
        kept = KeptIds(context.get("task_state_store"), self.log)
        if adopt := kept.adopt_args(self.adopt_flag):
            self.log.info("an earlier try's external ids, passed back to adopt: %s", adopt[1])
            cmd += adopt
        cwd = self.cwd or house_config.get_config().code_root
        bundle = bundle_env(context)
        self.log.info("running %s (cwd %s, preset %s, %s)", shlex.join(cmd), cwd, self.preset, bundle)
        tails = {name: collections.deque(maxlen=self.stderr_tail_lines) for name in ("stderr", "stdout")}
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=self.child_env(bundle),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # own process group: one signal reaches every descendant
        )
        self._proc = proc
        pumps = [
            threading.Thread(target=self._pump, args=(proc.stdout, "stdout", tails["stdout"]), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, "stderr", tails["stderr"]), daemon=True),
        ]
        for t in pumps:
            t.start()
        try:
            while True:  # the announced ids reach the store while the step runs
                try:
                    returncode = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    self._persist_external(kept)
            # The child is gone; make sure nothing it started outlives the task (and
            # holds the pipes open).
            if _group_alive(proc.pid):
                self._stop(proc, "leftover processes after the step exited")
            for t in pumps:
                t.join(timeout=30)
        except BaseException as exc:  # timeout (AirflowTaskTimeout), SIGTERM, KeyboardInterrupt...
            self._stop(proc, type(exc).__name__)
            raise
        finally:
            self._proc = None
            self._persist_external(kept)
        if returncode != 0:
            how = f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"
            error = StepRejected if returncode == EXIT_BAD_INPUT else StepFailed
            raise error(
                f"step `python -m {self.package} {shlex.join(cmd[3:])}` failed ({how}"
                f"{', bad input: not retried' if error is StepRejected else ''}); {failure_tail(tails)}",
                returncode,
            )
        self.log.info("step finished (exit code 0)")

    def on_kill(self) -> None:
        proc = self._proc
        if proc is not None:
            self._stop(proc, "task killed")


def failure_tail(tails: dict[str, collections.deque]) -> str:
    """The last lines of the stream holding the cause: stderr, else stdout (blank lines dropped)."""
    for name in ("stderr", "stdout"):
        lines = [line for line in tails[name] if line.strip()]
        if lines:
            return f"last {len(lines)} {name} lines:\n" + "\n".join(lines)
    return "no output on stderr or stdout"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in the group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not os.path.isdir("/proc/self"):
        return True
    # Zombies still count for killpg(); they are dead, just not yet reaped by their
    # (new) parent, which in a container may be an init that never reaps.
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False
