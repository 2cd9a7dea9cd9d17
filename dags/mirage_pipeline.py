"""Mirage pipeline: trace -> samples -> dataset -> models -> online validation -> report.

Every step is ``python -m mirage_tasks <step>`` declared with the house factory
(``plugins/house``), run as a local process or a pod depending on ``HOUSE_RUNNER``.
Data moves through storage only: each step writes under this run's prefix

    <HOUSE_STORAGE_ROOT>/mirage_pipeline/<logical date, e.g. 2023-04-01T000000Z>/<step>/...

so a cleared or retried run reuses its own prefix and the steps skip finished work.

The recipe: ``plan`` computes every command line (``mirage_tasks.plan``); the trace is
ingested (or generated); ``sample`` runs mapped over node sizes x shards; ``merge`` builds
one chronological dataset per node size; ``train`` runs mapped over models x node sizes
(torch models on the ``gpu`` preset when ``device`` is ``cuda``), the policies after their
base models; ``validate`` runs mapped over models, the reactive and avg baselines, node
sizes and shards; ``metrics`` and ``report`` close the run; ``fidelity`` (real vs simulated waits over the validation
window) feeds the report.

Windows: validation defaults to the month before the logical date, training to the
``train_count`` samples just before it (with a ``workload_days`` gap), so a monthly
backfill (``airflow backfill create --dag-id mirage_pipeline --from-date 2023-02-01
--to-date 2023-04-01``) validates each month on models trained on the weeks before it.
Give ``train_start``/``val_start`` to pin them (e.g. the Mirage seed: train from
2022-11-01, 684 samples; validate from 2023-03-01, 156 samples).

Trace: ``trace`` is a real trace URI (sacct log, ``sacct --parsable2`` or SWF), trimmed to
``window_from``/``window_to`` if given; empty = a synthetic trace from ``synth_profile``
covering the windows.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.sdk import DAG, Param, TriggerRule, task

from house import default_args, steps_for, storage_prefix

step, step_partial = steps_for("mirage_tasks")

with DAG(
    dag_id="mirage_pipeline",
    description="Mirage (SC'23): trace -> samples -> models -> online validation -> report",
    doc_md=__doc__,
    schedule="@monthly",  # one validation month per run: backfills walk a trace month by month
    start_date=datetime(2022, 12, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=2,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "pipeline", "ml"],
    params={
        "trace": Param("", type="string", title="Trace URI",
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
        "device": Param("cpu", enum=["cpu", "cuda"], title="Training device",
                        description="cuda runs the torch models on the gpu preset (pool gpu in kubernetes mode)."),
        "policy_eval": Param("sampled", enum=["sampled", "greedy"], title="Policy evaluation",
                             description="sampled: seeded sampling of the policy's actions, as it was trained; "
                                         "greedy: argmax."),
        "seed": Param(0, type="integer", minimum=0, title="Seed", description="Seeds the synthetic trace and training."),
    },
) as dag:

    @task(multiple_outputs=True)
    def plan(**context) -> dict:
        """This run's storage prefix and every step's argv (no work, no I/O)."""
        from mirage_tasks.plan import plan as make_plan

        logical_date = context.get("logical_date")
        if logical_date:  # deterministic per logical date: a cleared/retried run reuses its prefix
            key = logical_date.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
        else:
            key = context["run_id"].replace(":", "").replace("+", "")
        prefix = storage_prefix(context["dag"].dag_id, key)
        return make_plan(dict(context["params"]), prefix, logical_date)

    @task
    def argvs(p: dict, key: str) -> list:
        """One list of argvs to map a step over (Airflow maps over a task's whole return value)."""
        return p[key]

    run = plan()
    trace = step("prepare_trace", argv=run["trace_argv"], preset="cpu-small", timeout=timedelta(minutes=30))

    sample = step_partial("sample", preset="cpu-large", timeout=timedelta(hours=2)).expand(
        argv=argvs.override(task_id="sample_argvs")(run, "sample"))
    merge = step_partial("merge", preset="cpu-small", timeout=timedelta(minutes=30)).expand(
        argv=argvs.override(task_id="merge_argvs")(run, "merge"))

    # Mapped steps with an empty list are skipped: only one of each cpu/gpu pair runs.
    after_any = {"trigger_rule": TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS}
    train_cpu = step_partial("train_cpu", preset="cpu-large", timeout=timedelta(hours=6), **after_any).expand(
        argv=argvs.override(task_id="train_cpu_argvs")(run, "train_cpu"))
    train_gpu = step_partial("train_gpu", preset="gpu", timeout=timedelta(hours=12), **after_any).expand(
        argv=argvs.override(task_id="train_gpu_argvs")(run, "train_gpu"))
    policy_cpu = step_partial("policy_cpu", preset="cpu-large", timeout=timedelta(hours=6), **after_any).expand(
        argv=argvs.override(task_id="policy_cpu_argvs")(run, "policy_cpu"))
    policy_gpu = step_partial("policy_gpu", preset="gpu", timeout=timedelta(hours=12), **after_any).expand(
        argv=argvs.override(task_id="policy_gpu_argvs")(run, "policy_gpu"))
    validate = step_partial("validate", preset="cpu-large", timeout=timedelta(hours=3), **after_any).expand(
        argv=argvs.override(task_id="validate_argvs")(run, "validate"))
    fidelity = step("fidelity", argv=run["fidelity"], preset="cpu-large", timeout=timedelta(hours=2))
    metrics = step("metrics", argv=run["metrics"], preset="cpu-small", timeout=timedelta(minutes=30))
    report = step("report", argv=run["report"], preset="cpu-small", timeout=timedelta(minutes=30))

    trace >> sample >> merge >> [train_cpu, train_gpu] >> policy_cpu
    [train_cpu, train_gpu] >> policy_gpu
    [policy_cpu, policy_gpu] >> validate >> metrics >> report
    trace >> fidelity >> report
