"""Mirage on any log under docs/results/protocol.md: one command per log, every
number of docs/results/mirage-clusters.md and docs/results/waitpred.md.

    nice -n 10 .venv/bin/python -m lab.campaigns.mirage_eval --root var/eval                 # the four shipped logs
    .venv/bin/python -m lab.campaigns.mirage_eval --log-file mysite.json --waitpred-only       # your own log
    .venv/bin/python -m lab.campaigns.mirage_eval --name mysite --trace sacct.log --timezone Europe/Berlin \
        --calibrate 2024-01-01 2024-03-01 --months 2024-03 2024-04 --waitpred-only      # the same as flags
    .venv/bin/python -m lab.campaigns.mirage_eval --root var/eval --write-doc docs/results/mirage-clusters.md
    .venv/bin/python -m lab.campaigns.mirage_eval --root var/eval --waitpred-only --write-doc docs/results/waitpred.md

A log is a description (:class:`mirage_tasks.run.evalplan.LogSpec`: trace, time zone, processors
per node, machine size, calibration period, scored months, node sizes), from a JSON/YAML file
(``--log-file``), from the flags, or one of the shipped ones (``lab/campaigns/logs/<name>.json``,
``--logs``). Every command line comes from :mod:`mirage_tasks.run.evalplan` (the
``mirage_evaluation`` DAG uses the same functions). Per log, under ``--root/<log>/``, each a step
CLI that skips when its output is up to date:

1. ``ingest`` the log; ``calibrate`` the simulator on the calibration period (the step scores its
   replay fidelity on the scored months); ``waitpred``: the wait predictor at submission time,
   fitted on the calibration period, scored on the scored months;
2. unless ``--waitpred-only``, per node size: ``sample --probe-spacing end`` over the training
   window and over the scored months; ``merge``; ``train`` each model; then the probe replay
   (``python -m lab.evaluation.probe_replay``).

At most ``--jobs`` logs run at once (2), each log's steps one after the other. It prints the CPU
time of the steps (user + system of the child processes), the wall time and how many logs
failed (exit 1 when any did), and writes ``run.json``. Two logs of one name are refused before
anything runs (exit 2, naming both descriptions): a log's outputs live under its name, and a
rerun of other inputs under an existing name is refused by the steps themselves
(``--on-change refuse``, :mod:`stepkit.step`). SIGTERM or SIGINT stops exactly the steps it
started (each runs in a process group of its own; SIGKILL for what is left after 20 s) and the
driver exits 143 (130) naming them. ``--smoke`` runs a tiny size (KTH only, a few samples, one
month; under v2 the online rules that ask the predictor every 10 minutes on node size 8 alone) for
the test.
``--write-doc PATH`` writes the Markdown page (and PNG figures beside it) from the outputs; it
runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab.campaigns._steprun import CHILDREN, run_logged, stoppable
from lab.evaluation import protocol_argvs
from mirage_tasks.run import evalplan
from mirage_tasks.run.evalplan import Budget, LogSpec, SpecError

ROOT = Path(__file__).resolve().parents[2]  # the repository (lab/campaigns/ is two below)
#: the shared traces: ``../shared/traces`` beside the checkout (a worktree under /work/wt/ has them two up)
TRACES = next(
    (d for d in (ROOT.parent / "shared" / "traces", ROOT.parent.parent / "shared" / "traces") if d.is_dir()),
    ROOT.parent / "shared" / "traces",
)
BOOTSTRAP_V2 = 10_000  # protocol v2's resamples
SHIPPED_DIR = Path(__file__).resolve().parent / "logs"
ORDER = ("KTH-SP2", "CTC-SP2", "ls6", "CEA-Curie")
#: protocol v2's fresh months per shipped log (docs/results/protocol-v2.md, committed before any v2 result)
FRESH = {
    "KTH-SP2": ("1997-04", "1997-05", "1997-06"),
    "CTC-SP2": ("1997-01", "1997-02", "1997-03"),
    "CEA-Curie": ("2012-08", "2012-09"),
}
#: logs whose fresh months the online decider also runs protocol v2's rules on (the protocol names
#: KTH-SP2, the cheapest log: the predictor asked every 10 minutes costs minutes per rule there)
ONLINE_RULE_LOGS = ("KTH-SP2",)


def shipped(traces: str) -> dict[str, LogSpec]:
    """The shipped log descriptions (``lab/campaigns/logs/*.json``), traces read from ``traces``."""
    specs = {p.stem: evalplan.load(str(p), traces=traces) for p in sorted(SHIPPED_DIR.glob("*.json"))}
    return {n: specs[n] for n in sorted(specs, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))}


def run(argv: list[str], log: Path) -> None:
    run_logged([sys.executable, *evalplan.command(argv)], log, ROOT, f"{log.parent.parent.name}: {log.stem}")


def chain(spec: LogSpec, root: Path, args: argparse.Namespace, budget: Budget) -> None:
    logs = root / spec.name / "logs"
    for name, argv in evalplan.waitpred_argvs(spec, str(root), budget):
        if name == "waitpred" and args.skip_waitpred:
            continue
        run(argv, logs / f"{name}.log")  # a calibration past its opt-in wall limit fails: nothing downstream runs
    if args.waitpred_only:
        return
    v2 = args.protocol == "v2"
    for name, argv in protocol_argvs.decision_argvs(
        spec,
        str(root),
        budget,
        tuple(args.nodes or ()),
        waitpred=v2,
        fresh=fresh(spec.name, args) if v2 else (),
        online_rules=spec.name in (args.online_rule_logs or ONLINE_RULE_LOGS),
        grid_rule_nodes=tuple(args.grid_rule_nodes) if args.grid_rule_nodes else None,
    ):
        run(argv, logs / (f"v2-{name}.log" if v2 else f"{name}.log"))


def fresh(name: str, args: argparse.Namespace) -> tuple[str, ...]:
    """Protocol v2's fresh months of a log (the first ``--max-months`` of them when capped)."""
    months = FRESH.get(name, ())
    return months[: args.max_months] if args.max_months else months


def specs_from_args(args: argparse.Namespace, p: argparse.ArgumentParser) -> list[LogSpec]:
    """The logs this invocation evaluates: --log-file files, a log given by flags, or shipped ones."""
    try:
        if args.trace:
            doc = {
                k: v
                for k, v in (
                    ("name", args.name),
                    ("trace", args.trace),
                    ("calibrate", args.calibrate),
                    ("months", args.months_list),
                    ("nodes", args.node_sizes),
                    ("timezone", args.timezone),
                    ("procs_per_node", args.procs_per_node),
                    ("machine_nodes", args.machine_nodes),
                    ("train_start", args.train_start),
                )
                if v is not None
            }
            return [LogSpec.from_dict(doc, source="the command line")]
        if args.log_file:
            return [evalplan.load(f, traces=args.traces if args.traces != str(TRACES) else None) for f in args.log_file]
        known = shipped(args.traces)
        bad = [n for n in args.logs if n not in known]
        if bad:
            p.error(
                f"--logs: {', '.join(bad)} not shipped (lab/campaigns/logs/: {', '.join(known)}); "
                "describe your own log with --log-file or --trace"
            )
        return [known[n] for n in args.logs]
    except SpecError as exc:
        p.error(str(exc))
    raise AssertionError


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="var/eval", help="output folder (var/eval)")
    p.add_argument("--traces", default=str(TRACES), help="folder of the shipped logs' traces (../shared/traces)")
    p.add_argument("--logs", nargs="+", default=list(ORDER), help="shipped logs (lab/campaigns/logs/<name>.json)")
    p.add_argument("--log-file", nargs="+", metavar="FILE", help="log descriptions (JSON or YAML) to evaluate instead")
    g = p.add_argument_group("a log given by flags (instead of a file)")
    g.add_argument("--trace", help="the raw log (sacct export or SWF), path or URI")
    g.add_argument("--name", default="mylog", help="its name (the output folder)")
    g.add_argument("--calibrate", nargs=2, metavar=("FROM", "TO"), help="calibration period [FROM, TO)")
    g.add_argument("--months", dest="months_list", nargs="+", metavar="YYYY-MM", help="scored months")
    g.add_argument("--node-sizes", nargs="+", type=int, default=None, help="service node sizes (1 8)")
    g.add_argument("--timezone", default=None, help="the log's time zone (sacct; SWF: the header's)")
    g.add_argument("--procs-per-node", type=int, default=None, help="processors per node (SWF without node counts)")
    g.add_argument("--machine-nodes", type=int, default=None, help="the machine's size, where the log does not say")
    g.add_argument("--train-start", default=None, help="first training sample day (default: the calibration start)")
    p.add_argument(
        "--waitpred-only",
        action="store_true",
        help="only the wait predictor (ingest, calibrate, waitpred): no sampling, training or probe replay",
    )
    p.add_argument("--models", nargs="+", default=list(evalplan.MODELS))
    p.add_argument("--interval-hours", type=float, default=evalplan.INTERVAL_H, help="sample interval (protocol: 6 h)")
    p.add_argument("--cal-trials", type=int, default=evalplan.CAL_TRIALS, help="calibrate --trials (protocol: 40)")
    p.add_argument(
        "--cal-timeout-s",
        type=float,
        default=evalplan.CAL_TIMEOUT_S,
        help="calibrate --timeout-s: opt-in wall limit, failing the calibration when reached (0: none)",
    )
    p.add_argument("--bootstrap", type=int, default=evalplan.BOOTSTRAP, help="bootstrap resamples (protocol: 2000)")
    p.add_argument("--max-months", type=int, default=0, help="score only the first N scored months (0: all)")
    p.add_argument("--max-train", type=int, default=0, help="cap on training samples (0: the protocol's)")
    p.add_argument("--max-score", type=int, default=0, help="cap on scored samples (0: the protocol's)")
    p.add_argument("--jobs", type=int, default=2, help="logs at once (2)")
    p.add_argument(
        "--nodes",
        nargs="*",
        type=int,
        default=None,
        help="only these of each log's node sizes (e.g. two invocations of one log, one per size, at once)",
    )
    p.add_argument(
        "--online-rule-logs",
        nargs="+",
        default=None,
        metavar="LOG",
        help="v2: the logs whose fresh months the online decider runs the v2 rules on (avg-cal, the "
        "wait predictor's rules, xgboost-wp; default: the protocol's KTH-SP2)",
    )
    p.add_argument(
        "--grid-rule-nodes",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="v2: run the online rules that ask the wait predictor every 10 minutes ("
        + ", ".join(protocol_argvs.PREDICTOR_GRID_RULES)
        + ") on these node sizes only (default: every node size; the other online rules run on every size)",
    )
    p.add_argument(
        "--skip-waitpred", action="store_true", help="leave the wait predictor out (another invocation runs it)"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny run (KTH, 1 month, 40 training and 12 scored samples, 5 trials, 200 resamples; "
        "under v2 the online rules that ask the predictor every 10 minutes on node size 8 alone)",
    )
    p.add_argument(
        "--protocol",
        choices=("v1", "v2"),
        default="v1",
        help="v1 (docs/results/protocol.md) or v2 (protocol-v2.md: samples with the wait predictor at each "
        "probe, its rules, the fresh months; under v2-* folders; 10,000 bootstrap resamples)",
    )
    p.add_argument("--write-doc", metavar="PATH", help="write the Markdown page from the outputs and exit")
    p.add_argument("--protocol-rev", default=None, help="with --write-doc: the protocol's commit (default: git log)")
    args = p.parse_args()
    for flag, v, lo, hi in (
        ("--cal-trials", args.cal_trials, 1, 10_000),
        ("--bootstrap", args.bootstrap, 10, 1_000_000),
        ("--jobs", args.jobs, 1, 64),
        ("--max-months", args.max_months, 0, 1000),
        ("--max-train", args.max_train, 0, 1_000_000),
        ("--max-score", args.max_score, 0, 1_000_000),
    ):
        if not lo <= v <= hi:
            p.error(f"{flag} must lie in {lo} .. {hi}, got {v}")
    if not (0 < args.interval_hours <= 24 * 7) or not (0 <= args.cal_timeout_s <= 86400):
        p.error("--interval-hours must lie in (0, 168] and --cal-timeout-s in [0, 86400]")
    root = (ROOT / args.root).resolve() if not Path(args.root).is_absolute() else Path(args.root)
    if root.exists() and not root.is_dir():
        p.error(f"--root {root} exists and is not a folder")
    if args.smoke:
        args.logs, args.max_months, args.max_train, args.max_score = ["KTH-SP2"], 1, 40, 12
        args.cal_trials, args.bootstrap = 5, 200
        # KTH's larger size alone: at each size those rules ask the predictor thousands of times
        args.grid_rule_nodes = [8]
        args.log_file = args.trace = None
    specs = specs_from_args(args, p)
    try:  # each log's outputs live under its name: two descriptions of one name would share them
        evalplan.unique_names(specs)
    except SpecError as exc:
        p.error(str(exc))
    if args.max_months:
        specs = [
            LogSpec.from_dict({**s.to_dict(), "months": list(s.months[: args.max_months])}, source=s.source)
            for s in specs
        ]
    if args.write_doc:
        from lab.pages.mirage_eval_page import write_doc, write_waitpred_doc

        if args.protocol == "v2":
            from lab.pages.mirage_v2_page import write_v2_doc

            write_v2_doc(root, Path(args.write_doc), args, specs)
            return 0
        (write_waitpred_doc if args.waitpred_only else write_doc)(root, Path(args.write_doc), args, specs)
        return 0
    if args.protocol == "v2" and args.bootstrap == evalplan.BOOTSTRAP:
        args.bootstrap = BOOTSTRAP_V2
    budget = Budget(
        trials=args.cal_trials,
        timeout_s=args.cal_timeout_s,
        interval_h=args.interval_hours,
        bootstrap=args.bootstrap,
        models=tuple(args.models),
        max_train=args.max_train,
        max_score=args.max_score,
    )
    try:  # each description as a whole against what its steps accept, before any of them runs
        for s in specs:
            evalplan.check_against_steps(s, str(root), budget)
    except SpecError as exc:
        p.error(str(exc))
    t_wall = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as ex:
        futs = {s.name: ex.submit(chain, s, root, args, budget) for s in specs}
        failed = {}
        for n, f in futs.items():
            try:
                f.result()
            except BaseException as exc:  # one log failing must not hide the others' results
                if CHILDREN.stopping:  # a SIGTERM or SIGINT: the steps are being stopped (see stoppable)
                    raise
                failed[n] = str(exc) or type(exc).__name__
                print(f"mirage_eval: {n} failed: {failed[n]}", flush=True)
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    wall = time.monotonic() - t_wall
    root.mkdir(parents=True, exist_ok=True)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    rec = {
        "argv": sys.argv,
        "logs": [s.name for s in specs],
        "failed": failed,
        "cpu_s_children": round(cpu, 1),
        "wall_s": round(wall, 1),
        "cpus": os.cpu_count(),
        "loadavg": load,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    # every invocation is kept (a rerun only does what is missing: its CPU time is not the whole run's)
    hist = root / "runs.jsonl"
    seen = hist.read_text().splitlines() if hist.exists() else []
    prev = root / "run.json"
    if prev.exists() and json.dumps(json.loads(prev.read_text()), sort_keys=True) not in seen:
        seen.append(json.dumps(json.loads(prev.read_text()), sort_keys=True))
    seen.append(json.dumps(rec, sort_keys=True))
    hist.write_text("\n".join(seen) + "\n")
    prev.write_text(json.dumps(rec, indent=2) + "\n")
    print(
        f"mirage_eval: CPU {cpu:.0f} s (user+system of the steps run now), wall {wall:.0f} s, load {' '.join(load)}",
        flush=True,
    )
    print(
        f"mirage_eval: {len(specs) - len(failed)} of {len(specs)} log(s) done, {len(failed)} failed"
        + (f": {', '.join(failed)}" if failed else ""),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(stoppable(main, "mirage_eval"))
