"""Trace ingestion: the real logs as shipped, sacct --parsable2, SWF, bad input, reruns."""

from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from mirage_tasks.__main__ import STEPS
from mirage_tasks.data.schema import COLUMNS, read_trace
from stepkit import MARKER
from stepkit.cli import main

STEPS = {"ingest": ("mirage_tasks.steps.ingest", "")}


def ingest(*argv: str) -> int:
    return main("mirage_tasks", STEPS, ["ingest", *argv])


def report(out) -> dict:
    return json.loads((out / "ingest_report.json").read_text())


def test_ls6_as_shipped(ls6_parquet):
    rep = report(ls6_parquet)
    assert rep["format"] == "sacct-fixed"
    assert rep["rows_read"] == 24777 and rep["rows_kept"] == 24776 and rep["rows_rejected"] == 1
    (bad,) = rep["rejected"]
    assert bad["line"] == 19706 and "11 fields" in bad["reason"]  # job 746545, extra token after UID
    assert rep["notes"]["count_line"] == 24779
    df, meta = read_trace(str(ls6_parquet))
    assert list(df.columns) == COLUMNS and meta.timezone == "America/Chicago"
    first = df[df["job_id"] == "478729"].iloc[0]
    # 2022-10-05T11:52:48 US/Central (CDT, UTC-5) is 16:52:48 UTC.
    assert first["submit"] == pd.Timestamp("2022-10-05T16:52:48Z")
    assert first["time_limit_s"] == 2880 * 60 and first["nodes"] == 2 and first["priority"] == 1234
    assert "746545" not in set(df["job_id"])
    assert df["submit"].is_monotonic_increasing


def test_ls6_strict_policy_names_the_line(ls6_log, tmp_path, capsys):
    assert (
        ingest(
            "--trace",
            str(ls6_log),
            "--timezone",
            "America/Chicago",
            "--max-bad-rows",
            "0",
            "--out",
            str(tmp_path / "o"),
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "line 19706" in err and "ls6-a100.log.gz" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("name", "jobs", "nodes"),
    [
        ("KTH-SP2-1996-2.1-cln.swf.gz", 28476, 100),
        ("CTC-SP2-1996-3.1-cln.swf.gz", 77222, 338),
        pytest.param("CEA-Curie-2011-2.1-cln.swf.gz", 312826, 5544, marks=pytest.mark.e2e),
    ],  # 7 CPU s
)
def test_swf_counts_match_headers(name, jobs, nodes, tmp_path, shared_trace):
    path = shared_trace(name)
    out = tmp_path / "o"
    assert ingest("--trace", str(path), "--out", str(out)) == 0
    rep = report(out)
    assert rep["rows_kept"] == jobs == rep["notes"]["expected_records"]
    assert rep["rows_rejected"] == 0 and rep["machine_nodes"] == nodes


def test_swf_fields_and_window(tmp_path):
    text = "\n".join(
        [
            "; UnixStartTime: 1000000000",
            "; TimeZoneString: Europe/Stockholm",
            "; MaxNodes: 8",
            "; MaxProcs: 8",
            "; Partition: 1 batch",
            "1 0 10 100 2 -1 -1 2 3600 -1 1 7 1 -1 -1 1 -1 -1",
            "2 50 -1 -1 4 -1 -1 4 7200 -1 5 8 1 -1 -1 1 -1 -1",
            "3 90000 0 60 1 -1 -1 -1 600 -1 0 7 1 -1 -1 -1 -1 -1",
        ]
    )
    path = tmp_path / "t.swf"
    path.write_text(text + "\n")
    out = tmp_path / "o"
    assert ingest("--trace", str(path), "--out", str(out), "--to", "2001-09-10T00:00:00") == 0
    df, meta = read_trace(str(out))
    assert list(df["job_id"]) == ["1", "2"] and report(out)["rows_outside_window"] == 1
    j1, j2 = df.iloc[0], df.iloc[1]
    assert j1["start"] == pd.Timestamp(1000000010, unit="s", tz="UTC")
    assert j1["end"] == pd.Timestamp(1000000110, unit="s", tz="UTC")
    assert j1["nodes"] == 2 and j1["partition"] == "batch" and j1["status"] == "COMPLETED"
    assert pd.isna(j2["start"]) and j2["status"] == "CANCELLED"
    assert meta.machine_nodes == 8 and meta.timezone == "Europe/Stockholm"


PARSABLE = """JobID|User|Partition|Submit|Start|End|Timelimit|NNodes|State|Priority
100|alice|gpu|2023-03-12T01:30:00|2023-03-12T03:30:00|2023-03-12T04:00:00|1-00:00:00|2|COMPLETED|4000
100.batch|alice|gpu|2023-03-12T01:30:00|2023-03-12T03:30:00|2023-03-12T04:00:00||1|COMPLETED|
101_3|bob|gpu|2023-11-05T01:30:00|Unknown|Unknown|30:00|1|CANCELLED by 5|1001
102|bob|gpu|2023-01-01T00:00:00|2023-01-01T00:10:00|2023-01-01T02:10:00|02:00:00|1|TIMEOUT|1001
"""


def test_sacct_parsable2(tmp_path):
    path = tmp_path / "sacct.txt"
    path.write_text(PARSABLE)
    out = tmp_path / "o"
    assert ingest("--trace", str(path), "--timezone", "America/Chicago", "--out", str(out)) == 0
    rep = report(out)
    assert rep["format"] == "sacct-parsable" and rep["notes"]["job_steps_skipped"] == 1
    df = read_trace(str(out))[0].set_index("job_id")
    assert list(df.index) == ["102", "100", "101_3"]
    assert df.loc["100", "time_limit_s"] == 86400 and df.loc["101_3", "time_limit_s"] == 1800
    assert df.loc["101_3", "status"] == "CANCELLED" and pd.isna(df.loc["101_3", "start"])
    assert df.loc["102", "status"] == "TIMEOUT"
    # 03:30 CDT on the spring-forward day is 08:30 UTC; 01:30 CST before it is 07:30 UTC.
    assert df.loc["100", "start"] == pd.Timestamp("2023-03-12T08:30:00Z")
    assert df.loc["100", "submit"] == pd.Timestamp("2023-03-12T07:30:00Z")
    # The repeated autumn hour is read as standard time and counted.
    assert df.loc["101_3", "submit"] == pd.Timestamp("2023-11-05T07:30:00Z")
    assert rep["notes"]["ambiguous_local_times"] == 1


def test_bad_inputs_name_file_and_line(tmp_path, capsys):
    unknown = tmp_path / "x.csv"
    unknown.write_text("a,b,c\n1,2,3\n")
    assert ingest("--trace", str(unknown), "--out", str(tmp_path / "o1")) == 2
    assert "unknown trace format" in capsys.readouterr().err

    bad_time = tmp_path / "t.txt"
    bad_time.write_text(PARSABLE.replace("2023-01-01T00:10:00", "yesterday"))
    assert (
        ingest("--trace", str(bad_time), "--timezone", "UTC", "--max-bad-rows", "0", "--out", str(tmp_path / "o2")) == 2
    )
    err = capsys.readouterr().err
    # the field and the line are named, the value described (9 characters), never quoted
    assert "line 5" in err and "(9 characters) is not a time" in err and "t.txt" in err
    assert "yesterday" not in err

    cols = tmp_path / "c.txt"
    cols.write_text(PARSABLE + "103|x|gpu|2023-01-01T00:00:00\n")
    assert ingest("--trace", str(cols), "--timezone", "UTC", "--max-bad-rows", "0", "--out", str(tmp_path / "o3")) == 2
    assert "line 6: 4 fields, expected 10" in capsys.readouterr().err
    # Within the policy the row is skipped and reported.
    assert ingest("--trace", str(cols), "--timezone", "UTC", "--out", str(tmp_path / "o4")) == 0
    assert report(tmp_path / "o4")["rejected"] == [{"line": 6, "reason": "4 fields, expected 10"}]

    trunc = tmp_path / "t.swf.gz"
    trunc.write_bytes(
        gzip.compress(b"; UnixStartTime: 0\n" + b"1 0 0 1 1 -1 -1 1 60 -1 1 1 1 -1 -1 -1 -1 -1\n" * 50)[:40]
    )
    assert ingest("--trace", str(trunc), "--out", str(tmp_path / "o5")) == 2
    assert "t.swf.gz" in capsys.readouterr().err

    assert ingest("--trace", str(tmp_path / "missing.log"), "--out", str(tmp_path / "o6")) == 2
    assert "not found" in capsys.readouterr().err
    assert ingest("--trace", str(cols), "--timezone", "Mars/Olympus", "--out", str(tmp_path / "o7")) == 2
    assert "Mars/Olympus" in capsys.readouterr().err
    for i in range(1, 8):
        assert not (tmp_path / f"o{i}" / MARKER).exists() or i == 4


def test_rerun_skips_and_bad_rerun_keeps_results(tmp_path, capsys):
    path = tmp_path / "sacct.txt"
    path.write_text(PARSABLE)
    out = tmp_path / "o"
    args = ["--trace", str(path), "--timezone", "UTC", "--out", str(out)]
    assert ingest(*args) == 0
    before = (out / "trace.parquet").read_bytes()
    capsys.readouterr()
    assert ingest(*args) == 0
    assert "skipped" in capsys.readouterr().out
    # A rerun that fails on its window keeps the committed results untouched.
    assert ingest(*args, "--from", "2030-01-01") == 2
    assert (out / "trace.parquet").read_bytes() == before and (out / MARKER).exists()


HYGIENE_SWF = [
    "; UnixStartTime: 1000000000",
    "; MaxNodes: 8",
    "; MaxProcs: 8",
    "; Partition: 1 batch",
    "; Partition: 2 debug",
    # job submit wait run procs cpu mem reqprocs reqtime reqmem status user group exe queue part prec think
    "1 0 0 500 1 -1 -1 1 1000 -1 1 7 1 -1 -1 1 -1 -1",  # user 7: 1000 s asked, ended at 500
    "2 2000 10 9000 1 -1 -1 1 -1 -1 1 7 1 -1 -1 1 -1 -1",  # no limit: user 7's finished job asked 1000
    "3 2000 0 50 1 -1 -1 1 -1 -1 1 8 1 -1 -1 2 -1 -1",  # no limit: debug's declared maximum
    "4 3000 0 100 1 -1 -1 1 -1 -1 1 9 1 -1 -1 1 -1 -1",  # no limit, no history: the log's default
    "5 2500 0 10 1 -1 -1 1 -1 -1 1 7 1 -1 -1 1 -1 -1",  # user 7 again: job 2 had not ended
    "6 100 0 5000 1 -1 -1 1 20000 -1 1 10 1 -1 -1 1 -1 -1",  # user 10 asks 20000 s, ends at 5100
    "7 200 0 10 1 -1 -1 1 -1 -1 1 10 1 -1 -1 1 -1 -1",  # job 6 still running: not history
    "8 300 600 0 1 -1 -1 1 3600 -1 5 11 1 -1 -1 1 -1 -1",  # cancelled after 600 s in the queue
]


def test_swf_missing_limits_are_filled_with_what_was_known_at_submission(tmp_path, capsys):
    path = tmp_path / "t.swf"
    path.write_text("\n".join(HYGIENE_SWF) + "\n")
    out = tmp_path / "o"
    argv = ["--trace", str(path), "--out", str(out), "--partition-max-limit", "debug=1800"]
    assert ingest(*argv, "--default-limit-s", "7200") == 0
    df, meta = read_trace(str(out))
    limit = dict(zip(df["job_id"], df["time_limit_s"].astype(int)))
    # never a run time (job 2 ran 9000 s, job 7 10 s); job 7's user had asked 20000 s of a job still running
    assert limit == {"1": 1000, "2": 1000, "3": 1800, "4": 7200, "5": 1000, "6": 20000, "7": 7200, "8": 3600}
    fill = report(out)["limit_fill"]
    assert (fill["jobs_without_limit"], fill["partition_max"], fill["user_history"], fill["log_default"]) == (
        5,
        1,
        2,
        2,
    )
    assert fill["log_default_s"] == 7200 and fill["log_default_declared"] is True
    assert meta.hygiene["limit_fill"]["user_history"] == 2
    assert "5 limits filled" in capsys.readouterr().out
    # without a declared default or maximum: the documented default (one day)
    assert ingest("--trace", str(path), "--out", str(tmp_path / "o2")) == 0
    df2, _ = read_trace(str(tmp_path / "o2"))
    assert dict(zip(df2["job_id"], df2["time_limit_s"].astype(int)))["3"] == 86400
    assert report(tmp_path / "o2")["limit_fill"]["log_default"] == 3
    assert ingest(*argv, "--partition-max-limit", "debug") == 2
    assert "--partition-max-limit 'debug'" in capsys.readouterr().err


def test_swf_jobs_that_never_ran_are_kept_with_the_time_they_left(tmp_path):
    from mirage_tasks.sim import Workload

    path = tmp_path / "t.swf"
    path.write_text("\n".join(HYGIENE_SWF) + "\n")
    out = tmp_path / "o"
    assert ingest("--trace", str(path), "--out", str(out)) == 0
    df, meta = read_trace(str(out))
    j8 = df[df["job_id"] == "8"].iloc[0]
    assert pd.isna(j8["start"]) and j8["end"] == pd.Timestamp(1000000900, unit="s", tz="UTC")
    assert report(out)["never_ran"] == {"jobs": 1, "cancelled": 1, "no_leave_time": 0}
    assert meta.hygiene["never_ran"]["jobs"] == 1
    wl = Workload.from_frame(df)
    assert "8" not in set(wl.job_id) and list(wl.never_ran.job_id) == ["8"]  # queued, never run, never scored
    assert wl.never_ran.leave[0] == 1000000900 and wl.never_ran.limit[0] == 3600


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


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
