"""Bad input is exit 2 with a message naming the file/line/flag, never exit 1, never silent.

Trace rows that cannot be used are rejected with their line and reason: with
``--max-bad-rows 0`` the file is refused (exit 2, nothing written); with the default
they are counted as rejected in ``ingest_report.json`` and left out of the trace.
"""

from __future__ import annotations

import argparse
import json

import pytest

from mirage_tasks.__main__ import STEPS as MIRAGE_STEPS
from stepkit import MARKER, StepError
from stepkit.cli import main

SWF_HEADER = "; UnixStartTime: 1672531200\n; MaxNodes: 64\n; MaxProcs: 64\n"
SWF_GOOD = "1 0 10 100 2 -1 -1 2 3600 -1 1 3 1 -1 1 1 -1 -1\n2 60 10 100 4 -1 -1 4 3600 -1 1 4 1 -1 1 1 -1 -1\n"
SACCT_HEADER = "JobID|Submit|Start|End|Timelimit|NNodes|State\n"
SACCT_GOOD = (
    "1|2023-01-01T00:00:00|2023-01-01T00:01:00|2023-01-01T01:00:00|01:00:00|2|COMPLETED\n"
    "2|2023-01-01T00:00:00|2023-01-01T00:02:00|2023-01-01T02:00:00|02:00:00|1|COMPLETED\n"
)


def _swf_row(job="3", submit="120", limit="3600"):
    return f"{job} {submit} 10 100 2 -1 -1 2 {limit} -1 1 3 1 -1 1 1 -1 -1\n"


def _sacct_row(job="3", limit="01:00:00", nodes="2"):
    return f"{job}|2023-01-01T00:00:00|2023-01-01T00:03:00|2023-01-01T01:00:00|{limit}|{nodes}|COMPLETED\n"


def ingest(tmp_path, text, *extra, name="trace.txt"):
    trace = tmp_path / name
    trace.write_text(text)
    out = tmp_path / "out"
    rc = main("mirage_tasks", MIRAGE_STEPS, ["ingest", "--trace", str(trace), "--out", str(out), *extra])
    return rc, trace, out


SWF_CASES = {
    "nan submit": (_swf_row(submit="nan"), "submit time nan"),
    "1e300 submit": (_swf_row(submit="1e300"), "submit time 1e+300"),
    "all -1": (" ".join(["-1"] * 18) + "\n", "job number -1"),
    "inf job id": (_swf_row(job="inf"), "job number inf"),
    "submit -1e12": (_swf_row(submit="-1e12"), "submit time -1e+12 is negative"),
    "duplicate job id": (_swf_row(job="2"), "duplicate job number 2"),
    "inf time limit": (_swf_row(limit="inf"), "requested time inf"),
    "1e15 s time limit": (_swf_row(limit="1e15"), "requested time 1e+15 s is out of range"),
    "1e12 processors": ("3 120 10 100 1e12 -1 -1 2 3600 -1 1 3 1 -1 1 1 -1 -1\n", "allocated processors 1e+12"),
}
SACCT_CASES = {
    # a text field is described, never quoted (the file may be anything: tests/test_reach.py)
    "Timelimit abc": (_sacct_row(limit="abc"), "Timelimit (3 characters) is not a Slurm duration"),
    "NNodes 0": (_sacct_row(nodes="0"), "NNodes 0 is not a positive count"),
    "NNodes -4": (_sacct_row(nodes="-4"), "NNodes -4 is not a positive count"),
    "duplicate JobID": (_sacct_row(job="1"), "duplicate JobID (that of line 2)"),
}
BAD_LINE = {"swf": 6, "sacct": 4}  # the bad row is the last line of each file


@pytest.mark.parametrize("case", SWF_CASES)
def test_swf_bad_row_strict_exits_2_naming_the_line(tmp_path, capsys, case):
    row, reason = SWF_CASES[case]
    rc, trace, out = ingest(tmp_path, SWF_HEADER + SWF_GOOD + row, "--max-bad-rows", "0")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert str(trace) in err and f"line {BAD_LINE['swf']}: SWF {reason}" in err
    assert not (out / MARKER).exists()


@pytest.mark.parametrize("case", SWF_CASES)
def test_swf_bad_row_is_counted_as_rejected(tmp_path, case):
    row, reason = SWF_CASES[case]
    rc, _, out = ingest(tmp_path, SWF_HEADER + SWF_GOOD + row)
    assert rc == 0
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["rows_kept"] == 2 and report["rows_rejected"] == 1
    (bad,) = report["rejected"]
    assert bad["line"] == BAD_LINE["swf"] and reason in bad["reason"]


@pytest.mark.parametrize("case", SACCT_CASES)
def test_sacct_bad_row_strict_exits_2_naming_the_line(tmp_path, capsys, case):
    row, reason = SACCT_CASES[case]
    rc, trace, out = ingest(tmp_path, SACCT_HEADER + SACCT_GOOD + row, "--max-bad-rows", "0", "--timezone", "UTC")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert str(trace) in err and f"line {BAD_LINE['sacct']}: {reason}" in err
    assert not (out / MARKER).exists()


@pytest.mark.parametrize("case", SACCT_CASES)
def test_sacct_bad_row_is_counted_as_rejected(tmp_path, case):
    row, reason = SACCT_CASES[case]
    rc, _, out = ingest(tmp_path, SACCT_HEADER + SACCT_GOOD + row, "--timezone", "UTC")
    assert rc == 0
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["rows_kept"] == 2 and report["rows_rejected"] == 1
    assert report["rejected"][0]["line"] == BAD_LINE["sacct"] and reason in report["rejected"][0]["reason"]


def test_sacct_rows_that_are_all_bad_refuse_the_file(tmp_path, capsys):
    rows = "".join(_sacct_row(job=str(i), nodes="0") for i in range(5))
    rc, _, out = ingest(tmp_path, SACCT_HEADER + rows, "--max-bad-rows", "3", "--timezone", "UTC")
    assert rc == 2 and "5 unusable rows exceed --max-bad-rows 3" in capsys.readouterr().err
    assert not out.exists() or not (out / MARKER).exists()


# --- cluster configuration (sample, fidelity, validate share config_from_args) ----------


def _config(tmp_path, doc, *flags):
    from mirage_tasks.sim.config import add_config_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(doc))
    return path, lambda: config_from_args(parser.parse_args(["--cluster-config", str(path), *flags]))


@pytest.mark.parametrize(
    ("doc", "field", "expected"),
    [
        ({"nodes": "abc"}, "nodes", "must be an integer, got 'abc'"),
        ({"nodes": 8, "tick_s": "5"}, "tick_s", "must be an integer, got '5'"),
        ({"nodes": 8, "weight_age": "heavy"}, "weight_age", "must be a number, got 'heavy'"),
        ({"nodes": 8, "age_cap": "yes"}, "age_cap", "must be true or false"),
        ({"nodes": 8.5}, "nodes", "must be an integer, got 8.5"),
    ],
)
def test_cluster_config_wrong_type_names_field_and_file(tmp_path, doc, field, expected):
    path, build = _config(tmp_path, doc)
    with pytest.raises(StepError) as err:
        build()
    msg = str(err.value)
    assert str(path) in msg and f"field {field!r} {expected}" in msg


def test_cluster_config_nodes_zero_says_positive(tmp_path):
    path, build = _config(tmp_path, {"nodes": 0})
    with pytest.raises(StepError, match="nodes must be a positive number of nodes") as err:
        build()
    assert str(path) in str(err.value) and "unknown" not in str(err.value)


@pytest.mark.parametrize("field", ["weight_age", "weight_size", "max_jobs_per_user", "max_nodes_per_user"])
def test_cluster_config_negative_weights_and_limits_are_refused(tmp_path, field):
    path, build = _config(tmp_path, {"nodes": 8, field: -1})
    with pytest.raises(StepError, match=f"{field} must be >= 0, got -1") as err:
        build()
    assert str(path) in str(err.value)


def test_nodes_flag_zero_says_positive(tmp_path):
    _, build = _config(tmp_path, {"nodes": 8}, "--nodes", "0")
    with pytest.raises(StepError, match=r"^--nodes: nodes must be a positive number of nodes .* got 0$"):
        build()


def test_cluster_config_valid_file_still_loads(tmp_path):
    _, build = _config(tmp_path, {"nodes": 8, "tick_s": 60, "weight_age": 1000, "age_cap": False})
    cfg = build()
    assert (cfg.nodes, cfg.tick_s, cfg.weight_age, cfg.age_cap) == (8, 60, 1000, False)


def test_bad_cluster_config_exits_2_through_a_step(tmp_path, capsys):
    """The same check through a real step's command line (sample reads its config first)."""
    cfg = tmp_path / "cluster.json"
    cfg.write_text(json.dumps({"nodes": 8, "tick_s": "5"}))
    trace = tmp_path / "trace.swf"
    trace.write_text(SWF_HEADER + SWF_GOOD)
    assert main("mirage_tasks", MIRAGE_STEPS, ["ingest", "--trace", str(trace), "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    rc = main(
        "mirage_tasks",
        MIRAGE_STEPS,
        [
            "fidelity",
            "--trace",
            str(tmp_path / "t"),
            "--out",
            str(tmp_path / "f"),
            "--cluster-config",
            str(cfg),
            "--from",
            "2023-01-01T00:00:00",
            "--to",
            "2023-01-02T00:00:00",
        ],
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--cluster-config {cfg}: field 'tick_s' must be an integer" in err


# --- values that parse but cannot be right: an error or a warning that names them ---------


@pytest.mark.parametrize("size", ["-5", "0", "lots"])
def test_swf_header_machine_size_must_be_positive(tmp_path, capsys, size):
    rc, trace, out = ingest(tmp_path, SWF_HEADER.replace("MaxNodes: 64", f"MaxNodes: {size}") + SWF_GOOD)
    err = capsys.readouterr().err
    shown = size if size != "lots" else "(4 characters)"  # the number read, or the text described
    assert rc == 2 and f"{trace}: header MaxNodes {shown} is not a positive integer" in err, err
    assert not (out / MARKER).exists()


def test_swf_unknown_zone_and_jobs_larger_than_the_machine_are_said(tmp_path, capsys):
    text = SWF_HEADER.replace("MaxProcs: 64", "MaxProcs: 3") + "; TimeZoneString: Mars/Olympus_Mons\n" + SWF_GOOD
    rc, trace, _ = ingest(tmp_path, text)
    err = capsys.readouterr().err
    assert rc == 0
    assert "TimeZoneString (17 characters) is not a known time zone" in err  # described, not quoted
    assert "1 job(s) ask for more processors than the header's MaxProcs 3 (largest: 4)" in err


def test_sacct_times_in_a_spring_forward_gap_are_counted_and_said(tmp_path, capsys):
    gap = "3|2023-03-12T02:30:00|2023-03-12T03:10:00|2023-03-12T04:00:00|01:00:00|1|COMPLETED\n"  # no 02:30 in Chicago
    rc, trace, out = ingest(tmp_path, SACCT_HEADER + SACCT_GOOD + gap, "--timezone", "America/Chicago")
    assert rc == 0
    assert "1 submit time(s) fall in a spring-forward gap of America/Chicago" in capsys.readouterr().err
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["notes"]["nonexistent_local_times"] == 1, report


def test_sacct_empty_timezone_warns_as_an_omitted_one(tmp_path, capsys):
    rc, *_ = ingest(tmp_path, SACCT_HEADER + SACCT_GOOD, "--timezone", "")
    assert rc == 0 and "assuming UTC (pass --timezone" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--load-scale", "nan", "--load-scale nan: not a finite number"),
        ("--load-scale", "inf", "--load-scale inf: not a finite number"),
        ("--load-scale", "1e30", "--load-scale 1e+30: must be > 0 and at most 1000"),
        ("--out", "s3:///no-bucket", "--out s3:///no-bucket: an s3:// URI needs a bucket"),
    ],
)
def test_flag_values_no_step_can_use_exit_2_naming_the_flag(tmp_path, capsys, flag, value, message):
    argv = [
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2023-01-01",
        "--to",
        "2023-01-02",
        "--out",
        str(tmp_path / "o"),
        flag,
        value,
    ]
    assert main("mirage_tasks", MIRAGE_STEPS, argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_negative_batch_gap_is_refused(tmp_path, capsys):
    rc, trace, _ = ingest(tmp_path, SWF_HEADER + SWF_GOOD)
    argv = ["synth", "--fit", str(trace), "--batch-gap-s", "-5", "--out", str(tmp_path / "fit")]
    assert main("mirage_tasks", MIRAGE_STEPS, argv) == 2
    assert "--batch-gap-s -5: must be >= 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["under a file", "the input file itself"])
def test_an_output_that_cannot_be_a_folder_exits_2_naming_it(tmp_path, capsys, where):
    trace = tmp_path / "trace.swf"
    trace.write_text(SWF_HEADER + SWF_GOOD)
    out = trace / "sub" if where == "under a file" else trace
    rc = main("mirage_tasks", MIRAGE_STEPS, ["ingest", "--trace", str(trace), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and f"output {out}: cannot create or use it as a folder" in err, err
    assert trace.read_text() == SWF_HEADER + SWF_GOOD  # the input untouched
