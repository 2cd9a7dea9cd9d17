"""Mirage pipeline: trace -> samples -> dataset -> models -> online validation -> report.

Every step is ``python -m mirage_tasks <step>`` declared with the house factory
(``plugins/house``), run as a local process or a pod depending on ``HOUSE_RUNNER``.
Data moves through storage only, keyed by what it depends on (``mirage_tasks.run.plan``):

    <root>/mirage/traces/<trace key>/                      ingested once per (trace content, time zone, window)
    <root>/mirage/samples/node<N>-<family key>/day=<D>/    samples starting on trace day D (shared with mirage_samples)
    <root>/mirage_pipeline/<logical date>-<config key>/    datasets, models, validation, metrics, report

so a run whose training window overlaps an earlier run's (a monthly backfill) samples only
the days no run has sampled yet, and a second run with the same params does no work: every
step finds its committed output and skips. A run with other params (a manual run beside a
backfill of the same date) gets its own prefix.

The recipe: ``plan`` (one folded task group: ``plan.commands`` and the argvs, with their
labels, each mapped step expands over) fingerprints the trace, finds the missing sample days and computes every
command line; the trace is ingested (or generated); ``sample`` runs mapped over the missing
days of each node size (in up to ``shards`` tasks; skipped when none is missing); ``merge``
builds one chronological dataset per node size from the window's day partitions; ``train``
runs mapped over models x node sizes (torch models on the ``gpu`` preset when ``device`` is
``cuda``; the ``*_gpu`` tasks and the ``cuda`` choice exist only where the deployment declares
GPU nodes, ``HOUSE_GPUS=true``), the policies after their base models; ``validate`` runs mapped over models, the reactive and avg baselines, node sizes and
shards; ``fidelity`` (real vs simulated waits over the validation window), ``metrics`` and
``report`` close the run. Mapped instances are labelled (node size, days, model, shard) with
the labels the plan computes beside each argv.

CPUs: in kubernetes mode ``sample``/``validate`` get ``--workers`` and ``train`` ``--threads``
from the ``cpu-large`` preset's CPU request; locally each heavy step gets one CPU (one worker,
one torch/OpenMP thread) and at most as many instances of it run at once as this machine
has CPUs (``max_active_tis_per_dag``, affinity-aware).

Params (``mirage_tasks.run.runconf``: each one typed, with its range and a description in the
form): ``size`` comes first. ``demo`` (the form's default) finishes in minutes: 30 training
samples 12 h apart, 6 validation samples, node sizes 1 and 8, 2 shards, short policy
training, and on the synthetic trace fixed windows (validation from 2023-02-11), so it means
the same whatever the logical date; ``month`` validates a whole month on the 180 samples
before it; ``paper`` is the Mirage seed's full configuration (684 samples every 4 h, the whole
month, all 8 models). A param left empty takes the size's value; one you set wins. The
resolved configuration is the plan's ``config`` (its XCom); storage keys hash the resolved
values, not the size.

Windows: validation defaults to the month before the logical date, training to the
``train_count`` samples just before it (with a ``workload_days`` gap), so a monthly
backfill validates each month on models trained on the weeks before it (give a size other
than ``demo``, whose synthetic-trace windows are fixed). A paused DAG's backfill runs stay
queued and never start (Airflow 3), so unpause it first (unpausing also starts the latest
scheduled run, size ``scheduled``, see below):

    airflow dags unpause mirage_pipeline
    airflow backfill create --dag-id mirage_pipeline --from-date 2023-02-01 --to-date 2023-04-01 --max-active-runs 2 --dag-run-conf '{"size": "paper"}'

Give ``train_start``/``val_start`` to pin the windows
(e.g. the Mirage seed: train from 2022-11-01, 684 samples; validate from 2023-03-01, 156
samples).

Scheduled runs (the DAG unpaused) have size ``scheduled`` whatever the form says: one week of
training (``train_count`` 42), 12 validation samples, one shard, xgboost and random_forest
only; trigger by hand or backfill for other sizes.

Trace: ``trace`` is a real trace URI (sacct log, ``sacct --parsable2`` or SWF), trimmed to
``window_from``/``window_to`` if given; empty = a synthetic trace from ``synth_profile``
covering the windows.
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import DAG, Param, TaskGroup, TriggerRule, task

from house import MAP_LABEL, cron_schedule, default_args, get_config, mapped_items, steps_for, storage_prefix
from house.config import PRESETS
from mirage_tasks.run.runconf import PIPELINE_FORM, form

step, step_partial = steps_for("mirage_tasks")
#: CPUs a heavy step is granted: the cpu-large preset's request in a pod, one locally, where at
#: most as many heavy instances run at once as this machine has CPUs (affinity-aware).
LOCAL = get_config().runner == "local"
#: GPU tasks exist only where the deployment has GPU nodes (HOUSE_GPUS); ``device`` offers cuda then.
GPUS = get_config().gpus
DEVICES = ["cpu", "cuda"] if GPUS else ["cpu"]
#: The plan's argv lists the mapped steps expand over, each with its labels (mirage_tasks.run.plan.MAPPED_STEPS).
STEP_LISTS = (
    "sample",
    "merge",
    "train_cpu",
    *(("train_gpu",) if GPUS else ()),
    "policy_cpu",
    *(("policy_gpu",) if GPUS else ()),
    "validate",
)
GRANTED = 1 if LOCAL else int(float(PRESETS["cpu-large"].requests["cpu"]))
HEAVY = {
    "env": {"OMP_NUM_THREADS": str(GRANTED), "MKL_NUM_THREADS": str(GRANTED)},
    **({"max_active_tis_per_dag": len(os.sched_getaffinity(0))} if LOCAL else {}),
}


with DAG(
    dag_id="mirage_pipeline",
    description="Mirage (SC'23): trace -> samples -> models -> online validation -> report",
    doc_md=__doc__,
    schedule=cron_schedule("@monthly"),  # one validation month per run; first run: the next 1st after unpausing
    catchup=False,
    max_active_runs=2,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "pipeline", "ml"],
    # every param declared once, typed and described, in mirage_tasks.run.runconf (size first)
    params={name: Param(**spec) for name, spec in form(PIPELINE_FORM, choices={"device": DEVICES}).items()},
) as dag:

    @task(multiple_outputs=True)
    def plan(**context) -> dict:
        """This run's storage prefix, the missing sample days and every step's argv (no work)."""
        from airflow.sdk.exceptions import AirflowFailException

        from house import input_roots
        from mirage_tasks.run.plan import plan_run
        from mirage_tasks.run.runconf import MirageRun, input_params
        from mirage_tasks.run.runlog import record_run
        from stepkit import StepError, reach

        run_type = context["dag_run"].run_type  # scheduled: size "scheduled"; backfill: no fixed demo windows
        try:
            conf = MirageRun.from_params(
                dict(context["params"]), scheduled=run_type == "scheduled", backfill=run_type == "backfill"
            )
            # the params a step opens are data, not reach: under the allowed roots, before the plan reads the trace
            reach.check_params(input_params(conf), input_roots())
            planned = plan_run(
                conf,
                storage_prefix("mirage"),
                storage_prefix(context["dag"].dag_id),
                context.get("logical_date"),
                workers=GRANTED,
                threads=GRANTED,
            )
        except (ValueError, StepError) as exc:  # bad params or a missing trace: a retry cannot help
            raise AirflowFailException(str(exc)) from exc
        # which DAG run used this prefix (the results view lists runs by it)
        record_run(
            planned["prefix"],
            dag_id=context["dag"].dag_id,
            run_id=context["run_id"],
            run_type=run_type,
            logical_date=context.get("logical_date"),
            params=dict(context["params"]),
            defaults=context["dag"].params.dump(),
        )
        print(f"run prefix: {planned['prefix']}", flush=True)  # make demo's summary reads it from the log
        return planned

    @task
    def argvs(p: dict, key: str) -> list:
        """One step's argvs with their labels, to map it over (Airflow maps over a task's whole return value)."""
        return mapped_items(p[key], p["labels"][key])

    @task
    def missing_days(p: dict) -> list:
        """The sample argvs (and labels) of the days still missing, once the trace is ingested: a
        committed day counts only if it saw the same jobs as this trace (a grown trace keeps its days)."""
        from mirage_tasks.run.plan import checked_against, sample_argvs

        argvs_, labels, missing = sample_argvs(p, checked_against(p["trace"], p["workload_days"]))
        print("days to sample per node size:", {n: len(d) for n, d in missing.items()}, flush=True)
        return mapped_items(argvs_, labels)

    # The plan and the per-step argv lists sit in one task group (one folded row in the grid):
    # Airflow maps over a task's whole return value, so each mapped step needs its own list.
    with TaskGroup("plan", tooltip="Fingerprint the trace, find missing sample days, build every argv"):
        run = plan.override(task_id="commands")()
        lists = {key: argvs.override(task_id=key)(run, key) for key in STEP_LISTS if key != "sample"}
        lists["sample"] = missing_days.override(task_id="sample")(run)
    trace = step("prepare_trace", argv=run["trace_argv"], preset="cpu-small", timeout=timedelta(minutes=30))
    trace >> lists["sample"]

    # Mapped steps with an empty list are skipped: sample when every day is committed, and
    # one of each cpu/gpu pair. Each instance is labelled with the plan's label for its argv.
    after_any = {"trigger_rule": TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS}
    mapped = {"map_index_template": MAP_LABEL}
    sample = step_partial("sample", preset="cpu-large", timeout=timedelta(hours=2), **mapped, **HEAVY).expand_kwargs(
        lists["sample"]
    )
    merge = step_partial(
        "merge", preset="cpu-small", timeout=timedelta(minutes=30), trigger_rule=TriggerRule.NONE_FAILED, **mapped
    ).expand_kwargs(lists["merge"])
    train = [
        step_partial(
            "train_cpu", preset="cpu-large", timeout=timedelta(hours=6), **after_any, **mapped, **HEAVY
        ).expand_kwargs(lists["train_cpu"])
    ]
    policy = [
        step_partial(
            "policy_cpu", preset="cpu-large", timeout=timedelta(hours=6), **after_any, **mapped, **HEAVY
        ).expand_kwargs(lists["policy_cpu"])
    ]
    if GPUS:  # only where the deployment has GPU nodes (HOUSE_GPUS)
        train.append(
            step_partial("train_gpu", preset="gpu", timeout=timedelta(hours=12), **after_any, **mapped).expand_kwargs(
                lists["train_gpu"]
            )
        )
        policy.append(
            step_partial("policy_gpu", preset="gpu", timeout=timedelta(hours=12), **after_any, **mapped).expand_kwargs(
                lists["policy_gpu"]
            )
        )
    validate = step_partial(
        "validate", preset="cpu-large", timeout=timedelta(hours=3), **after_any, **mapped, **HEAVY
    ).expand_kwargs(lists["validate"])
    fidelity = step("fidelity", argv=run["fidelity"], preset="cpu-large", timeout=timedelta(hours=2))
    metrics = step("metrics", argv=run["metrics"], preset="cpu-small", timeout=timedelta(minutes=30))
    report = step("report", argv=run["report"], preset="cpu-small", timeout=timedelta(minutes=30))

    trace >> sample >> merge >> train
    for p in policy:
        train >> p
    policy >> validate >> metrics >> report
    trace >> fidelity >> report
