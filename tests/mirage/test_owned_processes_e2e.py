"""Every long-running step owns what it starts: killed at a random point it
leaves no process and the committed outputs intact.

* ``python -m lab replay-slurm --slurm-root`` and ``python -m lab keeper-slurm --slurm-root`` (a real local Slurm: munged,
  slurmctld, one slurmd per node, the replayed jobs): SIGTERM -> exit 143 within a bounded
  time, every job cancelled, every daemon stopped; SIGKILL (what the kubelet sends at the end
  of the grace period; the issue's run: SIGTERM, then SIGKILL 5 s later) -> the step's guard
  (:class:`stepkit.procs.Guard`) stops the cluster.
  These need root and Debian's Slurm (``make system-deps``) and skip without them.
* ``calibrate``: SIGTERM mid-search -> exit 143, no process left.
* ``waitpred``: SIGTERM at a random point after it starts working -> exit 143, no lease left.

"Committed outputs intact": each run writes into an ``--out`` that already holds a committed
output of other parameters; after the kill its marker and files are byte for byte the same.
Every wait is for a condition with a generous deadline; the random point is drawn once per
test (the seed printed in the failure).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proctree import all_gone, tree, wait_for
from test_sim_support import T0, random_trace, write_committed_trace

from lab.slurm.cluster import LocalSlurm, missing_binaries
from mirage_tasks import __version__
from mirage_tasks.data.times import iso
from stepkit import Step

ROOT = Path(__file__).resolve().parents[2]
NODES = 8

needs_slurm = pytest.mark.skipif(
    bool(missing_binaries()) or os.geteuid() != 0,
    reason=(
        f"Slurm not installed ({', '.join(missing_binaries())}; make system-deps installs slurmctld slurmd "
        "slurm-client munge)"
        if missing_binaries()
        else "the local Slurm's daemons run as root"
    ),
)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(5, days=6, nodes=NODES, rate_per_h=6.0))


def _committed(out: Path, step: str) -> dict[str, str]:
    """A committed output of other parameters in ``out``; returns {file: sha256} of everything there."""
    s = Step(step, str(out), __version__, {"earlier": True})
    s.write_json("earlier.json", {"kept": True})
    s.commit(summary={"earlier": True})
    return _digest(out)


def _digest(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name != "_LEASE.json"
    }


def _start(argv: list[str], package: str = "mirage_tasks") -> subprocess.Popen:
    """``python -m <package> <argv>``: a product step, or a lab command (``package="lab"``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-m", package, *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, deadline_s: float = 180) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        for p in tree(proc.pid)[::-1]:
            p.kill()
        proc.communicate()
        raise AssertionError(f"the step did not end within {deadline_s} s of the signal") from None
    return proc.returncode, err


def _slurm_jobs(cluster: LocalSlurm, prefix: str) -> int:
    try:
        r = cluster.cmd("squeue", "-h", "-o", "%j", check=False, timeout=10)
    except subprocess.SubprocessError:
        return 0
    return sum(1 for ln in r.stdout.split() if ln.startswith(prefix))


def _kill_and_check(proc: subprocess.Popen, cluster: LocalSlurm, sig: str, out: Path, before: dict, rng_seed: int):
    everything = tree(proc.pid)  # the step, its guard, munged, slurmctld and every slurmd (its children)
    assert len(everything) >= NODES + 3, [p.cmdline()[:2] for p in everything]
    if sig == "TERM":
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc, err = _finish(proc)
        took = time.monotonic() - t
        assert rc == 143, (rng_seed, err[-3000:])
        assert "terminated by SIGTERM" in err and "Traceback" not in err, err[-3000:]
        assert took < 60, f"stopping took {took:.0f} s (seed {rng_seed})"  # generous; it aims at 30 s
    else:  # SIGKILL outright (the kubelet at the end of the grace period, the OOM killer): no finally runs
        proc.kill()
        rc, err = _finish(proc)
        assert rc == -signal.SIGKILL
        # the guard, not the step, stopped the cluster (it writes to the step's stderr)
        assert "stepkit guard:" in err and "ended without stopping it" in err, err[-3000:]
    # nothing left: the step's tree, the daemons by their pid files, job steps of this root
    all_gone(everything, deadline_s=120)
    wait_for(
        lambda: not cluster.running() and not cluster.leftovers(),
        f"the cluster's daemons and job steps to be gone (seed {rng_seed})",
        deadline_s=120,
    )
    assert _digest(out) == before, f"the committed output changed (seed {rng_seed})"


@needs_slurm
@pytest.mark.parametrize("sig", ["TERM", "KILL"])
def test_replay_slurm_killed_at_a_random_point_leaves_nothing(trace, tmp_path, sig):
    out = tmp_path / "out"
    before = _committed(out, "replay-slurm")
    root = tmp_path / "slurm"
    cluster = LocalSlurm(root)
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    # two trace days at x600: about 290 s of submissions, cut short by the signal
    proc = _start(
        [
            "replay-slurm",
            "--trace",
            trace,
            "--from",
            iso(T0 + 2 * 86400),
            "--to",
            iso(T0 + 4 * 86400),
            "--factor",
            "600",
            "--slurm-root",
            str(root),
            "--out",
            str(out),
            "--nodes",
            str(NODES),
            "--cluster-config",
            "ls6",
        ],
        package="lab",
    )  # the lab's Slurm replay, on this harness
    try:
        wait_for(
            lambda: proc.poll() is not None or _slurm_jobs(cluster, "mr") >= 3,
            "the replay's first jobs in the queue",
            deadline_s=180,
        )
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(rng.uniform(0, 15))  # a random point of the submissions
        _kill_and_check(proc, cluster, sig, out, before, seed)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.stop()


@needs_slurm
@pytest.mark.parametrize("sig", ["TERM", "KILL"])
def test_keep_service_killed_at_a_random_point_leaves_nothing(trace, tmp_path, sig):
    out = tmp_path / "out"
    before = _committed(out, "keep-service")
    root = tmp_path / "slurm"
    cluster = LocalSlurm(root)
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    proc = _start(
        [
            "keeper-slurm",
            "--policy",
            "reactive,avg",
            "--node",
            "1",
            "--service-hours",
            "2",
            "--links",
            "5",
            "--factor",
            "120",
            "--slurm-root",
            str(root),
            "--trace",
            trace,
            "--background-from",
            iso(T0 + 2 * 86400),
            "--background-to",
            iso(T0 + 4 * 86400),
            "--stop-chain",
            "--out",
            str(out),
            "--nodes",
            str(NODES),
            "--cluster-config",
            "ls6",
        ],
        package="lab",
    )
    try:
        wait_for(
            lambda: proc.poll() is not None or (_slurm_jobs(cluster, "svc-") >= 2 and _slurm_jobs(cluster, "bg") >= 1),
            "the service chains and the background in the queue",
            deadline_s=180,
        )
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(rng.uniform(0, 15))
        _kill_and_check(proc, cluster, sig, out, before, seed)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.stop()


def test_calibrate_sigterm_mid_search_exits_143_and_leaves_the_committed_output(tmp_path):
    trace = write_committed_trace(tmp_path / "trace", random_trace(7, days=20, nodes=16))
    out = tmp_path / "out"
    before = _committed(out, "calibrate")
    seed = random.randrange(10**6)
    proc = _start(
        [
            "calibrate",
            "--trace",
            trace,
            "--calibrate-from",
            iso(T0 + 2 * 86400),
            "--calibrate-to",
            iso(T0 + 12 * 86400),
            "--score-from",
            iso(T0 + 12 * 86400),
            "--score-to",
            iso(T0 + 19 * 86400),
            "--trials",
            "1000",
            "--timeout-s",
            "0",
            "--out",
            str(out),
        ]
    )
    lines: list[str] = []
    # the search logs every trial on stderr: wait for a random number of them
    want = random.Random(seed).randint(1, 4)
    try:
        while sum("trial" in ln and "objective" in ln for ln in lines) < want:
            ln = proc.stderr.readline()
            assert ln or proc.poll() is None, "".join(lines)[-3000:]
            lines.append(ln)
        everything = tree(proc.pid)
        proc.send_signal(signal.SIGTERM)
        rc, err = _finish(proc, deadline_s=120)
        assert rc == 143, (seed, ("".join(lines) + err)[-3000:])
        assert "terminated by SIGTERM" in err and "Traceback" not in err, err[-3000:]
        all_gone(everything)
        assert _digest(out) == before
    finally:
        if proc.poll() is None:
            proc.kill()


def test_waitpred_sigterm_at_a_random_point_exits_143_and_leaves_the_committed_output(tmp_path):
    trace = write_committed_trace(tmp_path / "trace", random_trace(9, days=40, nodes=16, rate_per_h=8.0))
    out = tmp_path / "out"
    before = _committed(out, "waitpred")
    (tmp_path / "cfg.json").write_text('{"nodes": 16}')
    seed = random.randrange(10**6)
    proc = _start(
        [
            "waitpred",
            "--trace",
            trace,
            "--cluster-config",
            str(tmp_path / "cfg.json"),
            "--calibrate-from",
            iso(T0 + 86400)[:10],
            "--calibrate-to",
            "2023-12-01",  # T0: 2023-11-14
            "--months",
            "2023-12",
            "--out",
            str(out),
        ]
    )
    lines: list[str] = []
    try:
        while not any("the queue at each submission" in ln for ln in lines):
            ln = proc.stderr.readline()
            assert ln or proc.poll() is None, "".join(lines)[-3000:]
            lines.append(ln)
        time.sleep(random.Random(seed).uniform(0.0, 3.0))  # the sweep, or the models
        everything = tree(proc.pid)
        proc.send_signal(signal.SIGTERM)
        rc, err = _finish(proc, deadline_s=120)
        assert rc in (143, 0), (seed, ("".join(lines) + err)[-3000:])  # 0: it had finished first
        assert "Traceback" not in err, err[-3000:]
        all_gone(everything)
        assert not (out / "_LEASE.json").exists()
        if rc == 143:
            assert _digest(out) == before
    finally:
        if proc.poll() is None:
            proc.kill()
