"""Process-tree helpers for the fault tests: wait for a step's workers, check nothing is left.

Every wait is for a condition with a generous deadline (the machine is often loaded);
none asserts how long anything took.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psutil

DEADLINE_S = 120.0


def wait_for(
    cond: Callable[[], object],
    what: str,
    deadline_s: float = DEADLINE_S,
    poll_s: float = 0.05,
    retry_on: tuple[type[BaseException], ...] = (),
    explain: Callable[[], str] | None = None,
):
    """``cond()``'s first truthy value, polled until ``deadline_s``; fails naming ``what``. The one
    wait of the suite. ``retry_on``: exceptions that mean "not yet" (a browser element React
    replaced meanwhile), tried again like a falsy value; ``explain()``: what to add to the failure
    (the end of a server's log)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            got = cond()
        except retry_on:
            got = None
        if got:
            return got
        if time.monotonic() > end:
            more = f"\n{explain()}" if explain else ""
            raise AssertionError(f"gave up waiting for {what} after {deadline_s:.0f} s{more}")
        time.sleep(poll_s)


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and all its descendants that exist now."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def pool_workers(pid: int, n: int) -> list[psutil.Process] | None:
    """The ``n`` pool workers under step ``pid`` (the forkserver's children), once all exist."""
    for p in tree(pid):
        try:
            if "forkserver" in " ".join(p.cmdline()):
                kids = p.children()
                return kids if len(kids) >= n else None
        except psutil.NoSuchProcess:
            continue
    return None


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (same pid and start time; zombies count as gone)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def all_gone(procs: list[psutil.Process], deadline_s: float = 60.0) -> None:
    """Wait until none of ``procs`` runs; fails listing the survivors (and kills them)."""
    try:
        wait_for(lambda: not alive(procs), "the step's processes to go away", deadline_s)
    except AssertionError:
        left = alive(procs)
        desc = [f"{p.pid} {' '.join(p.cmdline())[:120]}" for p in left]
        for p in left:
            p.kill()
        raise AssertionError(f"processes left running: {desc}") from None
