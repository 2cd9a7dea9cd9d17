"""The normalised job-trace schema every Mirage step reads (written by ``ingest`` and ``synth``).

One row per job, in submit order. Times are UTC (``timestamp[s, tz=UTC]``); the source's
local times are converted with an explicit time zone at ingestion.

| column         | type                 | meaning                                                        |
|----------------|----------------------|----------------------------------------------------------------|
| job_id         | string               | the scheduler's job id (unique within a trace)                 |
| submit         | timestamp[s, UTC]    | submission time                                                |
| start          | timestamp[s, UTC]?   | start time (null: never started / unknown)                     |
| end            | timestamp[s, UTC]?   | end time (null: unknown)                                       |
| time_limit_s   | int64?               | requested wall-time limit in seconds                           |
| nodes          | int32?               | nodes requested (null when the source gives processors only)   |
| procs          | int32?               | processors requested (null when the source gives nodes only)   |
| partition      | string?              | partition / queue name                                         |
| user           | string?              | anonymised user id                                             |
| status         | string               | COMPLETED, FAILED, CANCELLED, TIMEOUT or UNKNOWN                |
| priority       | int64?               | the scheduler's recorded priority (Slurm sacct), else null     |

The Parquet file also carries key ``mirage.trace`` in its schema metadata: a JSON object
with ``source``, ``format``, ``timezone``, ``machine_nodes`` and ``machine_procs`` (null
when unknown), the ``partitions`` map of SWF headers and ``hygiene`` (how many jobs got a filled
time limit, of which kind, and how many never ran: :mod:`mirage_tasks.data.limits`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from stepkit import StepError, storage

TS = pa.timestamp("s", tz="UTC")
SCHEMA = pa.schema(
    [
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("submit", TS, nullable=False),
        pa.field("start", TS),
        pa.field("end", TS),
        pa.field("time_limit_s", pa.int64()),
        pa.field("nodes", pa.int32()),
        pa.field("procs", pa.int32()),
        pa.field("partition", pa.string()),
        pa.field("user", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("priority", pa.int64()),
    ]
)
COLUMNS = [f.name for f in SCHEMA]
STATUSES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "UNKNOWN")
META_KEY = b"mirage.trace"
TRACE_FILE = "trace.parquet"


@dataclass
class TraceMeta:
    source: str
    format: str
    timezone: str
    machine_nodes: int | None = None
    machine_procs: int | None = None
    partitions: dict[str, str] = field(default_factory=dict)
    #: what ingest filled or kept for the jobs the log leaves incomplete: ``limit_fill`` (the
    #: counts of :func:`mirage_tasks.data.limits.fill_limits`) and ``never_ran`` (jobs that left
    #: the queue without running, with the time they left)
    hygiene: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)


def to_table(df: pd.DataFrame, meta: TraceMeta) -> pa.Table:
    """Arrow table in the normalised schema (columns checked, rows sorted by submit then id)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise StepError(f"trace frame lacks columns {missing}")
    df = df[COLUMNS].sort_values(["submit", "job_id"], kind="stable").reset_index(drop=True)
    table = pa.Table.from_pandas(df, schema=SCHEMA, preserve_index=False)
    return table.replace_schema_metadata({META_KEY: meta.to_json().encode()})


def write_trace(uri: str, df: pd.DataFrame, meta: TraceMeta) -> None:
    table = to_table(df, meta)
    with storage.atomic_write(uri) as f:
        pq.write_table(table, f, compression="zstd")


def resolve(uri: str) -> str:
    """Accept either the Parquet file or an ingest/synth output prefix holding ``trace.parquet``."""
    if uri.endswith(".parquet"):
        return uri
    return storage.join(uri, TRACE_FILE)


def read_trace(
    uri: str, start: pd.Timestamp | None = None, end: pd.Timestamp | None = None
) -> tuple[pd.DataFrame, TraceMeta]:
    """Read a normalised trace, optionally only jobs submitted in ``[start, end)``."""
    path = resolve(uri)
    if not storage.exists(path):
        raise StepError(f"trace not found: {path}")
    with storage.open_read(path) as f:
        table = pq.read_table(f)
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise StepError(f"{path}: not a normalised trace (no {META_KEY.decode()} metadata); run ingest first")
    meta = TraceMeta(**json.loads(raw))
    got = [f.name for f in table.schema]
    if got != COLUMNS:
        raise StepError(f"{path}: columns {got} do not match the trace schema {COLUMNS}")
    df = table.to_pandas()
    if start is not None:
        df = df[df["submit"] >= start]
    if end is not None:
        df = df[df["submit"] < end]
    return df.reset_index(drop=True), meta


def parse_time(value: str | None, flag: str) -> pd.Timestamp | None:
    """A command-line ISO date/time as a UTC timestamp (UTC when it has no offset); None stays None."""
    if value is None:
        return None
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError) as exc:
        raise StepError(f"{flag} {value!r} is not an ISO date/time") from exc
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")


def epoch_seconds(series: pd.Series) -> np.ndarray:
    """int64 seconds since the Unix epoch; -1 where null."""
    out = np.full(len(series), -1, dtype=np.int64)
    mask = series.notna().to_numpy()
    if mask.any():
        out[mask] = series[mask].astype("int64").to_numpy() // _unit_divisor(series)
    return out


def _unit_divisor(series: pd.Series) -> int:
    unit = getattr(series.dtype, "unit", "ns")
    return {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}[unit]


def describe(df: pd.DataFrame) -> dict[str, Any]:
    """Short statistics of a trace frame (used by reports and the ingest summary)."""
    if df.empty:
        return {"jobs": 0}
    wait = (df["start"] - df["submit"]).dt.total_seconds()
    return {
        "jobs": int(len(df)),
        "first_submit": df["submit"].min().isoformat(),
        "last_submit": df["submit"].max().isoformat(),
        "users": int(df["user"].nunique()),
        "mean_wait_h": float(np.nanmean(wait) / 3600) if wait.notna().any() else None,
        "nodes_max": int(df["nodes"].max()) if df["nodes"].notna().any() else None,
    }


DAY_S = 86400


def submit_prefixes(df: pd.DataFrame) -> dict[str, Any]:
    """Digests of the trace's prefixes: for each UTC midnight M from the first submit's day to
    the day after the last submit, the SHA-256 of every row (all columns) submitted before M,
    in the normalised order (submit, then job id). ``all`` is the digest of every row; a
    midnight past the last day has it, one before the first day the empty digest.

    A sample starting on day D depends only on the jobs submitted before D + 1 day + its
    workload (:func:`mirage_tasks.data.prefixes.prefix_before`): a trace that grew by later jobs (a cluster's next
    daily export) keeps that digest, one whose earlier rows changed (a job that ended since
    and now appears) does not."""
    # the canonical form read_trace returns (types, order), whatever frame is given
    df = to_table(df, TraceMeta(source="", format="", timezone="UTC")).to_pandas()
    sec = epoch_seconds(df["submit"]) if len(df) else np.zeros(0, np.int64)
    # one text line per row (missing values as Python prints them)
    rows = ["\x1f".join(map(str, r)) for r in df.itertuples(index=False, name=None)]
    h = hashlib.sha256()
    days: dict[str, str] = {}
    if len(df):
        first = int(sec[0]) // DAY_S * DAY_S
        last = int(sec[-1]) // DAY_S * DAY_S + DAY_S
        i = 0
        for m in range(first, last + DAY_S, DAY_S):
            j = int(np.searchsorted(sec, m, side="left"))
            for line in rows[i:j]:
                h.update(line.encode())
                h.update(b"\n")
            i = j
            days[_day(m)] = h.hexdigest()
    return {"version": 1, "days": days, "all": h.hexdigest() if len(df) else hashlib.sha256().hexdigest()}


def _day(epoch: int) -> str:
    return pd.Timestamp(epoch, unit="s", tz="UTC").strftime("%Y-%m-%d")
