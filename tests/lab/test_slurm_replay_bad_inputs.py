"""``python -m lab replay-slurm`` checks every flag before it starts a cluster or writes anything
(the step contract the product's steps keep, tests/mirage/test_step_flags.py): exit 2,
a message naming the flag, no output folder and no cluster root."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from lab.__main__ import STEPS
from mirage_tasks.data.times import iso
from stepkit.cli import main
from tests.mirage.test_sim_support import T0, random_trace, write_committed_trace

DAY = 86400
#: the random trace's submits span about T0 .. T0 + 6 days
SPAN_DAYS = 6


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(3, days=SPAN_DAYS, nodes=8))


def _refused(capsys, out, *argv, names: str) -> str:
    rc = main("lab", STEPS, [str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err[-2000:]
    assert names in err and "Traceback" not in err, err[-2000:]
    assert not out.exists(), "a refused run left its output folder"
    return err


def test_a_window_outside_the_trace_exits_2_before_a_cluster_starts(trace, tmp_path, capsys):
    out = tmp_path / "r"
    _refused(
        capsys,
        out,
        "replay-slurm",
        "--trace",
        trace,
        "--from",
        iso(T0 + 50 * DAY),
        "--to",
        iso(T0 + 51 * DAY),
        "--factor",
        "60",
        "--nodes",
        "8",
        "--slurm-root",
        tmp_path / "slurm",
        "--out",
        out,
        names="--from/--to",
    )
    assert not (tmp_path / "slurm").exists()


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["--factor", "0"], "--factor"),
        (["--factor", "60", "--drain", "-5"], "--drain"),
    ],
)
def test_zero_and_negative_sizes_exit_2_naming_the_flag(tmp_path, capsys, argv, flag):
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "replay-slurm",
        "--trace",
        "T",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
        *argv,
        "--out",
        out,
        names=flag,
    )


def test_an_existing_file_as_slurm_root_exits_2(trace, tmp_path, capsys):
    f = tmp_path / "a-file"
    f.write_text("x")
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "replay-slurm",
        "--trace",
        trace,
        "--from",
        iso(T0 + DAY),
        "--to",
        iso(T0 + 2 * DAY),
        "--factor",
        "600",
        "--nodes",
        "8",
        "--slurm-root",
        f,
        "--out",
        out,
        names="--slurm-root",
    )


def test_a_replay_of_weeks_at_x1_is_refused_as_unbounded_work(trace, tmp_path, capsys):
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "replay-slurm",
        "--trace",
        trace,
        "--from",
        iso(T0),
        "--to",
        iso(T0 + SPAN_DAYS * DAY),
        "--factor",
        "0.5",
        "--nodes",
        "8",
        "--slurm-root",
        tmp_path / "slurm",
        "--out",
        out,
        names="--from/--to/--factor",
    )
    assert not (tmp_path / "slurm").exists()


def test_a_missing_slurm_conf_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """A Slurm client retries a missing slurm.conf for 60 s per call."""
    out = tmp_path / "o"
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))
    _refused(
        capsys,
        out,
        "replay-slurm",
        "--trace",
        "T",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
        "--factor",
        "60",
        "--out",
        out,
        names="SLURM_CONF=",
    )


def test_a_cluster_size_beyond_a_local_slurm_is_refused(trace, tmp_path, capsys):
    """The ls6 preset's 84 nodes are fine for the simulator; 5000 slurmd are not a local cluster."""
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "replay-slurm",
        "--trace",
        trace,
        "--from",
        iso(T0 + DAY),
        "--to",
        iso(T0 + 2 * DAY),
        "--factor",
        "600",
        "--nodes",
        "5000",
        "--slurm-root",
        tmp_path / "slurm",
        "--out",
        out,
        names="--slurm-root",
    )
    assert not (tmp_path / "slurm").exists()


_numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_number_for_a_bounded_flag_is_taken_or_refused_naming_it(data):
    """Every flag in replay-slurm's BOUNDS, given any int or float: inside its range, or a StepError
    naming the flag (exit 2), before the step reads its inputs."""
    import argparse
    import math

    from lab.slurm import replay_slurm
    from stepkit import StepError
    from stepkit.cli import check_flag_values

    dest = data.draw(st.sampled_from(sorted(replay_slurm.BOUNDS)))
    value = data.draw(_numbers)
    lo, hi = replay_slurm.BOUNDS[dest]
    ns = argparse.Namespace(**{dest: value})
    ok = (
        (not isinstance(value, float) or math.isfinite(value))
        and (lo is None or value >= lo)
        and (hi is None or value <= hi)
    )
    if ok:
        check_flag_values(ns, replay_slurm.BOUNDS)
    else:
        with pytest.raises(StepError, match="--" + dest.replace("_", "-")):
            check_flag_values(ns, replay_slurm.BOUNDS)
