"""The measurement flags of ``python -m lab keeper-slurm`` (the product's keep-service on a local
Slurm of its own, over a replayed background) are checked before anything is started or written:
exit 2, a message naming the flag, no output folder, no cluster folder. (The product step's own
flags: tests/mirage/test_step_flags.py.)"""

from __future__ import annotations

import pytest

from lab.__main__ import STEPS
from mirage_tasks.data.times import iso
from stepkit.cli import main
from tests.mirage.test_sim_support import T0, random_trace, write_committed_trace

DAY = 86400


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(3, days=6, nodes=8))


def _refused(capsys, out, *argv, names: str) -> str:
    rc = main("lab", STEPS, [str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err[-2000:]
    assert names in err and "Traceback" not in err, err[-2000:]
    assert not out.exists(), "a refused run left its output folder"
    return err


def test_keep_service_windows_outside_the_trace_exit_2(trace, tmp_path, capsys):
    """(replay-slurm's: tests/lab/test_slurm_replay_bad_inputs.py)"""
    out = tmp_path / "r"
    _refused(
        capsys,
        out,
        "keeper-slurm",
        "--policy",
        "reactive",
        "--trace",
        trace,
        "--slurm-root",
        tmp_path / "slurm",
        "--background-from",
        iso(T0 + 50 * DAY),
        "--background-to",
        iso(T0 + 51 * DAY),
        "--nodes",
        "8",
        "--out",
        out,
        names="--background-from/--background-to",
    )


def test_keep_service_with_more_service_nodes_at_once_than_the_cluster_has_exits_2(trace, tmp_path, capsys):
    """2 policies x 5 chains of 1 node on 8 nodes: refused before a cluster starts, naming the
    flags."""
    out = tmp_path / "k"
    _refused(
        capsys,
        out,
        "keeper-slurm",
        "--policy",
        "reactive,avg",
        "--chains",
        "5",
        "--trace",
        trace,
        "--slurm-root",
        tmp_path / "slurm",
        "--background-from",
        iso(T0 + DAY),
        "--background-to",
        iso(T0 + 2 * DAY),
        "--nodes",
        "8",
        "--out",
        out,
        names="--chains",
    )
    assert not (tmp_path / "slurm").exists()


def test_an_existing_file_as_slurm_root_exits_2(trace, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "keeper-slurm",
        "--policy",
        "reactive",
        "--nodes",
        "8",
        "--slurm-root",
        f,
        "--out",
        out,
        names="--slurm-root",
    )


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--chains", "0"], "--chains"),
        (["--stagger-hours", "-1"], "--stagger-hours"),
        (["--late-nodes", "-1"], "--late-nodes"),
    ],
)
def test_zero_or_negative_measurement_sizes_exit_2_naming_the_flag(tmp_path, capsys, argv, flag):
    out = tmp_path / "o"
    _refused(capsys, out, "keeper-slurm", "--policy", "reactive", *argv, "--out", out, names=flag)


def test_more_nodes_than_a_local_slurm_is_refused(tmp_path, capsys):
    """The ls6 preset's 84 nodes are fine for the simulator, 5000 slurmd are not a local cluster."""
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "keeper-slurm",
        "--policy",
        "reactive",
        "--nodes",
        "5000",
        "--slurm-root",
        tmp_path / "slurm",
        "--out",
        out,
        names="--slurm-root",
    )
    assert not (tmp_path / "slurm").exists()
