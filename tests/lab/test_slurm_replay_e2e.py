"""``python -m lab replay-slurm`` and ``fidelity-slurm`` on a real local Slurm with accounting
(slurmdbd on a local MariaDB, started by LocalSlurm in a temporary root and stopped after). Skips
only where Slurm, slurmdbd or MariaDB is not installed (make system-deps installs them) or the
tests do not run as root."""

from __future__ import annotations

import os

import pytest
from conftest import REPO

from lab.slurm.cluster import LocalSlurm, missing_accounting, missing_binaries
from tests.mirage.test_sim_support import T0, frame, write_committed_trace

_missing = missing_binaries() + missing_accounting()
pytestmark = pytest.mark.skipif(
    bool(_missing) or os.geteuid() != 0,
    reason=(
        f"not installed: {', '.join(_missing)} (make system-deps installs Debian's slurmctld, slurmd, "
        "slurm-client, munge, slurmdbd and mariadb-server)"
        if _missing
        else "the local Slurm's daemons run as root"
    ),
)


def test_replay_slurm_with_accounting_holds_a_users_jobs_as_the_simulator_does(tmp_path):
    """``replay-slurm --accounting --slurm-root`` as a user runs it: user a's three jobs meet a
    running-jobs limit of 1 on an otherwise idle 4-node cluster, so Slurm runs them one after
    another beside b's; the comparison's simulator, given each job's user, agrees, and rescored
    without the limit (fidelity-slurm) it does not. At x600: about a minute of real time."""
    import json
    import subprocess
    import sys

    import pandas as pd

    from mirage_tasks.data.times import iso

    h = 3600
    rows = [
        {
            "submit": T0 + 600 + i,
            "start": T0 + 600 + i * h,
            "end": T0 + 600 + (i + 1) * h,
            "limit": 2 * h,
            "nodes": 1,
            "user": "a",
            "priority": 1000,
        }
        for i in range(3)
    ]
    rows.append(
        {
            "submit": T0 + 900,
            "start": T0 + 900,
            "end": T0 + 900 + h,
            "limit": 2 * h,
            "nodes": 1,
            "user": "b",
            "priority": 1000,
        }
    )
    trace = write_committed_trace(tmp_path / "trace", frame(rows))
    out, root = tmp_path / "replay", tmp_path / "slurm"
    cmd = [
        sys.executable,
        "-m",
        "lab",
        "replay-slurm",
        "--trace",
        trace,
        "--from",
        iso(T0),
        "--to",
        iso(T0 + h),
        "--factor",
        "600",
        "--out",
        f"file://{out}",
        "--slurm-root",
        str(root),
        "--accounting",
        "--nodes",
        "4",
        "--max-jobs-per-user",
        "1",
        "--drain",
        "120",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    doc = json.loads((out / "replay.json").read_text())
    assert doc["accounting"] is True
    assert not any("per-user limits" in n for n in doc["not_enforced_by_slurm"])
    jobs = pd.read_parquet(out / "jobs.parquet").set_index("trace_job_id")
    wait_h = (jobs["start_t"] - jobs["submit_t"]) / h
    a = jobs.index[jobs["user"] == 0]
    assert sorted(wait_h[a].round()) == [0.0, 1.0, 2.0], wait_h  # one at a time (each runs 1 h)
    assert wait_h[jobs.index[jobs["user"] == 1]].max() < 0.2  # b's job did not wait behind a's
    c = doc["comparison"]
    assert c["compared"] == 4 and c["sim_vs_slurm"]["within_1h"] == 1.0, c
    assert c["sim_config"]["max_jobs_per_user"] == 1
    # the same replay scored with a simulator that has no limit: a's jobs start at once there
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab",
            "fidelity-slurm",
            "--replay",
            f"file://{out}",
            "--out",
            f"file://{tmp_path / 'nolimit'}",
            "--max-jobs-per-user",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    c0 = json.loads((tmp_path / "nolimit" / "fidelity_slurm.json").read_text())["comparison"]
    assert c0["sim_vs_slurm"]["within_1h"] < 1.0 and c0["start_error_h"]["max"] > 1.5, c0
    assert not LocalSlurm(root).running() and LocalSlurm(root).leftovers() == []
