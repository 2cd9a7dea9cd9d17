"""Mirage on four logs under docs/results/protocol.md (issue 22): one command, every number of
docs/results/mirage-clusters.md.

    nice -n 10 .venv/bin/python bench/mirage_eval.py --root var/eval
    .venv/bin/python bench/mirage_eval.py --root var/eval --write-doc docs/results/mirage-clusters.md

Per log (:data:`LOGS`: the protocol's windows, node sizes and processors per node), under
``--root/<log>/``, each a step CLI that skips when its output is up to date:

1. ``ingest`` the log; ``calibrate`` the simulator on the calibration window (scored on the
   scored months by the step itself);
2. per node size: ``sample --probe-spacing end`` over the training window and, separately, over
   the scored months; ``merge`` the training samples; ``train`` each model once on them
   (thresholds calibrated on their split);
3. ``python -m mirage_tasks.evaluation.probe_replay``: the probe replay of every method on each scored month
   (baselines calibrated on the same split), trade-off curves, paired intervals;
4. ``python -m mirage_tasks.calibration.waitpred``: the guarded wait predictor, fitted on the calibration
   window, scored on the scored months.

At most ``--jobs`` logs run at once (2), each log's steps one after the other. It prints the CPU
time of the steps (user + system of the child processes) and the wall time, and writes
``run.json``. ``--smoke`` runs a tiny size (KTH only, a few samples, one month) for the test.
``--write-doc PATH`` writes the Markdown page (and PNG figures beside it) from the outputs; it
runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
#: the shared traces: ``../shared/traces`` beside the checkout (a worktree under /work/wt/ has them two up)
TRACES = next((d for d in (ROOT.parent / "shared" / "traces", ROOT.parent.parent / "shared" / "traces")
               if d.is_dir()), ROOT.parent / "shared" / "traces")
MODELS = ("xgboost", "linear_quantile")
WORKLOAD_DAYS = 5.0


@dataclass(frozen=True)
class Log:
    """One log as the protocol fixes it (UTC dates for samples; calibrate reads dates in the log's zone)."""

    name: str
    file: str
    calibrate: tuple[str, str]        # the simulator's (and the wait predictor's) calibration window
    train_start: str                  # first training sample start (UTC day)
    months: tuple[str, ...]           # scored months (YYYY-MM)
    nodes: tuple[int, ...]
    procs_per_node: int | None = None
    timezone: str | None = None       # ingest --timezone (sacct); SWF: the header's
    start_config: str | None = None
    ingest_args: tuple[str, ...] = field(default=())


LOGS: dict[str, Log] = {
    "KTH-SP2": Log("KTH-SP2", "KTH-SP2-1996-2.1-cln.swf.gz", ("1996-10-08", "1997-01-01"), "1996-10-08",
                   ("1997-01", "1997-02", "1997-03"), (1, 8), procs_per_node=1),
    "CTC-SP2": Log("CTC-SP2", "CTC-SP2-1996-3.1-cln.swf.gz", ("1996-07-03", "1996-10-01"), "1996-07-03",
                   ("1996-10", "1996-11", "1996-12"), (1, 8), procs_per_node=1),
    "ls6": Log("ls6", "ls6-a100.log.gz", ("2022-11-01", "2023-01-01"), "2022-11-01",
               ("2023-01", "2023-02", "2023-03"), (1, 8), timezone="America/Chicago", start_config="ls6"),
    "CEA-Curie": Log("CEA-Curie", "CEA-Curie-2011-2.1-cln.swf.gz", ("2012-02-10", "2012-05-01"), "2012-02-10",
                     ("2012-05", "2012-06", "2012-07"), (8, 64), procs_per_node=16),
}
ORDER = ("KTH-SP2", "CTC-SP2", "ls6", "CEA-Curie")


def utc(day: str) -> pd.Timestamp:
    return pd.Timestamp(f"{day}T00:00:00+00:00") if len(day) == 10 else pd.Timestamp(f"{day}-01T00:00:00+00:00")


def month_end(m: str) -> pd.Timestamp:
    return utc(m) + pd.offsets.MonthBegin(1)


def sample_counts(lg: Log, interval_h: float, months: tuple[str, ...]) -> tuple[int, str, int]:
    """(training count, first scored start, scored count) on the protocol's grid."""
    first = utc(months[0])
    step = pd.Timedelta(hours=interval_h)
    n_train = int((first - pd.Timedelta(days=WORKLOAD_DAYS) - utc(lg.train_start)) / step) + 1
    n_score = int((month_end(months[-1]) - first) / step)
    return n_train, first.isoformat(), n_score


def run(argv: list[str], log: Path, module: str = "mirage_tasks") -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", module, *argv]
    t = time.monotonic()
    with open(log, "a") as fh:
        fh.write("$ " + shlex.join(cmd) + "\n")
        fh.flush()
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT)
    tail = log.read_text().strip().splitlines()[-1:] if log.exists() else []
    print(f"[{time.strftime('%H:%M:%S')}] {module} {argv[0]} {log.name} rc={rc} {time.monotonic() - t:.0f}s :: "
          f"{tail[0][:150] if tail else ''}", flush=True)
    if rc != 0:
        raise SystemExit(f"step failed (rc {rc}): {shlex.join(cmd)}; log {log}")


def chain(lg: Log, root: Path, args: argparse.Namespace) -> None:
    d = root / lg.name
    logs = d / "logs"
    trace = d / "trace"
    ing = ["ingest", "--trace", str(Path(args.traces) / lg.file), "--out", str(trace)]
    if lg.timezone:
        ing += ["--timezone", lg.timezone]
    run(ing, logs / "ingest.log")
    months = tuple(lg.months[: args.months]) if args.months else lg.months
    cal = ["calibrate", "--trace", str(trace), "--calibrate-from", lg.calibrate[0], "--calibrate-to", lg.calibrate[1],
           "--score-from", f"{months[0]}-01", "--score-to", month_end(months[-1]).strftime("%Y-%m-%d"),
           "--trials", str(args.cal_trials), "--timeout-s", str(args.cal_timeout_s), "--seed", "0",
           "--out", str(d / "cal")]
    if lg.procs_per_node:
        cal += ["--procs-per-node", str(lg.procs_per_node)]
    if lg.start_config:
        cal += ["--start-config", lg.start_config]
    run(cal, logs / "calibrate.log")
    cfg = str(d / "cal" / "config.json")
    n_train, score_start, n_score = sample_counts(lg, args.interval_hours, months)
    if args.max_train or args.max_score:
        n_train, n_score = min(n_train, args.max_train or n_train), min(n_score, args.max_score or n_score)
        # the smoke size: the last training samples before the first scored month
        train_start = (utc(months[0]) - pd.Timedelta(days=WORKLOAD_DAYS)
                       - pd.Timedelta(hours=args.interval_hours) * (n_train - 1)).isoformat()
    else:
        train_start = utc(lg.train_start).isoformat()
    nodes = [n for n in lg.nodes if not args.nodes or n in args.nodes]
    for n in nodes:
        common = ["--trace", str(trace), "--cluster-config", cfg, "--interval-hours", str(args.interval_hours),
                  "--probe-spacing", "end", "--node", str(n), "--workers", "1"]
        run(["sample", *common, "--start", train_start, "--count", str(n_train),
             "--out", str(d / "samples-train" / f"node{n}")], logs / f"sample-train-node{n}.log")
        run(["merge", "--in", str(d / "samples-train" / f"node{n}"), "--out", str(d / "datasets" / f"node{n}"),
             "--no-compress"], logs / f"merge-node{n}.log")
        run(["sample", *common, "--start", score_start, "--count", str(n_score),
             "--out", str(d / "samples-score" / f"node{n}")], logs / f"sample-score-node{n}.log")
        for model in args.models:
            run(["train", "--model", model, "--dataset", str(d / "datasets" / f"node{n}"),
                 "--out", str(d / "models" / f"node{n}" / model), "--preset", "quick", "--seed", "0",
                 "--threads", "1"], logs / f"train-node{n}-{model}.log")
    for n in nodes:
        run(["--train-samples", str(d / "samples-train" / f"node{n}"), "--dataset", str(d / "datasets" / f"node{n}"),
             "--score-samples", str(d / "samples-score" / f"node{n}"), "--months", *months,
             "--models", *(str(d / "models" / f"node{n}" / m) for m in args.models),
             "--out", str(d / "eval" / f"node{n}"), "--bootstrap", str(args.bootstrap)],
            logs / f"eval-node{n}.log", module="mirage_tasks.evaluation.probe_replay")
    if args.skip_waitpred:
        return
    wp = ["--trace", str(trace), "--cluster-config", cfg, "--calibrate-from", lg.calibrate[0],
          "--calibrate-to", lg.calibrate[1], "--months", *months, "--out", str(d / "waitpred")]
    run(wp, logs / "waitpred.log", module="mirage_tasks.calibration.waitpred")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="var/eval", help="output folder (var/eval)")
    p.add_argument("--traces", default=str(TRACES), help="folder of the four logs (../shared/traces)")
    p.add_argument("--logs", nargs="+", default=list(ORDER), choices=list(LOGS))
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--interval-hours", type=float, default=6.0, help="sample interval (protocol: 6 h)")
    p.add_argument("--cal-trials", type=int, default=40, help="calibrate --trials (protocol: 40)")
    p.add_argument("--cal-timeout-s", type=float, default=300.0, help="calibrate --timeout-s (protocol: 300)")
    p.add_argument("--bootstrap", type=int, default=2000, help="bootstrap resamples (protocol: 2000)")
    p.add_argument("--months", type=int, default=0, help="score only the first N scored months (0: all)")
    p.add_argument("--max-train", type=int, default=0, help="cap on training samples (0: the protocol's)")
    p.add_argument("--max-score", type=int, default=0, help="cap on scored samples (0: the protocol's)")
    p.add_argument("--jobs", type=int, default=2, help="logs at once (2)")
    p.add_argument("--nodes", nargs="*", type=int, default=None,
                   help="only these of each log's node sizes (e.g. two invocations of one log, one per size, at once)")
    p.add_argument("--skip-waitpred", action="store_true", help="leave the wait predictor out (another invocation runs it)")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny run (KTH, 1 month, 40 training and 12 scored samples, 5 trials, 200 resamples)")
    p.add_argument("--write-doc", metavar="PATH", help="write the Markdown page from the outputs and exit")
    p.add_argument("--protocol-rev", default=None, help="with --write-doc: the protocol's commit (default: git log)")
    args = p.parse_args()
    root = (ROOT / args.root).resolve() if not Path(args.root).is_absolute() else Path(args.root)
    if args.write_doc:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from mirage_eval_doc import write_doc  # bench/mirage_eval_doc.py

        write_doc(root, Path(args.write_doc), args, [LOGS[n] for n in args.logs])
        return 0
    if args.smoke:
        args.logs, args.months, args.max_train, args.max_score = ["KTH-SP2"], 1, 40, 12
        args.cal_trials, args.bootstrap = 5, 200
    t_wall = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        futs = {n: ex.submit(chain, LOGS[n], root, args) for n in args.logs}
        failed = {}
        for n, f in futs.items():
            try:
                f.result()
            except BaseException as exc:  # noqa: BLE001 - one log failing must not hide the others' results
                failed[n] = str(exc)
                print(f"mirage_eval: {n} failed: {exc}", flush=True)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    wall = time.monotonic() - t_wall
    root.mkdir(parents=True, exist_ok=True)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    rec = {"argv": sys.argv, "logs": args.logs, "failed": failed, "cpu_s_children": round(cpu, 1),
           "wall_s": round(wall, 1), "cpus": os.cpu_count(), "loadavg": load,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # every invocation is kept (a rerun only does what is missing: its CPU time is not the whole run's)
    hist = root / "runs.jsonl"
    seen = hist.read_text().splitlines() if hist.exists() else []
    prev = root / "run.json"
    if prev.exists() and json.dumps(json.loads(prev.read_text()), sort_keys=True) not in seen:
        seen.append(json.dumps(json.loads(prev.read_text()), sort_keys=True))
    seen.append(json.dumps(rec, sort_keys=True))
    hist.write_text("\n".join(seen) + "\n")
    prev.write_text(json.dumps(rec, indent=2) + "\n")
    print(f"mirage_eval: CPU {cpu:.0f} s (user+system of the steps run now), wall {wall:.0f} s, "
          f"load {' '.join(load)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
