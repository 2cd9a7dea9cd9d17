"""What unpausing a DAG starts: the cron DAGs' first scheduled run is the next cron time after
the unpause, never one for a time already past (which the trigger form's "Unpause on trigger"
box, ticked by default, would otherwise start beside the user's own run)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from conftest import DAGS


def _serialized(dag_id: str):
    """The DAG as the scheduler sees it (serialized and read back: core timetable, restriction)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
    assert not bag.import_errors, bag.import_errors
    return DagSerialization.from_dict(DagSerialization.to_dict(bag.dags[dag_id]))


@pytest.mark.parametrize(
    "dag_id, period", [("mirage_pipeline", timedelta(days=31)), ("faasm_benchmarks", timedelta(days=1))]
)
def test_first_scheduled_run_is_after_the_unpause(dag_id, period):
    dag = _serialized(dag_id)
    assert dag._time_restriction.earliest is None, "a start_date would make unpausing run the last past time"
    before = datetime.now(UTC)
    first = dag.timetable.next_dagrun_info(last_automated_data_interval=None, restriction=dag._time_restriction)
    assert before < first.run_after <= before + period, (dag_id, first.run_after)


def test_runs_follow_the_cron_once_scheduled():
    """After a scheduled run the next one is the following cron time (a DAG paused for longer
    resumes with its most recent missed time, as catchup=False does)."""
    from airflow.timetables.base import DataInterval

    dag = _serialized("mirage_pipeline")
    now = datetime.now(UTC)
    month_start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = DataInterval(month_start, month_start)
    nxt = dag.timetable.next_dagrun_info(last_automated_data_interval=last, restriction=dag._time_restriction)
    assert nxt.run_after > now and nxt.run_after.day == 1 and nxt.run_after - month_start <= timedelta(days=31)
