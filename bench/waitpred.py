"""What scoring a log's months at submission time costs, beside the replay.

    OMP_NUM_THREADS=1 .venv/bin/python bench/waitpred.py --root var/eval --log CEA-Curie [--json OUT]
    .venv/bin/python bench/waitpred.py --smoke        # a 10-day slice of KTH-SP2, for the test

Reads a log's ingested trace and calibrated configuration under ``--root/<log>/`` (what
``python -m lab.campaigns.mirage_eval --waitpred-only`` leaves there; with ``--smoke`` it ingests KTH-SP2 into a
temporary folder and uses a 100-node machine) and measures, in this one process, the CPU seconds
of

* the submission-time sweep (:func:`mirage_tasks.calibration.atsubmit.sweep`): the state of the
  queue at every job's submission and both plans, for every job submitted in the scored months
  (the log before them is walked for state only);
* the replay of the same months with the calibrated simulator (each month from a warm start 7
  days before it: what ``calibrate`` scores as fidelity), for scale.

It prints jobs, CPU seconds, milliseconds per job and the ratio, and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the lab wing (lab/), run from anywhere


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="var/eval", help="lab/campaigns/mirage_eval.py's output folder (var/eval)")
    p.add_argument("--log", default="CEA-Curie", help="a log under --root with trace/ and cal/config.json")
    p.add_argument("--json", default=None, help="also write the figures here (default: --root/waitpred-bench.json)")
    p.add_argument("--smoke", action="store_true", help="a 10-day slice of KTH-SP2 (seconds)")
    args = p.parse_args()

    import pandas as pd

    from lab.campaigns.mirage_eval import TRACES, shipped  # the shipped log descriptions
    from mirage_tasks.calibration import atsubmit
    from mirage_tasks.calibration.calibrate import replay_months
    from mirage_tasks.data.schema import read_trace
    from mirage_tasks.sim.config import SimConfig, load_config
    from mirage_tasks.sim.workload import Workload

    root = (ROOT / args.root) if not Path(args.root).is_absolute() else Path(args.root)
    spec = shipped(str(TRACES)).get("KTH-SP2" if args.smoke else args.log)
    if args.smoke:
        tmp = Path(tempfile.mkdtemp(prefix="waitpred-bench-"))
        subprocess.run(
            [sys.executable, "-m", "mirage_tasks", "ingest", "--trace", spec.trace, "--out", str(tmp / "trace")],
            check=True,
            capture_output=True,
        )
        trace, cfg = str(tmp / "trace"), SimConfig(nodes=100)
        months = ("1997-01",)
    else:
        if spec is None:
            p.error(f"--log {args.log}: not a shipped log (lab/campaigns/logs/)")
        trace, cfg_path = root / args.log / "trace", root / args.log / "cal" / "config.json"
        if not cfg_path.is_file():
            p.error(
                f"{cfg_path} is missing: run python -m lab.campaigns.mirage_eval --waitpred-only --logs {args.log} first"
            )
        trace, cfg = str(trace), SimConfig.from_dict(load_config(str(cfg_path)))
        months = spec.months
    df, meta = read_trace(trace)
    tz = meta.timezone or "UTC"
    wl = Workload.from_frame(df, spec.procs_per_node or cfg.procs_per_node or None)
    a = int(pd.Timestamp(f"{months[0]}-01").tz_localize(tz).timestamp())
    b = int((pd.Timestamp(f"{months[-1]}-01").tz_localize(tz) + pd.offsets.MonthBegin(1)).timestamp())
    if args.smoke:
        b = a + 10 * 86400
    t = time.process_time()
    fr = atsubmit.sweep(wl, cfg, a, b, tz)
    sweep_s = time.process_time() - t
    t = time.process_time()
    rep = replay_months(wl, cfg, a, b, 7 * 86400, tz)
    replay_s = time.process_time() - t
    load = os.getloadavg()
    rec = {
        "log": spec.name,
        "months": list(months),
        "jobs": int(len(fr)),
        "sweep_cpu_s": round(sweep_s, 3),
        "sweep_ms_per_job": round(1000 * sweep_s / max(1, len(fr)), 3),
        "replay_cpu_s": round(replay_s, 3),
        "replay_jobs": int(len(rep)),
        "ratio_sweep_over_replay": round(sweep_s / replay_s, 2) if replay_s else None,
        "mean_pending_at_submission": round(float(fr["pending_jobs"].mean()), 1),
        "loadavg": [round(x, 2) for x in load],
        "cpus": os.cpu_count(),
        "smoke": args.smoke,
        "command": " ".join(["bench/waitpred.py", *sys.argv[1:]]),
    }
    rec["line"] = (
        f"{spec.name} {', '.join(months)}: {rec['jobs']} jobs scored at submission in {sweep_s:.1f} CPU s "
        f"({rec['sweep_ms_per_job']} ms/job, {rec['mean_pending_at_submission']} jobs pending on average); "
        f"the replay of the same months {replay_s:.1f} CPU s (x{rec['ratio_sweep_over_replay']}); load "
        f"{' '.join(f'{x:.1f}' for x in load)} on {os.cpu_count()} CPUs"
    )
    print("waitpred bench: " + rec["line"], flush=True)
    out = Path(args.json) if args.json else (None if args.smoke else root / "waitpred-bench.json")
    if out:
        out.write_text(json.dumps(rec, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
