"""A helper of the bench scripts, not a command: a step's command line run from
``lab/campaigns/mirage_eval.py`` or ``lab/campaigns/ls6_months.py``, its output appended to a log file, one
progress line printed, and a failure ending the bench with the command and the log named."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from stepkit.pool import Terminated
from stepkit.procs import ChildGroups

#: every step this bench process runs, each in its own process group: on SIGTERM the bench
#: stops exactly these (``CHILDREN.stop()``) and nothing it did not start
CHILDREN = ChildGroups()


def run_logged(cmd: list[str], log: Path, cwd: Path, label: str, slots: threading.Semaphore | None = None) -> float:
    """Run ``cmd`` (inside ``slots`` when given: at most that many at once), its output into
    ``log``; returns its wall seconds, or exits naming the command and the log when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with slots or nullcontext():
        t = time.monotonic()
        with open(log, "a") as fh:
            fh.write("$ " + shlex.join(cmd) + "\n")
            fh.flush()
            rc = CHILDREN.run(cmd, label, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
        took = time.monotonic() - t
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    print(f"[{time.strftime('%H:%M:%S')}] {label} rc={rc} {took:.0f}s :: {tail[0][:150] if tail else ''}", flush=True)
    if rc != 0:
        raise SystemExit(f"step failed (rc {rc}): {shlex.join(cmd)}; log {log}")
    return took


def stoppable(main: Callable[[], int], prog: str) -> int:
    """``main()``, stopped by SIGTERM or SIGINT the way a step is: the first one stops every step
    this process started (:data:`CHILDREN`, in a thread, while ``main``'s threads unwind), and the
    bench exits 143 (130 for SIGINT) saying what it stopped. The steps run in process groups of
    their own, out of reach of a terminal's Ctrl-C, so SIGINT is handled here too."""
    stopping: list[tuple[threading.Thread, int]] = []
    stopped: list[str] = []

    def on_signal(signum, frame):
        if stopping:
            print(
                f"{prog}: {signal.Signals(signum).name} again: still stopping the steps it started",
                file=sys.stderr,
                flush=True,
            )
            return
        CHILDREN.stopping = True  # at once: the runner threads start nothing more from here
        t = threading.Thread(target=lambda: stopped.extend(CHILDREN.stop()), name="stop-steps", daemon=True)
        stopping.append((t, signum))
        t.start()
        raise Terminated(f"terminated by {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return main()
    except Terminated as exc:
        if not stopping:  # raised by a runner thread without a signal: nothing of ours is stopping
            raise
        t, signum = stopping[0]
        t.join()
        what = "; ".join(stopped) if stopped else "none was running"
        print(
            f"{prog}: {exc}; stopped {len(stopped)} running step(s) it had started: {what}", file=sys.stderr, flush=True
        )
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
