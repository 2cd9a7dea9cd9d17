"""Results layout and the run record.

``<results>/<date>/<run-id>/<experiment>/<system>/<params-slug>/repeat-<r>/attempt-<k>/``
holds ``run.json`` (the run record, schema ``schemas/run_record.schema.json``) and the
point's files (``histogram.hdr``, ``latency.json``, ``latency.txt``, ``calls.jsonl``,
``output.txt``, ``billing_summary.json``, ...). A rerun claims the next attempt number;
nothing is ever overwritten except the attempt's own ``run.json`` as it moves from
``running`` to ``succeeded``/``failed``. A failed attempt keeps whatever it wrote.
Run-level files: ``_ops/`` (one report per step invocation), ``billing/`` and ``summary/``.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import json
import os
import platform
import socket
import sys
import uuid
from importlib import resources
from typing import Any

import jsonschema

from stepkit import StepError, storage

from . import __version__
from .catalogue import slug

RECORD = "run.json"


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def run_prefix(root: str, date: str, run_id: str) -> str:
    return storage.join(root, date, run_id)


def point_prefix(root: str, date: str, run_id: str, experiment: str, system: str, params: dict[str, Any],
                 repeat: int) -> str:
    return storage.join(root, date, run_id, experiment, system, slug(params), f"repeat-{repeat}")


def _schema() -> dict[str, Any]:
    return json.loads(resources.files("faasm_tasks").joinpath("schemas/run_record.schema.json").read_text())


def validate_record(rec: dict[str, Any]) -> None:
    errs = sorted(jsonschema.Draft7Validator(_schema()).iter_errors(rec), key=lambda e: list(e.absolute_path))
    if errs:
        raise StepError("invalid run record: " + "; ".join(
            f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errs[:5]))


def versions() -> dict[str, Any]:
    pk = {}
    for name in ("numpy", "torch", "redis", "requests", "hdrhistogram", "kubernetes", "psutil"):
        try:
            pk[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return {"faasm_tasks": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
            "packages": pk}


def _fresh(uri: str):
    """The filesystem with its listing cache dropped (s3fs caches directory listings)."""
    fs, path = storage.filesystem(uri)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache(path)
    return fs, path


def attempts(prefix: str) -> list[int]:
    fs, path = _fresh(prefix)
    try:
        names = [os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []
    return sorted(int(n.split("-", 1)[1]) for n in names if n.startswith("attempt-") and n[8:].isdigit())


def latest_record(prefix: str) -> dict[str, Any] | None:
    for k in reversed(attempts(prefix)):
        uri = storage.join(prefix, f"attempt-{k}", RECORD)
        if storage.exists(uri):
            return storage.read_json(uri)
    return None


class Attempt:
    """One attempt folder: claimed on creation, finished exactly once."""

    def __init__(self, prefix: str, base: dict[str, Any]):
        self.prefix = prefix
        for _ in range(20):
            k = (attempts(prefix) or [0])[-1] + 1
            self.uri = storage.join(prefix, f"attempt-{k}")
            if storage.is_local(self.uri):
                try:
                    os.makedirs(storage.local_path(self.uri), exist_ok=False)
                except FileExistsError:
                    continue  # another process claimed it: take the next number
            elif storage.exists(storage.join(self.uri, RECORD)):
                continue
            break
        else:
            raise StepError(f"could not claim an attempt folder under {prefix}")
        self.files: list[str] = []
        self.record = {
            "schema_version": 1, **base, "attempt": k, "status": "running", "started": utcnow(),
            "finished": None, "duration_s": None, "outcome": {"ok": False, "error": None},
            "versions": versions(), "host": socket.gethostname(), "files": [], "metrics": {},
        }
        self.record.setdefault("images", {})
        self._t0 = dt.datetime.now(dt.UTC)
        self._save()

    def _save(self) -> None:
        self.record["files"] = sorted(self.files)
        validate_record(self.record)
        storage.write_json(storage.join(self.uri, RECORD), self.record)

    def path(self, name: str) -> str:
        return storage.join(self.uri, name)

    def write_text(self, name: str, text: str) -> str:
        return self.write_bytes(name, text.encode("utf-8"))

    def write_bytes(self, name: str, data: bytes) -> str:
        uri = self.path(name)
        if storage.exists(uri):
            raise StepError(f"refusing to overwrite {uri}")
        storage.write_bytes(uri, data)
        self.files.append(name)
        return uri

    def write_json(self, name: str, obj: Any) -> str:
        return self.write_text(name, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def finish(self, ok: bool, error: str | None = None, metrics: dict[str, Any] | None = None,
               failed_calls: int = 0) -> dict[str, Any]:
        self.record["status"] = "succeeded" if ok else "failed"
        self.record["finished"] = utcnow()
        self.record["duration_s"] = round((dt.datetime.now(dt.UTC) - self._t0).total_seconds(), 3)
        self.record["outcome"] = {"ok": ok, "error": error, "failed_calls": failed_calls}
        self.record["metrics"] = metrics or {}
        self._save()
        return self.record

    def update(self, **fields: Any) -> None:
        self.record.update(fields)
        self._save()


def iter_records(root: str, date: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    """(attempt URI, record) for every attempt of a run."""
    base = run_prefix(root, date, run_id)
    _fresh(base)
    out = []
    for rel in storage.list_files(base):
        if rel.endswith("/" + RECORD) and "/attempt-" in rel:
            uri = storage.join(base, rel)
            try:
                out.append((uri[: -len(RECORD) - 1], storage.read_json(uri)))
            except (ValueError, OSError):
                continue
    return out


def write_op_report(root: str, date: str, run_id: str, step: str, report: dict[str, Any]) -> str:
    """One report per step invocation under ``_ops/`` (timestamped, never overwritten)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    uri = storage.join(run_prefix(root, date, run_id), "_ops", f"{step}-{stamp}-{uuid.uuid4().hex[:6]}.json")
    storage.write_json(uri, {"step": step, "run_id": run_id, "date": date, "at": utcnow(),
                             "host": socket.gethostname(), **report})
    return uri
