"""Mirage pipeline: trace -> samples -> dataset -> models -> online validation -> report.

Every step is ``python -m mirage_tasks <step>`` declared with the house factory
(``plugins/house``), run as a local process or a pod depending on ``HOUSE_RUNNER``.
Data moves through storage only, keyed by what it depends on (``mirage_tasks.plan``):

    <root>/mirage/traces/<trace key>/                      ingested once per (trace content, time zone, window)
    <root>/mirage/samples/node<N>-<family key>/day=<D>/    samples starting on trace day D (shared with mirage_samples)
    <root>/mirage_pipeline/<logical date>-<config key>/    datasets, models, validation, metrics, report

so a run whose training window overlaps an earlier run's (a monthly backfill) samples only
the days no run has sampled yet, and a second run with the same params does no work: every
step finds its committed output and skips. A run with other params (a manual run beside a
backfill of the same date) gets its own prefix.

The recipe: ``plan`` (one folded task group: ``plan.commands`` and the argv list each mapped
step expands over) fingerprints the trace, finds the missing sample days and computes every
command line; the trace is ingested (or generated); ``sample`` runs mapped over the missing
days of each node size (in up to ``shards`` tasks; skipped when none is missing); ``merge``
builds one chronological dataset per node size from the window's day partitions; ``train``
runs mapped over models x node sizes (torch models on the ``gpu`` preset when ``device`` is
``cuda``; the ``*_gpu`` tasks and the ``cuda`` choice exist only where the deployment declares
GPU nodes, ``HOUSE_GPUS=true``), the policies after their base models; ``validate`` runs mapped over models, the reactive and avg baselines, node sizes and
shards; ``fidelity`` (real vs simulated waits over the validation window), ``metrics`` and
``report`` close the run. Mapped instances are labelled (node size, days, model, shard).

CPUs: in kubernetes mode ``sample``/``validate`` get ``--workers`` and ``train`` ``--threads``
from the ``cpu-large`` preset's CPU request; locally each heavy step gets one CPU (one worker,
one torch/OpenMP thread) and at most as many instances of it run at once as this machine
has CPUs (``max_active_tis_per_dag``, affinity-aware).

Windows: validation defaults to the month before the logical date, training to the
``train_count`` samples just before it (with a ``workload_days`` gap), so a monthly
backfill (``airflow backfill create --dag-id mirage_pipeline --from-date 2023-02-01
--to-date 2023-04-01 --max-active-runs 2``) validates each month on models trained on the
weeks before it. Give ``train_start``/``val_start`` to pin them (e.g. the Mirage seed: train
from 2022-11-01, 684 samples; validate from 2023-03-01, 156 samples).

Scheduled runs (the DAG unpaused) use the params' defaults but a small size: the run
samples one week (``train_count`` 42), validates 12 samples, one shard, xgboost and
random_forest only (``SCHEDULED``); trigger by hand or backfill for full-size runs.

Trace: ``trace`` is a real trace URI (sacct log, ``sacct --parsable2`` or SWF), trimmed to
``window_from``/``window_to`` if given; empty = a synthetic trace from ``synth_profile``
covering the windows.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, Param, TaskGroup, TriggerRule, task

from house import default_args, get_config, steps_for, storage_prefix
from house.config import PRESETS

step, step_partial = steps_for("mirage_tasks")

#: What a scheduled run (not a manual run, not a backfill) changes in the defaults.
SCHEDULED = {"train_count": 42, "val_count": 12, "shards": 1, "models": ["xgboost", "random_forest"]}
#: CPUs a heavy step is granted: the cpu-large preset's request in a pod, one locally, where at
#: most as many heavy instances run at once as this machine has CPUs (affinity-aware).
LOCAL = get_config().runner == "local"
#: GPU tasks exist only where the deployment has GPU nodes (HOUSE_GPUS); ``device`` offers cuda then.
GPUS = get_config().gpus
DEVICES = ["cpu", "cuda"] if GPUS else ["cpu"]
#: The plan's argv lists the mapped steps expand over (mirage_tasks.plan.plan_run's keys).
STEP_LISTS = ("sample", "merge", "train_cpu", *(("train_gpu",) if GPUS else ()), "policy_cpu",
              *(("policy_gpu",) if GPUS else ()), "validate")
GRANTED = 1 if LOCAL else int(float(PRESETS["cpu-large"].requests["cpu"]))
HEAVY = {"env": {"OMP_NUM_THREADS": str(GRANTED), "MKL_NUM_THREADS": str(GRANTED)},
         **({"max_active_tis_per_dag": len(os.sched_getaffinity(0))} if LOCAL else {})}


def step_label(argv) -> str:
    """The label of a mapped step instance (``map_index_template``): model, node size, days, shard."""
    argv = list(argv or [])
    val = {a: argv[i + 1] for i, a in enumerate(argv[:-1]) if a.startswith("--")}
    days = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--day"]
    node = val.get("--node") or next((seg[4:] for seg in val.get("--out", "").split("/")
                                      if seg.startswith("node") and seg[4:].isdigit()), None)
    parts = [val.get("--name") or val.get("--model"), f"node {node}" if node else None,
             (f"{days[0]}..{days[-1]} ({len(days)} d)" if len(days) > 1 else days[0]) if days else None,
             f"shard {val['--shard']}" if "--shard" in val else None]
    return " · ".join(p for p in parts if p) or (argv[0] if argv else "")


LABEL = "{{ (task.argv if task.argv is defined else task.arguments) | step_label }}"

with DAG(
    dag_id="mirage_pipeline",
    description="Mirage (SC'23): trace -> samples -> models -> online validation -> report",
    doc_md=__doc__,
    schedule="@monthly",  # one validation month per run: backfills walk a trace month by month
    start_date=datetime(2022, 12, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=2,
    default_args=default_args(owner="mirage"),
    user_defined_filters={"step_label": step_label},
    tags=["mirage", "pipeline", "ml"],
    params={
        "trace": Param(None, type=["null", "string"], title="Trace URI",
                       description="Real trace (sacct log or SWF, local path, file:// or s3://). "
                                   "Empty: the embedded synthetic trace."),
        "window_from": Param(None, type=["null", "string"], title="Trace window start (ISO 8601)",
                             description="Trim the trace to jobs submitted from here (empty: whole trace)."),
        "window_to": Param(None, type=["null", "string"], title="Trace window end (ISO 8601)",
                           description="... and before here (exclusive)."),
        "trace_timezone": Param(None, type=["null", "string"], title="Trace time zone",
                                description="IANA zone of a sacct log's local times "
                                            "(America/Chicago for Lonestar6); SWF logs carry their own."),
        "synth_profile": Param("ls6-a100", type="string", title="Synthetic profile",
                               description="Workload profile (packaged name or JSON URI) used when no trace is given."),
        "cluster_config": Param("ls6", type="string", title="Simulator configuration",
                                description="Preset (ls6, reference) or a JSON URI of simulator settings."),
        "train_start": Param(None, type=["null", "string"], title="First training sample (ISO 8601)",
                             description="Empty: as late as the validation window allows."),
        "train_count": Param(684, type="integer", minimum=1, title="Training samples"),
        "val_start": Param(None, type=["null", "string"], title="First validation sample (ISO 8601)",
                           description="Empty: the first day of the month before the run's logical date."),
        "val_count": Param(None, type=["null", "integer"], minimum=1, title="Validation samples",
                           description="Empty: the whole validation month."),
        "interval_hours": Param(4, type="number", exclusiveMinimum=0, title="Hours between samples"),
        "warmup_days": Param(2, type="number", minimum=0, title="Warm-up days before the predecessor"),
        "workload_days": Param(5, type="number", exclusiveMinimum=0, title="Workload days per sample"),
        "probes": Param(7, type="integer", minimum=2, title="Probes per training sample"),
        "probe_spacing": Param("uniform", enum=["uniform", "end"], title="Probe spacing",
                               description="uniform: probes equally spaced from the predecessor's submission "
                                           "to its end (the reference's); end: at its end minus 24 h .. 10 min "
                                           "(sample --probe-spacing)."),
        "node_sizes": Param([1, 8], type="array", items={"type": "integer", "minimum": 1}, title="Service job sizes (nodes)"),
        "shards": Param(4, type="integer", minimum=1, maximum=64, title="Shards per node size"),
        "models": Param(["xgboost", "random_forest", "xgboost_quantile", "linear_quantile", "transformer", "moe",
                         "transformer_policy", "moe_policy"],
                        type="array", title="Models",
                        items={"type": "string", "enum": ["xgboost", "random_forest", "xgboost_quantile",
                                                          "linear_quantile", "transformer", "moe",
                                                          "transformer_policy", "moe_policy"]}),
        "preset": Param("quick", enum=["quick", "paper"], title="Training preset"),
        "train_params": Param({}, type="object", title="Hyper-parameter overrides",
                              description='Per model, a list of "key=value" (train --param), '
                                          'e.g. {"transformer": ["epochs=10"]}.'),
        "device": Param("cpu", enum=DEVICES, title="Training device",
                        description="cuda runs the torch models on the gpu preset (pool gpu in kubernetes mode); "
                                    "offered where the deployment has GPU nodes (HOUSE_GPUS=true)."),
        "policy_eval": Param("sampled", enum=["sampled", "greedy"], title="Policy evaluation",
                             description="sampled: seeded sampling of the policy's actions, as it was trained; "
                                         "greedy: argmax."),
        "seed": Param(0, type="integer", minimum=0, title="Seed", description="Seeds the synthetic trace and training."),
    },
) as dag:

    @task(multiple_outputs=True)
    def plan(**context) -> dict:
        """This run's storage prefix, the missing sample days and every step's argv (no work)."""
        from airflow.sdk.exceptions import AirflowFailException
        from mirage_tasks.plan import plan_run
        from mirage_tasks.runlog import record_run
        from stepkit import StepError

        params = dict(context["params"])
        if context["dag_run"].run_type == "scheduled":
            params.update(SCHEDULED)
        try:
            p = plan_run(params, storage_prefix("mirage"), storage_prefix(context["dag"].dag_id),
                         context.get("logical_date"), workers=GRANTED, threads=GRANTED)
        except (ValueError, StepError) as exc:  # bad params or a missing trace: a retry cannot help
            raise AirflowFailException(str(exc)) from exc
        # which DAG run used this prefix (the results view lists runs by it)
        record_run(p["prefix"], dag_id=context["dag"].dag_id, run_id=context["run_id"],
                   run_type=context["dag_run"].run_type, logical_date=context.get("logical_date"),
                   params=params, defaults=context["dag"].params.dump())
        return p

    @task
    def argvs(p: dict, key: str) -> list:
        """One list of argvs to map a step over (Airflow maps over a task's whole return value)."""
        return p[key]

    @task
    def missing_days(p: dict) -> list:
        """The sample argvs of the days still missing, once the trace is ingested: a committed
        day counts only if it saw the same jobs as this trace (a grown trace keeps its days)."""
        from mirage_tasks.plan import checked_against, sample_argvs

        if not p["sample_jobs"]:
            return []
        have = checked_against(p["trace"], p["sample_jobs"][0]["argv"]["workload_days"])
        argvs_, missing = sample_argvs(p, have)
        print("days to sample per node size:", {n: len(d) for n, d in missing.items()}, flush=True)
        return argvs_

    # The plan and the per-step argv lists sit in one task group (one folded row in the grid):
    # Airflow maps over a task's whole return value, so each mapped step needs its own list.
    with TaskGroup("plan", tooltip="Fingerprint the trace, find missing sample days, build every argv"):
        run = plan.override(task_id="commands")()
        lists = {key: argvs.override(task_id=key)(run, key) for key in STEP_LISTS if key != "sample"}
        lists["sample"] = missing_days.override(task_id="sample")(run)
    trace = step("prepare_trace", argv=run["trace_argv"], preset="cpu-small", timeout=timedelta(minutes=30))
    trace >> lists["sample"]

    # Mapped steps with an empty list are skipped: sample when every day is committed, and
    # one of each cpu/gpu pair. Labels: map_index_template over each instance's argv.
    after_any = {"trigger_rule": TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS}
    mapped = {"map_index_template": LABEL}
    sample = step_partial("sample", preset="cpu-large", timeout=timedelta(hours=2), **mapped, **HEAVY).expand(
        argv=lists["sample"])
    merge = step_partial("merge", preset="cpu-small", timeout=timedelta(minutes=30),
                         trigger_rule=TriggerRule.NONE_FAILED, **mapped).expand(argv=lists["merge"])
    train = [step_partial("train_cpu", preset="cpu-large", timeout=timedelta(hours=6), **after_any, **mapped,
                          **HEAVY).expand(argv=lists["train_cpu"])]
    policy = [step_partial("policy_cpu", preset="cpu-large", timeout=timedelta(hours=6), **after_any, **mapped,
                           **HEAVY).expand(argv=lists["policy_cpu"])]
    if GPUS:  # only where the deployment has GPU nodes (HOUSE_GPUS)
        train.append(step_partial("train_gpu", preset="gpu", timeout=timedelta(hours=12), **after_any,
                                  **mapped).expand(argv=lists["train_gpu"]))
        policy.append(step_partial("policy_gpu", preset="gpu", timeout=timedelta(hours=12), **after_any,
                                   **mapped).expand(argv=lists["policy_gpu"]))
    validate = step_partial("validate", preset="cpu-large", timeout=timedelta(hours=3), **after_any, **mapped,
                            **HEAVY).expand(argv=lists["validate"])
    fidelity = step("fidelity", argv=run["fidelity"], preset="cpu-large", timeout=timedelta(hours=2))
    metrics = step("metrics", argv=run["metrics"], preset="cpu-small", timeout=timedelta(minutes=30))
    report = step("report", argv=run["report"], preset="cpu-small", timeout=timedelta(minutes=30))

    trace >> sample >> merge >> train
    for p in policy:
        train >> p
    policy >> validate >> metrics >> report
    trace >> fidelity >> report
