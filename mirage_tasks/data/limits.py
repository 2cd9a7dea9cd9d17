"""A time limit known at submission for the jobs whose log records none.

A job without a requested time (SWF requested time ``-1``, a Slurm ``UNLIMITED`` or
``Partition_Limit``) gets, in this order:

1. ``partition_max``: its partition's (queue's) maximum, where the log description declares one
   (``ingest --partition-max-limit NAME=SECONDS``; ``*`` names every partition);
2. ``user_history``: the largest requested time or run time among its user's jobs that had
   *finished* (left the system: ended, or cancelled before starting) at or before its submission,
   i.e. what the site knew of that user then; a job's own run time, or any later outcome, is never
   read;
3. ``log_default``: the log's default, as declared (``ingest --default-limit-s``), else
   :data:`DEFAULT_LIMIT_S` (one day).

How many jobs got each kind is recorded (the ingest report and the trace's metadata, and the
wait predictor's report). A job that later ran past its filled limit is replayed to that limit,
as every job past its limit is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepkit import StepError

#: the log's default time limit when its description declares none (seconds): one day
DEFAULT_LIMIT_S = 86_400
#: the kinds of fill, in the order they are tried
KINDS = ("partition_max", "user_history", "log_default")


def parse_partition_max(items: list[str] | None, flag: str = "--partition-max-limit") -> dict[str, int]:
    """``NAME=SECONDS`` items -> ``{name: seconds}``; a bad item is a :class:`StepError` naming ``flag``."""
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        try:
            seconds = int(value)
        except ValueError:
            seconds = 0
        if not sep or not name.strip() or seconds <= 0:
            raise StepError(f"{flag} {item!r}: expected NAME=SECONDS with SECONDS a positive integer")
        out[name.strip()] = seconds
    return out


def fill_limits(
    submit: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    limit: np.ndarray,
    user: np.ndarray,
    partition: np.ndarray | None = None,
    partition_max: dict[str, int] | None = None,
    default_s: int | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(limits, kind per job, summary). ``submit``/``start``/``end``: epoch seconds, ``-1`` unknown;
    ``limit``: seconds, NaN or ``<= 0`` unknown; ``user``: ids, ``""``/``None`` unknown (no history);
    ``partition``: names (``None`` unknown). ``kind`` is ``""`` for a job whose limit was recorded.
    The summary counts each kind and names the default used and whether it was declared."""
    submit = np.asarray(submit, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    lim = np.asarray(limit, dtype=np.float64).copy()
    n = len(lim)
    missing = np.isnan(lim) | (lim <= 0)
    kind = np.full(n, "", dtype=object)
    default = int(default_s) if default_s else DEFAULT_LIMIT_S
    summary: dict[str, Any] = {
        "jobs_without_limit": int(missing.sum()),
        **{k: 0 for k in KINDS},
        "log_default_s": default,
        "log_default_declared": bool(default_s),
        "partition_max_s": dict(partition_max or {}),
    }
    if not missing.any():
        return lim, kind, summary
    lim[missing] = np.nan
    todo = missing.copy()
    # 1. the partition's declared maximum
    if partition_max and partition is not None:
        parts = np.asarray(partition, dtype=object)
        for j in np.flatnonzero(todo):
            p = parts[j]
            v = partition_max.get(str(p)) if p is not None and p == p else None
            v = v if v is not None else partition_max.get("*")
            if v is not None:
                lim[j], kind[j], todo[j] = v, "partition_max", False
    # 2. the user's finished jobs: the largest requested time or run time, left at or before the submission
    users = np.asarray(user, dtype=object)
    ran = (start >= 0) & (end >= start)
    seen = np.where(ran, (end - start).astype(np.float64), np.nan)
    known = np.fmax(np.where(missing, np.nan, lim), seen)  # a filled limit is never history
    left = (end >= 0) & ~np.isnan(known)
    for u in {users[j] for j in np.flatnonzero(todo)}:
        if u is None or u != u or u == "":
            continue
        mine = np.flatnonzero(left & (users == u))
        if not len(mine):
            continue
        order = mine[np.argsort(end[mine], kind="stable")]
        run_max = np.maximum.accumulate(known[order])
        for j in np.flatnonzero(todo & (users == u)):
            k = int(np.searchsorted(end[order], submit[j], side="right"))
            if k:
                lim[j], kind[j], todo[j] = run_max[k - 1], "user_history", False
    # 3. the log's default
    lim[todo] = default
    kind[todo] = "log_default"
    for k in KINDS:
        summary[k] = int((kind == k).sum())
    return np.maximum(np.ceil(lim), 1.0), kind, summary
