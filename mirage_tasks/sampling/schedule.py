"""The sample schedule ``sample`` and ``validate`` share: starts, shards, guards, workers.

Sample ``k`` (``0 <= k < --count``) starts at ``--start + k * --interval-hours``; shard
``I/S`` takes the samples with ``k % S == I``. Both steps declare these flags through
:func:`add_schedule_arguments`, check them with :func:`check_schedule`, and run their
samples in a worker pool (:func:`stepkit.pool.run_pool`, processes from :func:`pool_context`) sized by :func:`cpu_count`, the one
CPU count of every Mirage step (the CPUs this process may run on: a pod's CPU set, not
the whole machine's); `train` sizes its thread pools with it too.

Importing this module is cheap (stdlib and stepkit only).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os

from stepkit import StepError

from ..data.keys import grid
from ..data.times import hours_to_s


def add_schedule_arguments(p: argparse.ArgumentParser, days: bool = False) -> None:
    """The schedule flags; ``days=True`` (``sample``) makes ``--count`` optional, for the
    day-partition mode where ``--day`` picks the samples and ``--start`` only anchors the grid."""
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument(
        "--start",
        required=True,
        help="first sample start (ISO; UTC if no offset); with --day: any point of the sample grid",
    )
    p.add_argument(
        "--count",
        type=int,
        required=not days,
        default=None,
        help="number of samples (all shards together)" + ("; not with --day" if days else ""),
    )
    p.add_argument("--interval-hours", type=float, default=4.0, help="hours between sample starts (4)")
    p.add_argument("--warmup-days", type=float, default=2.0, help="predecessor submitted this long after the start (2)")
    p.add_argument(
        "--workload-days", type=float, default=5.0, help="trace jobs submitted within this span are replayed (5)"
    )
    p.add_argument("--node", type=int, required=True, help="nodes of the predecessor and successor jobs")
    p.add_argument("--shard", default="0/1", help="I/S: this run computes samples k with k %% S == I (0/1)")
    p.add_argument("--workers", type=int, default=1, help="processes (0 = one per CPU this process may use)")


def parse_shard(text: str) -> tuple[int, int]:
    try:
        i, s = (int(x) for x in text.split("/"))
    except ValueError as exc:
        raise StepError(f"--shard must look like I/S, got {text!r}") from exc
    if s < 1 or not 0 <= i < s:
        raise StepError(f"--shard {text}: need 0 <= I < S")
    return i, s


def check_schedule(args: argparse.Namespace) -> tuple[int, int]:
    """The flags of :func:`add_schedule_arguments` checked; returns the shard ``(I, S)``."""
    shard = parse_shard(args.shard)
    if (args.count is not None and args.count < 1) or args.node < 1:
        raise StepError("--count and --node must be >= 1")
    if args.interval_hours <= 0 or args.warmup_days < 0 or args.workload_days <= args.warmup_days:
        raise StepError("need --interval-hours > 0 and --workload-days > --warmup-days >= 0")
    if args.workers < 0:
        raise StepError("--workers must be >= 0 (0 = one per CPU)")
    return shard


def sample_tasks(t_first: int, count: int, interval_hours: float, shard: tuple[int, int]) -> list[tuple[int, int]]:
    """``[(k, start epoch)]`` of the samples of ``shard``, in order of ``k``."""
    step_s = hours_to_s(interval_hours)
    i, s = shard
    return [(k, t_first + k * step_s) for k in range(i, count, s)]


def cpu_count() -> int:
    """CPUs this process may use (its affinity set: a pod's or a ``taskset``'s CPUs)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # platforms without sched_getaffinity
        return os.cpu_count() or 1


def resolve_workers(workers: int) -> int:
    """``--workers``: 0 means one per CPU of :func:`cpu_count`."""
    return cpu_count() if workers == 0 else max(1, workers)


DAY_S = 86400


def grid_phase(anchor: int, interval_hours: float) -> tuple[int, int]:
    """``(interval seconds, phase)`` of the sample grid through ``anchor`` (epoch seconds):
    sample starts are the times ``t`` with ``t % interval == phase``."""
    try:  # the grid the plan keys sample families by
        return grid(anchor, interval_hours)
    except ValueError as exc:
        raise StepError(str(exc)) from exc


def day_tasks(day_start: int, interval_hours: float, anchor: int) -> list[tuple[int, int]]:
    """``[(k, start epoch)]`` of the grid samples whose start falls on the UTC day that begins
    at ``day_start``; ``k`` counts grid points from the epoch, so it is the same in every run."""
    step_s, phase = grid_phase(anchor, interval_hours)
    first = day_start + (phase - day_start) % step_s
    return [((t - phase) // step_s, t) for t in range(first, day_start + DAY_S, step_s)]


def set_threads(cpus: int | None = None) -> int:
    """Thread pools of this process sized to the CPUs it is granted (:func:`cpu_count`):
    ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (inherited by worker processes, read by OpenMP
    when it starts) unless the caller set them, and torch's pool if torch is loaded."""
    import sys

    n = max(1, cpus or cpu_count())
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(n))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    return n


def pool_context() -> mp.context.BaseContext:
    """Worker processes started from a clean server process, never forked from this one: a
    fork after torch or OpenMP threads exist (a caller that already ran a model, a test
    session) can deadlock the child. The pool itself is :func:`stepkit.pool.run_pool`, which
    fails fast when a worker dies."""
    from stepkit.pool import default_context

    return default_context()
