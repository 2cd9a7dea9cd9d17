"""The step contract: outputs first, then a success marker carrying a fingerprint.

A step owns one output prefix (``--out``). It writes its files there, each atomically,
and last the marker ``_SUCCESS.json``::

    {"step": ..., "fingerprint": ..., "params": ..., "inputs": [...],
     "outputs": {"name": {"size": .., "sha256": ..}}, "started": .., "finished": ..}

The fingerprint is the SHA-256 of the step name, its code version, its parameters and
the fingerprints of its inputs (an input produced by another step contributes that
step's fingerprint; any other file contributes the SHA-256 of its bytes). A rerun with
the same fingerprint is skipped only when every output still has the size and SHA-256
the marker recorded (a truncated or edited output is recomputed). A rerun with a
different fingerprint first removes the old marker, so readers never trust outputs
that are being replaced. A failing step never writes a marker.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import socket
from collections.abc import Iterable, Sequence
from typing import Any

from . import storage

MARKER = "_SUCCESS.json"
log = logging.getLogger("stepkit")


class StepError(Exception):
    """A user-facing error: bad input or parameters. The CLI prints it and exits 2."""


def _utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def marker_uri(out: str) -> str:
    return storage.join(out, MARKER)


def read_marker(out: str) -> dict[str, Any] | None:
    """The marker of a committed output prefix, or None."""
    uri = marker_uri(out)
    if not storage.exists(uri):
        return None
    try:
        return storage.read_json(uri)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StepError(f"{uri}: corrupt success marker ({exc})") from exc


def load_json(uri: str) -> Any:
    """The JSON document at ``uri``; a :class:`StepError` naming the file when it does not parse."""
    try:
        return storage.read_json(uri)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StepError(f"{uri}: not valid JSON ({exc})") from exc


def input_fingerprint(uri: str) -> str:
    """Fingerprint of one input: an upstream step's marker fingerprint, else content hash."""
    marker = read_marker(uri) if _looks_like_dir(uri) else None
    if marker is not None:
        return "step:" + marker["fingerprint"]
    fs, path = storage.filesystem(uri)
    if not fs.exists(path):
        raise StepError(f"input not found: {uri}")
    if fs.isdir(path):
        h = hashlib.sha256()
        for rel in storage.list_files(uri):
            h.update(rel.encode() + b"\0" + storage.sha256_of(storage.join(uri, rel)).encode())
        return "dir:" + h.hexdigest()
    return "sha256:" + storage.sha256_of(uri)


def _looks_like_dir(uri: str) -> bool:
    fs, path = storage.filesystem(uri)
    try:
        return fs.isdir(path)
    except Exception:  # noqa: BLE001 - object stores may refuse isdir on odd keys
        return False


def fingerprint(step: str, version: str, params: dict[str, Any], inputs: Sequence[str]) -> tuple[str, list[dict]]:
    ins = [{"uri": storage.normalize(u), "fingerprint": input_fingerprint(u)} for u in inputs]
    # The URI of an input is where it lives, not what it is: only its fingerprint counts.
    doc = {"step": step, "version": version, "params": params, "inputs": [i["fingerprint"] for i in ins]}
    blob = json.dumps(doc, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest(), ins


class Step:
    """One run of a step writing under ``out``.

    >>> step = Step("ingest", out, version, params={...}, inputs=[trace_uri])
    >>> if step.skip(): return 0
    >>> step.write_bytes("trace.parquet", data)
    >>> step.commit(summary={...})
    """

    def __init__(self, name: str, out: str, version: str, params: dict[str, Any], inputs: Iterable[str] = ()):
        self.name = name
        self.out = storage.normalize(out)
        self.version = version
        self.params = params
        self.fingerprint, self.inputs = fingerprint(name, version, params, list(inputs))
        self.started = _utcnow()
        self.outputs: list[str] = []
        self._invalidated = False

    def path(self, rel: str) -> str:
        """URI of an output file (relative to the output prefix)."""
        return storage.join(self.out, rel)

    def skip(self) -> bool:
        """True (and a log line) when a committed run with the same fingerprint is present.

        Otherwise the stale marker is removed at this run's first write (not before, so
        a run that fails on bad input leaves the stored results and their marker alone).
        """
        marker = read_marker(self.out)
        if marker is not None and marker.get("fingerprint") == self.fingerprint:
            changed = self._changed_outputs(marker.get("outputs") or {})
            if not changed:
                log.info("%s: skipped, outputs in %s are up to date (fingerprint %s)",
                         self.name, self.out, self.fingerprint[:12])
                print(f"{self.name}: skipped (up to date: {self.out})", flush=True)
                return True
            log.warning("%s: marker present but outputs differ from what it recorded (%s); recomputing",
                        self.name, "; ".join(changed))
            print(f"{self.name}: recomputing, committed outputs changed since their marker: {'; '.join(changed)}",
                  flush=True)
        return False

    def _changed_outputs(self, recorded: dict[str, Any]) -> list[str]:
        """Outputs that are missing or whose size or SHA-256 differs from the marker's record."""
        changed = []
        for rel, want in recorded.items():
            uri = self.path(rel)
            if not storage.exists(uri):
                changed.append(f"{rel}: missing")
                continue
            if not isinstance(want, dict) or "size" not in want or "sha256" not in want:
                changed.append(f"{rel}: no size/sha256 recorded")
                continue
            size = storage.size_of(uri)
            if size != want["size"]:
                changed.append(f"{rel}: {size} bytes, {want['size']} committed")
            elif storage.sha256_of(uri) != want["sha256"]:
                changed.append(f"{rel}: content changed (SHA-256)")
        return changed

    def _invalidate(self) -> None:
        """Remove a previous run's marker before the first output is replaced."""
        if not self._invalidated:
            storage.remove(marker_uri(self.out))
            self._invalidated = True

    def record(self, rel: str) -> str:
        """Declare an output written by other means (e.g. ``atomic_write(step.path(rel))``)."""
        self._invalidate()
        if rel not in self.outputs:
            self.outputs.append(rel)
        return self.path(rel)

    def write_bytes(self, rel: str, data: bytes) -> str:
        uri = self.record(rel)
        storage.write_bytes(uri, data)
        return uri

    def write_json(self, rel: str, obj: Any) -> str:
        uri = self.record(rel)
        storage.write_json(uri, obj)
        return uri

    def commit(self, summary: dict[str, Any] | None = None) -> dict[str, Any]:
        """Write the success marker, last. Returns the marker document."""
        self._invalidate()
        outputs = {}
        for rel in self.outputs:
            uri = self.path(rel)
            if not storage.exists(uri):
                raise StepError(f"{self.name}: declared output {uri} was not written")
            outputs[rel] = {"size": storage.size_of(uri), "sha256": storage.sha256_of(uri)}
        doc = {
            "step": self.name,
            "version": self.version,
            "fingerprint": self.fingerprint,
            "params": self.params,
            "inputs": self.inputs,
            "outputs": outputs,
            "summary": summary or {},
            "started": self.started,
            "finished": _utcnow(),
            "host": socket.gethostname(),
        }
        storage.write_json(marker_uri(self.out), doc)
        print(f"{self.name}: committed {len(outputs)} output(s) to {self.out}", flush=True)
        return doc


def require_committed(uri: str, what: str = "input") -> dict[str, Any]:
    """The marker of an upstream output prefix; a clear error when it is missing."""
    marker = read_marker(uri)
    if marker is None:
        raise StepError(f"{what} {uri} has no {MARKER}: the step that writes it did not finish")
    return marker
