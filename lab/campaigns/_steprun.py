"""A helper of the bench scripts, not a command: a step's command line run from
``lab/campaigns/mirage_eval.py`` or ``lab/campaigns/ls6_months.py``, its output appended to a log file, one
progress line printed, and a failure ending the bench with the command and the log named."""

from __future__ import annotations

import shlex
import subprocess
import threading
import time
from contextlib import nullcontext
from pathlib import Path


def run_logged(cmd: list[str], log: Path, cwd: Path, label: str, slots: threading.Semaphore | None = None) -> float:
    """Run ``cmd`` (inside ``slots`` when given: at most that many at once), its output into
    ``log``; returns its wall seconds, or exits naming the command and the log when it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with slots or nullcontext():
        t = time.monotonic()
        with open(log, "a") as fh:
            fh.write("$ " + shlex.join(cmd) + "\n")
            fh.flush()
            rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
        took = time.monotonic() - t
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    print(f"[{time.strftime('%H:%M:%S')}] {label} rc={rc} {took:.0f}s :: {tail[0][:150] if tail else ''}", flush=True)
    if rc != 0:
        raise SystemExit(f"step failed (rc {rc}): {shlex.join(cmd)}; log {log}")
    return took
