"""A worker-process pool that fails fast: a dead worker ends the step, naming its work.

``multiprocessing.Pool`` never returns the task of a worker that was killed (``kill -9``,
the kernel's OOM killer in a pod): it starts a replacement and the caller waits for
ever. :func:`run_pool` gives each worker its own pipe and at most one task at a time, so
the parent always knows which task each worker holds; it waits on the pipes and on the
workers' process sentinels together, and when a worker dies it stops every other worker
and raises :class:`WorkerDied` naming the task (the caller's ``describe``) and the signal
or exit status. A task that raises re-raises the same exception in the parent (the
worker's traceback as its cause), after the other workers are stopped.

While the pool runs (in the main thread) SIGTERM raises :class:`Terminated` in the
parent, so the pool's workers are stopped before the step ends; :mod:`stepkit.cli` turns
it into exit 143. Idle workers leave when their parent's end of the pipe closes, so a
parent killed with SIGKILL leaves no idle worker behind.

Results come back in the order of ``tasks`` whatever order the workers finish in.
Stdlib only; cheap to import.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import threading
import traceback
from collections.abc import Callable, Iterable, Sequence
from multiprocessing import connection as mp_connection
from typing import Any

#: Seconds a worker gets to leave after SIGTERM before it is killed.
STOP_GRACE_S = 5.0


class WorkerDied(RuntimeError):
    """A pool worker ended (killed by a signal or exited) while it held a task."""


class Terminated(BaseException):
    """SIGTERM arrived while a pool ran; its workers are stopped (exit 143)."""


class RemoteTraceback(Exception):
    """The worker's traceback, attached as the cause of an exception a task raised."""

    def __init__(self, tb: str):
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


def default_context() -> mp.context.BaseContext:
    """Workers from a clean server process, never forked from the caller: a fork after torch
    or OpenMP threads exist (a caller that already ran a model, a test session) can deadlock
    the child."""
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


def exit_reason(exitcode: int | None) -> str:
    """``SIGKILL``, ``SIGTERM``, ``exit status 3`` or ``exit status unknown``."""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def _worker(conn, fn: Callable[[Any], Any], initializer: Callable[..., None] | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops its workers
    try:
        if initializer is not None:
            initializer(*initargs)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        _send_error(conn, -1, exc)
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return
        if msg is None:
            return
        i, task = msg
        try:
            out = ("ok", i, fn(task))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            _send_error(conn, i, exc)
            return
        try:
            conn.send(out)
        except (OSError, ValueError):  # the parent is gone
            return


def _send_error(conn, i: int, exc: BaseException) -> None:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        conn.send(("error", i, exc, tb))
    except Exception:  # noqa: BLE001 - an exception that does not pickle: its text then
        try:
            conn.send(("error", i, RuntimeError(f"{type(exc).__name__}: {exc}"), tb))
        except (OSError, ValueError):
            pass


class _Slot:
    def __init__(self, proc, conn):
        self.proc, self.conn = proc, conn
        self.task: int | None = None  # index of the task it holds


def run_pool(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any],
    workers: int,
    *,
    initializer: Callable[..., None] | None = None,
    initargs: Iterable[Any] = (),
    describe: Callable[[Any], str] = repr,
    name: str = "pool",
    context: mp.context.BaseContext | None = None,
) -> list[Any]:
    """``[fn(t) for t in tasks]`` computed by ``workers`` processes, each set up once with
    ``initializer(*initargs)``; results in the order of ``tasks``.

    ``fn`` and ``initializer`` must be module-level functions (they are pickled into the
    workers). ``describe(task)`` names a task in the error when its worker dies.
    Raises :class:`WorkerDied` (every other worker stopped), the task's own exception,
    or :class:`Terminated` on SIGTERM.
    """
    tasks = list(tasks)
    if not tasks:
        return []
    ctx = context or default_context()
    n = max(1, min(int(workers), len(tasks)))
    initargs = tuple(initargs)
    slots: list[_Slot] = []
    results: list[Any] = [None] * len(tasks)
    restore = _trap_sigterm()
    try:
        for w in range(n):
            parent, child = ctx.Pipe(duplex=True)
            p = ctx.Process(
                target=_worker, args=(child, fn, initializer, initargs), name=f"{name}-worker-{w}", daemon=True
            )
            p.start()
            child.close()
            slots.append(_Slot(p, parent))
        todo = iter(range(len(tasks)))
        for s in slots:
            _give(s, next(todo, None), tasks, describe)
        while any(s.task is not None for s in slots):
            busy = [s for s in slots if s.task is not None]
            waitables = [s.conn for s in busy] + [s.proc.sentinel for s in busy]
            ready = set(mp_connection.wait(waitables))
            for s in busy:
                if s.conn not in ready and s.proc.sentinel not in ready:
                    continue
                if not s.conn.poll():  # its process ended without a word
                    _died(s, tasks, describe)
                try:
                    msg = s.conn.recv()
                except (EOFError, OSError):
                    _died(s, tasks, describe)
                if msg[0] == "error":
                    _, i, exc, tb = msg
                    if i < 0:
                        raise RuntimeError(f"{name}: a worker's set-up failed") from RemoteTraceback(tb)
                    raise exc from RemoteTraceback(tb)
                _, i, value = msg
                results[i] = value
                _give(s, next(todo, None), tasks, describe)
        for s in slots:  # all done: let them leave
            try:
                s.conn.send(None)
            except (OSError, ValueError):
                pass
        return results
    finally:
        getattr(restore, "stopping", lambda: None)()
        _stop(slots)
        restore()


def _give(s: _Slot, i: int | None, tasks: list, describe) -> None:
    s.task = i
    if i is None:
        return
    try:
        s.conn.send((i, tasks[i]))
    except (OSError, ValueError):  # its process is gone
        _died(s, tasks, describe)


def _died(s: _Slot, tasks: list, describe) -> None:
    s.proc.join(timeout=STOP_GRACE_S)
    why = exit_reason(s.proc.exitcode)
    raise WorkerDied(
        f"worker for {describe(tasks[s.task])} died: {why} (pid {s.proc.pid}); the other workers were stopped"
    )


def _stop(slots: list[_Slot]) -> None:
    """Every worker gone: SIGTERM to those still running, SIGKILL after the grace period."""
    for s in slots:
        if s.proc.is_alive():
            s.proc.terminate()
    for s in slots:
        s.proc.join(timeout=STOP_GRACE_S)
        if s.proc.is_alive():
            s.proc.kill()
            s.proc.join(timeout=STOP_GRACE_S)
        s.conn.close()


def _trap_sigterm() -> Callable[[], None]:
    """SIGTERM raises :class:`Terminated` while the pool runs (main thread only); returns
    the function that puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    state = {"stopping": False, "late": False}

    def on_term(signum, frame):
        if state["stopping"]:  # already stopping the workers: finish that first
            state["late"] = True
            return
        raise Terminated(f"terminated by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, on_term)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)
        if state["late"]:
            raise Terminated("terminated by SIGTERM")

    def stopping() -> None:
        state["stopping"] = True

    restore.stopping = stopping  # type: ignore[attr-defined]
    return restore
