"""Simulator throughput on the ls6 trace: episodes per second and the seed's training set.

Run: ``.venv/bin/python bench/simulator.py [--workers 2] [--quick]``.

1. *Single core*: ``--serial-samples`` samples (default 48, spread evenly over the 684) for
   node 1 and node 8, 7 probes each, features included, one process. Reports ms per
   sample, ms per episode (= one probe: a successor decision simulated to its start) and
   episodes/s. The reference needs ~1.5 s per episode (measured ~3.5 s on ls6).
2. *The seed's configuration*: start 2022-11-01, 684 samples, interval 4 h, warm-up 2 d,
   workload 5 d, 7 probes, node 1 and node 8 (684 x 7 x 2 = 9,576 episodes), on
   ``--workers`` processes; wall time. ``--quick`` runs 1/6 of it and says so.

3. *Side by side with the reference* (``--reference DIR``, a checkout of
   github.com/zhaozhang/Mirage that the user fetched; its code is never part of this
   repository): ``--reference-samples`` samples (default 2, spread over the 684) x node 1
   and node 8, each simulated by the unmodified reference (``simulate_single`` of
   ``src/top/offline_data_gen.py``: one pre-simulation and 7 probe simulations, each
   re-parsing the trace, 88 nodes, its shipped configuration) and by this project on the
   same episodes (the same local sample start, 7 probes) with the tested configuration
   (``ls6`` by default) and with the ``reference`` preset. Reports wall and CPU seconds per
   episode for each and the ratio; this project's per-episode figure is also given with
   its one-time trace loading (ingest + Workload) added. The reference needs ``sklearn``
   and imports ``ray`` (only for a decorator it does not use serially): a stand-in module
   is installed when ``ray`` is absent.

CPU is counted for this process and for its finished children (the pool workers' rusage,
which ``run_samples`` reaps before returning), so the pooled stage reports what its
workers spent, not just the parent.

The trace is ingested from ../shared/traces/ls6-a100.log.gz (America/Chicago) into a
temporary directory unless ``--trace`` names an ingest output. The cluster model is the
shipped ``ls6`` preset unless ``--cluster-config`` says otherwise. Prints a JSON summary.

Example (the figure in docs/results/simulator-speed.md)::

    nice -n 10 .venv/bin/python bench/simulator.py --skip-full --serial-samples 24 \
        --reference /tmp/mirage-ref --reference-samples 2
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

import pandas as pd  # noqa: E402

from mirage_tasks.data.schema import read_trace  # noqa: E402
from mirage_tasks.sampling.sample import assemble, run_samples  # noqa: E402
from mirage_tasks.sim import EpisodeSpec, Workload  # noqa: E402
from mirage_tasks.sim.config import PRESETS, SimConfig, load_config  # noqa: E402
from stepkit.cli import main  # noqa: E402

LS6 = ROOT.parent / "shared" / "traces" / "ls6-a100.log.gz"
START = "2022-11-01T00:00:00+00:00"


def ensure_trace(arg: str | None, tmp: str) -> str:
    if arg:
        return arg
    if not LS6.exists():
        sys.exit(f"bench: {LS6} not found (../shared/traces beside the repository); pass --trace")
    out = os.path.join(tmp, "ls6")
    rc = main(
        "mirage_tasks",
        {"ingest": ("mirage_tasks.steps.ingest", "")},
        ["ingest", "--trace", str(LS6), "--out", out, "--timezone", "America/Chicago", "--log-level", "WARNING"],
    )
    if rc:
        sys.exit(f"bench: ingest failed ({rc})")
    return out


def _cpu_self() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return me.ru_utime + me.ru_stime


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the worker pool)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _one_timed(task: tuple[int, int]) -> tuple[tuple[int, list], int, float]:
    """``samples._one`` in a pool worker, returning also the worker's pid and its own CPU
    seconds so far (initialisation included): the parent sums each worker's last figure."""
    from mirage_tasks.sampling import sample as samples

    return samples._one(task), os.getpid(), _cpu_self()


def run_pooled(
    wl: Workload, cfg: SimConfig, spec: EpisodeSpec, node: int, probes: int, tasks: list[tuple[int, int]], workers: int
) -> tuple[list, float]:
    """``samples.run_samples``'s pool (the same pool, context and initializer), and the
    CPU seconds its workers spent. Workers are children of the forkserver, not of this
    process, so RUSAGE_CHILDREN never sees them: each task reports its worker's own rusage."""
    from mirage_tasks.sampling import sample as samples
    from mirage_tasks.sampling.schedule import pool_context
    from stepkit.pool import run_pool

    if workers <= 1 or len(tasks) <= 1:
        return run_samples(wl, cfg, spec, node, probes, "default", tasks, 1), 0.0
    last: dict[int, float] = {}
    out = []
    for (k, res, _), pid, cpu in run_pool(
        _one_timed,
        tasks,
        workers,
        initializer=samples._init,
        initargs=(wl, cfg, spec, node, probes, "default"),
        context=pool_context(),
    ):
        out.append((k, res))  # samples._one also returns its own CPU time: assemble takes (k, res)
        last[pid] = max(cpu, last.get(pid, 0.0))
    out.sort(key=lambda r: r[0])
    return out, sum(last.values())


def run_config(
    wl: Workload, cfg: SimConfig, count: int, nodes: list[int], workers: int, probes: int = 7, stride: int = 1
) -> dict:
    t0 = int(pd.Timestamp(START).timestamp())
    tasks = [(k, t0 + k * 4 * 3600) for k in range(0, count * stride, stride)]
    spec = EpisodeSpec(2, 5, 144, 600)
    out = {}
    total = 0.0
    for node in nodes:
        t = time.perf_counter()
        cpu0 = _cpu()
        res, worker_cpu = run_pooled(wl, cfg, spec, node, probes, tasks, workers)
        arrays, meta = assemble(res, 144)
        wall = time.perf_counter() - t
        cpu = _cpu() - cpu0 + worker_cpu
        total += wall
        y = arrays["y"]
        out[f"node{node}"] = {
            "samples": count,
            "episodes": int(len(y)),
            "wall_s": round(wall, 2),
            "ms_per_sample": round(wall / count * 1000, 2),
            "ms_per_episode": round(wall / len(y) * 1000, 2),
            "episodes_per_s": round(len(y) / wall, 1),
            "cpu_s": round(cpu, 2),
            "cpu_ms_per_episode": round(cpu / len(y) * 1000, 2),
            "y_mean_h": round(float(y.mean()), 3),
            "reactive_mean_h": round(float(meta[meta.probe_index == probes - 1].interruption_s.mean() / 3600), 3),
            "backfilled_share": round(float(meta.backfilled.mean()), 4),
        }
    out["wall_s_total"] = round(total, 2)
    return out


def reference_trace(tmp: str) -> str:
    """The ls6 log in the layout the reference parser reads (its README's ``filtered-ls6.log``):
    the header first, space-separated, without the count line and the one 11-field row."""
    import gzip

    out = os.path.join(tmp, "filtered-ls6.log")
    with gzip.open(LS6, "rt") as f, open(out, "w") as g:
        lines = f.read().split("\n")
        g.write(lines[1] + "\n" + lines[2] + "\n")
        for row in lines[3:]:
            fields = row.split("\t")
            if len(fields) == 10:
                g.write(" ".join(fields) + "\n")
        # the file ends with a newline: the parser's skipped last line is the empty one
    return out


def _load_reference(ref_dir: str):
    import importlib.util
    import types

    src = os.path.join(ref_dir, "src")
    path = os.path.join(src, "top", "offline_data_gen.py")
    if not os.path.exists(path):
        sys.exit(f"bench: --reference {ref_dir}: {path} not found (a checkout of github.com/zhaozhang/Mirage)")
    if "ray" not in sys.modules:
        try:
            import ray  # noqa: F401
        except ImportError:  # only its @ray.remote decorator is evaluated at import time
            sys.modules["ray"] = types.SimpleNamespace(remote=lambda f: f)
    sys.path.insert(0, src)
    spec = importlib.util.spec_from_file_location("mirage_reference_offline_data_gen", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, src


def side_by_side(wl: Workload, cfg: SimConfig, ref_dir: str, count: int, load_s: float, tmp: str) -> dict:
    """The same episodes by the reference and by this project (tested config and the
    ``reference`` preset): seconds per episode (one probe; a sample's pre-simulation is
    counted in its probes' share, on both sides)."""
    import datetime as dt
    import logging

    from mirage_tasks.sim.episode import simulate_sample

    mod, src = _load_reference(ref_dir)
    logging.getLogger().setLevel(logging.ERROR)
    trace = reference_trace(tmp)
    with open(os.path.join(src, "test", "test_data", "slurm_config.json")) as f:
        slurm_config = json.load(f)
    with open(os.path.join(src, "test", "test_data", "backfill_config.json")) as f:
        backfill_config = json.load(f)
    stride = max(1, 684 // count)
    t0 = int(pd.Timestamp(START).timestamp())
    spec = EpisodeSpec(2, 5, 144, 600)
    rows = []
    totals = {"reference_code": [0.0, 0.0], "project_tested": [0.0, 0.0], "project_reference_preset": [0.0, 0.0]}
    episodes = 0
    for k in range(0, count * stride, stride):
        start = t0 + k * 4 * 3600
        # the reference works in the log's naive local time (US/Central)
        local = pd.Timestamp(start, unit="s", tz="UTC").tz_convert("America/Chicago").tz_localize(None)
        init = dt.datetime(local.year, local.month, local.day, local.hour, local.minute)
        for node in (1, 8):
            row = {"sample_start_utc": pd.Timestamp(start, unit="s", tz="UTC").isoformat(), "node": node}
            w, c = time.perf_counter(), _cpu_self()
            data, _avg = mod.simulate_single(
                init,
                0,
                slurm_config,
                backfill_config,
                7,
                4,
                trace,
                5,
                2,
                False,
                100,
                144,
                None,
                mode="default",
                node=node,
            )
            ref = (time.perf_counter() - w, _cpu_self() - c)
            n = len(data)
            for name, c_ in (("project_tested", cfg), ("project_reference_preset", PRESETS["reference"])):
                w, c = time.perf_counter(), _cpu_self()
                res = simulate_sample(wl, c_, start, node, spec, probes=7)
                row[name + "_s_per_episode"] = round((time.perf_counter() - w) / len(res), 5)
                totals[name][0] += time.perf_counter() - w
                totals[name][1] += _cpu_self() - c
            totals["reference_code"][0] += ref[0]
            totals["reference_code"][1] += ref[1]
            row["reference_code_s_per_episode"] = round(ref[0] / n, 3)
            episodes += n
            rows.append(row)
            print(json.dumps(row), flush=True)
    per = {
        k: {"wall_s_per_episode": round(v[0] / episodes, 5), "cpu_s_per_episode": round(v[1] / episodes, 5)}
        for k, v in totals.items()
    }
    ref_wall = totals["reference_code"][0]
    out = {
        "episodes_each": episodes,
        "per_episode": per,
        "project_trace_load_s": round(load_s, 3),
        "speedup_tested_vs_reference_code": round(ref_wall / totals["project_tested"][0], 1),
        "speedup_tested_vs_reference_code_cpu": round(totals["reference_code"][1] / totals["project_tested"][1], 1),
        "speedup_tested_incl_trace_load": round(ref_wall / (totals["project_tested"][0] + load_s), 1),
        "speedup_reference_preset_vs_reference_code": round(ref_wall / totals["project_reference_preset"][0], 1),
        "tested_over_reference_preset_time": round(
            totals["project_tested"][0] / totals["project_reference_preset"][0], 2
        ),
        "rows": rows,
    }
    return out


def main_(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default=None, help="ingest output of the ls6 log (default: ingest it now)")
    p.add_argument("--cluster-config", default="ls6", help="preset or JSON file (default ls6)")
    p.add_argument("--workers", type=int, default=2, help="processes for the full configuration (2)")
    p.add_argument("--serial-samples", type=int, default=48, help="samples per node size for the single-core figure")
    p.add_argument("--quick", action="store_true", help="run 114 of the 684 samples of the full configuration")
    p.add_argument("--skip-full", action="store_true", help="only the single-core figure")
    p.add_argument("--json", default=None, help="also write the summary here")
    p.add_argument(
        "--reference",
        default=None,
        metavar="DIR",
        help="checkout of github.com/zhaozhang/Mirage: also time its simulator on the same episodes",
    )
    p.add_argument("--reference-samples", type=int, default=2, help="samples per node size for --reference (2)")
    args = p.parse_args(argv)
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(
        p,
        args,
        {"workers": (1, 256), "serial_samples": (1, 100_000), "reference_samples": (1, 1000)},
        folders=(),
        files=("json",),
    )
    cfg = (
        SimConfig.from_dict(load_config(args.cluster_config))
        if args.cluster_config not in PRESETS
        else PRESETS[args.cluster_config]
    )
    t_load = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        df, _ = read_trace(ensure_trace(args.trace, tmp))
    wl = Workload.from_frame(df)
    load_s = time.perf_counter() - t_load
    summary: dict = {"config": cfg.to_dict(), "cpu_count": os.cpu_count(), "start": START}
    # spread over the 684 samples (light November to busy February alike)
    stride = max(1, 684 // args.serial_samples)
    serial = run_config(wl, cfg, args.serial_samples, [1, 8], workers=1, stride=stride)
    eps = sum(v["episodes"] for k, v in serial.items() if k.startswith("node"))
    cpu = sum(v["cpu_s"] for k, v in serial.items() if k.startswith("node"))
    summary["single_core"] = {
        **serial,
        "episodes_per_s": round(eps / serial["wall_s_total"], 1),
        "ms_per_episode": round(serial["wall_s_total"] / eps * 1000, 2),
        "cpu_ms_per_episode": round(cpu / eps * 1000, 2),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "speedup_vs_reference_1.5s": round(1.5 / (serial["wall_s_total"] / eps), 1),
    }
    print(json.dumps({"single_core": summary["single_core"]}, indent=2), flush=True)
    if not args.skip_full:
        count = 114 if args.quick else 684
        full = run_config(wl, cfg, count, [1, 8], workers=args.workers)
        full["workers"] = args.workers
        full["measured"] = "whole 684 x 7 x 2" if count == 684 else f"{count} samples x 7 x 2 (quick)"
        if count != 684:
            full["extrapolated_684_wall_s"] = round(full["wall_s_total"] * 684 / count, 1)
        summary["seed_configuration"] = full
        print(json.dumps({"seed_configuration": full}, indent=2), flush=True)
    if args.reference:
        with tempfile.TemporaryDirectory() as tmp:
            summary["side_by_side"] = side_by_side(wl, cfg, args.reference, args.reference_samples, load_s, tmp)
        print(
            json.dumps({"side_by_side": {k: v for k, v in summary["side_by_side"].items() if k != "rows"}}, indent=2),
            flush=True,
        )
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
