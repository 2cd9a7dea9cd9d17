"""Which DAG runs used a Mirage run prefix: ``<prefix>/_runs/<run>.json``, one small record each.

A run prefix is keyed by its configuration (:func:`mirage_tasks.run.plan.run_key`), so two DAG
runs with the same params share it (the second does no work); the storage key alone cannot
tell runs apart. The plan records, for each DAG run: its run id, logical date, trigger
(``manual``, ``scheduled``, ``backfill``, ...), the params it ran with and those that differ
from the DAG's defaults (:func:`changed_params`). The results view lists runs by these.
One file per DAG run: concurrent runs never rewrite each other's record; a retried plan
rewrites its own (atomically). Stdlib and ``stepkit.storage`` only; no Airflow import.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import Any

RUNS_DIR = "_runs"
SCHEMA = 1


def record_name(run_id: str) -> str:
    """A file name for ``run_id`` (readable, and unique through a digest of the exact id)."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", run_id)[:80]
    return f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}.json"


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def changed_params(params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{name: {"value": ..., "default": ...}}`` for every param whose value is not its default
    (a param without a default counts as changed when it is set)."""
    out = {}
    for k in sorted(params):
        v, d = _jsonable(params[k]), _jsonable(defaults.get(k))
        if v != d:
            out[k] = {"value": v, "default": d}
    return out


def record_run(
    prefix: str,
    *,
    dag_id: str,
    run_id: str,
    run_type: Any,
    logical_date: datetime | None,
    params: dict[str, Any],
    defaults: dict[str, Any],
) -> str:
    """Write ``<prefix>/_runs/<run>.json`` for this DAG run; returns its URI."""
    from stepkit import storage  # the DAG's plan task imports this module lazily

    rt = getattr(run_type, "value", run_type)
    doc = {
        "schema": SCHEMA,
        "dag_id": dag_id,
        "run_id": run_id,
        "run_type": str(rt) if rt is not None else None,
        "logical_date": logical_date.astimezone(UTC).isoformat() if logical_date else None,
        "params": _jsonable(dict(params)),
        "changed": changed_params(dict(params), dict(defaults)),
        "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    uri = storage.join(prefix, RUNS_DIR, record_name(run_id))
    storage.write_json(uri, doc)
    return uri
