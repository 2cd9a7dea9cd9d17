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
    build = subprocess.run(
        ["make", "-C", os.path.join(ROOT, "faasm_tasks", "functions")], capture_output=True, text=True, timeout=300
    )
    if build.returncode != 0:
        pytest.skip(f"the functions do not build here (make system-deps): {build.stderr[-300:]}")
    out, raw = tmp_path / "faasm-local.md", tmp_path / "faasm-local.json"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "faasm_local.py"),
            "--smoke",
            "--out",
            str(out),
            "--json",
            str(raw),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(raw.read_text())
    text = out.read_text()
    native = runtimes.runc_binary() is not None and os.geteuid() == 0
    systems = {"wasm", "native"} if native else {"wasm"}
    pts = res["points"]
    for key in (
        "cold_ms",
        "warm_ms",
        "mem_kb",
        "sgd1_time_s",
        "sgd2_time_s",
        "inf5_rps",
        "inf500_p99_ms",
        "mm100_time_s",
    ):
        assert set(pts[key]["values"]) == systems, key
        for system in systems:
            vals = pts[key]["values"][system]
            assert len(vals) >= 3 and all(v is not None and v > 0 for v in vals), (key, system, vals)
        assert not pts[key]["failed"], (key, pts[key]["failed"])  # every check passed: nothing left out
    assert len(pts["cold_ms"]["values"]["wasm"]) == 6 and not pts["cold_ms"]["paired"]
    assert "## The paper's claims" in text and "load before" in text and "median ratio [95 % CI]" in text
    if native:  # one worker, no race: both builds reach the same loss in every repeat
        assert pts["sgd1_loss"]["values"]["wasm"] == pts["sgd1_loss"]["values"]["native"]
        assert any(v in text for v in ("confirmed", "refuted", "not shown"))

    # the page from stored runs (the quiet and the busy run side by side), no measuring
    page2 = tmp_path / "two.md"
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "bench", "faasm_local.py"),
            "--runs",
            str(raw),
            str(raw),
            "--out",
            str(page2),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert page2.read_text().count("## Run: ") == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "faasm_local.py"), "--runs", str(bad), "--out", str(page2)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT),
    )
    assert proc.returncode == 2 and str(bad) in proc.stderr
