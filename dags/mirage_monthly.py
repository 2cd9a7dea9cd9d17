"""A Mirage experiment for each month whose sample partitions are complete (asset-aware).

``mirage_samples`` emits one ``mirage_samples`` asset event per trace day it committed, keyed
by that day. This DAG rolls the days up by month (``PartitionedAssetTimetable`` with a
``RollupMapper``: ``StartOfMonthMapper`` + ``MonthWindow``, waiting for every day of the
month): when the last day of month M arrives, it runs once with partition key ``M`` and starts
a ``mirage_pipeline`` run that validates M (logical date: the first of M + 1, the pipeline's
default validation window) on the models trained on the weeks before it, with the trace and
sampling params the days were sampled with (``mirage_tasks.run.plan.month_run``), so the
pipeline reads those partitions instead of sampling again. This is how a production
deployment that follows a cluster's daily ``sacct`` export gets a monthly experiment without a
clock: the month runs when its data is there. The pipeline run is a normal full-size run
(size ``paper``, ``run_id`` ``samples_complete__<M>``; skipped when it exists already, e.g.
from a backfill of that date with the same id).

After the pipeline run (``start_pipeline`` waits for it, deferred to the triggerer), ``gate``
(``python -m mirage_tasks gate``) judges the month: the primary decision rule (``gate_rule``,
xgboost) against reactive, the calibrated average (avg-cal, else avg) and the months before,
on the month's intervals, with the margin ``HOUSE_GATE_MARGIN`` (10 %). A regression fails the
gate task (exit 1, the numbers in its log); the verdict is stored either way under
``<storage root>/mirage_monthly/gate/<M>/gate.json``. Only earlier months are read. When the
pipeline run existed already (skipped), the gate still judges its stored metrics.

Pause this DAG to stop the automatic experiments; ``mirage_pipeline``'s own ``@monthly``
schedule and backfills are independent of it. The UI shows the pending month and which days
have arrived in the asset's partition view.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import (
    DAG,
    Asset,
    MonthWindow,
    Param,
    PartitionedAssetTimetable,
    RollupMapper,
    StartOfMonthMapper,
    TriggerRule,
    WaitForAll,
    task,
)

from house import MACROS, default_args, get_config, steps_for

step, _ = steps_for("mirage_tasks")

SAMPLES = Asset(name="mirage_samples", uri="file:///mirage/samples", group="mirage")

with DAG(
    dag_id="mirage_monthly",
    description="Start a mirage_pipeline run for each month whose sample partitions are complete",
    doc_md=__doc__,
    schedule=PartitionedAssetTimetable(
        assets=SAMPLES,
        default_partition_mapper=RollupMapper(
            upstream_mapper=StartOfMonthMapper(), window=MonthWindow(), wait_policy=WaitForAll()
        ),
    ),
    start_date=datetime(2022, 10, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "pipeline"],
    user_defined_macros=dict(MACROS),
    params={
        "gate_rule": Param(
            "xgboost",
            type="string",
            title="Gate: primary decision rule",
            description="the validated model the monthly gate judges (the protocol's primary rule: xgboost)",
        ),
    },
) as dag:

    @task(multiple_outputs=True)
    def month(**context) -> dict:
        """The pipeline run this month calls for, from the month's sample events."""
        from airflow.sdk.exceptions import AirflowFailException

        from mirage_tasks.run.plan import month_run

        key = context["dag_run"].partition_key
        events = [e for evs in context["triggering_asset_events"].values() for e in evs]
        try:
            run = month_run(key, [dict(e.extra or {}) for e in events])
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from exc
        print(
            f"month {key}: {len(events)} day event(s); starting mirage_pipeline {run['run_id']} "
            f"(logical date {run['logical_date']}) with {run['conf']}",
            flush=True,
        )
        return run

    run = month()
    start = TriggerDagRunOperator(
        task_id="start_pipeline",
        trigger_dag_id="mirage_pipeline",
        trigger_run_id=run["run_id"],
        logical_date=run["logical_date"],
        conf=run["conf"],
        skip_when_already_exists=True,
        # the gate reads the run's metrics: wait for it, in the triggerer (a paper run takes hours)
        wait_for_completion=True,
        deferrable=True,
        poke_interval=300,
        allowed_states=["success"],
        failed_states=["failed"],
    )
    # after the month's experiment; NONE_FAILED: also when the run existed already (start_pipeline skipped)
    gate = step(
        "gate",
        argv=[
            "gate",
            "--runs",
            "{{ house_storage_prefix('mirage_pipeline') }}",
            "--month",
            "{{ dag_run.partition_key }}",
            "--rule",
            "{{ params.gate_rule }}",
            "--margin",
            str(get_config().gate_margin),
            "--out",
            "{{ house_storage_prefix(dag.dag_id, 'gate', dag_run.partition_key) }}",
        ],
        preset="cpu-small",
        timeout=timedelta(minutes=15),
        trigger_rule=TriggerRule.NONE_FAILED,
        # one quick retry covers a storage hiccup; a regression fails again (the rerun gives the stored verdict)
        retries=1,
        retry_delay=timedelta(seconds=30),
    )
    start >> gate
