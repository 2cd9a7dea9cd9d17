"""Find the pipelines' reports on storage (local path, ``file://`` or ``s3://``) through fsspec.

Layout (written by the task packages; this module never imports them):

* Mirage: ``<root>/mirage_pipeline/<key>/report/report.html`` (committed: ``report/_SUCCESS.json``);
* Faasm:  ``<root>/faasm_benchmarks/<date>/<run id>/trends/trends.html`` (``trends/_SUCCESS.json``)
  and ``<root>/faasm_benchmarks/<date>/<run id>/summary/summary.json`` (``summary/_SUCCESS.json``);
* a site's log (``mirage_evaluation``): ``<root>/mirage_evaluation/<name>/waitpred/waitpred.md``
  (``waitpred/_SUCCESS.json``): the wait predictor's tables per month, its bound's coverage, the guard's pick.
* the monthly gate (``mirage_monthly``): ``<root>/mirage_monthly/gate/<YYYY-MM>/gate.md`` and
  ``gate.json`` (``gate/<YYYY-MM>/_SUCCESS.json``, its summary says whether the month passed);
* missed deadlines (``house.deadlines``): ``<root>/_deadlines/<dag>/<run>.json``, one small record
  each, listed by :func:`list_deadlines` and shown inline (not served as files).

Only files inside a committed report folder are ever served (:func:`resolve`), so the
view cannot be used to read anything else under the storage root; and only regular files
*inside* the root: on a local root every path component below it is opened without
following symbolic links (``O_NOFOLLOW`` from the root's descriptor down), so a link to a
file or folder outside (or inside) the root is refused, and a file with more than one hard
link (``st_nlink > 1``: it may be the same inode as a file outside the root; the writers
never make one) is refused too; on S3 only plain objects are read. And only what the report
step wrote: where the folder's marker lists its outputs (``outputs``: path → size and
SHA-256, :meth:`stepkit.step.Step.commit`), a file not listed, or whose size is not the
recorded one, is refused. Files are served in chunks (:func:`open_servable`), never read
whole.

Run identity: the Mirage plan records each DAG run that uses a run prefix in
``<prefix>/_runs/<run>.json`` (``mirage_tasks.run.runlog``: run id, logical date, trigger, the
params that differ from the DAG's defaults); the Faasm layout names the run in its path.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
from fsspec.core import url_to_fs

MARKER = "_SUCCESS.json"
RUNS_DIR = "_runs"  # mirage_tasks.run.runlog: one record per DAG run of a Mirage run prefix
TRIGGERS = ("manual", "scheduled", "backfill", "asset_triggered")
#: (pipeline, glob below the root of a report folder's marker, page inside that folder)
KINDS = {
    "mirage_report": ("mirage_pipeline", "mirage_pipeline/*/report/" + MARKER, "report.html"),
    "faasm_trends": ("faasm_benchmarks", "faasm_benchmarks/*/*/trends/" + MARKER, "trends.html"),
    "faasm_summary": ("faasm_benchmarks", "faasm_benchmarks/*/*/summary/" + MARKER, "summary.json"),
    # a site's own log through mirage_evaluation: <root>/mirage_evaluation/<name>/waitpred
    "mirage_evaluation": ("mirage_evaluation", "mirage_evaluation/*/waitpred/" + MARKER, "waitpred.md"),
    # the monthly gate's verdict of each month: <root>/mirage_monthly/gate/<YYYY-MM>
    "mirage_gate": ("mirage_monthly", "mirage_monthly/gate/*/" + MARKER, "gate.md"),
}
#: Missed deadlines: ``<root>/_deadlines/<dag>/<run>.json`` (``house.deadlines``).
DEADLINES = "_deadlines"
#: A deadline record is a few hundred bytes; a larger file there is not read.
DEADLINE_LIMIT = 64 * 1024
#: Folders whose files may be served, as regular expressions over the path below the root.
SERVABLE = [
    re.compile(r"^mirage_pipeline/[^/]+/report/(report\.html|report\.md|figures/[^/]+\.png)$"),
    re.compile(
        r"^faasm_benchmarks/\d{4}-\d{2}-\d{2}/[^/]+/trends/(trends\.html|trends\.md|trends\.json|"
        r"figures/[^/]+\.png)$"
    ),
    re.compile(r"^faasm_benchmarks/\d{4}-\d{2}-\d{2}/[^/]+/summary/(summary\.json|summary\.csv)$"),
    re.compile(r"^mirage_evaluation/[^/]+/waitpred/(waitpred\.md|waitpred\.json)$"),
    re.compile(r"^mirage_monthly/gate/\d{4}-\d{2}/(gate\.md|gate\.json)$"),
]


@dataclass
class Report:
    kind: str
    pipeline: str
    path: str  # page below the storage root, e.g. mirage_pipeline/2023-03-01T000000Z/report/report.html
    run: str  # the run key (Mirage) or "<date>/<run id>" (Faasm)
    finished: str | None
    summary: dict[str, Any]
    #: the DAG runs behind it: run_id, logical_date, trigger, changed (params unlike the defaults)
    runs: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def filesystem(root: str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = url_to_fs(root)
    return fs, path.rstrip("/")


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,))


def _parts(rel: str) -> list[str]:
    parts = rel.split("/")
    if not rel or "\\" in rel or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise KeyError(rel)
    return parts


def _open_local(base: str, rel: str) -> int:
    """A descriptor of ``base/rel`` when every component below ``base`` is a real folder and the
    last a regular file: opened from ``base``'s descriptor down with ``O_NOFOLLOW`` (no
    check-then-open race); ``KeyError`` otherwise."""
    parts = _parts(rel)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise KeyError(rel) from exc
    try:
        for part in parts[:-1]:
            nfd = os.open(part, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow, dir_fd=fd)
            os.close(fd)
            fd = nfd
        ffd = os.open(parts[-1], os.O_RDONLY | nofollow | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
    except OSError as exc:  # ELOOP (a link), ENOTDIR, ENOENT, EACCES: not a servable file
        raise KeyError(rel) from exc
    finally:
        os.close(fd)
    st = os.fstat(ffd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:  # a hard link may be a file outside the root
        os.close(ffd)
        raise KeyError(rel)
    return ffd


def _plain_object(fs: fsspec.AbstractFileSystem, path: str, rel: str) -> None:
    try:
        info = fs.info(path)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise KeyError(rel) from exc
    if info.get("type") != "file":
        raise KeyError(rel)


#: What the view reads whole per request, at most: a success marker (it lists a folder's outputs:
#: kilobytes) and a Faasm summary. A larger file is refused (:class:`TooLarge`), never read whole.
MARKER_LIMIT = 4 << 20
SUMMARY_LIMIT = 64 << 20


class TooLarge(KeyError):
    """A stored file over the size the view reads whole (its path and the limit in ``args``)."""


def _bounded(f, rel: str, limit: int | None) -> bytes:
    data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise TooLarge(rel, limit)
    return data


def read_plain(root: str, rel: str, limit: int | None = -1) -> bytes:
    """The bytes of the regular file (local) or plain object (S3 ...) ``rel`` below ``root``, at
    most ``limit`` of them (:class:`TooLarge` past it, having read ``limit`` + 1 bytes);
    ``KeyError`` for anything else: a symbolic link anywhere below the root, a folder, a
    device or FIFO, a missing file, a path with ``..``. ``limit`` -1: :data:`MARKER_LIMIT`."""
    _parts(rel)
    limit = MARKER_LIMIT if limit == -1 else limit
    fs, base = filesystem(root)
    if _is_local(fs):
        fd = _open_local(base, rel)
        with os.fdopen(fd, "rb") as f:
            return _bounded(f, rel, limit)
    path = f"{base}/{rel}"
    _plain_object(fs, path, rel)
    try:
        with fs.open(path, "rb") as f:
            return _bounded(f, rel, limit)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
        raise KeyError(rel) from exc


def is_plain(root: str, rel: str) -> bool:
    """Whether :func:`read_plain` would read ``rel`` (without reading it)."""
    try:
        _parts(rel)
        fs, base = filesystem(root)
        if _is_local(fs):
            os.close(_open_local(base, rel))
        else:
            _plain_object(fs, f"{base}/{rel}", rel)
        return True
    except KeyError:
        return False


def _json(root: str, rel: str) -> Any:
    try:
        return json.loads(read_plain(root, rel).decode("utf-8"))
    except (KeyError, OSError, ValueError, UnicodeDecodeError):
        return None


def trigger_of(run_id: str) -> str:
    """The trigger an Airflow run id names (``manual__...``, ``scheduled__...``, ``backfill__...``)."""
    head = run_id.split("__", 1)[0]
    return head if head in TRIGGERS and "__" in run_id else "unknown"


def _mirage_runs(root: str, fs: fsspec.AbstractFileSystem, base: str, rel_prefix: str) -> list[dict[str, Any]]:
    runs = []
    try:
        names = sorted(posixpath.basename(p) for p in fs.ls(f"{base}/{rel_prefix}/{RUNS_DIR}", detail=False))
    except (FileNotFoundError, NotADirectoryError):
        return []
    for name in names:
        if not name.endswith(".json"):
            continue
        doc = _json(root, f"{rel_prefix}/{RUNS_DIR}/{name}")
        if isinstance(doc, dict) and isinstance(doc.get("run_id"), str):
            runs.append(
                {
                    "run_id": doc["run_id"],
                    "logical_date": doc.get("logical_date"),
                    "trigger": doc.get("run_type") or trigger_of(doc["run_id"]),
                    "changed": doc.get("changed") if isinstance(doc.get("changed"), dict) else {},
                    "params": doc.get("params") if isinstance(doc.get("params"), dict) else {},
                    "recorded": doc.get("recorded"),
                }
            )
    runs.sort(key=lambda r: str(r.get("recorded") or ""), reverse=True)
    return runs


def list_reports(root: str) -> list[Report]:
    """Every committed report under ``root``, newest run first within each kind."""
    fs, base = filesystem(root)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache()
    out: list[Report] = []
    for kind, (pipeline, pattern, page) in KINDS.items():
        for marker_path in fs.glob(f"{base}/{pattern}"):
            folder = posixpath.dirname(marker_path)
            rel_folder = folder[len(base) + 1 :]
            marker = _json(root, f"{rel_folder}/{MARKER}")  # a linked folder or marker is no report
            if not isinstance(marker, dict) or not is_plain(root, f"{rel_folder}/{page}"):
                continue  # a half-written, foreign or linked marker or page: not a report
            parts = rel_folder.split("/")
            if pipeline in ("mirage_pipeline", "mirage_evaluation"):  # <pipeline>/<run key or log name>/...
                run = parts[1]
                runs = _mirage_runs(root, fs, base, f"{parts[0]}/{parts[1]}")
            elif pipeline == "mirage_monthly":  # mirage_monthly/gate/<month>: by month, no DAG run recorded
                run, runs = parts[2], []
            else:
                run = f"{parts[1]}/{parts[2]}"
                runs = [{"run_id": parts[2], "logical_date": parts[1], "trigger": trigger_of(parts[2]), "changed": {}}]
            summary = marker.get("summary") if isinstance(marker.get("summary"), dict) else {}
            out.append(
                Report(
                    kind=kind,
                    pipeline=pipeline,
                    path=f"{rel_folder}/{page}",
                    run=run,
                    finished=marker.get("finished"),
                    summary=summary,
                    runs=runs,
                )
            )
    out.sort(key=lambda r: (r.kind, r.run), reverse=True)
    return out


def list_deadlines(root: str) -> list[dict[str, Any]]:
    """Every missed-deadline record under ``root``, the latest fired first. A record that is not
    a JSON object naming the DAG of its folder (or is a link, or too large) is left out."""
    fs, base = filesystem(root)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache()
    out = []
    for path in fs.glob(f"{base}/{DEADLINES}/*/*.json"):
        rel = path[len(base) + 1 :]
        try:
            doc = json.loads(read_plain(root, rel, DEADLINE_LIMIT).decode("utf-8"))
        except (KeyError, OSError, ValueError, UnicodeDecodeError):
            continue
        if not isinstance(doc, dict) or doc.get("dag_id") != rel.split("/")[1]:
            continue
        keep = ("dag_id", "run_id", "run_state", "queued_at", "deadline", "interval", "fired_at")
        out.append({k: doc.get(k) for k in keep})
    out.sort(key=lambda d: str(d.get("fired_at") or ""), reverse=True)
    return out


def resolve(root: str, rel: str) -> int | None:
    """Check that ``rel`` below ``root`` is a servable file; ``KeyError`` when it is not one.
    Returns the size its marker recorded (None where the marker lists no outputs).

    ``rel`` must match :data:`SERVABLE` (no ``..``, no other folders), its report folder
    must hold a success marker (a regular file, not a link), and where that marker lists its
    outputs ``rel`` must be one of them.
    """
    _parts(rel)
    if not any(rx.match(rel) for rx in SERVABLE):
        raise KeyError(rel)
    folder = rel.split("/figures/")[0] if "/figures/" in rel else posixpath.dirname(rel)
    try:
        marker = json.loads(read_plain(root, f"{folder}/{MARKER}").decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise KeyError(rel) from exc
    outputs = marker.get("outputs") if isinstance(marker, dict) else None
    if isinstance(outputs, dict) and outputs:
        entry = outputs.get(rel[len(folder) + 1 :])
        if entry is None:
            raise KeyError(rel)  # not written by the report step: not served
        size = entry.get("size") if isinstance(entry, dict) else None
        return size if isinstance(size, int) else None
    return None


CHUNK = 256 * 1024


class Servable:
    """An open servable file: its ``size`` and its bytes in chunks (:meth:`chunks`, closes it)."""

    def __init__(self, f, size: int | None):
        self.f, self.size = f, size

    def chunks(self):
        try:
            while True:
                data = self.f.read(CHUNK)
                if not data:
                    return
                yield data
        finally:
            self.f.close()

    def close(self) -> None:
        self.f.close()


def open_servable(root: str, rel: str) -> Servable:
    """A servable report file (:func:`resolve`), opened as a regular file inside the root (not read):
    ``KeyError`` as for :func:`read_plain`, and when its size is not the one its marker recorded."""
    want = resolve(root, rel)
    fs, base = filesystem(root)
    if _is_local(fs):
        fd = _open_local(base, rel)
        size = os.fstat(fd).st_size
        f = os.fdopen(fd, "rb")
    else:
        path = f"{base}/{rel}"
        _plain_object(fs, path, rel)
        try:
            f = fs.open(path, "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as exc:
            raise KeyError(rel) from exc
        size = getattr(f, "size", None)
    if want is not None and size is not None and size != want:
        f.close()
        raise KeyError(rel)  # changed since the report step committed it
    return Servable(f, size)


def read(root: str, rel: str, limit: int | None = None) -> bytes:
    """A servable report file (:func:`open_servable`), read whole (small files: summaries); over
    ``limit`` bytes (default :data:`SUMMARY_LIMIT`) it is refused (:class:`TooLarge`) before being read."""
    limit = SUMMARY_LIMIT if limit is None else limit
    s = open_servable(root, rel)
    try:
        if s.size is not None and s.size > limit:
            raise TooLarge(rel, limit)
        return _bounded(s.f, rel, limit)
    finally:
        s.close()


#: Mirage run key: ``<logical date>-<hash>`` or ``manual-<hash>`` (mirage_tasks.run.plan.run_key)
RUN_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")


def run_metrics(root: str, key: str) -> dict[str, Any]:
    """A Mirage run's headline metrics (``metrics/_SUCCESS.json``: per model@node) and its DAG runs;
    ``KeyError`` when ``key`` is no run with committed metrics."""
    if not RUN_KEY.match(key):
        raise KeyError(key)
    marker = _json(root, f"mirage_pipeline/{key}/metrics/{MARKER}")
    if not isinstance(marker, dict):
        raise KeyError(key)
    fs, base = filesystem(root)
    summary = marker.get("summary") if isinstance(marker.get("summary"), dict) else {}
    headline = summary.get("headline") if isinstance(summary.get("headline"), dict) else {}
    report = _json(root, f"mirage_pipeline/{key}/report/{MARKER}")
    # the metrics step's table (metrics.json, listed in its marker): per model@node on all samples the
    # number of samples and the bootstrap intervals; and the validate runs behind it (trace fingerprints)
    detail = (
        _json(root, f"mirage_pipeline/{key}/metrics/metrics.json")
        if "metrics.json" in (marker.get("outputs") or {})
        else None
    )
    detail = detail if isinstance(detail, dict) else {}
    rows = {}
    for r in detail.get("rows") or []:
        if isinstance(r, dict) and r.get("level") == "all" and r.get("model") is not None:
            rows[f"{r['model']}@{r.get('node')}"] = r
    traces = sorted(
        {
            str(r.get("trace_fingerprint"))
            for r in detail.get("runs") or []
            if isinstance(r, dict) and r.get("trace_fingerprint")
        }
    )
    return {
        "key": key,
        "finished": marker.get("finished"),
        "headline": headline,
        "n_rows": summary.get("n_rows"),
        "runs": _mirage_runs(root, fs, base, f"mirage_pipeline/{key}"),
        "rows": rows,
        "traces": traces,
        "bootstrap": (detail.get("params") or {}).get("bootstrap"),
        "report": f"mirage_pipeline/{key}/report/report.html" if isinstance(report, dict) else None,
    }


#: A gate verdict (``gate.json``: every check with its numbers) is a few kilobytes; past this it is not read.
GATE_LIMIT = 1 << 20
MONTH = re.compile(r"^\d{4}-(0[1-9]|1[0-2])$")


def gate_verdict(root: str, month: str) -> dict[str, Any] | None:
    """The committed verdict of ``month``'s gate (``mirage_monthly/gate/<month>/gate.json``, served
    only as its marker lists it: :func:`read`): the rule, the margin, ``passed``, every check with
    its interval and limit, the rule's and the bars' hours per node size, the months compared.
    None when there is none, or it is unreadable, too large or not a JSON object."""
    if not MONTH.match(month):
        return None
    try:
        doc = json.loads(read(root, f"mirage_monthly/gate/{month}/gate.json", GATE_LIMIT).decode("utf-8"))
    except (KeyError, OSError, ValueError, UnicodeDecodeError):  # TooLarge is a KeyError
        return None
    return doc if isinstance(doc, dict) else None


def runs_of(root: str, dag_id: str, run_id: str) -> list[Report]:
    """The reports a DAG run made or used (Mirage: its recorded prefix; Faasm: its run folder)."""
    return [r for r in list_reports(root) if r.pipeline == dag_id and any(x["run_id"] == run_id for x in r.runs)]
