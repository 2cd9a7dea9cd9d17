"""Simulator throughput on the ls6 trace: episodes per second and the seed's training set.

Run: ``.venv/bin/python bench/simulator.py [--workers 2] [--quick]``.

1. *Single core*: ``--serial-samples`` samples (default 48, spread evenly over the 684) for
   node 1 and node 8, 7 probes each, features included, one process. Reports ms per
   sample, ms per episode (= one probe: a successor decision simulated to its start) and
   episodes/s. The reference needs ~1.5 s per episode (measured ~3.5 s on ls6).
2. *The seed's configuration*: start 2022-11-01, 684 samples, interval 4 h, warm-up 2 d,
   workload 5 d, 7 probes, node 1 and node 8 (684 x 7 x 2 = 9,576 episodes), on
   ``--workers`` processes; wall time. ``--quick`` runs 1/6 of it and says so.

The trace is ingested from ../shared/traces/ls6-a100.log.gz (America/Chicago) into a
temporary directory unless ``--trace`` names an ingest output. The cluster model is the
shipped ``ls6`` preset unless ``--cluster-config`` says otherwise. Prints a JSON summary.
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

from mirage_tasks.samples import assemble, run_samples  # noqa: E402
from mirage_tasks.schema import read_trace  # noqa: E402
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
    rc = main("mirage_tasks", {"ingest": ("mirage_tasks.steps.ingest", "")},
              ["ingest", "--trace", str(LS6), "--out", out, "--timezone", "America/Chicago", "--log-level", "WARNING"])
    if rc:
        sys.exit(f"bench: ingest failed ({rc})")
    return out


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the worker pool)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def run_config(wl: Workload, cfg: SimConfig, count: int, nodes: list[int], workers: int, probes: int = 7,
               stride: int = 1) -> dict:
    t0 = int(pd.Timestamp(START).timestamp())
    tasks = [(k, t0 + k * 4 * 3600) for k in range(0, count * stride, stride)]
    spec = EpisodeSpec(2, 5, 144, 600)
    out = {}
    total = 0.0
    for node in nodes:
        t = time.perf_counter()
        cpu0 = _cpu()
        res = run_samples(wl, cfg, spec, node, probes, "default", tasks, workers)
        arrays, meta = assemble(res, 144)
        wall = time.perf_counter() - t
        cpu = _cpu() - cpu0
        total += wall
        y = arrays["y"]
        out[f"node{node}"] = {
            "samples": count, "episodes": int(len(y)), "wall_s": round(wall, 2),
            "ms_per_sample": round(wall / count * 1000, 2), "ms_per_episode": round(wall / len(y) * 1000, 2),
            "episodes_per_s": round(len(y) / wall, 1), "cpu_s": round(cpu, 2),
            "cpu_ms_per_episode": round(cpu / len(y) * 1000, 2), "y_mean_h": round(float(y.mean()), 3),
            "reactive_mean_h": round(float(meta[meta.probe_index == probes - 1].interruption_s.mean() / 3600), 3),
            "backfilled_share": round(float(meta.backfilled.mean()), 4),
        }
    out["wall_s_total"] = round(total, 2)
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
    args = p.parse_args(argv)
    cfg = SimConfig.from_dict(load_config(args.cluster_config)) if args.cluster_config not in PRESETS \
        else PRESETS[args.cluster_config]
    with tempfile.TemporaryDirectory() as tmp:
        df, _ = read_trace(ensure_trace(args.trace, tmp))
    wl = Workload.from_frame(df)
    summary: dict = {"config": cfg.to_dict(), "cpu_count": os.cpu_count(), "start": START}
    # spread over the 684 samples (light November to busy February alike)
    stride = max(1, 684 // args.serial_samples)
    serial = run_config(wl, cfg, args.serial_samples, [1, 8], workers=1, stride=stride)
    eps = sum(v["episodes"] for k, v in serial.items() if k.startswith("node"))
    cpu = sum(v["cpu_s"] for k, v in serial.items() if k.startswith("node"))
    summary["single_core"] = {**serial, "episodes_per_s": round(eps / serial["wall_s_total"], 1),
                              "ms_per_episode": round(serial["wall_s_total"] / eps * 1000, 2),
                              "cpu_ms_per_episode": round(cpu / eps * 1000, 2),
                              "load_average_1min": round(os.getloadavg()[0], 2),
                              "speedup_vs_reference_1.5s": round(1.5 / (serial["wall_s_total"] / eps), 1)}
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
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main_())
