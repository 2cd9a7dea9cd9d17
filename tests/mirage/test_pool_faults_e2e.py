"""Pooled steps fail fast: ``sample`` and ``validate`` with ``--workers 2`` as subprocesses.

``kill -9`` of one worker (what the OOM killer does in a pod): the step exits 1, its error
names the sample, the shard and the signal, nothing is committed and no process of its
tree is left. SIGTERM of the step: it exits 143 and leaves no worker. The runs are far
longer than the tests (thousands of samples) so the signal always lands while the workers
hold tasks; every wait is for a condition with a generous deadline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proctree import all_gone, pool_workers, tree, wait_for
from test_sim_support import T0, random_trace, write_committed_trace

from mirage_tasks.data.times import iso

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ["--cluster-config", "ls6", "--nodes", "16", "--max-jobs-per-user", "3"]
#: 5000 samples 36 s apart: minutes of work for two workers, cut short by the signal
LONG = ["--count", "5000", "--interval-hours", "0.01", "--node", "2"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(11, days=14, nodes=16))


def _argv(step: str, trace: str, out: Path) -> list[str]:
    start = iso(T0 + 86400)
    extra = ["--probes", "3", "--window", "12"] if step == "sample" else ["--model", "reactive"]
    return [
        sys.executable,
        "-m",
        "mirage_tasks",
        step,
        "--trace",
        trace,
        "--start",
        start,
        *LONG,
        *extra,
        "--shard",
        "0/1",
        "--workers",
        "2",
        "--out",
        str(out),
        *CLUSTER,
        "--log-level",
        "WARNING",
    ]


def _start(step: str, trace: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        _argv(step, trace, out), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        for p in tree(proc.pid)[::-1]:
            p.kill()
        proc.communicate()
        raise AssertionError("the step did not exit after its worker died (it hangs)") from None
    return proc.returncode, err


@pytest.mark.parametrize("step", ["sample", "validate"])
def test_a_killed_worker_fails_the_step_naming_shard_and_signal(step, trace, tmp_path):
    out = tmp_path / "out"
    proc = _start(step, trace, out)
    workers = wait_for(lambda: pool_workers(proc.pid, 2), f"{step}'s two pool workers")
    everything = tree(proc.pid)
    victim = workers[0]
    victim.send_signal(signal.SIGKILL)
    rc, err = _finish(proc)
    assert rc == 1, err[-3000:]
    assert "died: SIGKILL" in err and f"pid {victim.pid}" in err, err[-3000:]
    assert "of shard 0/1" in err and "worker for sample " in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    all_gone(everything)
    assert not (out / "_SUCCESS.json").exists()


@pytest.mark.parametrize("step", ["sample", "validate"])
def test_sigterm_of_the_step_leaves_no_worker(step, trace, tmp_path):
    proc = _start(step, trace, tmp_path / "out")
    wait_for(lambda: pool_workers(proc.pid, 2), f"{step}'s two pool workers")
    everything = tree(proc.pid)
    proc.send_signal(signal.SIGTERM)
    rc, err = _finish(proc)
    assert rc == 143, err[-3000:]
    assert "terminated by SIGTERM" in err, err[-3000:]
    all_gone(everything)
