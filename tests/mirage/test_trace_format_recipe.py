"""A trace format added as the recipe says ("How to change it" in docs/mirage-steps.md).

This file plays the format's reader and its test at once: ``jobs-csv`` (a CSV export with the
header ``id,submit,start,end,nodes,limit_s,user``, times in Unix seconds) declares its detect
and parse functions here, is registered for the test only (``monkeypatch.setitem`` on
``READERS``: the one row a real format adds to ``mirage_tasks/data/ingest.py``), and then goes
through the real ``ingest`` step's command line (in-process, as the unit tier allows): an
explicit ``--format``, auto-detection, a rejected row with its line number, and the
normalised trace read back. Without the row the name is refused, so a recipe that drifts
fails here.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mirage_tasks.data import ingest
from mirage_tasks.data.ingest import ParseResult, Reader, Rejected
from mirage_tasks.data.schema import COLUMNS, TraceMeta, read_trace
from stepkit.cli import main

NAME = "jobs-csv"
HEADER = "id,submit,start,end,nodes,limit_s,user"

# ----------------------------------------------------------------------------- the format's reader


def detect(head: list[str]) -> bool:
    """A jobs.csv export: its header line first."""
    return head[0].strip().replace(" ", "") == HEADER


def parse(lines: list[str], uri: str, timezone: str | None) -> ParseResult:
    """Every row -> the normalised schema (UTC times: Unix seconds carry no zone)."""
    good: list[list[str]] = []
    rejected: list[Rejected] = []
    for i, raw in enumerate(lines[1:], start=2):  # line numbers are 1-based, the header is line 1
        if not raw.strip():
            continue
        parts = [p.strip() for p in raw.split(",")]
        if len(parts) != 7:
            rejected.append(Rejected(i, f"{len(parts)} fields, expected 7 ({HEADER})"))
            continue
        if not all(p.isdigit() for p in parts[1:6]):
            rejected.append(Rejected(i, "submit, start, end, nodes and limit_s must be whole numbers"))
            continue
        good.append(parts)
    col = list(zip(*good)) if good else [()] * 7
    df = ingest.frame(
        job_id=col[0],
        submit=[int(x) for x in col[1]],
        start=[int(x) for x in col[2]],
        end=[int(x) for x in col[3]],
        nodes=[int(x) for x in col[4]],
        time_limit_s=[int(x) for x in col[5]],
        user=col[6],
    )
    return ParseResult(df, TraceMeta(source=uri, format=NAME, timezone="UTC"), len(good) + len(rejected), rejected)


# ----------------------------------------------------------------------------- its row (test only)

ROW = Reader(detect, parse, f"a jobs.csv export ({HEADER})")

T0 = 1_680_307_200  # 2023-04-01T00:00:00Z
ROWS = [  # id, submit, start, end, nodes, limit_s, user
    ("101", T0, T0 + 60, T0 + 3660, 2, 7200, "u1"),
    ("102", T0 + 30, T0 + 600, T0 + 1200, 1, 3600, "u2"),
    ("103", T0 + 90, T0 + 90, T0 + 86_400, 8, 86_400, "u1"),
    ("104", T0 + 120, T0 + 4000, T0 + 5000, 4, 1800, "u3"),
]


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ingest.READERS, NAME, ROW)


@pytest.fixture
def jobs_csv(tmp_path):
    path = tmp_path / "jobs.csv"
    lines = [HEADER, *(",".join(map(str, r)) for r in ROWS[:2]), "105,oops", *(",".join(map(str, r)) for r in ROWS[2:])]
    path.write_text("\n".join(lines) + "\n")
    return path


def run_ingest(*argv: str) -> int:
    return main("mirage_tasks", {"ingest": ("mirage_tasks.steps.ingest", "")}, ["ingest", *argv])


def report(out) -> dict:
    return json.loads((out / "ingest_report.json").read_text())


def check_trace(out) -> None:
    df, meta = read_trace(str(out))
    assert list(df.columns) == COLUMNS and meta.format == NAME and meta.timezone == "UTC"
    assert list(df["job_id"]) == [r[0] for r in ROWS]  # submit order
    ts = lambda s: pd.Timestamp(s, unit="s", tz="UTC")  # noqa: E731
    for col, k in (("submit", 1), ("start", 2), ("end", 3)):
        assert list(df[col]) == [ts(r[k]) for r in ROWS], col
    assert list(df["nodes"]) == [r[4] for r in ROWS] and list(df["time_limit_s"]) == [r[5] for r in ROWS]
    assert list(df["user"]) == [r[6] for r in ROWS] and set(df["status"]) == {"UNKNOWN"}
    assert df["procs"].isna().all() and df["priority"].isna().all()


# ----------------------------------------------------------------------------- the recipe's test


def test_the_new_format_goes_through_the_ingest_step(registered, jobs_csv, tmp_path, capsys):
    out = tmp_path / "explicit"
    assert run_ingest("--trace", str(jobs_csv), "--format", NAME, "--out", str(out)) == 0
    check_trace(out)
    rep = report(out)
    assert rep["format"] == NAME and rep["rows_read"] == 5 and rep["rows_kept"] == 4
    assert rep["rejected"] == [{"line": 4, "reason": f"2 fields, expected 7 ({HEADER})"}]
    assert rep["span_first_submit"].startswith("2023-04-01T00:00:00")
    # --max-bad-rows applies to the new format like any other: nothing is written
    strict = tmp_path / "strict"
    assert run_ingest("--trace", str(jobs_csv), "--format", NAME, "--max-bad-rows", "0", "--out", str(strict)) != 0
    assert "line 4" in capsys.readouterr().err and not (strict / "trace.parquet").exists()


def test_auto_detection_picks_the_new_format(registered, jobs_csv, tmp_path, capsys):
    lines = jobs_csv.read_text().splitlines()
    assert ingest.detect_format(lines, str(jobs_csv)) == NAME
    assert ingest.formats()[-1] == NAME  # --format's choices and help come from the table
    out = tmp_path / "auto"
    assert run_ingest("--trace", str(jobs_csv), "--out", str(out)) == 0  # --format auto, the default
    check_trace(out)
    assert report(out)["format"] == NAME
    # the formats already there are still detected first
    assert ingest.detect_format(["JobID|Submit|Start|End|NNodes"], "x") == "sacct-parsable"
    assert ingest.detect_format(["; UnixStartTime: 0"], "x") == "swf"
    assert run_ingest("--help") == 0
    assert f"{NAME}: a jobs.csv export" in " ".join(capsys.readouterr().out.split())


def test_without_its_row_the_format_is_unknown(jobs_csv, tmp_path, capsys):
    """The row is the whole registration: without it the name is refused and the file undetected."""
    assert NAME not in ingest.formats()
    assert run_ingest("--trace", str(jobs_csv), "--format", NAME, "--out", str(tmp_path / "a")) == 2
    assert f"invalid choice: '{NAME}'" in capsys.readouterr().err
    assert run_ingest("--trace", str(jobs_csv), "--out", str(tmp_path / "b")) != 0
    assert "unknown trace format" in capsys.readouterr().err
