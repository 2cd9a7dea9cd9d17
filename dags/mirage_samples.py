"""Mirage training samples, one partition per trace day: built for backfills.

Each run samples one UTC day of a trace: every sample of the grid (midnight UTC, every
``interval_hours``) whose start falls on that day, for each node size, into

    <root>/mirage/samples/node<N>-<family key>/day=YYYY-MM-DD/     (committed by its _SUCCESS.json)

the same partitions ``mirage_pipeline`` reads (its default windows are on this grid when
``interval_hours`` divides 24), so an experiment over a backfilled range samples nothing.
The family key covers the trace's location, the simulator configuration, the sampling
parameters, the node size and the mode (``mirage_tasks.run.plan.sample_family``); each day
partition is checked against the trace's content before it is reused.

The schedule is a daily partitioned timetable (``CronPartitionTimetable``): a backfill turns
its date range into day partitions. A paused DAG's backfill runs stay queued and never start
(Airflow 3), so unpause it first (a scheduled run without ``trace`` skips, see below):

    airflow dags unpause mirage_samples
    airflow backfill create --dag-id mirage_samples --from-date 2023-01-01 --to-date 2023-01-31 \\
        --max-active-runs 2 --dag-run-conf '{"trace": "/data/ls6-a100.log.gz", "trace_timezone": "America/Chicago"}'

(``--to-date`` included; the UI's Backfill form does the same). A day whose partitions are
committed samples nothing (its ``sample`` task is skipped); a failed day is rerun alone
(``--reprocess-behavior failed``, or clear that run). The trace is ingested once per content
(``<root>/mirage/traces/<key>``) and reused by every day. Each run ends with ``publish``,
which emits one event of the ``mirage_samples`` asset per day it sampled (partition key the
day); their extra (one per run: Airflow gives a task's events of one asset the same extra)
names the trace, the params and each day's partitions, so lineage shows in the UI's asset view.
The DAG runs one run at a time (``max_active_runs=1``: a watched run samples every day its
folder completes, see below); a backfill keeps its own ``--max-active-runs``.

Scheduled runs (the DAG unpaused) follow a growing trace, e.g. a cluster's daily ``sacct``
export landing at ``trace``: each samples the newest day whose samples' workloads the trace
covers entirely (last submit minus ``workload_days``, minus a day). The family is named by
the trace's location, and each partition records the digest of the trace rows its samples
see (``mirage_tasks.data.prefixes``): when tomorrow's export has grown the trace, the days
already sampled stay valid and only new days (and any day whose rows changed, e.g. a job that
ended since and now appears) are sampled. A scheduled run without ``trace``
has nothing to follow and skips (unpausing costs nothing). A manual run or backfill
without ``trace`` samples its day of a synthetic trace generated for that day's month
(6 samples per node size and day).

A watched folder (``HOUSE_SACCT_EXPORT_URI``, ``house.watch``: a site drops one ``sacct``
export per day, ``ls6-2023-01-31.log.gz``) also starts runs on new files, with the *folder*
as their trace: ``ingest`` reads a folder as one trace, its export files in day order
(``mirage_tasks.data.exports``). A run samples the day each of its exports completes
(``mirage_tasks.run.plan.export_sample_day``: the export's day minus one day and the workload,
so every job its samples see is in the folder already, in any site time zone, and the
partition stays valid as later exports arrive), all of them when several exports reached one
run, and any other day the folder's exports complete whose partitions are not committed
(``mirage_tasks.run.plan.watched_days``): the scheduler gives a run only the events queued
until its first one came, and leaves those that came while the DAG was at ``max_active_runs``
to the next export's run, so the run that plans after an export landed samples its day either
way. A run whose exports complete only days before the folder's first export, with nothing to
catch up, skips. So every day of the folder is in one family named by the folder, the day events
carry one ``trace`` (the folder), and when a month is complete (its last day's export plus
the workload's) ``mirage_monthly`` starts one ``mirage_pipeline`` run with the folder as its
trace, which reads those partitions. A backfill of watched days gives the folder's URI (as
``HOUSE_SACCT_EXPORT_URI`` names it) as ``trace`` and skips the committed days; days
sampled from a single export file as the trace are another family and are never replaced.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from airflow.sdk import DAG, Asset, CronPartitionTimetable, Param, TriggerRule, task

from house import MAP_LABEL, default_args, get_config, mapped_items, steps_for, storage_prefix
from house.config import PRESETS
from house.watch import export_events, export_params, samples_schedule
from mirage_tasks.run.runconf import SAMPLES_FORM, form

step, step_partial = steps_for("mirage_tasks")
LOCAL = get_config().runner == "local"
#: CPUs a sample task is granted: one locally, the cpu-large preset's request in a pod.
GRANTED = 1 if LOCAL else int(float(PRESETS["cpu-large"].requests["cpu"]))

#: One event per committed trace day (extra: day, trace, partitions).
SAMPLES = Asset(name="mirage_samples", uri="file:///mirage/samples", group="mirage")

with DAG(
    dag_id="mirage_samples",
    description="Mirage training samples, one partition per trace day (backfill-friendly)",
    doc_md=__doc__,
    # one partition per UTC day; or a new sacct export when HOUSE_SACCT_EXPORT_URI is set (house.watch)
    schedule=samples_schedule(CronPartitionTimetable("0 0 * * *", timezone="UTC")),
    start_date=datetime(2022, 10, 1, tzinfo=UTC),
    catchup=False,
    # one run at a time: a watched run samples every day its folder completes that is not
    # committed, so two at once would sample the same days (backfills keep their own limit)
    max_active_runs=1,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "pipeline"],
    # the sample family's params, declared once in mirage_tasks.run.runconf (shared with mirage_pipeline)
    params={name: Param(**spec) for name, spec in form(SAMPLES_FORM).items()},
) as dag:

    def _fail(exc: Exception):
        from airflow.sdk.exceptions import AirflowFailException

        return AirflowFailException(str(exc))

    @task(multiple_outputs=True)
    def plan(**context) -> dict:
        """The run's days (its partition; a scheduled run decides after ingesting) and the trace."""
        from airflow.sdk.exceptions import AirflowSkipException

        from house import input_roots
        from mirage_tasks.run.plan import NothingToSample, run_days, samples_trace, trace_fingerprint
        from mirage_tasks.run.runconf import MirageRun, input_params
        from stepkit import StepError, reach

        params = dict(context["params"])
        dr = context["dag_run"]
        if dr.run_type == "scheduled" and not params.get("trace"):
            raise AirflowSkipException("a scheduled run follows a growing trace: set the trace param's default")
        when = getattr(dr, "partition_date", None) or context.get("logical_date") or dr.run_after
        # a run started by new sacct exports (house.watch): the watched folder is its trace, its days
        # those its exports complete and any other the folder completes not yet committed (run_days)
        exports = export_events(context) if dr.run_type == "asset_triggered" else []
        overrides = export_params(exports[-1], params) if exports else {}
        params.update(overrides)
        try:
            run = MirageRun.from_params(params)
            # the params a step opens are data, not reach: under the allowed roots, before the trace is read
            reach.check_params(input_params(run), input_roots())
            r = run_days(when.astimezone(UTC).date().isoformat(), exports, run)
            if r["note"]:
                print(r["note"])
            fp = trace_fingerprint(run.trace) if run.trace else None
            trace = samples_trace(run, storage_prefix("mirage"), r["day"], fp)
        except NothingToSample as exc:
            raise AirflowSkipException(str(exc)) from exc
        except (ValueError, StepError) as exc:
            raise _fail(exc) from exc
        follow = dr.run_type == "scheduled" and bool(params.get("trace"))
        return {
            "days": None if follow else r["days"],
            "catch_up": r["catch_up"],
            "trace_argv": trace.pop("argv"),
            "overrides": overrides,
            **trace,
        }

    @task(multiple_outputs=True)
    def day_plan(p: dict, **context) -> dict:
        """The days' sample argvs, only for node sizes whose partition is not committed."""
        from airflow.sdk.exceptions import AirflowSkipException

        from mirage_tasks.run.plan import checked_against, newest_complete_day, samples_days
        from mirage_tasks.run.runconf import MirageRun
        from stepkit import storage

        try:
            run = MirageRun.from_params({**context["params"], **p["overrides"]})
            days = p["days"]
            if days is None:  # a scheduled run follows the trace: its newest complete day
                report = storage.read_json(storage.join(p["trace"], "ingest_report.json"))
                days = [newest_complete_day(report["span_last_submit"], run.workload_days)]
            have = checked_against(p["trace"], run.workload_days)
            out = samples_days(
                run, storage_prefix("mirage"), p, days, catch_up=p["catch_up"], have=have, workers=GRANTED
            )
        except ValueError as exc:
            raise _fail(exc) from exc
        if not out["days"]:
            raise AirflowSkipException(f"every day the folder's exports complete is committed: {p['catch_up']}")
        print(f"days {out['days']}: node sizes to sample {out['missing']}")
        return {**out, "overrides": p["overrides"]}

    @task
    def sample_argvs(d: dict) -> list:
        """The days' sample argvs with their labels (node size, day) to map ``sample`` over."""
        return mapped_items(d["sample"], d["labels"]["sample"])

    # Runs when the day plan ran (its samples done or none needed); skipped with the plan when a
    # scheduled run has no trace to follow, so unpausing without one ends in a skipped run.
    @task(outlets=[SAMPLES], trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def publish(d: dict, **context) -> dict:
        """Every partition of the run's days committed: one asset event per day (its partition
        key is that day, also when a scheduled run followed the trace to an earlier day), all
        naming the days' partitions and the params (mirage_monthly starts a pipeline run with them)."""
        from mirage_tasks.run.plan import samples_event
        from stepkit.step import read_marker

        missing = [u for parts in d["partitions"].values() for u in parts.values() if read_marker(u) is None]
        if missing:
            raise RuntimeError(f"partitions not committed: {missing}")
        extra, keys = samples_event(d, {**context["params"], **d["overrides"]})
        events = context["outlet_events"][SAMPLES]
        events.extra = extra
        events.add_partitions(keys)
        return extra

    p = plan()
    trace = step("prepare_trace", argv=p["trace_argv"], preset="cpu-small", timeout=timedelta(minutes=30))
    d = day_plan(p)
    # one CPU per sample task locally (as many at once as this machine has CPUs), the preset's in a pod
    cpus = {
        "env": {"OMP_NUM_THREADS": str(GRANTED), "MKL_NUM_THREADS": str(GRANTED)},
        **({"max_active_tis_per_dag": len(os.sched_getaffinity(0))} if LOCAL else {}),
    }
    sample = step_partial(
        "sample", preset="cpu-large", timeout=timedelta(hours=1), map_index_template=MAP_LABEL, **cpus
    ).expand_kwargs(sample_argvs(d))
    trace >> d
    sample >> publish(d)
