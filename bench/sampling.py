"""The seed's full training-sample set on ls6: wall and CPU seconds of the ``sample`` step.

Run: ``nice -n 10 .venv/bin/python bench/sampling.py [--smoke] [--json OUT]``.

The seed's configuration (the Makefile's ``LS6_CONF``, ``lab/campaigns/ls6_months.py``): the ls6 log
ingested with America/Chicago local times, 684 samples every 4 h from 2022-11-01, 7
probes, warm-up 2 d, workload 5 d, the ``ls6`` cluster preset; node 1 and node 8, one
``python -m mirage_tasks sample --workers 2`` each (684 x 7 x 2 = 9,576 episodes), one after
the other, as written. Ingest is done first and not counted.

Printed per node size and in total: wall seconds of the step process, and CPU seconds of
the step and every process it started (its forkserver and pool workers: this process
makes itself their child subreaper, so the orphaned workers are reaped here and their
rusage counted), beside the load average before and after. ``--smoke`` samples 6 starts
per node size (seconds; what the test suite runs). ``--keep DIR`` leaves the outputs there
(e.g. to compare two versions' ``shard.npz`` byte for byte).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
LS6 = ROOT.parent / "shared" / "traces" / "ls6-a100.log.gz"
START = "2022-11-01T00:00:00+00:00"
COUNT = 684
SMOKE_COUNT = 6
PR_SET_CHILD_SUBREAPER = 36


def _subreaper() -> bool:
    """Adopt orphaned descendants (Linux), so that their CPU reaches RUSAGE_CHILDREN here."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _reap() -> None:
    """Wait for every adopted descendant (the forkserver and its workers leave on their own
    once the step's pipes close)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _loadavg() -> str:
    try:
        return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def _step(argv: list[str], env: dict) -> None:
    p = subprocess.run([sys.executable, "-m", "mirage_tasks", *argv], cwd=ROOT, env=env, capture_output=True, text=True)
    _reap()
    if p.returncode != 0:
        sys.exit(f"bench: {argv[0]} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", default=str(LS6), help=f"the ls6 log ({LS6})")
    ap.add_argument("--workers", type=int, default=2, help="sample --workers (2, the seed's)")
    ap.add_argument("--smoke", action="store_true", help=f"{SMOKE_COUNT} samples per node size instead of {COUNT}")
    ap.add_argument("--keep", default=None, help="directory to write the outputs to (default: a temporary one)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    args = ap.parse_args(argv)
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(ap, args, {"workers": (1, 256)}, folders=("keep",), files=("json",))
    if not os.path.exists(args.log):
        sys.exit(f"bench: {args.log} not found (../shared/traces beside the repository); pass --log")
    reaping = _subreaper()
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    tmp = tempfile.mkdtemp(prefix="bench-sampling-")
    root = pathlib.Path(args.keep) if args.keep else pathlib.Path(tmp)
    count = SMOKE_COUNT if args.smoke else COUNT
    try:
        trace = str(root / "ls6")
        _step(
            ["ingest", "--trace", args.log, "--timezone", "America/Chicago", "--out", trace, "--log-level", "WARNING"],
            env,
        )
        summary: dict = {
            "count": count,
            "probes": 7,
            "workers": args.workers,
            "load_before": _loadavg(),
            "cpu_counts_workers": reaping,
        }
        total_wall = total_cpu = 0.0
        for node in (1, 8):
            out = root / f"node{node}"
            if out.exists():
                shutil.rmtree(out)  # a rerun measures, never skips
            c0, t0 = _cpu_children(), time.perf_counter()
            _step(
                [
                    "sample",
                    "--trace",
                    trace,
                    "--start",
                    START,
                    "--count",
                    str(count),
                    "--interval-hours",
                    "4",
                    "--warmup-days",
                    "2",
                    "--workload-days",
                    "5",
                    "--probes",
                    "7",
                    "--node",
                    str(node),
                    "--cluster-config",
                    "ls6",
                    "--workers",
                    str(args.workers),
                    "--out",
                    str(out),
                    "--log-level",
                    "WARNING",
                ],
                env,
            )
            wall, cpu = time.perf_counter() - t0, _cpu_children() - c0
            info = json.loads((out / "shard.json").read_text())
            summary[f"node{node}"] = {
                "wall_s": round(wall, 2),
                "cpu_s": round(cpu, 2),
                "step_sampling_wall_s": info["wall_s"],
                "step_sampling_cpu_s": info["cpu_s"],
                "examples": info["n_examples"],
            }
            total_wall += wall
            total_cpu += cpu
        summary.update(total_wall_s=round(total_wall, 2), total_cpu_s=round(total_cpu, 2), load_after=_loadavg())
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    for node in (1, 8):
        s = summary[f"node{node}"]
        print(
            f"node {node}: {count} samples, {s['examples']} examples: {s['wall_s']:.1f} s wall, "
            f"{s['cpu_s']:.1f} CPU s (in the samples: {s['step_sampling_wall_s']:.1f} s wall, "
            f"{s['step_sampling_cpu_s']:.1f} CPU s)"
        )
    print(
        f"both node sizes: {summary['total_wall_s']:.1f} s wall, {summary['total_cpu_s']:.1f} CPU s "
        f"({args.workers} workers; load average {summary['load_before']} before, {summary['load_after']} after"
        + ("" if reaping else "; CPU without the pool workers: no subreaper here")
        + ")"
    )
    print(json.dumps(summary))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
