"""Documented bench commands run as written, at their smallest size, so none can rot unseen.

``bench/simulator.py`` without ``--skip-full`` (its pooled stage) crashed after five minutes
with ``too many values to unpack`` once ``samples._one`` returned its CPU time too; here it
runs with ``--quick --serial-samples 2`` (seconds) and must print its JSON summary.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, shared_trace_path


def test_simulator_bench_pooled_stage_runs(tmp_path):
    shared_trace_path("ls6-a100.log.gz")  # skips with the reason where ../shared/traces is absent
    out = tmp_path / "summary.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    p = subprocess.run(
        [sys.executable, "bench/simulator.py", "--quick", "--serial-samples", "2", "--json", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(out.read_text())
    full = summary["seed_configuration"]
    assert full["measured"] == "114 samples x 7 x 2 (quick)" and full["workers"] == 2
    assert full["node1"]["cpu_ms_per_episode"] > 0 and full["node8"]["cpu_ms_per_episode"] > 0
