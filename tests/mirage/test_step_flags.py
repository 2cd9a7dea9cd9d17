"""The flags every step shares (``stepkit.cli`` and ``mirage_tasks.data.times``' checks): a type, a
range and a bound on the work asked for, checked before anything is started or written: exit 2,
a message naming the flag, no output folder. Seeds out of range, non-numeric node lists, zero or
negative sizes, an output that cannot be a folder, and property tests over random numbers for
every bounded flag. A step's own bad inputs are with that step's tests (test_calibration.py,
test_fidelity.py, test_synth.py, test_ingest.py, test_sampling.py, test_train.py,
test_slurm_units.py, test_runconf.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from step_cli import DAY, SPAN_DAYS, refused, run_step, trace  # noqa: F401 (trace: a fixture)
from test_sim_support import T0

from mirage_tasks.__main__ import STEPS
from mirage_tasks.data.times import iso, window_outside_trace
from stepkit.cli import SEED_MAX

# ----------------------------------------------------------------------- windows outside the trace


def test_the_shared_window_check():
    first, last = T0, T0 + 5 * DAY + 100
    assert window_outside_trace(first, last, T0 + DAY, T0 + 2 * DAY, "--w") is None
    newest_day_end = ((T0 + 5 * DAY + 100) // DAY + 1) * DAY
    assert window_outside_trace(first, last, T0, newest_day_end, "--w") is None  # the newest day is allowed
    assert "past the trace" in window_outside_trace(first, last, T0, newest_day_end + 1, "--w")
    assert "ends before" in window_outside_trace(first, last, T0 - 9 * DAY, T0, "--w")
    assert "empty" in window_outside_trace(first, last, T0 + DAY, T0 + DAY, "--w")


# ----------------------------------------------------------------------- seeds, sizes, lists, work


@pytest.mark.parametrize("seed", [-1, SEED_MAX + 1, 2**70])
def test_seeds_out_of_range_exit_2_naming_the_flag(trace, tmp_path, capsys, seed):
    out = tmp_path / "s"
    refused(
        capsys,
        out,
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2024-01-01",
        "--to",
        "2024-01-02",
        "--seed",
        seed,
        "--out",
        out,
        names="--seed",
    )
    refused(
        capsys,
        out,
        "calibrate",
        "--trace",
        trace,
        "--calibrate-from",
        iso(T0 + DAY),
        "--calibrate-to",
        iso(T0 + 3 * DAY),
        "--score-from",
        iso(T0 + 3 * DAY),
        "--score-to",
        iso(T0 + 5 * DAY),
        "--seed",
        seed,
        "--out",
        out,
        names="--seed",
    )


@pytest.mark.parametrize("nodes", ["8,x", "8,-2", "8,0", "1.5", "8,,nan"])
def test_non_numeric_or_non_positive_node_lists_exit_2(trace, tmp_path, capsys, nodes):
    out = tmp_path / "f"
    refused(
        capsys,
        out,
        "fidelity",
        "--trace",
        trace,
        "--from",
        iso(T0 + DAY),
        "--to",
        iso(T0 + 2 * DAY),
        "--nodes",
        "8",
        "--sweep-nodes",
        nodes,
        "--out",
        out,
        names="--sweep-nodes",
    )


@pytest.mark.parametrize(
    "step,argv,flag",
    [
        ("keep-service", ["--policy", "reactive", "--links", "1000000000"], "--links"),
        ("keep-service", ["--policy", "reactive", "--service-hours", "1e9"], "--service-hours"),
        ("keep-service", ["--policy", "reactive", "--service-hours", "0"], "--service-hours"),
        ("keep-service", ["--policy", "reactive", "--node", "0"], "--node"),
        ("keep-service", ["--policy", "reactive", "--node", "-3"], "--node"),
        ("keep-service", ["--policy", "reactive", "--step-s", "-1"], "--step-s"),
        (
            "calibrate",
            [
                "--trace",
                "T",
                "--calibrate-from",
                "a",
                "--calibrate-to",
                "b",
                "--score-from",
                "c",
                "--score-to",
                "d",
                "--trials",
                "0",
            ],
            "--trials",
        ),
        (
            "calibrate",
            [
                "--trace",
                "T",
                "--calibrate-from",
                "a",
                "--calibrate-to",
                "b",
                "--score-from",
                "c",
                "--score-to",
                "d",
                "--trials",
                "10000000",
            ],
            "--trials",
        ),
        ("fidelity", ["--trace", "T", "--from", "a", "--to", "b", "--episode-days", "-1"], "--episode-days"),
        ("ingest", ["--trace", "T", "--cluster-nodes", "-16"], "--cluster-nodes"),
        ("ingest", ["--trace", "T", "--cluster-nodes", "0"], "--cluster-nodes"),
        ("metrics", ["--in", "X", "--bootstrap", "1000000000"], "--bootstrap"),
    ],
)
def test_zero_negative_and_unbounded_sizes_exit_2_naming_the_flag(tmp_path, capsys, step, argv, flag):
    out = tmp_path / "o"
    refused(capsys, out, step, *argv, "--out", out, names=flag)


# ----------------------------------------------------------------------- profile values


# ----------------------------------------------------------------------- a count line that disagrees


# ----------------------------------------------------------------------- property tests


_numbers = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=st.sampled_from(["keep-service", "calibrate", "fidelity", "metrics", "report"]), data=st.data())
def test_any_number_for_a_bounded_flag_is_taken_or_refused_naming_it(step, data):
    """Every flag in a newer step's BOUNDS, given any int or float: either inside its range or
    exit 2 naming the flag, before the step reads its inputs (none of them exist here)."""
    import importlib

    from stepkit import StepError
    from stepkit.cli import check_flag_values

    module = importlib.import_module(STEPS[step][0])
    dest = data.draw(st.sampled_from(sorted(module.BOUNDS)))
    value = data.draw(_numbers)
    lo, hi = module.BOUNDS[dest]
    import argparse
    import math

    ns = argparse.Namespace(**{dest: value})
    ok = (
        (not isinstance(value, float) or math.isfinite(value))
        and (lo is None or value >= lo)
        and (hi is None or value <= hi)
    )
    if ok:
        check_flag_values(ns, module.BOUNDS)
    else:
        with pytest.raises(StepError, match="--" + dest.replace("_", "-")):
            check_flag_values(ns, module.BOUNDS)


# ----------------------------------------------------------------------- the wrong kind of input


@pytest.mark.parametrize(
    "step,argv",
    [
        ("synth", ["--profile", "ls6-a100", "--from", "2024-01-01", "--to", "2024-01-02"]),
        ("keep-service", ["--policy", "reactive", "--nodes", "8"]),
    ],
)
def test_an_out_that_cannot_be_created_exits_2_naming_it(tmp_path, capsys, step, argv):
    """Not a permission error (the tests run as root) nor a file in the way: /proc refuses new
    folders with ENOENT, which gave a FileNotFoundError traceback (exit 1)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("# a cluster's slurm.conf\n")
    if step == "keep-service":
        argv = [*argv, "--slurm-conf", str(conf)]
    rc, err = run_step(capsys, step, *argv, "--out", "/proc/no-such-folder/out")
    assert rc == 2 and "output /proc/no-such-folder/out: cannot create or use it as a folder" in err, err[-2000:]
    assert "Traceback" not in err
