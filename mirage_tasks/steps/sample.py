"""``python -m mirage_tasks sample``: offline Mirage training examples, one shard per run.

Sample ``k`` (``0 <= k < --count``) starts at ``--start + k * --interval-hours``; shard
``I/S`` takes the samples with ``k % S == I`` (:mod:`mirage_tasks.sampling.schedule`). Each sample is
simulated once up to the predecessor's submission, then forked per probe
(:mod:`mirage_tasks.sampling.sample`): ``--baseline default`` gives ``--probes`` examples per
sample, ``reactive``/``avg`` one.

**Probe spacing** (``--probe-spacing``, default mode only): ``uniform`` (the default, the
reference's) places ``--probes`` decisions equally spaced from the predecessor's submission
to its end, 8 h apart with 7; ``end`` places them at the predecessor's pre-simulated end minus
24 h, 16 h, 8 h, 4 h, 2 h, 1 h, 30 min and 10 min and at its end
(:data:`mirage_tasks.sim.probes.END_OFFSETS_MIN`), where a submission decides between a short
overlap and a gap. A non-default spacing is part of the output's parameters (so of its skip
check, of ``merge``'s check that shards agree, and of the plan's sample-family key); the
uniform spacing is left out of them, so outputs written before the option stay valid. The
default stays ``uniform``: on the three-month ls6 evaluation (``docs/results/ls6-months.md``)
``end`` left the verdict against ``avg`` unchanged (node 1: 0 of 3 months, node 8: 1 of 3)
and lowered the calibration objective in 3 of the 6 month x node cells, raised it in 3.

Outputs under ``--out``:

* ``shard.npz``: ``X`` float32 [n, window, F] (features at the decision moment,
  :mod:`mirage_tasks.sim.features`), ``y`` float32 [n] signed interruption in hours,
  ``sample`` int64 (global index k), ``sample_start``, ``probe_time`` int64 epoch seconds,
  ``node`` int64; rows ordered by sample, then probe time;
* ``probes.parquet``: one row per example with the probe metadata (sample start, probe
  time, predecessor submit/start/end, successor submit/start, interruption, backfilled,
  queue length and average wait at the decision and at the predecessor's start, ...);
* ``shard.json``: parameters, configuration, counts and timing; then ``_SUCCESS.json``.

**The wait predictor at each decision** (``--waitpred URI``, a committed ``waitpred`` output of the
same log): ``probes.parquet`` gains the predictor's answer for the successor submitted at that
probe, from the simulator's queue at that instant (:mod:`mirage_tasks.calibration.atprobe`): its
wait ``wp_wait_s``, its bound ``wp_bound_s`` and Slurm's own plan ``wp_plan_request_s``. The
waitpred output is an input of the sample (its fingerprint is in the parameters) only when given.

**Day partitions** (``--day D``, repeatable; ``--count`` and ``--shard`` not used): the
samples are the points of the grid through ``--start`` (every ``--interval-hours``) whose
start falls on UTC day ``D``; each day is written, committed and skipped on its own under
``<--out>/day=YYYY-MM-DD/`` (the same three files and marker), with ``sample`` counting grid
points from the epoch, so a partition is the same whichever run computed it. ``--out`` is
then the sample family's root (``mirage_tasks.data.keys.sample_family``, which the plan calls: one per trace source,
simulator configuration, sampling parameters, node size and mode), and ``merge --start
--count`` joins the days of a window. A partition records the digest of the trace rows its
samples can see (submitted before the day's end plus the workload,
``mirage_tasks.data.prefixes``) instead of the whole trace's, so when the trace grows
(a cluster's next daily export) only the days whose samples see new jobs are recomputed.

**Days the trace covers.** No sample may start after the UTC day of the trace's last submit
(:func:`check_span`): such a ``--day`` (or, with ``--count``, a window's sample) is an exit 2
naming the days and the span, before anything is simulated or written (those days are not in
the export yet: their samples would be simulated without their jobs and committed as if
complete). The newest day of a growing trace is allowed; samples whose workload reaches past
the last submit are kept with a warning. Days before the first submit are sampled with a
warning naming them: a long training window (684 samples at 4 h reach 114 days back) may
start before a log does, and those samples replay the cluster as the log knows it, from empty.
"""

from __future__ import annotations

import argparse
import logging
import time
from datetime import UTC

from stepkit import Step, StepError

from .. import __version__
from ..data import keys
from ..data.artifacts import PROBES_FILE, SHARD_FILE, SHARD_INFO_FILE
from ..sampling.schedule import (
    DAY_S,
    add_schedule_arguments,
    check_schedule,
    day_tasks,
    grid_phase,
    resolve_workers,
    sample_tasks,
    set_threads,
)
from ..sim.config import add_config_arguments
from ..sim.probes import BASELINES, PROBE_SPACINGS

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_schedule_arguments(p, days=True)
    p.add_argument(
        "--day",
        dest="days",
        action="append",
        default=None,
        help="UTC day YYYY-MM-DD (repeatable): write that day's partition <out>/day=YYYY-MM-DD",
    )
    p.add_argument(
        "--probes",
        type=int,
        default=7,
        help="decision times per sample in default mode with --probe-spacing uniform (7)",
    )
    p.add_argument(
        "--probe-spacing",
        default=keys.DEFAULT_SPACING,
        choices=PROBE_SPACINGS,
        help="default mode's probe times: uniform (the reference's: --probes equally spaced from the "
        "predecessor's submission to its end) or end (its end minus 24, 16, 8, 4, 2, 1 h, 30 and "
        f"10 min, and its end; --probes not used) ({keys.DEFAULT_SPACING})",
    )
    p.add_argument(
        "--baseline",
        default="default",
        choices=("default", *BASELINES),
        help="default (training probes), reactive or avg",
    )
    p.add_argument("--window", type=int, default=144, help="snapshots per history (144)")
    p.add_argument("--step-s", type=int, default=600, help="seconds between snapshots (600)")
    p.add_argument(
        "--waitpred",
        default=None,
        metavar="URI",
        help="a committed waitpred output: ask its predictor at every decision time, on the simulator's "
        "queue then, for the successor's wait and bound (probes.parquet columns wp_wait_s, "
        "wp_bound_s, wp_plan_request_s; protocol v2's wait-pred and guarantee rules)",
    )
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


def _utc_day(epoch: int) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(epoch, UTC).date().isoformat()


def _parse_days(days: list[str]) -> list[tuple[str, int]]:
    from datetime import date, datetime

    out = []
    for d in days:
        try:
            day = date.fromisoformat(d)
        except ValueError as exc:
            raise StepError(f"--day {d!r}: expected YYYY-MM-DD") from exc
        out.append((day.isoformat(), int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp())))
    if len({d for d, _ in out}) != len(out):
        raise StepError("--day: a day is given twice")
    return sorted(out)


def _listed(days: list[str], n: int = 6) -> str:
    if len(days) <= n:
        return ", ".join(days)
    return f"{', '.join(days[:n])} and {len(days) - n} more (to {days[-1]})"


def check_span(trace: str, df, days: list[str]) -> None:
    """Refuse sample days after the trace's newest UTC day (exit 2 naming the days and the
    span); warn, naming them, about days before its first.

    A sample on a day the trace does not reach yet would be simulated on a cluster missing
    that day's jobs and look like any other example (a growing trace's next export would have
    them). The newest day stays allowed as long as the trace holds a job submitted on it;
    samples whose workload reaches past the last submit are kept with a warning
    (:func:`_compute`). Days before the first submit replay the log's cluster from empty, as a
    training window that starts before a log always has: said, not refused."""
    from ..data.times import iso

    if df.empty:
        raise StepError(f"{trace}: the trace holds no jobs")
    first, last = df["submit"].min(), df["submit"].max()
    lo, hi = first.date().isoformat(), last.date().isoformat()
    before = sorted({d for d in days if d < lo})
    if before:
        log.warning(
            "%s: sample day(s) %s come before the trace's first submit (%s): their samples replay the "
            "cluster from empty, with only the jobs the log holds",
            trace,
            _listed(before),
            lo,
        )
    outside = sorted({d for d in days if d > hi})
    if outside:
        raise StepError(
            f"{trace}: sample day(s) {_listed(outside)} lie outside the trace's span {lo} .. {hi} (submits "
            f"{iso(first.to_pydatetime())} .. {iso(last.to_pydatetime())}): their samples would be simulated "
            f"without the jobs of those days; sample days the trace covers, or ingest a trace that covers them"
        )


def run(args: argparse.Namespace) -> int:
    from ..data.artifacts import require_input
    from ..data.prefixes import load_prefixes, prefix_before
    from ..data.schema import parse_time, read_trace
    from ..sim.config import config_from_args
    from ..sim.episode import EpisodeSpec
    from ..sim.features import FEATURE_NAMES

    shard_i, shard_n = check_schedule(args)
    if args.days and (args.count is not None or args.shard != "0/1"):
        raise StepError("--day picks the samples itself: leave out --count and --shard")
    if not args.days and args.count is None:
        raise StepError("give --count (a window of samples) or --day (day partitions)")
    days = _parse_days(args.days) if args.days else []
    require_input(args.trace, "--trace")
    if args.probes < 1 or args.window < 1 or args.step_s < 1:
        raise StepError("--probes, --window and --step-s must be >= 1")
    start = parse_time(args.start, "--start")
    df, meta = read_trace(args.trace)
    if days:
        check_span(args.trace, df, [d for d, _ in days])
    else:
        window = sample_tasks(int(start.timestamp()), max(0, args.count), args.interval_hours, (0, 1))
        check_span(args.trace, df, sorted({_utc_day(t) for _, t in window}))
    cfg = config_from_args(args, meta.machine_nodes)
    if args.node > cfg.nodes:
        raise StepError(f"--node {args.node} exceeds the {cfg.nodes}-node cluster")
    big = (df["nodes"] > cfg.nodes).fillna(False).astype(bool)  # processors-only rows (NA nodes) are not counted
    if big.any():  # the simulator cannot place them: never dropped without a word
        log.warning(
            "%s: %d job(s) ask for more nodes than the %d-node cluster (up to %d): the simulator leaves them "
            "out of every sample; raise --nodes (or the config's nodes) to keep them",
            args.trace,
            int(big.sum()),
            cfg.nodes,
            int(df.loc[big, "nodes"].max()),
        )
    spec = EpisodeSpec(args.warmup_days, args.workload_days, args.window, args.step_s)
    common = {
        "interval_hours": args.interval_hours,
        "warmup_days": args.warmup_days,
        "workload_days": args.workload_days,
        "probes": args.probes,
        "node": args.node,
        "baseline": args.baseline,
        "window": args.window,
        "step_s": args.step_s,
        "config": cfg.to_dict(),
        "feature_names": FEATURE_NAMES,
        **keys.spacing_params(args.baseline, args.probe_spacing),
    }
    at_probe = None
    if args.waitpred:  # a new input only when given: outputs written without it keep their keys
        from stepkit.step import input_fingerprint

        from ..calibration.atprobe import WaitAtProbe
        from ..sim.workload import Workload

        wl = Workload.from_frame(df, cfg.procs_per_node or None)
        at_probe = WaitAtProbe.load(args.waitpred, wl, meta.timezone or "UTC")
        common["waitpred"] = input_fingerprint(args.waitpred)
    set_threads(1)  # the simulator is single-threaded; its parallelism is --workers processes
    workers = resolve_workers(args.workers)
    wl = None if at_probe is None else wl
    if not days:
        params = {"start": start.isoformat(), "count": args.count, **common, "shard": [shard_i, shard_n]}
        step = Step("sample", args.out, __version__, params, inputs=[args.trace])
        if step.skip():
            return 0
        tasks = sample_tasks(int(start.timestamp()), args.count, args.interval_hours, (shard_i, shard_n))
        _compute(step, params, tasks, df, cfg, spec, args, workers, wl, at_probe)
        return 0
    anchor = int(start.timestamp())
    step_s, phase = grid_phase(anchor, args.interval_hours)
    prefixes = load_prefixes(args.trace, df)
    done = computed = 0
    for day, day_start in days:
        # A day depends on the jobs its samples can see, not on the whole trace: a trace that
        # grew by later jobs leaves the partition valid (mirage_tasks.data.schema.prefix_before).
        params = {
            "day": day,
            "grid": {"interval_s": step_s, "phase_s": phase},
            "trace_prefix": prefix_before(prefixes, day, args.workload_days),
            **common,
        }
        step = Step("sample", keys.partition(args.out, day), __version__, params)
        if step.skip():
            done += 1
            continue
        wl = _compute(
            step, params, day_tasks(day_start, args.interval_hours, anchor), df, cfg, spec, args, workers, wl, at_probe
        )
        computed += 1
    print(
        f"sample: {len(days)} day partition(s) under {args.out}: {computed} computed, {done} already complete",
        flush=True,
    )
    return 0


def _compute(
    step: Step, params: dict, tasks: list[tuple[int, int]], df, cfg, spec, args, workers: int, wl=None, at_probe=None
):
    """Simulate ``tasks`` and commit them as one output (a shard or a day partition)."""
    from ..data.artifacts import npz_bytes, parquet_bytes
    from ..data.times import iso
    from ..sampling.sample import assemble, run_samples
    from ..sim.workload import Workload

    if wl is None:
        wl = Workload.from_frame(df, cfg.procs_per_node or None)
    if len(wl) == 0:
        raise StepError(f"{args.trace}: no usable jobs")
    last_needed = tasks[-1][1] + int(args.workload_days * DAY_S) if tasks else 0
    if tasks and (tasks[0][1] < wl.submit[0] or last_needed > wl.submit[-1]):
        log.warning(
            "sample: samples reach outside the trace's submits (%s .. %s): their workload is truncated",
            iso(wl.submit[0]),
            iso(wl.submit[-1]),
        )
    t = time.perf_counter()
    cpu: list[float] = []
    part = f"day {params['day']}" if "day" in params else "shard {}/{}".format(*params["shard"])
    results = run_samples(
        wl,
        cfg,
        spec,
        args.node,
        args.probes,
        args.baseline,
        tasks,
        workers,
        cpu=cpu,
        spacing=args.probe_spacing,
        part=part,
        at_probe=at_probe,
    )
    wall = time.perf_counter() - t
    cpu_s = sum(cpu)
    arrays, probes = assemble(results, args.window)
    step.write_bytes(SHARD_FILE, npz_bytes(arrays))
    step.write_bytes(PROBES_FILE, parquet_bytes(probes))
    info = {
        "params": params,
        "trace_fingerprint": wl.fingerprint,
        "n_samples": len(tasks),
        "n_examples": int(len(probes)),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu_s, 3),
        "workers": workers,
        "sample_start_min": int(arrays["sample_start"].min()) if len(probes) else None,
        "sample_start_max": int(arrays["sample_start"].max()) if len(probes) else None,
        "history_full": int(probes["history_full"].sum()) if len(probes) else 0,
    }
    step.write_json(SHARD_INFO_FILE, info)
    y = arrays["y"]
    summary = {
        "n_samples": len(tasks),
        "n_examples": int(len(y)),
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu_s, 3),
        "y_mean_h": float(y.mean()) if len(y) else None,
    }
    step.commit(summary=summary)
    print(
        f"sample: {len(tasks)} samples, {len(y)} examples in {wall:.1f} s, {cpu_s:.1f} CPU s "
        f"({wall / max(1, len(y)) * 1000:.1f} ms per example, {workers} worker(s)) -> {step.out}",
        flush=True,
    )
    return wl
