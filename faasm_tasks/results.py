"""Results layout and the run record.

``<results>/<date>/<run-id>/<experiment>/<system>/<params-slug>/repeat-<r>/attempt-<k>/``
holds ``run.json`` (the run record, schema ``schemas/run_record.schema.json``) and the
point's files (``histogram.hdr``, ``latency.json``, ``latency.txt``, ``calls.jsonl``,
``output.txt``, ``billing_summary.json``, ...). A rerun claims the next attempt number;
nothing is ever overwritten except the attempt's own ``run.json`` as it moves from
``running`` to ``succeeded``, ``failed`` or ``invalid`` (it ran, but the measurement
cannot be trusted: :func:`judge_load` says why). A failed attempt keeps whatever it
wrote. An attempt left ``running`` by a killed process becomes ``failed`` with
``interrupted`` at the next ``collect``, ``teardown`` or ``summarize``
(:func:`mark_interrupted`).
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
import psutil

from stepkit import StepError, storage

from . import __version__
from .catalogue import slug
from .order import repeat_dir

RECORD = "run.json"


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def run_prefix(root: str, date: str, run_id: str) -> str:
    return storage.join(root, date, run_id)


def point_prefix(
    root: str,
    date: str,
    run_id: str,
    experiment: str,
    system: str,
    params: dict[str, Any],
    repeat: int,
    arm: str | None = None,
) -> str:
    """The folder of one trial: ``repeat-<r>``, or ``repeat-<r>.<arm>`` for an arm of the A/A
    control (:func:`faasm_tasks.order.repeat_dir`)."""
    return storage.join(root, date, run_id, experiment, system, slug(params), repeat_dir(repeat, arm))


def _schema() -> dict[str, Any]:
    return json.loads(resources.files("faasm_tasks").joinpath("schemas/run_record.schema.json").read_text())


def validate_record(rec: dict[str, Any]) -> None:
    errs = sorted(jsonschema.Draft7Validator(_schema()).iter_errors(rec), key=lambda e: list(e.absolute_path))
    if errs:
        raise StepError(
            "invalid run record: "
            + "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errs[:5])
        )


def versions() -> dict[str, Any]:
    pk = {}
    for name in ("numpy", "wasmtime", "redis", "requests", "hdrhistogram", "kubernetes", "psutil"):
        try:
            pk[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return {
        "faasm_tasks": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": pk,
    }


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
            "schema_version": 1,
            **base,
            "attempt": k,
            "status": "running",
            "started": utcnow(),
            "finished": None,
            "duration_s": None,
            "outcome": {"ok": False, "error": None},
            "versions": versions(),
            "host": socket.gethostname(),
            "files": [],
            "metrics": {},
            "owner": {"host": socket.gethostname(), "pid": os.getpid(), "create_time": psutil.Process().create_time()},
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

    def finish(
        self,
        ok: bool,
        error: str | None = None,
        metrics: dict[str, Any] | None = None,
        failed_calls: int = 0,
        invalid_reasons: list[str] | None = None,
    ) -> dict[str, Any]:
        """``ok`` with ``invalid_reasons`` records ``invalid``: it ran, the numbers are not trustworthy."""
        invalid = bool(ok and invalid_reasons)
        self.record["status"] = "invalid" if invalid else ("succeeded" if ok else "failed")
        self.record["finished"] = utcnow()
        self.record["duration_s"] = round((dt.datetime.now(dt.UTC) - self._t0).total_seconds(), 3)
        self.record["outcome"] = {
            "ok": ok and not invalid,
            "failed_calls": failed_calls,
            "error": ("invalid: " + "; ".join(invalid_reasons)) if invalid else error,
        }
        if invalid:
            self.record["outcome"]["invalid_reasons"] = list(invalid_reasons)
        self.record["metrics"] = metrics or {}
        self._save()
        return self.record

    def update(self, **fields: Any) -> None:
        self.record.update(fields)
        self._save()


#: Metrics a reader does arithmetic on: a record with a non-number under one of these is damaged.
NUMERIC_METRICS = (
    "run_time_ms",
    "final_loss",
    "requests_ok",
    "requests_all",
    "throughput_ok",
    "throughput_all",
    "p50_us",
    "p99_us",
    "p999_us",
    "max_us",
    "errors_total",
    "send_lag_p99_us",
)


def record_problem(rec: Any) -> str | None:
    """Why a parsed ``run.json`` cannot be used (None: it can): not a run record by the schema,
    or metrics that are not numbers. A damaged record is not a missing one: readers count it
    as a failed point instead of leaving it out."""
    if not isinstance(rec, dict):
        return f"not a run record (a JSON {type(rec).__name__})"
    try:
        validate_record(rec)
    except StepError as exc:
        return str(exc)
    m = rec.get("metrics")
    if m is not None and not isinstance(m, dict):
        return f"metrics is a {type(m).__name__}, not an object"
    for k in NUMERIC_METRICS:
        v = (m or {}).get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"metric {k} is {v!r}, not a number"
    return None


def iter_records(
    root: str, date: str, run_id: str, problems: list[dict[str, str]] | None = None
) -> list[tuple[str, dict[str, Any]]]:
    """(attempt URI, record) for every readable attempt of a run. An unreadable one (truncated or
    corrupt JSON, not a run record, damaged metrics: :func:`record_problem`) is left out of the
    result and, when ``problems`` is given, appended to it as ``{"uri": <run.json URI>, "error": why}``
    so the caller can count and name it."""
    base = run_prefix(root, date, run_id)
    _fresh(base)
    out = []
    for rel in storage.list_files(base):
        if rel.endswith("/" + RECORD) and "/attempt-" in rel:
            uri = storage.join(base, rel)
            try:
                rec = storage.read_json(uri)
                why = record_problem(rec)
            except (ValueError, OSError) as exc:
                why = f"unreadable ({type(exc).__name__}: {exc})"
            if why is None:
                out.append((uri[: -len(RECORD) - 1], rec))
            elif problems is not None:
                problems.append({"uri": uri, "error": why})
    return out


def unreadable_text(problems: list[dict[str, str]]) -> str:
    """``<uri>: <why>; ...`` for a message (at most five named, then how many more)."""
    text = "; ".join(f"{p['uri']}: {p['error']}" for p in problems[:5])
    return text + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")


def write_op_report(root: str, date: str, run_id: str, step: str, report: dict[str, Any]) -> str:
    """One report per step invocation under ``_ops/`` (timestamped, never overwritten)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    uri = storage.join(run_prefix(root, date, run_id), "_ops", f"{step}-{stamp}-{uuid.uuid4().hex[:6]}.json")
    storage.write_json(
        uri, {"step": step, "run_id": run_id, "date": date, "at": utcnow(), "host": socket.gethostname(), **report}
    )
    return uri


def write_failure_report(
    root: str, date: str, run_id: str, step: str, exc: BaseException, fields: dict[str, Any]
) -> str | None:
    """The ``_ops`` report of a step that failed (``"failed": true`` and its error), so the day's
    summary counts an experiment group that failed before it had any point. Never raises: the
    step's own error is what its caller must see."""
    err = str(exc) or type(exc).__name__
    try:
        return write_op_report(
            root, date, run_id, step, {**fields, "failed": True, "error": f"{type(exc).__name__}: {err}"}
        )
    except Exception as report_exc:  # noqa: BLE001 - storage trouble: the step's error still goes out
        print(f"{step}: could not record the failure in _ops: {report_exc}", file=sys.stderr, flush=True)
        return None


def op_reports(root: str, date: str, run_id: str, problems: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """Every ``_ops`` report of a run, oldest first (by their ``at``); an unreadable one goes
    to ``problems`` (URI and cause) when given."""
    base = storage.join(run_prefix(root, date, run_id), "_ops")
    _fresh(base)
    out = []
    try:
        names = storage.list_files(base)
    except FileNotFoundError:
        return []
    for rel in names:
        if not rel.endswith(".json"):
            continue
        uri = storage.join(base, rel)
        try:
            rep = storage.read_json(uri)
            if not isinstance(rep, dict):
                raise ValueError(f"a JSON {type(rep).__name__}, not a report")
        except (ValueError, OSError) as exc:
            if problems is not None:
                problems.append({"uri": uri, "error": f"unreadable ({type(exc).__name__}: {exc})"})
            continue
        out.append({**rep, "_uri": uri})
    return sorted(out, key=lambda r: str(r.get("at", "")))


def failed_groups(
    root: str,
    date: str,
    run_id: str,
    records: list[tuple[str, dict[str, Any]]],
    problems: list[dict[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """The experiment groups (experiment, system) of a run that failed without a failed point to
    show for it, from the run's ``_ops`` reports: the group's latest ``deploy`` failed, its latest
    ``run`` failed before recording its points, or it was deployed and nothing ran before the next
    deploy (wait-ready, upload-data or run failed first; a deployment that served other
    experiments' runs is not counted), or the day's ``preflight`` failed before the
    group's turn (every group it selected). A day whose every group failed this way
    has no point at all; these are what make it count as failed instead of "0 points"."""
    latest: dict[tuple[str, str, str], dict[str, Any]] = {}
    preflight: dict[str, Any] | None = None
    ran_after: set[str] = set()  # deploy reports followed by a run (of any experiment) before the next deploy
    last_deploy: str | None = None
    for rep in op_reports(root, date, run_id, problems):  # oldest first: the last one wins
        if rep.get("step") in ("deploy", "run") and rep.get("experiment") and rep.get("system"):
            latest[(str(rep["experiment"]), str(rep["system"]), rep["step"])] = rep
            if rep["step"] == "deploy":
                last_deploy = rep["_uri"]
            elif last_deploy:  # a deployment can serve other experiments' runs (the local target, by hand)
                ran_after.add(last_deploy)
        elif rep.get("step") == "preflight":
            preflight = rep
    with_points = {(r.get("experiment"), r.get("system")) for _, r in records}
    out = []
    if preflight and preflight.get("failed"):  # the day stopped before its first group: each selected one failed
        for exp, system in (g for g in preflight.get("groups") or [] if isinstance(g, list) and len(g) == 2):
            if not any((exp, system, st) in latest for st in ("deploy", "run")) and (exp, system) not in with_points:
                out.append(
                    {
                        "experiment": exp,
                        "system": system,
                        "step": "preflight",
                        "error": preflight.get("error"),
                        "report": preflight["_uri"],
                    }
                )
    for exp, system in sorted({(e, s) for e, s, _ in latest}):
        dep, run = latest.get((exp, system, "deploy")), latest.get((exp, system, "run"))
        if dep and dep.get("failed") and not (run and not run.get("failed")):
            out.append(
                {
                    "experiment": exp,
                    "system": system,
                    "step": "deploy",
                    "error": dep.get("error"),
                    "report": dep["_uri"],
                }
            )
        elif run and run.get("failed"):
            out.append(
                {"experiment": exp, "system": system, "step": "run", "error": run.get("error"), "report": run["_uri"]}
            )
        elif dep and not run and (exp, system) not in with_points and dep["_uri"] not in ran_after:
            out.append(
                {
                    "experiment": exp,
                    "system": system,
                    "step": "deploy",
                    "error": "deployed, but no point was run (wait-ready, upload-data or run failed "
                    "before the first point)",
                    "report": dep["_uri"],
                }
            )
    return out


def _owner_alive(owner: dict[str, Any] | None) -> bool:
    """The process that claimed an attempt is still running (only knowable on its own host)."""
    if not owner or owner.get("host") != socket.gethostname():
        return False
    try:
        return abs(psutil.Process(int(owner["pid"])).create_time() - float(owner["create_time"])) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, TypeError, ValueError):
        return False


def mark_interrupted(root: str, date: str, run_id: str) -> list[str]:
    """Mark every attempt of the run still ``running`` whose process is gone as ``failed``
    (error ``interrupted``). Its owner is checked on this host; an attempt claimed on another
    host (a Kubernetes pod) counts as interrupted, since ``collect``, ``teardown`` and
    ``summarize`` run after ``run`` has ended. Returns the attempt URIs it marked."""
    marked = []
    for uri, rec in iter_records(root, date, run_id):
        if rec.get("status") != "running" or _owner_alive(rec.get("owner")):
            continue
        owner = rec.get("owner") or {}
        rec["status"] = "failed"
        rec["finished"] = utcnow()
        rec["outcome"] = {
            **(rec.get("outcome") or {}),
            "ok": False,
            "interrupted": True,
            "error": f"interrupted: the process that ran this attempt "
            f"(pid {owner.get('pid', '?')} on {owner.get('host', '?')}) ended without "
            "finishing it",
        }
        validate_record(rec)
        storage.write_json(storage.join(uri, RECORD), rec)
        marked.append(uri)
    return marked


def judge_load(
    summary: dict[str, Any],
    mode: str,
    rate: float | None,
    max_late_fraction: float = 0.01,
    max_rate_shortfall: float = 0.01,
    min_requests: int = 100,
) -> list[str]:
    """Why a load point's numbers cannot be trusted (empty: they can).

    * open loop: the sent rate falls more than ``max_rate_shortfall`` short of the offered
      rate, or the share of requests sent late or never sent exceeds ``max_late_fraction``;
    * any mode: fewer successful requests than ``min_requests`` (p99 needs >= 100 samples).
    """
    reasons = []
    ok = int(summary.get("requests_ok") or 0)
    if ok < min_requests:
        reasons.append(f"only {ok} successful requests (< {min_requests} needed for the percentiles)")
    if mode == "open":
        dur = float(summary.get("duration_s") or 0)
        if "sent" not in summary or "scheduled" not in summary or not dur:
            reasons.append("the driver reported no sent/scheduled counts, so the offered rate is unverified")
            return reasons
        offered = float(rate or summary.get("rate") or 0)
        sent_rate = summary["sent"] / dur
        if offered > 0 and sent_rate < offered * (1 - max_rate_shortfall):
            reasons.append(
                f"sent {sent_rate:.1f} req/s of {offered:g} offered "
                f"({100 * (1 - sent_rate / offered):.1f} % short; limit {100 * max_rate_shortfall:g} %)"
            )
        scheduled = int(summary["scheduled"] or 0)
        late = int(summary.get("late") or 0) + max(0, scheduled - int(summary["sent"]))
        frac = late / scheduled if scheduled else 1.0
        if frac > max_late_fraction:
            reasons.append(
                f"{late} of {scheduled} requests late or never sent ({100 * frac:.2f} %; "
                f"limit {100 * max_late_fraction:g} %)"
            )
    return reasons
