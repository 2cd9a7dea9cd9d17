"""The step contract: outputs first, then a success marker carrying a fingerprint.

A step owns one output prefix (``--out``). It writes its files there, each atomically,
and last the marker ``_SUCCESS.json``::

    {"step": ..., "fingerprint": ..., "params": ..., "inputs": [...],
     "outputs": {"name": {"size": .., "sha256": ..}}, "started": .., "finished": ..,
     "code": {"bundle_name": .., "bundle_version": .., "source": ..},
     "command": {"package": .., "argv": [...], "cwd": ..}}

The fingerprint is the SHA-256 of the step name, its code version, its parameters and
the fingerprints of its inputs (an input produced by another step contributes that
step's fingerprint; any other file contributes the SHA-256 of its bytes). A rerun with
the same fingerprint is skipped only when every output still has the size and SHA-256
the marker recorded (a truncated or edited output is recomputed). A rerun with a
different fingerprint first removes the old marker, so readers never trust outputs
that are being replaced. A failing step never writes a marker.

**The code that made it.** ``code`` names the DAG bundle and its version (a git commit) that
produced the outputs (:func:`stepkit.provenance.code_version`) and ``command`` the step's command
line (``python -m <package> <argv...>``, set by the CLI), so ``devtools/rerun_at_version.py`` can
rerun the output at that commit and compare digests. Both are recorded, not part of the
fingerprint: a rerun of the same inputs and parameters under a newer commit still skips, and the
marker keeps naming the code that really wrote the outputs (markers written before they were
recorded have neither and skip as before).

**Replaced or refused.** What a rerun with a *different* fingerprint does is the run's
``on_change``: ``replace`` (the default for an output whose location is keyed by what it
depends on, such as every ``mirage_pipeline`` prefix of :mod:`mirage_tasks.data.keys`: there a
new fingerprint means new code or a grown source, and recomputing is the point) or ``refuse``
(an output keyed by a name a user gave, such as ``mirage_evaluation``'s
``<root>/<name>/{trace,cal,waitpred}``: its neighbours were computed from it, so other inputs
under the same name would leave them describing another output). A refused run raises
:class:`StepError` (exit 2) naming the committed inputs and parameters and the new ones, and
touches nothing. A run that commits under ``refuse`` records it in its marker, so a later run
that does not say (``on_change=None``, the CLI's default) refuses too; only an explicit
``replace`` (``--on-change replace``) replaces it. The CLI sets the policy for every step with
``--on-change`` (:attr:`Step.default_on_change`). A rerun with the same fingerprint whose
outputs were damaged is recomputed under either policy: its inputs are the same.

**One writer per prefix.** A run takes the prefix's lease (:mod:`stepkit.lease`,
``_LEASE.json``) before it decides whether to skip and before its first write, and gives
it back when it skipped, committed or failed; a second writer of the same prefix meanwhile
fails with exit 2 naming the first. A skip holds the lease only while it checks the
outputs: "up to date" is then true of outputs no other run is replacing at that moment.

**Inputs verified, not trusted.** An upstream output a step reads (an input folder whose
marker :func:`input_fingerprint` or :func:`require_committed` read) is trusted through its
marker only as far as its files still match it: every file of that folder the step opens
(:func:`stepkit.storage.open_read`) is checked against the size (every open) and the
SHA-256 (once per file per process) the marker recorded, and a mismatch is an exit 2
naming the file and what differs (:func:`verify_read`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import socket
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from . import lease as leases, provenance, storage
from .errors import StepError

MARKER = "_SUCCESS.json"
log = logging.getLogger("stepkit")

__all__ = ["MARKER", "ON_CHANGE", "Step", "StepError", "read_marker", "require_committed", "verify_read"]

#: What a rerun with a different fingerprint does to a committed output (see the module docstring).
ON_CHANGE = ("replace", "refuse")


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
    """Fingerprint of one input: an upstream step's marker fingerprint, else content hash.

    An upstream folder's marker is registered for :func:`verify_read`; so is the marker of the
    folder holding a single input file when it lists that file (``.../trace.parquet``)."""
    marker = read_marker(uri) if _looks_like_dir(uri) else None
    if marker is not None:
        trust(uri, marker)
        return "step:" + marker["fingerprint"]
    fs, path = storage.filesystem(uri)
    if not fs.exists(path):
        raise StepError(f"input not found: {uri}")
    if fs.isdir(path):
        h = hashlib.sha256()
        for rel in storage.list_files(uri):
            h.update(rel.encode() + b"\0" + storage.sha256_of(storage.join(uri, rel)).encode())
        return "dir:" + h.hexdigest()
    digest = storage.sha256_of(uri)
    _trust_parent(uri, digest)
    return "sha256:" + digest


# ----------------------------------------------------------------------------- inputs verified against markers

_lock = threading.Lock()
#: committed upstream folders read by this process: normalised folder -> (marker URI, its outputs)
_trusted: dict[str, tuple[str, dict[str, Any]]] = {}
#: (file, size, sha256) whose content this process has hashed and found as its marker recorded
_verified: set[tuple[str, int, str]] = set()


def _norm(uri: str) -> str:
    return storage.normalize(uri).rstrip("/")


def trust(folder: str, marker: dict[str, Any]) -> None:
    """Check the files of the committed ``folder`` against ``marker`` whenever they are read."""
    outputs = marker.get("outputs")
    if isinstance(outputs, dict):
        with _lock:
            _trusted[_norm(folder)] = (marker_uri(folder), outputs)


def forget(folder: str) -> None:
    """Stop checking reads under ``folder`` (this process is about to write there)."""
    base = _norm(folder)
    with _lock:
        for key in [k for k in _trusted if k == base or k.startswith(base + "/")]:
            del _trusted[key]


def trust_containing(uri: str) -> None:
    """An input given as one file (``.../trace.parquet``) inside a committed folder that lists it:
    check the file (and the folder's other files) against that folder's marker when read."""
    _trust_parent(uri, None)


def _trust_parent(uri: str, digest: str | None) -> None:
    """An input file inside a committed folder that lists it: trust that folder's marker
    (and, with ``digest``, the file's content as already hashed)."""
    norm = _norm(uri)
    parent, _, rel = norm.rpartition("/")
    if not parent or rel == MARKER:
        return
    try:
        marker = read_marker(parent)
    except StepError:
        return  # a corrupt marker beside a file input: the file is fingerprinted by content anyway
    if marker is None or rel not in (marker.get("outputs") or {}):
        return
    trust(parent, marker)
    want = marker["outputs"][rel]
    if digest is not None and isinstance(want, dict) and want.get("sha256") == digest:
        with _lock:
            _verified.add((norm, int(want.get("size", -1)), digest))


def verify_read(uri: str) -> None:
    """Refuse (:class:`StepError`, exit 2) to read a file of a committed upstream output that no
    longer matches its marker: the size on every read, the SHA-256 once per file per process."""
    if not _trusted:
        return
    norm = _norm(uri)
    with _lock:
        found = [(k, v) for k, v in _trusted.items() if norm.startswith(k + "/")]
    if not found:
        return
    folder, (marker, outputs) = max(found, key=lambda kv: len(kv[0]))
    rel = norm[len(folder) + 1 :]
    if rel not in outputs:
        return
    want = outputs[rel]
    if not isinstance(want, dict) or "size" not in want or "sha256" not in want:
        raise StepError(
            f"input {uri}: its marker {marker} records no size and SHA-256 for {rel} "
            "(written by an older version): rerun the step that wrote it"
        )
    try:
        size = storage.size_of(uri)
    except FileNotFoundError:
        raise StepError(
            f"input {uri} is missing, but its marker {marker} lists it: the folder was changed "
            "after the step that wrote it committed; rerun that step"
        ) from None
    if size != want["size"]:
        raise StepError(
            f"input {uri} has {size} bytes, but its marker {marker} recorded {want['size']}: "
            f"the file was truncated or replaced after the step that wrote it committed; rerun that step"
        )
    key = (norm, int(want["size"]), str(want["sha256"]))
    if key in _verified:
        return
    digest = storage.sha256_of(uri)
    if digest != want["sha256"]:
        raise StepError(
            f"input {uri} has SHA-256 {digest[:16]}..., but its marker {marker} recorded "
            f"{str(want['sha256'])[:16]}... (same size, {size} bytes): the file was replaced after the "
            f"step that wrote it committed; rerun that step"
        )
    with _lock:
        _verified.add(key)


storage.read_check = verify_read


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


def _short(v: Any, limit: int = 160) -> str:
    text = json.dumps(v, sort_keys=True, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_difference(marker: dict[str, Any], step: Step) -> str:
    """What differs between a committed run (its marker) and ``step``, in words: the code
    version, each parameter that differs (committed value, then this run's) and each input
    (URI and fingerprint) that differs."""
    parts = []
    if marker.get("version") != step.version:
        parts.append(f"code version {marker.get('version')!r} committed, {step.version!r} now")
    old, new = marker.get("params") or {}, step.params
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k, "(absent)"), new.get(k, "(absent)")
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            parts.append(f"parameter {k}: committed {_short(a)}, this run {_short(b)}")

    def ins(doc_inputs: Any) -> list[str]:
        return [f"{i.get('uri')} ({str(i.get('fingerprint'))[:23]})" for i in doc_inputs or [] if isinstance(i, dict)]

    a_in, b_in = ins(marker.get("inputs")), ins(step.inputs)
    if a_in != b_in:
        parts.append(f"inputs: committed {', '.join(a_in) or 'none'}; this run {', '.join(b_in) or 'none'}")
    if not parts:
        parts.append(f"fingerprint {str(marker.get('fingerprint'))[:12]} committed, {step.fingerprint[:12]} now")
    return "; ".join(parts)


class Step:
    """One run of a step writing under ``out``.

    >>> step = Step("ingest", out, version, params={...}, inputs=[trace_uri])
    >>> if step.skip(): return 0
    >>> step.write_bytes("trace.parquet", data)
    >>> step.commit(summary={...})
    """

    #: the process's policy for runs that name none (the step CLI's ``--on-change``); None: the
    #: committed marker's, else ``replace``
    default_on_change: str | None = None
    #: the step's command line, recorded in the marker (``{"package", "argv", "cwd"}``; set by the step CLI)
    command: dict[str, Any] | None = None

    def __init__(
        self,
        name: str,
        out: str,
        version: str,
        params: dict[str, Any],
        inputs: Iterable[str] = (),
        *,
        on_change: str | None = None,
    ):
        on_change = on_change if on_change is not None else Step.default_on_change
        if on_change is not None and on_change not in ON_CHANGE:
            raise ValueError(f"on_change must be one of {ON_CHANGE} or None, not {on_change!r}")
        self.on_change = on_change
        self._checked = False
        self._committed: dict[str, Any] | None = None  # the policy the marker found here recorded
        self.name = name
        self.out = storage.normalize(out)
        self.version = version
        self.params = params
        self.fingerprint, self.inputs = fingerprint(name, version, params, list(inputs))
        self.started = _utcnow()
        self.outputs: list[str] = []
        self._invalidated = False
        self._lease: leases.Lease | None = None

    #: the lease each output prefix's latest Step of this process took (see :meth:`_hold`)
    _own: dict[str, leases.Lease] = {}

    def _hold(self) -> leases.Lease:
        """This run's lease on its prefix, taken on first use (:class:`stepkit.lease.LeaseHeld`,
        exit 2, when another writer holds it); :class:`~stepkit.lease.LeaseLost` once lost."""
        if self._lease is not None and (self._lease.held or self._lease.lost):
            self._lease.check()
            return self._lease
        earlier = Step._own.get(self.out)
        if earlier is not None and earlier is not self._lease and earlier.held:
            # an earlier Step of this process on the same prefix that failed without committing
            earlier.release()
        try:
            self._lease = leases.Lease(
                self.out, self.name, fingerprint=self.fingerprint, started=self.started
            ).acquire()
        except OSError as exc:  # any other reason the folder cannot be made (a missing /proc/x, a full disk)
            raise StepError(
                f"output {self.out}: cannot create or use it as a folder: "
                f"{exc.strerror or exc} ({exc.filename or self.out})"
            ) from None
        Step._own[self.out] = self._lease
        return self._lease

    def release(self) -> None:
        """Give the prefix's lease back (commit and a skip do; the CLI does when a step fails)."""
        if self._lease is not None:
            self._lease.release()
            if Step._own.get(self.out) is self._lease:
                del Step._own[self.out]

    def path(self, rel: str) -> str:
        """URI of an output file (relative to the output prefix)."""
        return storage.join(self.out, rel)

    def skip(self) -> bool:
        """True (and a log line) when a committed run with the same fingerprint is present.

        Otherwise the stale marker is removed at this run's first write (not before, so
        a run that fails on bad input leaves the stored results and their marker alone).

        The check holds the prefix's lease: a run that skips gives it back at once; one that
        goes on keeps it until it commits or fails.
        """
        try:
            self._hold()
        except leases.OutputNotWritable:
            # nobody can write here, so no lease is needed to read it: up to date skips, as
            # before leases; anything else cannot be computed here and is refused (exit 2)
            marker = read_marker(self.out)
            if (
                marker is not None
                and marker.get("fingerprint") == self.fingerprint
                and not self._changed_outputs(marker.get("outputs") or {})
            ):
                log.info(
                    "%s: skipped, outputs in %s (not writable here) are up to date (fingerprint %s)",
                    self.name,
                    self.out,
                    self.fingerprint[:12],
                )
                print(f"{self.name}: skipped (up to date: {self.out})", flush=True)
                return True
            raise
        marker = read_marker(self.out)
        self._refuse_other_inputs(marker)
        if marker is not None and marker.get("fingerprint") == self.fingerprint:
            changed = self._changed_outputs(marker.get("outputs") or {})
            if not changed:
                self.release()
                log.info(
                    "%s: skipped, outputs in %s are up to date (fingerprint %s)",
                    self.name,
                    self.out,
                    self.fingerprint[:12],
                )
                print(f"{self.name}: skipped (up to date: {self.out})", flush=True)
                return True
            log.warning(
                "%s: marker present but outputs differ from what it recorded (%s); recomputing",
                self.name,
                "; ".join(changed),
            )
            print(
                f"{self.name}: recomputing, committed outputs changed since their marker: {'; '.join(changed)}",
                flush=True,
            )
        return False

    def _policy(self, marker: dict[str, Any] | None) -> str:
        """This run's ``on_change``: its own, else what the committed marker recorded, else replace."""
        if self.on_change is not None:
            return self.on_change
        return "refuse" if marker is not None and marker.get("on_change") == "refuse" else "replace"

    def _refuse_other_inputs(self, marker: dict[str, Any] | None) -> None:
        """Under ``refuse``: a :class:`StepError` naming both runs' inputs and parameters when a
        committed output of another fingerprint is there. Nothing is touched (the caller gives
        the lease back: the CLI on the error, a library caller through :meth:`release`)."""
        self._checked = True
        self._committed = {"on_change": marker.get("on_change")} if marker else None
        if marker is None or marker.get("fingerprint") == self.fingerprint or self._policy(marker) != "refuse":
            return
        raise StepError(
            f"{self.out} holds a committed {marker.get('step') or self.name} output of other inputs, "
            f"and an output under a given name is never replaced by other inputs (its neighbours were "
            f"computed from it). {describe_difference(marker, self)}. Nothing was changed: give this "
            f"run another name (another output folder), or, to replace that output and make what was "
            f"computed from it stale, rerun with --on-change replace"
        )

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
        """Hold the lease (checked at every write); remove a previous run's marker before the
        first output is replaced."""
        self._hold()
        if not self._invalidated:
            if not self._checked:  # a step that writes without asking skip() first
                self._refuse_other_inputs(read_marker(self.out))
            forget(self.out)  # this process writes here now: its reads are no upstream's
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

    def commit(self, summary: dict[str, Any] | None = None, *, release: bool = True) -> dict[str, Any]:
        """Write the success marker, last, and give the lease back (``release=False``: the
        caller still tidies the prefix and calls :meth:`release`). Returns the marker document.

        Just before the marker the lease is renewed and checked (:meth:`stepkit.lease.Lease.verify`):
        a run that lost it (taken over after it stalled past its expiry) fails instead of committing."""
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
            # which code wrote the outputs, and how to run it again: recorded, never fingerprinted
            "code": provenance.code_version(),
        }
        if Step.command is not None:
            doc["command"] = Step.command
        if self._policy(self._committed) == "refuse":  # a later run that names no policy refuses too
            doc["on_change"] = "refuse"
        self._hold().verify()
        storage.write_json(marker_uri(self.out), doc)
        if release:
            self.release()
        print(f"{self.name}: committed {len(outputs)} output(s) to {self.out}", flush=True)
        return doc


def require_committed(uri: str, what: str = "input") -> dict[str, Any]:
    """The marker of an upstream output prefix; a clear error when it is missing.

    From here on, the files this process reads from the prefix are checked against it
    (:func:`verify_read`)."""
    marker = read_marker(uri)
    if marker is None:
        raise StepError(f"{what} {uri} has no {MARKER}: the step that writes it did not finish")
    trust(uri, marker)
    return marker
