"""Deadline alerts (``house.deadlines``): ``faasm_benchmarks`` and ``mirage_service`` carry one whose
interval is the house setting, not a literal, and whose callback records a missed deadline."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from conftest import load_dag

pytestmark = pytest.mark.timeout(120)

DAGS = ("faasm_benchmarks", "mirage_service")


@pytest.fixture(autouse=True)
def _fresh_variable_cache():
    from house.config import clear_variable_cache

    clear_variable_cache()
    yield
    clear_variable_cache()


@pytest.mark.parametrize("dag_id", DAGS)
def test_dag_carries_the_configured_deadline(dag_id, monkeypatch, tmp_path):
    """The interval follows HOUSE_DEADLINE_<DAG>; counted from the run's queue time; the callback is
    the house notifier (run in the triggerer), and it survives serialization as the scheduler sees it."""
    from airflow.sdk import AsyncCallback, DeadlineReference
    from airflow.serialization.serialized_objects import DagSerialization

    from house.config import deadline_env_var
    from house.deadlines import DeadlineRecord

    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path))
    monkeypatch.setenv(deadline_env_var(dag_id), "17m")
    monkeypatch.setenv("HOUSE_DEADLINE_NOTIFIER", "house.deadlines.DeadlineRecord")
    monkeypatch.setenv("HOUSE_DEADLINE_NOTIFIER_KWARGS", json.dumps({"dag_id": "site", "interval_s": 1}))
    dag = load_dag(dag_id)
    alerts = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
    assert len(alerts) == 1
    alert = alerts[0]
    assert alert.interval == timedelta(minutes=17)
    assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT
    assert isinstance(alert.callback, AsyncCallback)
    assert alert.callback.path == f"{DeadlineRecord.__module__}.DeadlineRecord"
    assert alert.callback.kwargs == {
        "dag_id": dag_id,
        "interval_s": 17 * 60.0,
        "notifier": "house.deadlines.DeadlineRecord",
        "notifier_kwargs": {"dag_id": "site", "interval_s": 1},
    }
    # what the scheduler reads back from the serialized DAG
    (ser,) = DagSerialization.from_dict(DagSerialization.to_dict(dag)).deadline
    assert ser["reference"] == {"reference_type": "DagRunQueuedAtDeadline"}
    assert ser["interval"]["__data__"] == 17 * 60.0
    assert ser["callback"]["__data__"]["path"] == "house.deadlines.DeadlineRecord"
    assert ser["callback"]["__data__"]["kwargs"]["dag_id"] == dag_id


def test_default_intervals_and_bad_settings(monkeypatch):
    from house.config import DEFAULT_DEADLINES, ConfigError, get_config

    for key in ("HOUSE_DEADLINE_FAASM_BENCHMARKS", "HOUSE_DEADLINE_MIRAGE_SERVICE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOUSE_NO_VARIABLES", "1")
    cfg = get_config()
    assert cfg.deadlines == dict(DEFAULT_DEADLINES)
    assert cfg.deadline_for("faasm_benchmarks") == timedelta(hours=20)
    with pytest.raises(ConfigError, match="HOUSE_DEADLINE_MIRAGE_PIPELINE"):
        cfg.deadline_for("mirage_pipeline")
    for text, want in (("90", 90), ("90s", 90), ("1.5m", 90), ("2h", 7200), ("1d", 86400)):
        monkeypatch.setenv("HOUSE_DEADLINE_MIRAGE_SERVICE", text)
        assert get_config().deadline_for("mirage_service") == timedelta(seconds=want)
    for bad in ("soon", "-5m", "0", "3w"):
        monkeypatch.setenv("HOUSE_DEADLINE_MIRAGE_SERVICE", bad)
        with pytest.raises(ConfigError, match="HOUSE_DEADLINE_MIRAGE_SERVICE"):
            get_config()
    monkeypatch.delenv("HOUSE_DEADLINE_MIRAGE_SERVICE")
    monkeypatch.setenv("HOUSE_DEADLINE_NOTIFIER_KWARGS", "[1]")
    with pytest.raises(ConfigError, match="HOUSE_DEADLINE_NOTIFIER_KWARGS"):
        get_config()


#: Forwarded deadlines, as a site's notifier would send them (see test_callback_records...).
SENT: list[dict] = []


class SiteNotifier:
    """A site's channel: takes its own arguments and the deadline context, then is awaited."""

    def __init__(self, channel: str, context=None):
        self.channel, self.context = channel, context

    def __await__(self):
        SENT.append({"channel": self.channel, "run": self.context["dag_run"]["dag_run_id"]})
        yield from asyncio.sleep(0).__await__()


def _context(run_id: str, dag_id: str = "faasm_benchmarks") -> dict:
    """The context Airflow's scheduler hands a deadline callback (``Deadline.handle_miss``)."""
    return {
        "dag_run": {
            "dag_id": dag_id,
            "dag_run_id": run_id,
            "state": "running",
            "queued_at": "2026-12-07T08:00:00Z",
            "start_date": "2026-12-07T08:00:01Z",
        },
        "deadline": {"id": "0193", "deadline_time": datetime(2026, 12, 7, 8, 0, 5, tzinfo=UTC)},
    }


def test_callback_records_logs_and_forwards(monkeypatch, tmp_path, caplog):
    """Built and awaited as the triggerer does (``CallbackTrigger``): a JSON record under
    ``_deadlines/<dag>/<run>.json``, a log line, then the site's notifier."""
    from house.deadlines import DeadlineRecord, record_path

    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path))
    SENT.clear()
    run_id = "manual__2026-12-07T08:00:00+00:00"
    cb = DeadlineRecord(
        dag_id="faasm_benchmarks",
        interval_s=5,
        notifier=f"{__name__}.SiteNotifier",
        notifier_kwargs={"channel": "#bench"},
        context=_context(run_id),
    )
    with caplog.at_level("WARNING", logger="house.deadlines"):
        asyncio.run(_await(cb))
    path = tmp_path / "_deadlines" / "faasm_benchmarks" / "manual__2026-12-07T08_00_00_00_00.json"
    assert record_path(str(tmp_path), "faasm_benchmarks", run_id) == str(path)
    rec = json.loads(path.read_text())
    assert rec["dag_id"] == "faasm_benchmarks" and rec["run_id"] == run_id
    assert rec["deadline"] == "2026-12-07T08:00:05+00:00" and rec["interval_s"] == 5.0
    assert rec["queued_at"] == "2026-12-07T08:00:00Z" and rec["fired_at"]
    assert not list(path.parent.glob("*.tmp-*"))
    assert f"deadline missed: faasm_benchmarks run {run_id}" in caplog.text
    assert SENT == [{"channel": "#bench", "run": run_id}]


def test_record_is_kept_when_the_channel_fails(monkeypatch, tmp_path):
    from house.deadlines import DeadlineRecord

    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path))
    cb = DeadlineRecord(
        dag_id="mirage_service",
        interval_s=60,
        notifier="no_such_module.Notifier",
        context=_context("manual__x", "mirage_service"),
    )
    with pytest.raises(ImportError):
        asyncio.run(_await(cb))
    assert (tmp_path / "_deadlines" / "mirage_service" / "manual__x.json").is_file()


async def _await(cb):
    await cb


def test_off_leaves_the_dag_without_a_deadline(monkeypatch, tmp_path):
    """``HOUSE_DEADLINE_<DAG>=off``: no alert (what ``airflow dags test`` needs in Airflow 3.3.2)."""
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path))
    monkeypatch.setenv("HOUSE_DEADLINE_FAASM_BENCHMARKS", "off")
    assert not load_dag("faasm_benchmarks").deadline
    monkeypatch.setenv("HOUSE_DEADLINE_FAASM_BENCHMARKS", "3h")
    (alert,) = load_dag("faasm_benchmarks").deadline
    assert alert.interval == timedelta(hours=3)
