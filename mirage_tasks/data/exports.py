"""A folder of daily ``sacct`` exports read as one trace (``ingest --trace <folder>``).

A site's exporter drops one file per day into a folder, named with that day
(``ls6-2023-01-31.log.gz``: the first ``YYYY-MM-DD`` in the name). Given the folder as its
trace, ``ingest`` reads every export file directly in it, in day order (then name), as one
trace: the folder is a trace that grows by a file a day, and the sample families of its days
are named by the folder (``mirage_tasks.run.plan.sample_source``), so a month of days is one
family and ``mirage_pipeline`` reads the month's partitions with the folder as its trace.

What is an export here is what ``house.watch`` announces (its rule mirrors :data:`DAY` and
:data:`IGNORED`: the plugins never import the task packages; tests/dags/test_sacct_watch.py pins
them equal): hidden files, ``_``-prefixed markers and partial uploads (``.part``, ``.tmp``,
``.partial``, ``.crdownload``) are ignored quietly; a file whose name holds no day, a
subfolder and a link leading out of the folder are skipped and named. The folder's content
fingerprint covers exactly the files read (:func:`fingerprint`), so an upload in progress
changes nothing. Stdlib and :mod:`stepkit` only.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from datetime import date

from stepkit import StepError, storage

#: The day of an export: the first ``YYYY-MM-DD`` in its file name.
DAY = re.compile(r"(\d{4}-\d{2}-\d{2})")
#: File names that are never exports (partial uploads, hidden files, markers).
IGNORED = re.compile(r"^(\.|_)|\.(tmp|part|partial|crdownload)$")


def export_day(name: str) -> str:
    """The day an export file brings: the first ``YYYY-MM-DD`` in its name; ``ValueError``
    naming the file when there is none or it is no date."""
    m = DAY.search(name)
    if not m:
        raise ValueError(f"sacct export {name!r}: no day (YYYY-MM-DD) in its name")
    try:
        return date.fromisoformat(m.group(1)).isoformat()
    except ValueError:
        raise ValueError(f"sacct export {name!r}: {m.group(1)!r} is not a date") from None


def is_folder(uri: str) -> bool:
    """Whether ``uri`` names an existing folder (a trace of daily exports), not a file."""
    fs, path = storage.filesystem(uri)
    return bool(fs.exists(path) and fs.isdir(path))


@dataclass
class Exports:
    """The export files of a folder, oldest day first (``files``: ``(day, uri)``), and the
    entries skipped with the reason (``skipped``: ``(name, why)``)."""

    folder: str
    files: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def list_exports(folder: str) -> Exports:
    """The export files directly in ``folder`` (:class:`Exports`); a :class:`StepError` naming the
    folder when it holds none."""
    folder = folder.rstrip("/")
    fs, path = storage.filesystem(folder)
    if not fs.exists(path):
        raise StepError(f"trace not found: {folder}")
    local = "://" not in folder or folder.startswith("file://")
    real_root = os.path.realpath(path) if local else None
    out = Exports(folder)
    for info in fs.ls(path, detail=True):
        name = info["name"].rstrip("/").rsplit("/", 1)[-1]
        if IGNORED.search(name):
            continue
        if local and (info.get("islink") or os.path.islink(info["name"])):
            real = os.path.realpath(info["name"])
            if not (real == real_root or real.startswith(real_root.rstrip("/") + "/")):
                out.skipped.append((name, "a link leading out of the folder"))
                continue
            if not os.path.isfile(real):
                out.skipped.append((name, "not a file"))
                continue
        elif info.get("type") != "file":
            out.skipped.append((name, "not a file"))
            continue
        try:
            day = export_day(name)
        except ValueError as exc:
            out.skipped.append((name, str(exc)))
            continue
        out.files.append((day, f"{folder}/{name}"))
    out.files.sort(key=lambda f: (f[0], f[1]))
    if not out.files:
        why = "; ".join(f"{n}: {w}" for n, w in out.skipped[:5])
        raise StepError(
            f"{folder}: a folder given as a trace holds daily exports named with their day "
            f"(<anything>YYYY-MM-DD<suffix>), and it has none{f' ({why})' if why else ''}"
        )
    return out


def first_day(folder: str) -> str:
    """The day of the folder's oldest export."""
    return list_exports(folder).files[0][0]


def fingerprint(folder: str) -> str:
    """The content fingerprint of the export files of ``folder`` (their names and SHA-256s, in
    day order): what ``ingest`` reads, nothing else (an upload in progress, a marker)."""
    h = hashlib.sha256()
    for _day, uri in list_exports(folder).files:
        h.update(uri.rsplit("/", 1)[-1].encode() + b"\0" + storage.sha256_of(uri).encode() + b"\n")
    return "exports:" + h.hexdigest()
