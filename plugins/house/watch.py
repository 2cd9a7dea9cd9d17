"""Sampling that follows the data: an asset watched for a site's daily ``sacct`` exports.

``HOUSE_SACCT_EXPORT_URI`` names the folder (``file:///data/ls6/sacct`` or
``s3://bucket/ls6/sacct``; it must lie under an allowed input root, see ``HOUSE_INPUT_ROOTS``)
where a site's exporter drops one file per day, named with that day
(``ls6-2023-01-31.log.gz``: the first ``YYYY-MM-DD`` in the name). Unset (the default),
``mirage_samples`` keeps its daily cron alone. Set, the DAG is also scheduled on the asset
``sacct_exports``, whose :class:`SacctExportTrigger` (run by the triggerer) lists the folder
every ``HOUSE_SACCT_EXPORT_POLL`` seconds (60) and emits one asset event per new export file,
``{"uri": <the file>, "day": "YYYY-MM-DD", "name": <file name>}`` (:func:`export_events`);
the asset-triggered run samples the day each of its exports completes (``mirage_samples``: the
export's day minus one day and the workload, whose samples' jobs are all in the folder by then)
with the folder as its trace (:func:`export_params`):
``ingest`` reads a folder as one trace, its export files in day order
(``mirage_tasks.data.exports``), so the days of the folder are one sample family (named by
the folder) and ``mirage_monthly`` starts one ``mirage_pipeline`` run per month with the
folder as its trace, reading those days' partitions. A backfill of watched days gives the
folder as ``trace`` (the same URI as ``HOUSE_SACCT_EXPORT_URI``, e.g. ``file:///data/ls6/sacct``)
and skips what the watched runs committed. Days sampled from one export file as the trace
(the layout before) are another family: they stay as committed and are never replaced.

So a day is sampled once its workload's exports are there, and its partition (which records
the digest of the jobs it saw, ``mirage_tasks.data.prefixes``) stays valid as later exports
arrive; an export that changes an earlier job's row (a job in two days' exports keeps the
newest row) makes the days that see it stale, and the month's pipeline run samples those again.
A month is complete when the export six days after its last day (five-day workload) arrives;
the first exports of a folder complete days before it and their runs skip. Exports that land
together may reach one run: it samples the day each completes. Events that come while
``mirage_samples`` is at ``max_active_runs`` are not all given to the next run (Airflow 3.3
queues one ``AssetDagRunQueue`` row per asset and DAG, created at the first of them, and the
run it starts consumes the events up to that time only; the others wait for the next export's
run), so every watched run also samples the days the folder's exports complete that are not
committed (``mirage_tasks.run.plan.watched_days``): the run that plans after an export landed
samples its day.

The files already announced are kept in the asset's state store (Airflow's, in the metadata
database, key ``seen``), so a restarted triggerer does not announce old files again; the
first poll of a watcher that has no state yet announces what is there (a backfill of those
days skips what is committed either way).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import date
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from house.config import ConfigError, _setting, input_roots

log = logging.getLogger(__name__)

#: The setting naming the watched folder (unset: no watcher, the cron alone).
EXPORT_ENV = "HOUSE_SACCT_EXPORT_URI"
POLL_ENV = "HOUSE_SACCT_EXPORT_POLL"
#: The IANA time zone of the exports' local times (``trace_timezone`` of the runs they start).
TIMEZONE_ENV = "HOUSE_SACCT_EXPORT_TIMEZONE"
DEFAULT_POLL_S = 60.0
#: The asset the watcher feeds (its events' extra: ``{"from_trigger": True, "payload": ...}``).
ASSET_NAME = "sacct_exports"
#: Key of the announced files in the asset's state store.
SEEN_KEY = "seen"
#: The export-name rule, as ``mirage_tasks.data.exports`` (whose ``ingest`` reads the folder) has it:
#: the plugins never import the task packages; tests/dags/test_sacct_watch.py pins the two equal.
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


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0] if "://" in uri else "file"


def _local(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


def _under(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def check_prefix(uri: str, roots: Sequence[str]) -> str:
    """``uri`` normalised (no trailing slash) if it is a folder under one of ``roots``; else
    :class:`ConfigError` naming the setting and the allowed roots."""
    uri = uri.strip().rstrip("/")
    why = None
    if any(seg in ("..", ".") for seg in uri.split("://", 1)[-1].split("/")):
        why = "a '..' or '.' segment is not allowed"
    elif _scheme(uri) == "file":
        path = _local(uri)
        if not os.path.isabs(path):
            why = "not an absolute folder (file:///absolute/path)"
        elif not any(
            _scheme(r) == "file" and _under(os.path.realpath(path), os.path.realpath(_local(r))) for r in roots
        ):
            why = "outside the allowed input roots"
    elif not any(_scheme(r) == _scheme(uri) and _under(uri, r.rstrip("/")) for r in roots):
        why = "outside the allowed input roots"
    if why:
        raise ConfigError(f"{EXPORT_ENV}={uri!r}: {why} (allowed: {', '.join(roots) or 'none'})")
    return uri


class SacctExportTrigger(BaseEventTrigger):
    """One event per new export file under ``prefix`` (its day in the payload).

    ``roots``: the allowed input roots the prefix was checked against when the DAG was parsed;
    checked again here (the triggerer may run elsewhere), and a local file whose real path leaves
    the prefix (a symbolic link) is never announced. A file whose name holds no day is logged
    once, with the reason, and never announced.
    """

    def __init__(
        self, prefix: str, roots: Sequence[str], poll_interval: float = DEFAULT_POLL_S, timezone: str | None = None
    ):
        super().__init__()
        self.prefix = prefix
        self.timezone = timezone
        self.roots = list(roots)
        self.poll_interval = float(poll_interval)
        self._seen: dict[str, str] | None = None
        self._refused: set[str] = set()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "house.watch.SacctExportTrigger",
            {
                "prefix": self.prefix,
                "roots": self.roots,
                "poll_interval": self.poll_interval,
                "timezone": self.timezone,
            },
        )

    # -- state: the announced files (name -> day), in the asset's state store when the triggerer gives one
    async def _load_seen(self) -> dict[str, str]:
        if self._seen is None:
            stored = await self.asset_state_store.aget(SEEN_KEY) if self.asset_state_store is not None else None
            self._seen = dict(stored) if isinstance(stored, Mapping) else {}
        return self._seen

    async def _save_seen(self) -> None:
        if self.asset_state_store is not None:
            await self.asset_state_store.aset(SEEN_KEY, dict(self._seen or {}))

    def list_exports(self) -> list[str]:
        """The files directly in the folder (sorted full URIs); none when it does not exist yet."""
        import fsspec

        fs, path = fsspec.core.url_to_fs(self.prefix)
        if not fs.exists(path):
            return []
        proto = _scheme(self.prefix)
        out = []
        for info in fs.ls(path, detail=True):
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            if proto == "file" and info.get("islink"):
                real = os.path.realpath(info["name"])
                if not _under(real, os.path.realpath(_local(self.prefix))):
                    if name not in self._refused:
                        self._refused.add(name)
                        self.log.warning("sacct export %s refused: a link leading out of %s", name, self.prefix)
                    continue
                if not os.path.isfile(real):
                    continue
            elif info.get("type") != "file":
                continue
            out.append(f"{self.prefix}/{name}")
        return sorted(out)

    async def poll(self) -> dict[str, str] | None:
        """One look at the folder: the payload of the oldest export file (by its day, then name)
        not announced yet, or None."""
        seen = await self._load_seen()
        fresh = []
        for uri in await asyncio.to_thread(self.list_exports):
            name = uri.rsplit("/", 1)[-1]
            if name in seen or name in self._refused or IGNORED.search(name):
                continue
            try:
                day = export_day(name)
            except ValueError as exc:
                self._refused.add(name)
                self.log.warning("%s: not announced (export names are <anything>YYYY-MM-DD<suffix>)", exc)
                continue
            fresh.append(
                {"uri": uri, "day": day, "name": name, **({"timezone": self.timezone} if self.timezone else {})}
            )
        return min(fresh, key=lambda p: (p["day"], p["name"])) if fresh else None

    async def mark_seen(self, payload: Mapping[str, str]) -> None:
        """Record ``payload``'s file as announced (in the asset's state store when there is one)."""
        seen = await self._load_seen()
        seen[payload["name"]] = payload["day"]
        await self._save_seen()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        check_prefix(self.prefix, self.roots)
        self.log.info("watching %s for sacct exports every %.0f s", self.prefix, self.poll_interval)
        while True:
            # one event per look: two files landing together start two runs, not one run of both
            payload = await self.poll()
            if payload is not None:
                self.log.info("sacct export %s brings %s", payload["name"], payload["day"])
                yield TriggerEvent(payload)
                # recorded once the event is handed over: a triggerer dying in between announces it
                # again (a second run of that day skips its committed partitions), never loses it
                await self.mark_seen(payload)
            await asyncio.sleep(self.poll_interval)


def export_asset():
    """The watched ``sacct_exports`` asset when ``HOUSE_SACCT_EXPORT_URI`` is set, else None."""
    from airflow.sdk import Asset, AssetWatcher

    uri = _setting(EXPORT_ENV)
    if uri is None:
        return None
    roots = input_roots()
    prefix = check_prefix(uri, roots)
    text = _setting(POLL_ENV, str(DEFAULT_POLL_S))
    try:
        poll = float(text)
        if not poll > 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{POLL_ENV}={text!r}: expected seconds (a positive number)") from None
    trigger = SacctExportTrigger(prefix=prefix, roots=roots, poll_interval=poll, timezone=_setting(TIMEZONE_ENV))
    uri_form = prefix if "://" in prefix else f"file://{prefix}"
    return Asset(
        name=ASSET_NAME,
        uri=uri_form,
        group="mirage",
        watchers=[AssetWatcher(name="sacct_export_watcher", trigger=trigger)],
    )


def samples_schedule(timetable):
    """``timetable`` alone (no watcher set), else it or a new export (``AssetOrTimeSchedule``):
    backfills and the cron keep working beside the watcher."""
    asset = export_asset()
    if asset is None:
        return timetable
    from airflow.sdk import AssetOrTimeSchedule

    return AssetOrTimeSchedule(timetable=timetable, assets=asset)


def export_events(context: Mapping[str, Any]) -> list[dict[str, str]]:
    """The export payloads that triggered this run (oldest day first): each event's extra is
    ``{"from_trigger": True, "payload": {"uri", "day", "name"}}``."""
    events = context.get("triggering_asset_events") or {}
    out = []
    for key in list(events.keys()) if hasattr(events, "keys") else []:
        name = getattr(key, "name", key)
        if name != ASSET_NAME:
            continue
        for ev in events[key]:
            payload = (ev.extra or {}).get("payload") or {}
            if isinstance(payload, Mapping) and payload.get("day") and payload.get("uri"):
                out.append({k: str(payload[k]) for k in ("uri", "day", "name", "timezone") if k in payload})
    return sorted(out, key=lambda p: (p["day"], p.get("name", "")))


def export_folder(payload: Mapping[str, str]) -> str:
    """The watched folder ``payload``'s export file lies in (its URI, as ``HOUSE_SACCT_EXPORT_URI``
    names it once normalised)."""
    return payload["uri"].rsplit("/", 1)[0]


def export_params(payload: Mapping[str, str], params: Mapping[str, Any]) -> dict[str, Any]:
    """The params a run started by ``payload``'s export overrides: the watched folder is its trace
    (every export file in it, in day order: ``ingest`` reads a folder as one trace), so every day
    of the folder is one sample family and a month of them one ``mirage_pipeline`` run; in the
    exports' time zone unless the DAG's params name one."""
    out: dict[str, Any] = {"trace": export_folder(payload)}
    if payload.get("timezone") and not params.get("trace_timezone"):
        out["trace_timezone"] = payload["timezone"]
    return out
