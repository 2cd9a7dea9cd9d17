"""A step owns the processes it starts: SIGTERM stops them, and so does the step's death.

* :func:`trap_sigterm`: while a step runs (:func:`stepkit.cli.dispatch` installs it for every
  step) the first SIGTERM raises :class:`~stepkit.pool.Terminated` in the main thread, so the
  step's ``finally`` blocks stop what it started and the CLI exits 143. A second SIGTERM
  while that clean-up runs is logged and ignored (the clean-up is bounded by the step; the
  Kubernetes grace period then ends it with SIGKILL).
* :class:`ChildGroups`: a command that runs steps (``python -m lab.campaigns.mirage_eval``, threads each
  running one step at a time) starts each in a process group of its own and, when it is
  stopped, stops exactly those groups: SIGTERM to each step (which stops what it started),
  SIGKILL to whatever of a group is left after a grace period, and it says what it stopped.
  A group is signalled only while its leader is unreaped (a zombie at worst), so its id is
  never another process's.
* :class:`Guard`: what the step's ``finally`` cannot do after a SIGKILL (the kubelet's at the
  end of the grace period, the OOM killer). A guard is a small process in a session of its
  own that holds the read end of a pipe whose write end only the step holds; when the step
  ends without :meth:`Guard.disarm` (the kernel closes the pipe whatever killed it) the
  guard runs its clean-up command (``python -m lab.slurm.cluster stop --root R``:
  cancel every job, stop munged, slurmctld and every slurmd, kill leftover job steps) and
  leaves. A step that ends normally disarms it: the guard exits at once and does nothing.

Stdlib only; cheap to import.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from .pool import Terminated

log = logging.getLogger(__name__)

#: Seconds a guard's clean-up command may run before the guard gives up on it.
GUARD_CLEANUP_TIMEOUT_S = 180.0


def trap_sigterm() -> Callable[[], None]:
    """SIGTERM raises :class:`Terminated` once (main thread only; elsewhere a no-op);
    returns the function that puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    state = {"raised": False}

    def on_term(signum, frame):
        if _DEFER["depth"] and not state["raised"]:  # inside deferred_sigterm(): raised at its end
            state["raised"] = True
            _DEFER["pending"] = f"terminated by {signal.Signals(signum).name}"
            return
        if state["raised"]:
            log.warning(
                "%s again while stopping what the step started: finishing that first", signal.Signals(signum).name
            )
            return
        state["raised"] = True
        raise Terminated(f"terminated by {signal.Signals(signum).name}")

    previous = signal.signal(signal.SIGTERM, on_term)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


_DEFER: dict = {"depth": 0, "pending": None}


@contextlib.contextmanager
def deferred_sigterm():
    """A critical section the trapped SIGTERM waits for: started a process and wrote down its
    pid, or neither. Without it a SIGTERM between ``Popen`` returning and the record being made
    would leave a process the step's clean-up does not know it started. The deferred
    :class:`Terminated` is raised when the outermost section ends."""
    _DEFER["depth"] += 1
    try:
        yield
    finally:
        _DEFER["depth"] -= 1
        if not _DEFER["depth"] and _DEFER["pending"]:
            why, _DEFER["pending"] = _DEFER["pending"], None
            raise Terminated(why)


def run_trapped(main: Callable[[list[str] | None], int], prog: str, argv: list[str] | None = None) -> int:
    """``main(argv)`` with the step contract's SIGTERM (:func:`trap_sigterm`), for a module run as
    ``python -m`` outside the step CLI: exit 143 after its ``finally`` blocks ran."""
    from .pool import Terminated

    restore = trap_sigterm()
    try:
        return main(argv)
    except Terminated as exc:
        print(f"{prog}: {exc}", file=sys.stderr, flush=True)
        return 143
    finally:
        restore()


#: Seconds a stopped step gets to stop what it started before its process group is killed
#: (inside Kubernetes' 30 s grace period).
STOP_GRACE_S = 20.0


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _exited(pid: int) -> bool:
    """True once ``pid`` (a child of this process) has exited; it is left unreaped (WNOWAIT),
    so its pid, and the id of the group it leads, stay its own until :meth:`Popen.wait`."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


class ChildGroups:
    """Steps run each in a process group of its own, all stoppable at once (:meth:`stop`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, tuple[subprocess.Popen, str]] = {}
        self.stopping = False

    def run(self, cmd: Sequence[str], label: str, **popen: object) -> int:
        """Run ``cmd`` in a new process group and return its exit status; refused (a
        :class:`Terminated`) once :meth:`stop` was called. Whatever of the group outlives its
        leader is killed before the leader is reaped."""
        with self._lock:
            if self.stopping:
                raise Terminated(f"{label}: not started, the command is stopping")
            proc = subprocess.Popen(list(cmd), start_new_session=True, **popen)  # type: ignore[arg-type]
            self._running[proc.pid] = (proc, label)
        try:
            while not _exited(proc.pid):
                time.sleep(0.05)
            with self._lock:
                self._running.pop(proc.pid, None)
                _killpg(proc.pid, signal.SIGKILL)  # leftovers of the group (the leader is a zombie)
        finally:
            rc = proc.wait()
            with self._lock:
                self._running.pop(proc.pid, None)
        return rc

    def stop(self, grace_s: float = STOP_GRACE_S) -> list[str]:
        """Start nothing more; SIGTERM every running step, SIGKILL each group still running after
        ``grace_s``; returns what was stopped, in words (``label (pid P): exited 143``)."""
        with self._lock:
            self.stopping = True
            running = dict(self._running)
            for pid in running:
                os.kill(pid, signal.SIGTERM)  # the step stops what it started (its trap)
        end = time.monotonic() + grace_s
        killed = set()
        while time.monotonic() < end and any(not _exited(pid) for pid in running):
            time.sleep(0.05)
        with self._lock:
            for pid in running:
                if pid in self._running and not _exited(pid):
                    _killpg(pid, signal.SIGKILL)
                    killed.add(pid)
        stopped = []
        for pid, (proc, label) in running.items():
            try:
                rc = proc.wait(timeout=grace_s)  # reaped by its runner thread, or here
            except subprocess.TimeoutExpired:
                rc = None
            how = "killed (SIGKILL) after its grace period" if pid in killed else f"exited {rc}"
            stopped.append(f"{label} (pid {pid}): {how}")
        return stopped


class Guard:
    """Runs ``argv`` after this process dies unless :meth:`disarm` is called first."""

    def __init__(self, argv: Sequence[str], what: str, env: dict[str, str] | None = None):
        self.what = what
        r, w = os.pipe()  # both ends non-inheritable: no other child of the step holds the write end
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "stepkit.procs", str(r), what, *argv],
                pass_fds=(r,),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._w: int | None = w

    def disarm(self, timeout: float = 10.0) -> None:
        """The step cleaned up itself: the guard leaves without doing anything."""
        if self._w is None:
            return
        try:
            os.write(self._w, b"ok")
        except OSError:
            pass
        os.close(self._w)
        self._w = None
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _guard_main(argv: list[str]) -> int:
    fd, what, cmd = int(argv[0]), argv[1], argv[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the step's terminal is the step's
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up must run to its end
    got = b""
    while True:
        try:
            chunk = os.read(fd, 16)
        except InterruptedError:
            continue
        if not chunk:
            break
        got += chunk
    if got.startswith(b"ok"):
        return 0
    print(
        f"stepkit guard: the step that started {what} ended without stopping it (killed); running: {' '.join(cmd)}",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, timeout=GUARD_CLEANUP_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    print(
        f"stepkit guard: clean-up of {what} ended with status {rc} after {time.monotonic() - t0:.1f} s",
        file=sys.stderr,
        flush=True,
    )
    return rc


if __name__ == "__main__":
    sys.exit(_guard_main(sys.argv[1:]))
