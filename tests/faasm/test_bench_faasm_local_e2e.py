"""bench/faasm_local.py --smoke: one command writes the wasm / native comparison."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from faasm_testutil import ROOT, needs_redis
from faasm_tasks import runtimes

pytestmark = needs_redis


def test_smoke_bench_writes_both_systems_side_by_side(tmp_path):
    build = subprocess.run(["make", "-C", os.path.join(ROOT, "faasm_tasks", "functions")], capture_output=True,
                           text=True, timeout=300)
    if build.returncode != 0:
        pytest.skip(f"the functions do not build here (make system-deps): {build.stderr[-300:]}")
    out, raw = tmp_path / "faasm-local.md", tmp_path / "faasm-local.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "faasm_local.py"), "--smoke", "--out", str(out),
                           "--json", str(raw)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(raw.read_text())
    text = out.read_text()
    native = runtimes.runc_binary() is not None and os.geteuid() == 0
    assert set(res["systems"]) == ({"wasm", "native"} if native else {"wasm"})
    for system, fig in res["systems"].items():
        assert fig["start"]["cold_ms_p50"] > 0 and fig["memory"]["per_instance_kb"] > 0
        assert [p["workers"] for p in fig["sgd"]] == [1, 2]
        assert [p["cold_start_interval"] for p in fig["inference"]] == [5, 500]
        assert all(p["requests"] > 0 and p["failed"] == 0 for p in fig["inference"])
        assert fig["matmul"][0]["max_rel_err"] < 1e-4
    if native:  # one worker, no race: both builds reach the same loss
        assert res["systems"]["wasm"]["sgd"][0]["final_loss"] == res["systems"]["native"]["sgd"][0]["final_loss"]
        assert "## The paper's claims here" in text and "refuted" in text or "holds" in text
    assert "load before" in text and "wasm/native" in text
