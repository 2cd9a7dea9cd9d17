"""Deadline alerts: a DAG run still unfinished a stated interval after it was queued is reported.

A DAG file adds ``deadline=deadline_alert(dag_id)`` (never a literal interval): the interval is
the house setting ``HOUSE_DEADLINE_<DAG>`` (:meth:`house.config.HouseConfig.deadline_for`),
counted from when the run was queued (``DeadlineReference.DAGRUN_QUEUED_AT``: a manual run has
no logical date, and a scheduled run is queued at its cron time). Airflow's scheduler notices
the missed deadline and queues the callback; the callback is an ``AsyncCallback``, so it runs in
the **triggerer** (a deployment running deadlines needs one), which imports it from this
plugins folder.

The callback, :class:`DeadlineRecord` (a notifier), always

1. writes one line to the triggerer's log (``deadline missed: <dag> run <run_id> ...``), and
2. commits a record the results view can show: ``<storage root>/_deadlines/<dag>/<run id>.json``
   with the DAG, the run, its queue time, the deadline, the interval and when it fired (written
   to a temporary name and renamed, so a reader never sees half a record),

then, when the site names one (``HOUSE_DEADLINE_NOTIFIER``: a notifier class such as a Slack or
SMTP provider's, with ``HOUSE_DEADLINE_NOTIFIER_KWARGS``), sends the deadline to it as well. The
record comes first: a channel that is down fails the callback (Airflow logs it as failed) but
never loses the record.

A run that finishes before its deadline has its deadline removed by Airflow: nothing fires.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference
from airflow.sdk.bases.notifier import BaseNotifier

from house import config as house_config
from house.records import commit_json

log = logging.getLogger(__name__)

#: Folder under the storage root holding one record per missed deadline, per DAG.
RECORDS = "_deadlines"


def deadline_alert(dag_id: str) -> DeadlineAlert | None:
    """The house deadline of ``dag_id``: queued time + its configured interval -> :class:`DeadlineRecord`;
    None where ``HOUSE_DEADLINE_<DAG>`` is ``off``. ``airflow dags test`` (``dag.test()``) needs it off
    in Airflow 3.3.2: it runs an in-memory copy of the DAG whose alerts are not yet stored, and a run
    that succeeds then fails looking its alerts up (``make demo-faasm`` sets it off)."""
    cfg = house_config.get_config()
    interval = cfg.deadline_for(dag_id)
    if interval is None:
        return None
    kwargs: dict[str, Any] = {"dag_id": dag_id, "interval_s": interval.total_seconds()}
    if cfg.deadline_notifier:
        kwargs["notifier"] = cfg.deadline_notifier
        kwargs["notifier_kwargs"] = dict(cfg.deadline_notifier_kwargs)
    return DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=interval,
        callback=AsyncCallback(DeadlineRecord, kwargs=kwargs),
        name=f"{dag_id}_overdue",
    )


def record_path(storage_root: str, dag_id: str, run_id: str) -> str:
    """``<root>/_deadlines/<dag>/<run id>.json``; the run id made a safe file name (``:`` ``+`` -> ``_``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id).lstrip(".") or "_"
    return "/".join([storage_root.rstrip("/"), RECORDS, dag_id, f"{safe}.json"])


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    return str(value)


def write_record(storage_root: str, record: dict[str, Any]) -> str:
    """Commit ``record`` at :func:`record_path` (a temporary name, then renamed); returns the path."""
    return commit_json(record_path(storage_root, record["dag_id"], record["run_id"]), record)


class DeadlineRecord(BaseNotifier):
    """The house deadline callback: a log line, a record under the storage root, the site's notifier.

    Built by the triggerer with the alert's ``kwargs`` and Airflow's deadline context
    (``dag_run``: the run as the REST API shows it; ``deadline``: its id and time), then awaited.
    """

    def __init__(
        self,
        dag_id: str,
        interval_s: float,
        notifier: str | None = None,
        notifier_kwargs: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
    ):
        super().__init__(context=context)
        self.dag_id = dag_id
        self.interval_s = float(interval_s)
        self.notifier = notifier
        self.notifier_kwargs = dict(notifier_kwargs or {})

    def record(self, context: dict[str, Any]) -> dict[str, Any]:
        """What the record holds, from the deadline context."""
        run = dict(context.get("dag_run") or {})
        deadline = dict(context.get("deadline") or {})
        return {
            "kind": "deadline_missed",
            "dag_id": run.get("dag_id") or self.dag_id,
            "run_id": run.get("dag_run_id") or run.get("run_id") or "unknown",
            "run_state": run.get("state"),
            "queued_at": _iso(run.get("queued_at")),
            "start_date": _iso(run.get("start_date")),
            "deadline": _iso(deadline.get("deadline_time")),
            "deadline_id": deadline.get("id"),
            "interval_s": self.interval_s,
            "interval": str(timedelta(seconds=self.interval_s)),
            "fired_at": datetime.now(UTC).isoformat(),
        }

    def notify(self, context: dict[str, Any]) -> None:
        """The record and the log line (sync; :meth:`async_notify` also forwards to the site's notifier)."""
        rec = self.record(dict(context or {}))
        root = house_config.get_config().storage_root
        path = write_record(root, rec)
        log.warning(
            "deadline missed: %s run %s not finished %s after it was queued (%s; deadline %s); record %s",
            rec["dag_id"],
            rec["run_id"],
            rec["interval"],
            rec["queued_at"],
            rec["deadline"],
            path,
        )
        # the triggerer's own log shows this line too: its logger may not reach the task logs
        print(f"deadline missed: {rec['dag_id']} run {rec['run_id']} (deadline {rec['deadline']}); record {path}")

    async def async_notify(self, context: dict[str, Any]) -> None:
        # the record is written off the event loop: the triggerer runs other triggers beside it
        await asyncio.to_thread(self.notify, context)
        if self.notifier:
            await _forward(self.notifier, self.notifier_kwargs, context)


async def _forward(path: str, kwargs: dict[str, Any], context: dict[str, Any]) -> None:
    """Send the deadline to the site's notifier, the way Airflow itself calls an ``AsyncCallback``."""
    from airflow.sdk._shared.module_loading import import_string

    target = import_string(path)
    params = inspect.signature(target).parameters
    takes_context = "context" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    result = target(**kwargs, context=context) if takes_context else target(**kwargs)
    if inspect.isawaitable(result):
        await result
