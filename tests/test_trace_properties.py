"""Property test: random rows fed to the SWF and sacct readers never crash the ingest step.

Whatever the rows hold, ``ingest`` ends with exit 0 (rows kept or counted as rejected)
or exit 2 (the file refused with a message), never exit 1 (a traceback) or another
exception; the reader itself returns or raises :class:`StepError`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mirage_tasks.__main__ import STEPS as MIRAGE_STEPS
from mirage_tasks.data.ingest import parse
from stepkit import StepError
from stepkit.cli import main

pytestmark = pytest.mark.timeout(600)

#: The readers alone are fast; the whole step (Parquet, marker) costs ~0.5 s an example.
READER = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STEP = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Field values that broke readers before, mixed with ordinary ones.
NASTY_NUMBERS = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e300",
    "-1e300",
    "-1e12",
    "1e12",
    "-1",
    "0",
    "-0",
    "1.5",
    "9223372036854775808",
    "abc",
    "",
    "0x10",
    "1_000",
    "+5",
    "-4",
]
number = st.one_of(
    st.integers(min_value=-10, max_value=10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(NASTY_NUMBERS),
)
swf_row = st.lists(number, min_size=16, max_size=19).map(lambda fields: " ".join(f or "0" for f in fields))

time_text = st.one_of(
    st.datetimes(
        min_value=__import__("datetime").datetime(1900, 1, 1), max_value=__import__("datetime").datetime(2300, 1, 1)
    ).map(lambda d: d.strftime("%Y-%m-%dT%H:%M:%S")),
    st.sampled_from(
        ["Unknown", "None", "", "2023-13-01T00:00:00", "2023-03-12T02:30:00", "abc", "9999-12-31T23:59:59"]
    ),
)
limit_text = st.one_of(
    st.sampled_from(
        [
            "UNLIMITED",
            "Partition_Limit",
            "abc",
            "",
            "1-",
            "-5",
            "1:2:3:4",
            "99999999999999999999",
            "01:00:00",
            "2-00:00:00",
            "30",
            "5:",
            "1-2-3",
            "00:00:00",
        ]
    ),
    st.text(alphabet="0123456789:-", max_size=12),
)
sacct_row = st.tuples(
    st.one_of(st.integers(0, 10**7).map(str), st.sampled_from(["", "inf", "1.batch", "12_3", "abc", "1"])),
    time_text,
    time_text,
    time_text,
    limit_text,
    number,
    st.sampled_from(["COMPLETED", "FAILED", "CANCELLED by 1", "TIMEOUT", "", "RUNNING"]),
).map("|".join)


def _check_reader(path: Path, **kwargs) -> None:
    try:
        parse(str(path), **kwargs)
    except StepError:
        pass


def _check_ingest(path: Path, out: Path, *extra: str) -> None:
    rc = main("mirage_tasks", MIRAGE_STEPS, ["ingest", "--trace", str(path), "--out", str(out), *extra])
    assert rc in (0, 2), f"ingest exited {rc} on {path.read_text()!r}"


SWF_HEAD = "; UnixStartTime: 1672531200\n; MaxNodes: 64\n; MaxProcs: 64\n"
SACCT_HEAD = "JobID|Submit|Start|End|Timelimit|NNodes|State\n"


def _write(tmp: str, name: str, head: str, rows: list[str]) -> Path:
    path = Path(tmp) / name
    path.write_text(head + "\n".join(rows) + "\n")
    return path


@READER
@given(rows=st.lists(swf_row, min_size=1, max_size=8))
def test_swf_reader_returns_or_refuses(rows):
    with tempfile.TemporaryDirectory() as tmp:
        _check_reader(_write(tmp, "trace.swf", SWF_HEAD, rows))


@READER
@given(rows=st.lists(sacct_row, min_size=1, max_size=8))
def test_sacct_reader_returns_or_refuses(rows):
    with tempfile.TemporaryDirectory() as tmp:
        _check_reader(_write(tmp, "trace.txt", SACCT_HEAD, rows), timezone="America/Chicago")


@STEP
@given(rows=st.lists(swf_row, min_size=1, max_size=8))
def test_swf_ingest_exits_0_or_2(rows):
    with tempfile.TemporaryDirectory() as tmp:
        _check_ingest(_write(tmp, "trace.swf", SWF_HEAD, rows), Path(tmp) / "out")


@STEP
@given(rows=st.lists(sacct_row, min_size=1, max_size=8))
def test_sacct_ingest_exits_0_or_2(rows):
    with tempfile.TemporaryDirectory() as tmp:
        _check_ingest(_write(tmp, "trace.txt", SACCT_HEAD, rows), Path(tmp) / "out", "--timezone", "America/Chicago")


@pytest.mark.parametrize("row", ["0|Unknown|Unknown|Unknown|UNLIMITED|0|", "5|9999-12-31T23:59:59||||1|COMPLETED"])
def test_rows_hypothesis_found(row, tmp_path):
    """Rows that once crashed the sacct reader (an empty State; a year-9999 time)."""
    _check_reader(_write(str(tmp_path), "t.txt", SACCT_HEAD, [row]), timezone="America/Chicago")
    _check_ingest(_write(str(tmp_path), "t.txt", SACCT_HEAD, [row]), tmp_path / "out", "--timezone", "UTC")
