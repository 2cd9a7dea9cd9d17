"""Every flag of the newer steps has a type, a range and a bound on the work it asks for, checked before anything is started or written: exit 2, a message naming
the flag, no output folder. One test per class of the held-out cases (windows outside the
trace, seeds out of range, non-numeric node lists, zero or negative sizes, an existing file as
a folder, an unbounded amount of work, unchecked profile values, a header count that
disagrees with the rows), and property tests over random windows and random numbers."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_sim_support import T0, random_trace, write_committed_trace

from mirage_tasks.__main__ import STEPS
from mirage_tasks.data.times import iso, window_outside_trace
from stepkit.cli import SEED_MAX, main

DAY = 86400
#: the random trace's submits span about T0 .. T0 + 6 days
SPAN_DAYS = 6


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(3, days=SPAN_DAYS, nodes=8))


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main("mirage_tasks", STEPS, [str(a) for a in argv])
    return rc, capsys.readouterr().err


def _refused(capsys, out, *argv, names: str) -> str:
    rc, err = _run(capsys, *argv)
    assert rc == 2, err[-2000:]
    assert names in err and "Traceback" not in err, err[-2000:]
    assert not out.exists(), "a refused run left its output folder"
    return err


# ----------------------------------------------------------------------- windows outside the trace


def test_calibrate_windows_outside_the_trace_exit_2_naming_the_flags(trace, tmp_path, capsys):
    out = tmp_path / "cal"
    past = [
        "--calibrate-from",
        iso(T0 + DAY),
        "--calibrate-to",
        iso(T0 + 3 * DAY),
        "--score-from",
        iso(T0 + 3 * DAY),
        "--score-to",
        iso(T0 + 40 * DAY),
    ]
    err = _refused(capsys, out, "calibrate", "--trace", trace, *past, "--out", out, names="--score-from/--score-to")
    assert "past the trace's last submit" in err
    before = [
        "--calibrate-from",
        iso(T0 - 90 * DAY),
        "--calibrate-to",
        iso(T0 - 60 * DAY),
        "--score-from",
        iso(T0 + DAY),
        "--score-to",
        iso(T0 + 3 * DAY),
    ]
    err = _refused(
        capsys, out, "calibrate", "--trace", trace, *before, "--out", out, names="--calibrate-from/--calibrate-to"
    )
    assert "ends before the trace begins" in err


def test_fidelity_window_37_days_past_the_last_submit_exits_2(trace, tmp_path, capsys):
    out = tmp_path / "fid"
    _refused(
        capsys,
        out,
        "fidelity",
        "--trace",
        trace,
        "--from",
        iso(T0 + (SPAN_DAYS + 30) * DAY),
        "--to",
        iso(T0 + (SPAN_DAYS + 37) * DAY),
        "--nodes",
        "8",
        "--out",
        out,
        names="--from/--to",
    )


def test_keep_service_refuses_a_policy_named_twice(tmp_path, capsys):
    """(more chains of one rule: the lab's keeper-slurm --chains, tests/lab/test_keeper_slurm_bad_inputs.py)"""
    out = tmp_path / "k"
    _refused(capsys, out, "keep-service", "--policy", "reactive,reactive", "--out", out, names="--chains")


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
    _refused(
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
    _refused(
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
    _refused(
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
    _refused(capsys, out, step, *argv, "--out", out, names=flag)


def test_a_100_year_synth_window_is_refused_at_once(tmp_path, capsys):
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2000-01-01",
        "--to",
        "2100-01-01",
        "--out",
        out,
        names="--from",
    )
    # ten years at x1000: the span is allowed, the expected number of jobs is not
    _refused(
        capsys,
        out,
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2000-01-01",
        "--to",
        "2009-01-01",
        "--load-scale",
        "1000",
        "--out",
        out,
        names="--load-scale",
    )


# ----------------------------------------------------------------------- profile values


def _profile(tmp_path, edit) -> str:
    from importlib import resources

    from mirage_tasks.data.synth import PACKAGED

    doc = json.loads(resources.files("mirage_tasks.data.profiles").joinpath(PACKAGED["ls6-a100"]).read_text())
    edit(doc)
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize(
    "key,edit",
    [
        ("machine_nodes", lambda d: d.update(machine_nodes=-4)),
        ("machine_nodes", lambda d: d.update(machine_nodes=2.5)),
        ("batch_gap_s", lambda d: d.update(batch_gap_s=-1)),
        ("shape_nodes_limit_counts", lambda d: d["shape_nodes_limit_counts"][0].__setitem__(0, 1.5)),
        ("shape_nodes_limit_counts", lambda d: d["shape_nodes_limit_counts"][0].__setitem__(1, 0)),
        ("arrivals.batch_size_pmf", lambda d: d["arrivals"]["batch_size_pmf"][0].__setitem__(0, 2.5)),
        (
            "arrivals.batch_rate_per_hour_of_week",
            lambda d: d["arrivals"]["batch_rate_per_hour_of_week"].__setitem__(0, 1e12),
        ),
        ("arrivals.intra_batch_gap_quantiles_s", lambda d: d["arrivals"]["intra_batch_gap_quantiles_s"].reverse()),
        (
            "runtime_by_limit_class.0.ratio_quantiles",
            lambda d: d["runtime_by_limit_class"]["0"].__setitem__(
                "ratio_quantiles", [2.0] * len(d["runtime_by_limit_class"]["0"]["ratio_quantiles"])
            ),
        ),
    ],
)
def test_profile_values_are_checked_in_profile_mode(tmp_path, capsys, key, edit):
    out = tmp_path / "o"
    prof = _profile(tmp_path, edit)
    _refused(
        capsys, out, "synth", "--profile", prof, "--from", "2024-01-01", "--to", "2024-01-03", "--out", out, names=key
    )


def test_the_packaged_profile_still_generates(tmp_path, capsys):
    rc, err = _run(
        capsys, "synth", "--profile", "ls6-a100", "--from", "2024-01-01", "--to", "2024-01-03", "--out", tmp_path / "o"
    )
    assert rc == 0, err[-2000:]


# ----------------------------------------------------------------------- a count line that disagrees


def test_a_swf_header_count_that_disagrees_with_the_rows_is_said_and_recorded(tmp_path, capsys):
    lines = ["; MaxJobs: 5", "; MaxRecords: 5", "; MaxNodes: 4", "; MaxProcs: 4", "; UnixStartTime: 1700000000"]
    for i in range(1, 4):  # 3 rows where the header promises 5
        lines.append(f"{i} {i * 100} 10 50 1 -1 -1 1 100 -1 1 1 1 1 1 1 -1 -1")
    src = tmp_path / "log.swf.gz"
    src.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    out = tmp_path / "t"
    rc = main("mirage_tasks", STEPS, ["ingest", "--trace", str(src), "--out", str(out)])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-2000:]
    assert "says 5 records, the file has 3" in cap.out + cap.err
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["header_count_mismatch"] == {"header_expects": 5, "rows_read": 3}


# ----------------------------------------------------------------------- property tests


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(a=st.integers(-400, 400), length=st.integers(-3, 400))
def test_any_fidelity_window_is_scored_or_refused_naming_the_window(trace, tmp_path_factory, a, length):
    """Random windows, inside, around and far outside the trace: exit 0 or exit 2 naming the
    window, never a traceback (the class that gave an IndexError in calibrate)."""
    out = tmp_path_factory.mktemp("fid") / "o"
    t0 = T0 + a * DAY // 4
    rc = main(
        "mirage_tasks",
        STEPS,
        [
            "fidelity",
            "--trace",
            trace,
            "--from",
            iso(t0),
            "--to",
            iso(t0 + length * DAY // 4),
            "--nodes",
            "8",
            "--compare",
            "--out",
            str(out),
            "--log-level",
            "ERROR",
        ],
    )
    assert rc in (0, 2)
    if rc == 2:
        assert not out.exists()


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


def test_a_sample_output_where_a_dataset_is_expected_exits_2_naming_the_flag(tmp_path, capsys):
    from mirage_tasks import __version__
    from stepkit import Step

    samples = tmp_path / "samples"
    s = Step("sample", str(samples), __version__, {"fake": True})
    s.write_json("shard.json", {})
    s.commit()
    out = tmp_path / "o"
    err = _refused(capsys, out, "train", "--model", "xgboost", "--dataset", samples, "--out", out, names="--dataset")
    assert "not a merge output" in err


@pytest.mark.parametrize(
    "conf,name",
    [
        ({"train_count": 10**9}, "train_count"),
        ({"val_count": 10**9}, "val_count"),
        ({"workload_days": 1e6}, "workload_days"),
        ({"probes": 10**6}, "probes"),
        ({"node_sizes": list(range(1, 40))}, "node_sizes"),
        ({"seed": 2**40}, "seed"),
    ],
)
def test_the_pipeline_forms_bound_the_work_a_run_asks_for(conf, name):
    from mirage_tasks.run.runconf import MirageRun

    with pytest.raises(ValueError, match=f"param {name}"):
        MirageRun.from_params(conf)


def test_calibrate_with_a_month_before_the_trace_runs_instead_of_an_index_error(trace, tmp_path, capsys):
    """The calibration window's first month holds no job (it starts 20 days before the trace):
    its replay is empty, which raised IndexError in calibration/fidelity.py."""
    rc, err = _run(
        capsys,
        "calibrate",
        "--trace",
        trace,
        "--calibrate-from",
        iso(T0 - 20 * DAY),
        "--calibrate-to",
        iso(T0 + DAY),
        "--score-from",
        iso(T0 + 3 * DAY),
        "--score-to",
        iso(T0 + 4 * DAY),
        "--trials",
        "2",
        "--out",
        tmp_path / "o",
        "--log-level",
        "ERROR",
    )
    assert rc == 0, err[-3000:]


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(a=st.integers(-60, 30), la=st.integers(-1, 40), gap=st.integers(0, 20), lc=st.integers(-1, 40))
def test_any_calibrate_windows_are_calibrated_or_refused(trace, tmp_path_factory, a, la, gap, lc):
    """Random calibration and scoring windows (quarter days) around and outside the trace:
    exit 0 or 2, never a traceback."""
    out = tmp_path_factory.mktemp("cal") / "o"
    t = [
        T0 + a * DAY // 4,
        T0 + (a + la) * DAY // 4,
        T0 + (a + la + gap) * DAY // 4,
        T0 + (a + la + gap + lc) * DAY // 4,
    ]
    rc = main(
        "mirage_tasks",
        STEPS,
        [
            "calibrate",
            "--trace",
            trace,
            "--calibrate-from",
            iso(t[0]),
            "--calibrate-to",
            iso(t[1]),
            "--score-from",
            iso(t[2]),
            "--score-to",
            iso(t[3]),
            "--trials",
            "1",
            "--out",
            str(out),
            "--log-level",
            "ERROR",
        ],
    )
    assert rc in (0, 2)


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
    rc, err = _run(capsys, step, *argv, "--out", "/proc/no-such-folder/out")
    assert rc == 2 and "output /proc/no-such-folder/out: cannot create or use it as a folder" in err, err[-2000:]
    assert "Traceback" not in err


def test_a_missing_slurm_conf_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """A Slurm client retries a missing slurm.conf for 60 s per call: keep-service sat silent."""
    out = tmp_path / "o"
    _refused(
        capsys,
        out,
        "keep-service",
        "--policy",
        "reactive",
        "--slurm-conf",
        tmp_path / "none.conf",
        "--out",
        out,
        names="--slurm-conf",
    )
    _refused(capsys, out, "keep-service", "--policy", "reactive", "--out", out, names="no cluster")


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    start_day=st.integers(-40_000, 40_000),
    days=st.one_of(st.integers(-5, 30), st.integers(36_610, 600_000)),
    load=st.one_of(st.floats(-10, 50), st.sampled_from([float("nan"), float("inf"), 1e4])),
    seed=st.integers(-5, 2**33),
)
def test_any_synth_request_generates_or_is_refused_quickly(tmp_path_factory, start_day, days, load, seed):
    """Random spans (up to three days, or more than ten years up to 160), load scales and seeds
    for ``synth --profile``: exit 0 or exit 2, never a traceback; a refusal comes before anything
    is generated (within seconds, nothing written)."""
    import time

    out = tmp_path_factory.mktemp("synth") / "o"
    a = T0 + start_day * DAY // 10
    t = time.monotonic()
    rc = main(
        "mirage_tasks",
        STEPS,
        [
            "synth",
            "--profile",
            "ls6-a100",
            "--from",
            iso(max(a, 0)),
            "--to",
            iso(max(a, 0) + days * DAY // 10),
            "--load-scale",
            str(load),
            "--seed",
            str(seed),
            "--out",
            str(out),
            "--log-level",
            "ERROR",
        ],
    )
    assert rc in (0, 2)
    if rc == 2:
        assert not out.exists()
        assert time.monotonic() - t < 60


def test_a_cluster_size_beyond_any_machine_or_a_local_slurm_is_refused(trace, tmp_path, capsys):
    out = tmp_path / "o"
    _refused(
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
        "10000000000",
        "--out",
        out,
        names="--nodes",
    )


def test_jobs_larger_than_the_cluster_are_said_when_sampled(tmp_path, capsys):
    """The simulator leaves out jobs larger than the cluster: sample says so, with the count and
    the largest size, instead of sampling without them silently."""
    tr = write_committed_trace(tmp_path / "t", random_trace(4, days=8, nodes=16))
    rc, err = _run(
        capsys,
        "sample",
        "--trace",
        tr,
        "--start",
        iso(T0 + DAY),
        "--count",
        "1",
        "--probes",
        "2",
        "--window",
        "12",
        "--node",
        "1",
        "--nodes",
        "2",
        "--workers",
        "1",
        "--out",
        tmp_path / "s",
    )
    assert rc == 0, err[-2000:]
    assert "more nodes than the 2-node cluster" in err and "leaves them out of every sample" in err, err[-2000:]
