"""Mirage on ls6 over several validation months: every number of docs/results/ls6-months.md.

    nice -n 5 .venv/bin/python -m lab.campaigns.ls6_months            # then:
    .venv/bin/python -m lab.campaigns.ls6_months --write-doc docs/results/ls6-months.md

One command runs the package's step CLIs (``python -m mirage_tasks <step>``), in this order,
under ``--root`` (default ``var/ls6-months``); every step skips when its output is up to
date, so a rerun only does what is missing:

1. ``ingest`` the ls6 log (local times read as America/Chicago);
2. ``sample`` per node size, one after the other: one sample every ``--interval-hours`` (1 h)
   from 2022-11-01 to the last start whose 5-day workload ends before the last validation
   month (the seed sampled every 4 h), probes placed by ``--probe-spacing`` (``end``: at the
   predecessor's end minus 24 h ... 10 min and at its end; ``uniform``: the reference's 7
   equally spaced); ``merge``; a node's months start training once its dataset is merged;
3. per validation month (Jan, Feb, Mar 2023) and node size: ``train`` each model on the
   samples whose episodes end before the month starts (``--samples-until``: models see
   nothing of the month), with the chronological split and purge inside that history; the
   submit threshold is calibrated there (``--waste-weight``), never on the month; the
   ``--hpo-models`` first search their hyper-parameters there with Optuna (``--hpo-trials``,
   ``--hpo-timeout-s``);
4. ``validate`` the baselines and each model on ``--val-count`` samples every 4 h from the
   month's first day (156: 26 days, as the seed's March run), a decision every 10 minutes;
5. ``metrics`` per month (paired bootstrap 95 % intervals, also of the difference to ``avg``);
6. a learning curve on the last month: the curve models retrained on 25 % and 50 % of the
   samples (evenly thinned: a 4 h and a 2 h interval over the same history) and validated.

It prints the CPU time of the steps it ran (user + system of the child processes) and the
wall time. ``--write-doc PATH`` writes the Markdown report from the outputs (no numbers
typed by hand) and, beside it, the run's record (``PATH`` with ``.json``: verdicts and each
model's online result); ``--compare-with JSON`` sets the verdicts beside an earlier run's
committed record. It runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

from lab.campaigns._steprun import run_logged, stoppable
from mirage_tasks.run.plan import argv  # the planner's argv builder: each flag spelled once, by its step

ROOT = Path(__file__).resolve().parents[2]  # the repository (lab/campaigns/ is two below)
MONTHS = ("2023-01", "2023-02", "2023-03")
MODELS = ("xgboost", "random_forest", "linear_quantile", "transformer")
SAMPLE_START = "2022-11-01T00:00:00+00:00"
WORKLOAD_DAYS = 5.0


def month_start(m: str) -> pd.Timestamp:
    return pd.Timestamp(f"{m}-01T00:00:00+00:00")


#: At most ``--jobs`` step processes at once (set in main).
SLOTS = threading.Semaphore(2)


def run(argv: list[str], log: Path) -> None:
    label = f"{argv[0]} {' '.join(a for a in argv[1:] if not a.startswith('-'))[:90]}"
    run_logged([sys.executable, "-m", "mirage_tasks", *argv], log, ROOT, label, SLOTS)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="var/ls6-months", help="output folder (var/ls6-months)")
    p.add_argument("--trace", default=str(ROOT.parent / "shared/traces/ls6-a100.log.gz"))
    p.add_argument("--months", nargs="+", default=list(MONTHS), help="validation months YYYY-MM")
    p.add_argument("--nodes", nargs="+", type=int, default=[1, 8])
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--interval-hours", type=float, default=1.0, help="training sample interval (1 h)")
    p.add_argument(
        "--probe-spacing",
        default="end",
        choices=("uniform", "end"),
        help="sample --probe-spacing of the training samples (end: near the predecessor's end)",
    )
    p.add_argument("--val-count", type=int, default=156, help="validation samples per month, 4 h apart (156)")
    p.add_argument("--preset", default="quick")
    p.add_argument(
        "--param",
        action="append",
        default=["transformer:epochs=20"],
        metavar="MODEL:KEY=VALUE",
        help="train --param for one model (repeatable; default transformer:epochs=20)",
    )
    p.add_argument("--waste-weight", type=float, default=None, help="train --waste-weight (default: train's)")
    p.add_argument(
        "--hpo-models",
        nargs="*",
        default=["xgboost", "linear_quantile"],
        help="models whose hyper-parameters are searched (train --hpo-trials); the others keep the preset",
    )
    p.add_argument("--hpo-trials", type=int, default=10, help="train --hpo-trials for --hpo-models (10)")
    p.add_argument("--hpo-timeout-s", type=float, default=90.0, help="train --hpo-timeout-s (90)")
    p.add_argument(
        "--curve-models",
        nargs="*",
        default=["xgboost", "random_forest"],
        help="models of the learning curve (on the last month)",
    )
    p.add_argument("--curve-fractions", nargs="*", type=float, default=[0.25, 0.5])
    p.add_argument(
        "--jobs", type=int, default=2, help="step processes at once (2); the node sizes are sampled one after the other"
    )
    p.add_argument(
        "--reuse-samples",
        action="store_true",
        help="run no ingest/sample/merge: use the committed trace and datasets already under --root "
        "(e.g. symlinks to an earlier run's, which must not be written); only train/validate/metrics run",
    )
    p.add_argument("--write-doc", metavar="PATH", help="write the Markdown report from the outputs and exit")
    p.add_argument(
        "--compare-with",
        metavar="JSON",
        help="with --write-doc: set the verdicts beside those of an earlier run's record (the JSON "
        "--write-doc writes beside its page, committed with it; e.g. docs/results/ls6-months-ff01480.json)",
    )
    p.add_argument(
        "--compare-label",
        default=None,
        help="with --compare-with: what the earlier run was, in the tables' headers (default: uniform)",
    )
    p.add_argument("--run-label", default=None, help="with --compare-with: what this run is (default: end)")
    args = p.parse_args()
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(
        p,
        args,
        {
            "nodes": (1, 10_000),
            "interval_hours": (0.01, 24 * 31),
            "val_count": (1, 100_000),
            "waste_weight": (0, 100),
            "hpo_trials": (0, 10_000),
            "hpo_timeout_s": (0, 86400),
            "curve_fractions": (0.001, 1),
            "jobs": (1, 64),
        },
        folders=("root",),
        files=("write_doc",),
    )
    root = (ROOT / args.root).resolve()
    if args.write_doc:
        from lab.pages.ls6_months_page import write_doc

        write_doc(root, Path(args.write_doc), args)
        return 0
    global SLOTS
    SLOTS = threading.Semaphore(max(1, args.jobs))
    t_wall = time.monotonic()
    logs = root / "logs"
    trace = root / "trace"
    if args.reuse_samples:
        for d in [trace, *(root / "datasets" / f"node{n}" for n in args.nodes)]:
            if not (d / "_SUCCESS.json").exists():
                raise SystemExit(f"--reuse-samples: {d} holds no committed step output")
    else:
        run(argv("ingest", trace=args.trace, timezone="America/Chicago", out=trace), logs / "ingest.log")
    sim = {"cluster_config": "ls6"}
    last = max(month_start(m) for m in args.months)
    span = pd.Timedelta(days=WORKLOAD_DAYS)
    count = int((last - span - pd.Timestamp(SAMPLE_START)) / pd.Timedelta(hours=args.interval_hours)) + 1
    datasets = {n: root / "datasets" / f"node{n}" for n in args.nodes}
    ready = {n: threading.Event() for n in args.nodes}
    failed: list[BaseException] = []

    def build_all() -> None:  # one sampling process at a time; a node's chains start once its dataset is merged
        try:
            for n in args.nodes:
                if args.reuse_samples:
                    ready[n].set()
                    continue
                s = root / "samples" / f"node{n}"
                run(
                    argv(
                        "sample",
                        trace=trace,
                        **sim,
                        start=SAMPLE_START,
                        count=count,
                        interval_hours=args.interval_hours,
                        probe_spacing=args.probe_spacing,
                        node=n,
                        workers=1,
                        out=s,
                    ),
                    logs / f"sample-node{n}.log",
                )
                run(argv("merge", inputs=[s], out=datasets[n], no_compress=True), logs / f"merge-node{n}.log")
                ready[n].set()
        except BaseException as exc:
            failed.append(exc)
            for e in ready.values():
                e.set()
            raise

    def dataset_ready(n: int) -> None:
        ready[n].wait()
        if failed:
            raise SystemExit(f"sampling failed: {failed[0]}")

    builder = threading.Thread(target=build_all, daemon=True)
    builder.start()

    params: dict[str, list[str]] = {}
    for item in args.param:
        model, _, kv = item.partition(":")
        params.setdefault(model, []).append(kv)

    def train(model: str, n: int, until: pd.Timestamp, out: Path, fraction: float = 1.0) -> None:
        dataset_ready(n)
        hpo = bool(args.hpo_trials and model in args.hpo_models)
        run(
            argv(
                "train",
                model=model,
                dataset=datasets[n],
                out=out,
                preset=args.preset,
                samples_until=until.isoformat(),
                threads=1,
                sample_fraction=fraction if fraction < 1.0 else None,
                waste_weight=args.waste_weight,
                hpo_trials=args.hpo_trials if hpo else None,
                hpo_timeout_s=args.hpo_timeout_s if hpo else None,
                param=params.get(model) or None,
            ),
            logs / f"train-{out.relative_to(root).as_posix().replace('/', '-')}.log",
        )

    def validate(model: str, n: int, start: pd.Timestamp, out: Path, name: str | None = None) -> None:
        run(
            argv(
                "validate",
                trace=trace,
                **sim,
                start=start.isoformat(),
                count=args.val_count,
                interval_hours=4,
                node=n,
                model=model,
                out=out,
                workers=1,
                name=name,
            ),
            logs / f"validate-{out.relative_to(root).as_posix().replace('/', '-')}.log",
        )

    def chain(month: str, n: int) -> None:
        start = month_start(month)
        for b in ("reactive", "avg"):
            validate(b, n, start, root / "validate" / month / f"node{n}" / b)
        for model in args.models:
            m_out = root / "models" / month / f"node{n}" / model
            train(model, n, start, m_out)
            validate(str(m_out), n, start, root / "validate" / month / f"node{n}" / model)

    def curve(month: str, n: int, model: str, f: float) -> None:
        start = month_start(month)
        tag = f"{model}@{int(round(f * 100))}pct"
        m_out = root / "curve" / month / f"node{n}" / tag
        train(model, n, start, m_out, fraction=f)
        validate(str(m_out), n, start, root / "curve-validate" / month / f"node{n}" / tag, name=tag)

    # threads wait for their dataset and for a process slot (SLOTS): node by node, so the first node's
    # chains train while the next node samples
    with ThreadPoolExecutor(len(args.months) * len(args.nodes)) as ex:
        chains = [ex.submit(chain, m, n) for n in args.nodes for m in args.months]
        # the learning curve last: the months' results come first if the run is cut short
        curves = [
            ex.submit(curve, args.months[-1], n, model, f)
            for n in args.nodes
            for model in args.curve_models
            for f in args.curve_fractions
        ]
        for fut in chains:
            fut.result()
        for month in args.months:
            ins = sorted(str(d) for d in (root / "validate" / month).glob("node*/*") if (d / "_SUCCESS.json").exists())
            run(argv("metrics", inputs=ins, out=root / "metrics" / month), logs / f"metrics-{month}.log")
        for fut in curves:
            fut.result()
    builder.join()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ru.ru_utime + ru.ru_stime
    wall = time.monotonic() - t_wall
    (root / "run.json").write_text(
        json.dumps(
            {
                "argv": sys.argv,
                "probe_spacing": args.probe_spacing,
                "reuse_samples": args.reuse_samples,
                "interval_hours": args.interval_hours,
                "cpu_s_children": round(cpu, 1),
                "wall_s": round(wall, 1),
                "cpus": os.cpu_count(),
                "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
            indent=2,
        )
        + "\n"
    )
    print(f"ls6_months: CPU {cpu:.0f} s (user+system of the steps run now), wall {wall:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(stoppable(main, "ls6_months"))
