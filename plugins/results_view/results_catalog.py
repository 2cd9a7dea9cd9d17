"""Find the pipelines' reports on storage (local path, ``file://`` or ``s3://``) through fsspec.

Layout (written by the task packages; this module never imports them):

* Mirage: ``<root>/mirage_pipeline/<key>/report/report.html`` (committed: ``report/_SUCCESS.json``);
* Faasm:  ``<root>/faasm_benchmarks/<date>/<run id>/trends/trends.html`` (``trends/_SUCCESS.json``)
  and ``<root>/faasm_benchmarks/<date>/<run id>/summary/summary.json`` (``summary/_SUCCESS.json``).

Only files inside a committed report folder are ever served (:func:`resolve`), so the
view cannot be used to read anything else under the storage root.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import asdict, dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

MARKER = "_SUCCESS.json"
#: (pipeline, glob below the root of a report folder's marker, page inside that folder)
KINDS = {
    "mirage_report": ("mirage_pipeline", "mirage_pipeline/*/report/" + MARKER, "report.html"),
    "faasm_trends": ("faasm_benchmarks", "faasm_benchmarks/*/*/trends/" + MARKER, "trends.html"),
    "faasm_summary": ("faasm_benchmarks", "faasm_benchmarks/*/*/summary/" + MARKER, "summary.json"),
}
#: Folders whose files may be served, as regular expressions over the path below the root.
SERVABLE = [
    re.compile(r"^mirage_pipeline/[^/]+/report/(report\.html|report\.md|figures/[^/]+\.png)$"),
    re.compile(r"^faasm_benchmarks/\d{4}-\d{2}-\d{2}/[^/]+/trends/(trends\.html|trends\.md|trends\.json|"
               r"figures/[^/]+\.png)$"),
    re.compile(r"^faasm_benchmarks/\d{4}-\d{2}-\d{2}/[^/]+/summary/(summary\.json|summary\.csv)$"),
]


@dataclass
class Report:
    kind: str
    pipeline: str
    path: str  # page below the storage root, e.g. mirage_pipeline/2023-03-01T000000Z/report/report.html
    run: str  # the run key (Mirage) or "<date>/<run id>" (Faasm)
    finished: str | None
    summary: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def filesystem(root: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = url_to_fs(root)
    return fs, path.rstrip("/")


def list_reports(root: str) -> list[Report]:
    """Every committed report under ``root``, newest run first within each kind."""
    fs, base = filesystem(root)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache()
    out: list[Report] = []
    for kind, (pipeline, pattern, page) in KINDS.items():
        for marker_path in fs.glob(f"{base}/{pattern}"):
            folder = posixpath.dirname(marker_path)
            rel_folder = folder[len(base) + 1:]
            try:
                with fs.open(marker_path, "rb") as f:
                    marker = json.loads(f.read().decode("utf-8"))
            except (OSError, ValueError, UnicodeDecodeError):
                continue  # a half-written or foreign marker: not a report
            parts = rel_folder.split("/")
            run = parts[1] if pipeline == "mirage_pipeline" else f"{parts[1]}/{parts[2]}"
            summary = marker.get("summary") if isinstance(marker.get("summary"), dict) else {}
            out.append(Report(kind=kind, pipeline=pipeline, path=f"{rel_folder}/{page}", run=run,
                              finished=marker.get("finished"), summary=summary))
    out.sort(key=lambda r: (r.kind, r.run), reverse=True)
    return out


def resolve(root: str, rel: str) -> str:
    """The storage path of a servable file ``rel`` below ``root``; ``KeyError`` when it is not one.

    ``rel`` must match :data:`SERVABLE` (no ``..``, no other folders) and its report folder
    must hold a success marker.
    """
    if not rel or "\\" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
        raise KeyError(rel)
    if not any(rx.match(rel) for rx in SERVABLE):
        raise KeyError(rel)
    fs, base = filesystem(root)
    folder = rel.split("/figures/")[0] if "/figures/" in rel else posixpath.dirname(rel)
    if not fs.exists(f"{base}/{folder}/{MARKER}"):
        raise KeyError(rel)
    return f"{base}/{rel}"


def read(root: str, rel: str) -> bytes:
    fs, _ = filesystem(root)
    path = resolve(root, rel)
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as exc:
        raise KeyError(rel) from exc
