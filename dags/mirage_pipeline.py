"""Mirage pipeline: trace -> (sample -> merge -> train -> validate -> report, in later issues).

Every step is ``python -m mirage_tasks <step>`` declared with the house factory
(``plugins/house``), run as a local process or a pod depending on ``HOUSE_RUNNER``.
Data moves through storage only: each step writes under this run's prefix

    <HOUSE_STORAGE_ROOT>/mirage_pipeline/<logical date, e.g. 2026-11-29T120000Z>/<step>/

so a cleared or retried run reuses its own prefix and the steps skip finished work.

Params:
* ``trace``: URI or path of a real trace (Slurm sacct log, ``sacct --parsable2`` or SWF);
  empty = generate a synthetic trace from the packaged ls6 profile.
* ``window_from`` / ``window_to``: ISO 8601 time window. For a real trace it trims the
  trace (empty = the whole trace); for the synthetic trace it is the span to generate
  (empty = one week from 2024-01-01).
* ``trace_timezone``: IANA zone of a sacct log's local times (``America/Chicago`` for ls6).
* ``synth_profile``, ``seed``: the synthetic generator's profile and seed.
"""

from __future__ import annotations

from datetime import timedelta, timezone

from airflow.sdk import DAG, Param, task

from house import default_args, get_config, step

SYNTH_DEFAULT_FROM = "2024-01-01T00:00:00+00:00"
SYNTH_DEFAULT_TO = "2024-01-08T00:00:00+00:00"

with DAG(
    dag_id="mirage_pipeline",
    description="Mirage (SC'23): trace -> samples -> models -> validation report",
    doc_md=__doc__,
    schedule=None,
    max_active_runs=4,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "pipeline"],
    params={
        "trace": Param("", type="string", title="Trace URI",
                       description="Real trace (sacct log or SWF, local path, file:// or s3://). "
                                   "Empty: the embedded synthetic trace."),
        "window_from": Param(None, type=["null", "string"], title="Window start (ISO 8601)",
                             description="Start of the trace window, e.g. 2022-11-01T00:00:00+00:00."),
        "window_to": Param(None, type=["null", "string"], title="Window end (ISO 8601)",
                           description="End of the trace window (exclusive)."),
        "trace_timezone": Param(None, type=["null", "string"], title="Trace time zone",
                                description="IANA zone of a sacct log's local times "
                                            "(America/Chicago for Lonestar6); SWF logs carry their own."),
        "synth_profile": Param("ls6-a100", type="string", title="Synthetic profile",
                               description="Workload profile (packaged name or JSON URI) used when no "
                                           "trace is given."),
        "seed": Param(0, type="integer", minimum=0, title="Seed", description="Seed of the synthetic trace."),
    },
) as dag:

    @task(multiple_outputs=True)  # run["prefix"], run["trace"], run["trace_argv"]: one XCom each
    def plan_run(**context) -> dict:
        """This run's storage prefix and the argv of each step (no work, no I/O)."""
        params, logical_date = context["params"], context.get("logical_date")
        if logical_date:  # deterministic per logical date: a cleared/retried run reuses its prefix
            key = logical_date.astimezone(timezone.utc).strftime("%Y-%m-%dT%H%M%SZ")
        else:
            key = context["run_id"].replace(":", "").replace("+", "")
        prefix = f"{get_config().storage_root.rstrip('/')}/mirage_pipeline/{key}"
        trace_out = f"{prefix}/trace"
        window = [params.get("window_from"), params.get("window_to")]
        if params["trace"]:
            trace_argv = ["ingest", "--trace", params["trace"], "--out", trace_out]
            options = zip(("--from", "--to", "--timezone"), [*window, params.get("trace_timezone")])
            trace_argv += [x for flag, value in options if value for x in (flag, value)]
        else:
            trace_argv = ["synth", "--profile", params["synth_profile"],
                          "--from", window[0] or SYNTH_DEFAULT_FROM, "--to", window[1] or SYNTH_DEFAULT_TO,
                          "--seed", str(params["seed"]), "--out", trace_out]
        return {"prefix": prefix, "trace": trace_out, "trace_argv": trace_argv}

    run = plan_run()

    # 1. The trace, normalised to <prefix>/trace/trace.parquet (+ _SUCCESS.json).
    trace = step("prepare_trace", argv=run["trace_argv"], preset="cpu-small", timeout=timedelta(minutes=30))

    # Later issues extend the recipe here, each step reading run["prefix"] / run["trace"] and
    # writing under the same prefix: sample >> merge >> train >> validate >> report. A mapped
    # step maps over the *return value* of a small @task (Airflow cannot map over one key of
    # a multiple_outputs dict), and mapped argv items are not templated:
    #     shard_argvs = plan_shards(run["trace"])                       # -> [[...], [...], ...]
    #     samples = step_partial("sample", preset="cpu-large", timeout=...).expand(argv=shard_argvs)
    #     trace >> samples
