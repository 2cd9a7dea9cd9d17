"""``python -m lab keeper-slurm``: the product's keep-service run with the lab's measurement around
it. Without a Slurm here, the session is replaced where it would start keeping: what reaches it
(the product's keeper arguments, the background replay plan, the chains) and the step's
parameters are checked. (On a real local Slurm: tests/mirage/test_slurm_e2e.py.)"""

from __future__ import annotations

import argparse

import pytest

from lab.slurm import keeper_slurm
from mirage_tasks.data.times import iso
from tests.mirage.test_sim_support import T0, random_trace, write_committed_trace

DAY = 86400


class _Started(Exception):
    pass


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(3, days=6, nodes=8))


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    keeper_slurm.add_arguments(p)
    return p.parse_args(argv)


def test_a_background_on_a_real_cluster_reaches_the_measured_session(trace, tmp_path, monkeypatch):
    seen = {}

    def run(self, deadline_s):
        seen["session"], seen["deadline_s"] = self, deadline_s
        raise _Started

    monkeypatch.setattr(keeper_slurm.MeasuredSession, "run", run)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    argv = [
        "--policy",
        "reactive,avg",
        "--slurm-conf",
        str(conf),
        "--trace",
        trace,
        "--background-from",
        iso(T0 + DAY),
        "--background-to",
        iso(T0 + 2 * DAY),
        "--nodes",
        "8",
        "--chains",
        "2",
        "--stagger-hours",
        "6",
        "--account",
        "acct",
        "--out",
        str(tmp_path / "o"),
    ]
    with pytest.raises(_Started):
        keeper_slurm.run(_parse(argv))
    s = seen["session"]
    assert s.policies == ["reactive", "avg"] and s.chains == 2 and s.stagger_s == 6 * 3600
    assert s.background is not None and len(s.background) and s.t0 == T0 + DAY
    assert s.env["SLURM_CONF"] == str(conf) and s.jobcomp is None and not s.owns_cluster
    assert s.keeper["account"] == "acct" and s.keeper["node"] == 1 and s.keeper["scale"] == 1.0
    assert not (tmp_path / "o" / "_SUCCESS.json").exists()


def test_its_flags_at_their_defaults_leave_the_steps_parameters_as_before(tmp_path):
    m = keeper_slurm.LocalMeasurement(_parse(["--policy", "reactive", "--out", str(tmp_path / "o")]))
    moved = {"policy": "reactive", "accounting": False, "chains": 1, "stagger_hours": 0.0, "offset_hours": 0.0}
    moved["late_nodes"] = 0
    m.params(moved)
    assert moved == {"policy": "reactive"}
    kept = {"chains": 3, "late_nodes": 2, "accounting": True}
    m.params(kept)
    assert kept == {"chains": 3, "late_nodes": 2, "accounting": True}
