"""Which jobs a sample day can see, as digests: how a growing trace keeps its sample days.

An ingested (or generated) trace carries ``submit_prefixes.json`` beside ``trace.parquet``
(:func:`mirage_tasks.data.schema.submit_prefixes`): for each UTC midnight, the SHA-256 of every row
submitted before it. A sample starting on day D replays the jobs submitted before D + 1 day +
its workload (and the warm start, jobs submitted before its start), so its partition records
:func:`prefix_before` of that horizon. When the trace grows (a cluster's daily ``sacct`` export
landing at the same place), the days whose horizon lies before the new jobs keep their digest
and are reused; the others, and any day whose earlier rows changed, are sampled again.

Stdlib only (the DAG's plan imports it); :func:`load_prefixes` computes the digests with
pandas for a trace written before the file existed.
"""

from __future__ import annotations

import hashlib
import math
from datetime import date, timedelta
from typing import Any

PREFIXES_FILE = "submit_prefixes.json"
EMPTY = hashlib.sha256().hexdigest()


def horizon(day: str, workload_days: float) -> str:
    """The midnight (YYYY-MM-DD) before which every job a sample starting on ``day`` sees was submitted."""
    return (date.fromisoformat(day) + timedelta(days=1 + math.ceil(float(workload_days)))).isoformat()


def prefix_before(prefixes: dict[str, Any], day: str, workload_days: float) -> str:
    """The digest of the jobs a sample starting on UTC ``day`` can see."""
    key = horizon(day, workload_days)
    days = prefixes["days"]
    if key in days:
        return days[key]
    if not days or key > max(days):
        return prefixes["all"]
    return EMPTY  # before the first job


def prefixes_uri(trace: str) -> str:
    """``submit_prefixes.json`` of a trace given as its prefix or its ``trace.parquet``."""
    root = trace[: -len("trace.parquet")] if trace.endswith("trace.parquet") else trace
    return root.rstrip("/") + "/" + PREFIXES_FILE


def read_prefixes(trace: str) -> dict[str, Any] | None:
    """The trace's stored digests, or None when it has none (not ingested yet, or older)."""
    from stepkit import storage

    path = prefixes_uri(trace)
    if not storage.exists(path):
        return None
    doc = storage.read_json(path)
    return doc if doc.get("version") == 1 else None


def load_prefixes(trace: str, df: Any = None) -> dict[str, Any]:
    """The stored digests, or computed from ``df`` (the trace as read) when there are none."""
    doc = read_prefixes(trace)
    if doc is not None:
        return doc
    from .schema import read_trace, submit_prefixes

    if df is None:
        df, _meta = read_trace(trace)
    return submit_prefixes(df)
