"""Readers for job-trace formats, each returning a frame in the normalised schema.

Formats (detected from the content, not the file name):

* ``sacct-fixed``: the Mirage/Lonestar6 export as shipped: an optional bare row-count
  line, a space-padded ``sacct`` header, a dashed ruler, then tab-separated rows.
* ``sacct-parsable``: ``sacct --parsable2`` (``|``-separated, header first). Job steps
  (``123.batch``, ``123.0``, ``123.extern``) are skipped and counted, not rejected.
* ``swf``: the Standard Workload Format of the Parallel Workloads Archive, header
  comments included (``UnixStartTime``, ``TimeZoneString``, ``MaxNodes``, ``MaxProcs``,
  ``Partition:`` lines, and the cleaning filters that say how many jobs were removed).

Every row that cannot be used is recorded with its line number and reason; the caller
decides (``max_bad_rows``) how many may be skipped before the whole file is refused.

Adding a format is one row of :data:`READERS` (name -> :class:`Reader`: a detect function and
a parse function) and its test: ``--format``'s choices and help, :func:`formats`,
:func:`detect_format` and :func:`parse` all read the table (docs/mirage-steps.md, "How to
change it"; tests/mirage/test_trace_format_recipe.py adds one inside the test).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError, reach, storage

from .exports import is_folder, list_exports
from .schema import COLUMNS, TraceMeta

log = logging.getLogger(__name__)

# sacct column aliases -> normalised meaning. The first alias found wins.
SACCT_COLUMNS = {
    "job_id": ("JobID", "JobIDRaw"),
    "submit": ("Submit",),
    "start": ("Start",),
    "end": ("End",),
    "limit_min": ("TimelimitRaw", "TimelimitR"),
    "limit_text": ("Timelimit",),
    "nodes": ("NNodes", "ReqNodes", "AllocNodes"),
    "procs": ("ReqCPUS", "NCPUS", "AllocCPUS"),
    "partition": ("Partition",),
    "user": ("User", "UID"),
    "state": ("State",),
    "priority": ("Priority",),
}
_SACCT_NULL_TIMES = {"", "Unknown", "None", "N/A"}
_MIN_TIME, _MAX_TIME = pd.Timestamp("1970-01-01"), pd.Timestamp("2200-01-01")
_SACCT_NO_LIMIT = ["UNLIMITED", "Partition_Limit", "INVALID", ""]
#: Sanity bounds: a time limit of at most 100 years, at most 10 million nodes/CPUs.
_MAX_LIMIT_MIN = 100 * 366 * 24 * 60
_MAX_COUNT = 10_000_000
_STEP_ID = re.compile(r"^\d+(?:_\d+|\+\d+)?\.")  # 123.batch, 123_4.0, 123+1.extern


@dataclass
class Rejected:
    line: int
    reason: str
    #: the export file of a folder trace the line is in (None: the trace is one file)
    file: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"line": self.line, "reason": self.reason, **({"file": self.file} if self.file else {})}

    def where(self) -> str:
        """``line N`` of the trace, or ``<file>: line N`` of a folder's export file."""
        return f"{self.file}: line {self.line}" if self.file else f"line {self.line}"


@dataclass
class ParseResult:
    frame: pd.DataFrame
    meta: TraceMeta
    rows_read: int
    rejected: list[Rejected] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


class BadRows(StepError):
    """Too many unusable rows: the file is refused."""


def _text_lines(uri: str) -> tuple[list[str], str]:
    """The file's lines and what it looks like (:func:`stepkit.reach.describe_bytes`), for the
    errors about a file that is no trace: they describe it, never quote it."""
    try:
        with storage.open_read(uri, "rb", compression="infer") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise StepError(f"trace not found: {uri}") from exc
    except (OSError, EOFError) as exc:  # e.g. a truncated or fake .gz; gzip's message quotes its first bytes
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise StepError(f"{uri}: cannot read ({why}); the file is {_describe_raw(uri)}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    return text.splitlines(), reach.describe_bytes(data[:4096], len(data))


def _describe_raw(uri: str) -> str:
    """:func:`stepkit.reach.describe_bytes` of the file's raw (still compressed) first bytes."""
    try:
        with storage.open_read(uri, "rb") as f:
            head = f.read(4096)
        return reach.describe_bytes(head, storage.size_of(uri))
    except (OSError, StepError):
        return "unreadable"


def _chars(value: Any) -> str:
    """A field's value described, not quoted: a trace that is no trace must not be printed."""
    return f"({len(str(value))} characters)" if value is not None and not pd.isna(value) else "(empty)"


@dataclass(frozen=True)
class Reader:
    """One trace format. ``detect(head)``: whether the file's first non-blank lines (up to 50,
    at least one) are this format; ``parse(lines, uri, timezone)``: every line of the file ->
    a :class:`ParseResult` in the normalised schema (:mod:`mirage_tasks.data.schema`), each
    unusable row a :class:`Rejected` with its line number, ``meta.format`` the format's name;
    ``what``: the format in a few words (``--format``'s help, the unknown-format error)."""

    detect: Callable[[list[str]], bool]
    parse: Callable[[list[str], str, str | None], ParseResult]
    what: str


def _is_sacct_parsable(head: list[str]) -> bool:
    first = head[0]
    return not _is_swf_comment(first) and "|" in first and "JobID" in first.split("|")[0]


def _is_sacct_fixed(head: list[str]) -> bool:
    # the JobID header may follow a bare row-count line
    return not _is_swf_comment(head[0]) and any(ln.split() and ln.split()[0] == "JobID" for ln in head[:3])


def _is_swf_comment(line: str) -> bool:
    return line.lstrip().startswith(";")


def _is_swf(head: list[str]) -> bool:
    fields = head[0].split()
    return _is_swf_comment(head[0]) or (len(fields) == 18 and all(_is_number(x) for x in fields))


#: The trace formats, ``name -> Reader``, in the order :func:`detect_format` tries them (the
#: first whose ``detect`` says yes wins, so a looser test goes after a stricter one). Adding a
#: format is a row here; ``ingest --format`` offers ``auto`` and every name.
READERS: dict[str, Reader] = {
    "sacct-parsable": Reader(
        _is_sacct_parsable,
        lambda lines, uri, tz: _parse_sacct(lines, uri, "sacct-parsable", tz),
        "sacct --parsable2 output",
    ),
    "sacct-fixed": Reader(
        _is_sacct_fixed,
        lambda lines, uri, tz: _parse_sacct(lines, uri, "sacct-fixed", tz),
        "a Slurm sacct export with a JobID header",
    ),
    "swf": Reader(_is_swf, lambda lines, uri, tz: _parse_swf(lines, uri), "SWF"),
}


#: The pandas type of each normalised column (:data:`mirage_tasks.data.schema.SCHEMA`), for :func:`frame`.
_DTYPES = {
    "job_id": "string",
    "time_limit_s": "Int64",
    "nodes": "Int32",
    "procs": "Int32",
    "partition": "string",
    "user": "string",
    "status": "string",
    "priority": "Int64",
}


def frame(**columns: Any) -> pd.DataFrame:
    """A frame in the normalised schema from the columns a new format's reader has (``job_id``
    and ``submit`` at least, equal lengths): times as UTC timestamps or Unix seconds, counts and
    limits as numbers; a column not given is null (``status``: ``UNKNOWN``)."""
    n = len(columns["job_id"])
    out = {}
    for name in COLUMNS:
        value = columns.get(name)
        if name in ("submit", "start", "end"):
            s = pd.Series(value if value is not None else [pd.NaT] * n)
            if pd.api.types.is_numeric_dtype(s):
                s = pd.to_datetime(s, unit="s", utc=True)
            out[name] = pd.to_datetime(s, utc=True).dt.as_unit("s")
        elif value is None:
            out[name] = pd.Series(["UNKNOWN" if name == "status" else pd.NA] * n, dtype=_DTYPES[name])
        elif _DTYPES[name].startswith("Int"):
            out[name] = pd.Series(value).astype("Float64").round().astype(_DTYPES[name])
        else:
            out[name] = pd.Series(value).astype(_DTYPES[name])
    return pd.DataFrame(out)


def formats() -> tuple[str, ...]:
    """``ingest --format``'s choices: ``auto`` (detect from the content), then every :data:`READERS` name."""
    return ("auto", *READERS)


def formats_help() -> str:
    """``ingest --format``'s help, from :data:`READERS`."""
    return "trace format (default: auto, detected from the content): " + "; ".join(
        f"{name}: {r.what}" for name, r in READERS.items()
    ).replace("%", "%%")


def detect_format(lines: list[str], uri: str, about: str | None = None) -> str:
    """Name the format of a trace from its first meaningful lines (:data:`READERS`, in order).
    A file of no known format is described (``about``: :func:`stepkit.reach.describe_bytes`),
    never quoted."""
    head = [ln for ln in lines[:50] if ln.strip()]
    if not head:
        raise StepError(f"{uri}: empty file, not a job trace ({about or 'no line holds anything'})")
    for name, reader in READERS.items():
        if reader.detect(head):
            return name
    whats = [r.what for r in READERS.values()]
    expected = ", ".join(whats[:-1]) + f", or {whats[-1]}" if len(whats) > 1 else whats[0]
    raise StepError(
        f"{uri}: line 1: unknown trace format (expected {expected}); the file is "
        f"{about or reach.describe_bytes(chr(10).join(lines[:50]).encode('utf-8', 'replace'))}"
    )


def _is_number(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def parse(uri: str, fmt: str = "auto", timezone: str | None = None) -> ParseResult:
    """Read ``uri`` in format ``fmt`` (``auto``: :func:`detect_format`) with its :data:`READERS` row;
    a folder of daily exports with :func:`parse_folder`."""
    if is_folder(uri):
        return parse_folder(uri, fmt, timezone)
    return _parse_file(uri, fmt, timezone)


def _parse_file(uri: str, fmt: str, timezone: str | None) -> ParseResult:
    lines, about = _text_lines(uri)
    if fmt == "auto":
        fmt = detect_format(lines, uri, about)
    if fmt not in READERS:
        raise StepError(f"--format {fmt!r}: choose from {', '.join(formats())}")
    return READERS[fmt].parse(lines, uri, timezone)


def parse_folder(uri: str, fmt: str = "auto", timezone: str | None = None) -> ParseResult:
    """A folder of daily exports (:mod:`mirage_tasks.data.exports`) read as one trace: each
    export file parsed on its own (its rejected rows name it and their line in it), in day
    order, and the rows joined. One format for all (``auto``: the first file's); a job in
    several exports (one running across midnight is in each day's) keeps the row of the newest
    export, which knows the most about it (counted in ``notes["duplicates_across_files"]``).
    The entries skipped (no day in the name, a subfolder) are logged and listed in
    ``notes["skipped"]``."""
    folder = uri.rstrip("/")
    found = list_exports(folder)
    for name, why in found.skipped:
        log.warning("%s: %s skipped: %s", folder, name, why)
    frames, rejected, per_file = [], [], []
    rows_read, first_fmt, meta0 = 0, None, None
    for day, file_uri in found.files:
        name = file_uri.rsplit("/", 1)[-1]
        res = _parse_file(file_uri, first_fmt or fmt, timezone)
        if first_fmt is None:
            first_fmt, meta0 = res.meta.format, res.meta
        rows_read += res.rows_read
        rejected.extend(Rejected(r.line, r.reason, name) for r in res.rejected)
        frames.append(res.frame)
        per_file.append({"name": name, "day": day, "rows_read": res.rows_read, "rows_rejected": len(res.rejected)})
    df = pd.concat(frames, ignore_index=True)
    dup = df["job_id"].duplicated(keep="last")
    df = df[~dup].reset_index(drop=True)
    meta = dataclasses.replace(meta0, source=folder)
    notes = {
        "files": per_file,
        "skipped": [{"name": n, "why": w} for n, w in found.skipped],
        "duplicates_across_files": int(dup.sum()),
    }
    return ParseResult(df, meta, rows_read, rejected, notes)


# ---------------------------------------------------------------- sacct


def _parse_sacct(lines: list[str], uri: str, fmt: str, timezone: str | None) -> ParseResult:
    tz = timezone or "UTC"
    notes: dict[str, Any] = {}
    if not timezone:  # omitted or empty: the same warning
        log.warning("%s: sacct times carry no zone; assuming UTC (pass --timezone, e.g. America/Chicago)", uri)
        notes["timezone_assumed"] = True
    idx = 0
    while idx < len(lines) and not lines[idx].strip():
        idx += 1
    expected_rows = None
    if fmt == "sacct-fixed" and lines[idx].strip().isdigit():
        expected_rows = int(lines[idx].strip())
        idx += 1
    header_line = idx + 1  # 1-based
    if fmt == "sacct-parsable":
        header = lines[idx].rstrip("|").split("|")
        sep = "|"
    else:
        header = lines[idx].split()
        sep = "\t"
    idx += 1
    if fmt == "sacct-fixed" and idx < len(lines) and set(lines[idx].strip()) <= {"-", " "} and lines[idx].strip():
        idx += 1
    cols = {}
    for key, aliases in SACCT_COLUMNS.items():
        for a in aliases:
            if a in header:
                cols[key] = header.index(a)
                break
    for required in ("job_id", "submit"):
        if required not in cols:
            raise StepError(
                f"{uri}: line {header_line}: sacct header lacks {SACCT_COLUMNS[required][0]} "
                f"(has {len(header)} columns, none of {', '.join(SACCT_COLUMNS[required])})"
            )
    if "nodes" not in cols and "procs" not in cols:
        raise StepError(f"{uri}: line {header_line}: sacct header has no node or CPU count column")
    ncols = len(header)

    rejected: list[Rejected] = []
    rows: list[list[str]] = []
    linenos: list[int] = []
    steps_skipped = 0
    for i in range(idx, len(lines)):
        raw = lines[i]
        if not raw.strip():
            continue
        parts = raw.rstrip("\n").split(sep)
        if fmt == "sacct-parsable" and len(parts) == ncols + 1 and parts[-1] == "":
            parts = parts[:-1]  # --parsable (not 2) leaves a trailing separator
        if fmt == "sacct-fixed" and len(parts) == 1:
            parts = raw.split()  # tolerate space-separated exports of the same layout
        if len(parts) != ncols:
            rejected.append(Rejected(i + 1, f"{len(parts)} fields, expected {ncols}"))
            continue
        if _STEP_ID.match(parts[cols["job_id"]].strip()):
            steps_skipped += 1
            continue
        rows.append(parts)
        linenos.append(i + 1)
    rows_read = len(rows) + len(rejected) + steps_skipped
    if expected_rows is not None:
        notes["count_line"] = expected_rows
    notes["job_steps_skipped"] = steps_skipped

    arr = np.array(rows, dtype=object).reshape(len(rows), ncols) if rows else np.empty((0, ncols), dtype=object)
    lineno = np.array(linenos, dtype=np.int64)

    def col(key: str) -> pd.Series | None:
        return pd.Series(arr[:, cols[key]], dtype="string").str.strip() if key in cols else None

    bad = np.zeros(len(rows), dtype=bool)
    reasons: dict[int, str] = {}

    def times(key: str, required: bool) -> pd.Series:
        s = col(key)
        if s is None:
            return pd.Series(pd.NaT, index=range(len(rows)), dtype="datetime64[s]")
        null = s.isin(_SACCT_NULL_TIMES) | s.isna()
        parsed = pd.to_datetime(s.where(~null), format="%Y-%m-%dT%H:%M:%S", errors="coerce")
        # Outside 1970-2200 is no job time (and would overflow time-zone conversion).
        parsed = parsed.where((parsed >= _MIN_TIME) & (parsed < _MAX_TIME))
        broken = parsed.isna() & ~null
        if required:
            broken |= null
        for j in np.flatnonzero(broken.to_numpy()):
            if not bad[j]:
                bad[j] = True
                reasons[j] = (
                    f"{SACCT_COLUMNS[key][0]} {_chars(s.iloc[j])} is not a time (YYYY-MM-DDTHH:MM:SS, 1970-2199)"
                )
        return parsed

    submit = times("submit", True)
    start = times("start", False)
    end = times("end", False)

    def ints(key: str) -> pd.Series | None:
        s = col(key)
        if s is None:
            return None
        out = pd.to_numeric(s.str.replace(r"[KMG]$", "", regex=True), errors="coerce")
        out = out.astype("Float64")
        broken = (out.isna() & s.notna() & (s != "")) | (out.notna() & ((out.abs() > 2**53) | (out.round() != out)))
        for j in np.flatnonzero(broken.fillna(False).to_numpy()):
            if not bad[j]:
                bad[j] = True
                reasons[j] = f"{SACCT_COLUMNS[key][0]} {_chars(s.iloc[j])} is not an integer"
        return out.where(~broken.fillna(False)).astype("Int64")

    def mark(mask: np.ndarray, reason) -> None:
        for j in np.flatnonzero(mask):
            if not bad[j]:
                bad[j] = True
                reasons[j] = reason(j)

    if "limit_min" in cols:
        lim = col("limit_min")
        unlimited = lim.isin(_SACCT_NO_LIMIT) | lim.isna()
        limit_min = pd.to_numeric(lim.where(~unlimited), errors="coerce")
        broken = ((limit_min.isna() & ~unlimited) | (limit_min < 0) | (limit_min > _MAX_LIMIT_MIN)).fillna(False)
        mark(
            broken.to_numpy(),
            lambda j: f"{SACCT_COLUMNS['limit_min'][0]} {_chars(lim.iloc[j])} is not a time limit in minutes",
        )
        limit_s = (limit_min.where(~broken) * 60).round().astype("Int64")
    elif "limit_text" in cols:
        text = col("limit_text")
        seconds, broken = [], []
        for value in text:
            try:
                sec = _slurm_duration_s(value)
                ok = np.isnan(sec) or 0 <= sec <= _MAX_LIMIT_MIN * 60
            except (ValueError, TypeError):
                sec, ok = np.nan, False
            seconds.append(sec if ok else np.nan)
            broken.append(not ok)
        mark(
            np.array(broken, dtype=bool),
            lambda j: f"Timelimit {_chars(text.iloc[j])} is not a Slurm duration ([D-]HH:MM:SS, MM, UNLIMITED)",
        )
        limit_s = pd.Series(pd.array(seconds, dtype="Float64"), dtype="Float64").round().astype("Int64")
    else:
        limit_s = pd.Series(pd.NA, index=range(len(rows)), dtype="Int64")
    nodes = ints("nodes")
    procs = ints("procs")
    priority = ints("priority")
    for key, counts in (("nodes", nodes), ("procs", procs)):
        if counts is not None:
            name = header[cols[key]]
            mark(
                ((counts < 1) | (counts > _MAX_COUNT)).fillna(False).to_numpy(),
                lambda j, c=counts, n=name: f"{n} {c.iloc[j]} is not a positive count",
            )
    job_ids = col("job_id")
    mark((job_ids.isna() | (job_ids == "")).to_numpy(), lambda j: "empty JobID")

    # Logical consistency: a job cannot start before it is submitted or end before it starts.
    incons = ((start.notna() & (start < submit)) | (end.notna() & start.notna() & (end < start))).to_numpy()
    for j in np.flatnonzero(incons):
        if not bad[j]:
            bad[j] = True
            reasons[j] = "times out of order (need Submit <= Start <= End)"

    for j in np.flatnonzero(bad):
        rejected.append(Rejected(int(lineno[j]), reasons[j]))
    keep = ~bad

    state = col("state")
    status = state.map(_slurm_status) if state is not None else pd.Series("UNKNOWN", index=range(len(rows)))

    local = pd.DataFrame({"submit": submit, "start": start, "end": end})
    utc, ambiguous, nonexistent = _localize(local, tz, uri)
    notes["ambiguous_local_times"] = ambiguous
    notes["nonexistent_local_times"] = nonexistent
    df = pd.DataFrame(
        {
            "job_id": col("job_id"),
            "submit": utc["submit"],
            "start": utc["start"],
            "end": utc["end"],
            "time_limit_s": limit_s,
            "nodes": nodes.astype("Int32")
            if nodes is not None
            else pd.Series(pd.NA, index=range(len(rows)), dtype="Int32"),
            "procs": procs.astype("Int32")
            if procs is not None
            else pd.Series(pd.NA, index=range(len(rows)), dtype="Int32"),
            "partition": col("partition")
            if "partition" in cols
            else pd.Series(pd.NA, index=range(len(rows)), dtype="string"),
            "user": col("user") if "user" in cols else pd.Series(pd.NA, index=range(len(rows)), dtype="string"),
            "status": status,
            "priority": priority if priority is not None else pd.Series(pd.NA, index=range(len(rows)), dtype="Int64"),
        }
    )[keep].reset_index(drop=True)
    dup = df["job_id"].duplicated(keep="first")
    if dup.any():
        kept_lines = lineno[keep]
        first_line = {v: int(kept_lines[i]) for i, v in reversed(list(enumerate(df["job_id"])))}
        for j in np.flatnonzero(dup.to_numpy()):  # the first row's line, not the JobID itself
            rejected.append(
                Rejected(int(kept_lines[j]), f"duplicate JobID (that of line {first_line[df['job_id'].iloc[j]]})")
            )
        df = df[~dup].reset_index(drop=True)
    rejected.sort(key=lambda r: r.line)
    meta = TraceMeta(source=uri, format=fmt, timezone=tz)
    return ParseResult(df, meta, rows_read, rejected, notes)


def _localize(local: pd.DataFrame, tz: str, uri: str) -> tuple[pd.DataFrame, int, int]:
    """Local wall-clock times -> UTC, with the counts of ambiguous and nonexistent ones.
    Ambiguous autumn times are read as standard time; times inside a spring-forward gap
    (which no clock showed) are moved to the first valid time after it. Both are counted
    and said in a warning naming the column and the zone, never silently."""
    out = {}
    ambiguous = nonexistent = 0
    for name in local.columns:
        s = local[name]
        amb = np.zeros(len(s), dtype=bool)  # False = standard time for ambiguous wall times
        try:
            probe = s.dt.tz_localize(tz, ambiguous="NaT", nonexistent="shift_forward")
            gaps = s.dt.tz_localize(tz, ambiguous=amb, nonexistent="NaT")
        except Exception as exc:  # unknown zone names
            raise StepError(f"--timezone {tz!r} is not a known time zone ({exc})") from exc
        n_amb, n_gap = int((probe.isna() & s.notna()).sum()), int((gaps.isna() & s.notna()).sum())
        if n_gap:
            first = s[gaps.isna() & s.notna()].iloc[0]
            log.warning(
                "%s: %d %s time(s) fall in a spring-forward gap of %s and do not exist (first: %s); "
                "moved to the first valid time after the gap",
                uri,
                n_gap,
                name,
                tz,
                first,
            )
        if n_amb:
            log.warning(
                "%s: %d %s time(s) are ambiguous in %s (the autumn hour shown twice); read as standard time",
                uri,
                n_amb,
                name,
                tz,
            )
        ambiguous, nonexistent = ambiguous + n_amb, nonexistent + n_gap
        out[name] = (
            s.dt.tz_localize(tz, ambiguous=amb, nonexistent="shift_forward").dt.tz_convert("UTC").dt.as_unit("s")
        )
    return pd.DataFrame(out), ambiguous, nonexistent


def _slurm_duration_s(text: str | None) -> float:
    """Slurm time strings: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``."""
    if text is None or text in ("", "UNLIMITED", "Partition_Limit", "INVALID") or pd.isna(text):
        return np.nan
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
        parts = [int(x) for x in text.split(":")]
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    else:
        parts = [int(x) for x in text.split(":")]
        if len(parts) == 1:
            h, m, s = 0, parts[0], 0
        elif len(parts) == 2:
            h, m, s = 0, parts[0], parts[1]
        else:
            h, m, s = parts
    return float(((days * 24 + h) * 60 + m) * 60 + s)


def _slurm_status(state: str | None) -> str:
    if state is None or pd.isna(state) or not state.split():
        return "UNKNOWN"
    s = state.split()[0].upper()
    if s == "COMPLETED":
        return "COMPLETED"
    if s in ("FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"):
        return "FAILED"
    if s.startswith("CANCELLED"):
        return "CANCELLED"
    if s == "TIMEOUT":
        return "TIMEOUT"
    return "UNKNOWN"


# ---------------------------------------------------------------- SWF

_SWF_STATUS = {1: "COMPLETED", 0: "FAILED", 5: "CANCELLED"}
_HEADER = re.compile(r"^;\s*([A-Za-z]+)\s*:\s*(.*)$")
_REMOVED = re.compile(r"\((\d+) jobs? removed\)")


def _parse_swf(lines: list[str], uri: str) -> ParseResult:
    header: dict[str, str] = {}
    partitions: dict[str, str] = {}
    removed = 0
    cleaned = False
    data_lines: list[str] = []
    data_linenos: list[int] = []
    rejected: list[Rejected] = []
    for i, raw in enumerate(lines):
        s = raw.strip()
        if not s:
            continue
        if s.startswith(";"):
            m = _HEADER.match(s)
            if m:
                key, val = m.group(1), m.group(2).strip()
                if key == "Partition":
                    num, _, name = val.partition(" ")
                    partitions[num.strip()] = name.strip()
                elif key not in header:
                    header[key] = val
            if "CLEANED VERSION" in s:
                cleaned = True
            r = _REMOVED.search(s)
            if r:
                removed += int(r.group(1))
            continue
        data_lines.append(s)
        data_linenos.append(i + 1)
    # One split per line: count fields, keep the 18-field rows, parse them in one go.
    good: list[str] = []
    good_lines: list[int] = []
    for s, ln in zip(data_lines, data_linenos, strict=True):
        n = s.count(" ") + 1 if "  " not in s and "\t" not in s else len(s.split())
        if n != 18:
            rejected.append(Rejected(ln, f"{n} fields, expected 18 (SWF)"))
            continue
        good.append(s)
        good_lines.append(ln)
    try:
        values = np.loadtxt(io.StringIO("\n".join(good)), dtype=np.float64, ndmin=2) if good else np.empty((0, 18))
    except ValueError:
        values, more_rejected, good_lines = _swf_rowwise(good, good_lines)
        rejected.extend(more_rejected)
    if values.shape[0] and values.shape[1] != 18:
        raise StepError(f"{uri}: SWF rows do not have 18 fields")

    try:
        t0 = int(header.get("UnixStartTime", "0").split()[0])
    except (ValueError, IndexError) as exc:
        raise StepError(f"{uri}: header UnixStartTime {_chars(header.get('UnixStartTime'))} is not an integer") from exc
    if not 0 <= t0 <= _MAX_EPOCH_S:
        raise StepError(f"{uri}: header UnixStartTime {t0} is outside 1970-2200")
    if "UnixStartTime" not in header:
        log.warning("%s: no UnixStartTime header; times are seconds from the epoch", uri)
    keep, row_rejects = _swf_check_rows(values, good_lines, t0)
    rejected.extend(row_rejects)
    values = values[keep]

    v = values
    submit = t0 + v[:, 1]
    wait, run = v[:, 2], v[:, 3]
    # a job cancelled (status 5) with no run time never ran: no start; it left the queue at
    # submit + wait (the log's time of its cancellation), unknown when the wait is -1
    never_ran = (v[:, 10] == 5) & (run <= 0)
    start = np.where((wait >= 0) & ~never_ran, submit + np.maximum(wait, 0), np.nan)
    end = np.where((wait >= 0) & ((run >= 0) | never_ran), submit + np.maximum(wait, 0) + np.maximum(run, 0), np.nan)
    req_procs = np.where(v[:, 7] > 0, v[:, 7], v[:, 4])
    max_nodes = _header_size(header, "MaxNodes", uri)
    max_procs = _header_size(header, "MaxProcs", uri)
    if max_procs is not None:
        over = int((req_procs > max_procs).sum())
        if over:
            log.warning(
                "%s: %d job(s) ask for more processors than the header's MaxProcs %d (largest: %d)",
                uri,
                over,
                max_procs,
                int(req_procs.max()),
            )
    zone = header.get("TimeZoneString", "UTC").strip() or "UTC"
    try:
        import zoneinfo

        zoneinfo.ZoneInfo(zone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        log.warning(
            "%s: header TimeZoneString %s is not a known time zone (times are read from UnixStartTime, "
            "in UTC, as always)",
            uri,
            _chars(zone),
        )
    one_proc_per_node = max_nodes is not None and max_nodes == max_procs
    part_num = v[:, 15].astype(np.int64)

    def ts(a: np.ndarray) -> pd.Series:
        return pd.to_datetime(pd.Series(a), unit="s", utc=True).dt.as_unit("s")

    procs = pd.array(np.where(req_procs > 0, req_procs, np.nan), dtype="Float64").round().astype("Int32")
    df = pd.DataFrame(
        {
            "job_id": pd.Series(v[:, 0].astype(np.int64).astype(str), dtype="string"),
            "submit": ts(submit),
            "start": ts(start),
            "end": ts(end),
            "time_limit_s": pd.array(np.where(v[:, 8] > 0, v[:, 8], np.nan), dtype="Float64").round().astype("Int64"),
            "nodes": procs if one_proc_per_node else pd.array([pd.NA] * len(v), dtype="Int32"),
            "procs": procs,
            "partition": pd.Series(
                [partitions.get(str(p), str(p)) if p >= 0 else None for p in part_num], dtype="string"
            ),
            "user": pd.Series(np.where(v[:, 11] >= 0, v[:, 11].astype(np.int64).astype(str), None), dtype="string"),
            "status": pd.Series([_SWF_STATUS.get(int(x), "UNKNOWN") for x in v[:, 10]], dtype="string"),
            "priority": pd.array([pd.NA] * len(v), dtype="Int64"),
        }
    )
    notes: dict[str, Any] = {"header": {k: header[k] for k in sorted(header)}}
    # The header's own count: MaxJobs minus the jobs the cleaning filters removed, else MaxRecords.
    max_jobs = _header_int(header.get("MaxJobs"))
    max_records = _header_int(header.get("MaxRecords"))
    if cleaned and max_jobs is not None:
        notes["expected_records"] = max_jobs - removed
    elif max_records is not None:
        notes["expected_records"] = max_records
    rejected.sort(key=lambda r: r.line)
    meta = TraceMeta(
        source=uri,
        format="swf",
        timezone=header.get("TimeZoneString", "UTC"),
        machine_nodes=max_nodes,
        machine_procs=max_procs,
        partitions=partitions,
    )
    return ParseResult(df, meta, len(data_lines), rejected, notes)


_SWF_FIELDS = (
    "job number",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable number",
    "queue number",
    "partition number",
    "preceding job",
    "think time",
)
#: Latest absolute time accepted (2200-01-01 UTC): pandas' nanosecond timestamps end in 2262.
_MAX_EPOCH_S = 7_258_118_400


def _swf_check_rows(v: np.ndarray, lines: list[int], t0: int) -> tuple[np.ndarray, list[Rejected]]:
    """Rows that can be used (mask) and the others with their reason.

    Every field must be a finite number within the exact-integer range of a float;
    the job number a non-negative integer seen for the first time; the submit time
    non-negative (SWF counts from ``UnixStartTime``) and every resulting time before
    2200. ``-1`` stays "unknown" for the fields SWF allows it in (not the job number or
    the submit time).
    """
    if not len(v):
        return np.zeros(0, dtype=bool), []
    reasons: dict[int, str] = {}

    def mark(mask: np.ndarray, reason) -> None:
        for j in np.flatnonzero(mask):
            reasons.setdefault(int(j), reason(int(j)))

    with np.errstate(invalid="ignore"):
        finite = np.isfinite(v) & (np.abs(v) <= 2.0**53)
        bad_field = np.argmin(finite, axis=1)
        mark(
            ~finite.all(axis=1),
            lambda j: f"{_SWF_FIELDS[bad_field[j]]} {float(v[j, bad_field[j]]):g} is not a finite number in range",
        )
        job = v[:, 0]
        mark((job < 0) | (np.round(job) != job), lambda j: f"job number {job[j]:g} is not a non-negative integer")
        submit = v[:, 1]
        mark(submit < 0, lambda j: f"submit time {submit[j]:g} is negative (SWF times count from UnixStartTime)")
        for col in (4, 7):  # processor counts become Int32 columns
            mark(v[:, col] > _MAX_COUNT, lambda j, c=col: f"{_SWF_FIELDS[c]} {v[j, c]:g} is out of range")
        mark(v[:, 8] > _MAX_LIMIT_MIN * 60, lambda j: f"requested time {v[j, 8]:g} s is out of range")
        last = t0 + submit + np.maximum(v[:, 2], 0) + np.maximum(v[:, 3], 0)
        mark(last > _MAX_EPOCH_S, lambda j: f"submit/wait/run times end after 2200 (submit {submit[j]:g} s)")
    ok = np.ones(len(v), dtype=bool)
    ok[list(reasons)] = False
    seen: set[int] = set()
    for j in np.flatnonzero(ok):
        number = int(v[j, 0])
        if number in seen:
            reasons[int(j)] = f"duplicate job number {number}"
            ok[j] = False
        seen.add(number)
    return ok, [Rejected(lines[j], f"SWF {r}") for j, r in sorted(reasons.items())]


def _swf_rowwise(good: list[str], lines: list[int]) -> tuple[np.ndarray, list[Rejected], list[int]]:
    rows, kept, rej = [], [], []
    for s, ln in zip(good, lines, strict=True):
        try:
            rows.append([float(x) for x in s.split()])
            kept.append(ln)
        except ValueError:
            rej.append(Rejected(ln, "non-numeric field in SWF row"))
    return (np.array(rows, dtype=np.float64).reshape(-1, 18), rej, kept)


def _header_size(header: dict[str, str], key: str, uri: str) -> int | None:
    """A machine size from the SWF header (``MaxNodes``, ``MaxProcs``): None when absent, a
    :class:`StepError` naming the header when it is not a positive integer."""
    val = header.get(key)
    if not val or not val.strip():
        return None
    m = re.match(r"\s*([+-]?\d+)", val)
    if not m or int(m.group(1)) <= 0:  # the number read, or the text described: a header is the file's own
        shown = int(m.group(1)) if m else _chars(val.strip())
        raise StepError(f"{uri}: header {key} {shown} is not a positive integer (the machine's size)")
    return int(m.group(1))


def _header_int(val: str | None) -> int | None:
    if not val:
        return None
    m = re.match(r"\s*(\d+)", val)
    return int(m.group(1)) if m else None
