"""Faasm (ATC'20) benchmarks, daily: deploy, wait, upload, drive load, collect, **always tear down**.

One task group per experiment and system, run one after another so that nothing of one
experiment bleeds into the next. Inside a group::

    prepare (setup) >> deploy >> wait_ready >> upload_data >> run >> collect, teardown (teardowns) >> verify_clean

``prepare`` is a cheap setup that cannot fail (it only checks the selection), so the
teardowns (``collect``, then ``teardown``) run whenever anything was attempted, even
when deploy or the run failed: partial results are kept (marked failed) and the
deployment is removed. ``verify_clean`` is a teardown as well: it runs whenever the group was set up, even when
the teardown failed or was marked failed by hand, and a ``verify_clean`` failure stops the
following experiments. A final ``summarize`` writes the day's table. The ``watcher`` always runs
(``all_done``) and fails the DAG run when any task of the run failed or was marked failed
(by hand too), or when a selected experiment's ``verify_clean`` did not succeed: a
teardown's success never hides a failure. A point recorded ``invalid`` (its measurement
cannot be trusted) makes ``run`` exit 1, so an invalid point fails the day the same way.

Every step is ``python -m faasm_tasks <step>`` through the house factory. Results:
``<HOUSE_STORAGE_ROOT>/faasm_benchmarks/<date>/<run id>/...`` (see faasm_tasks).

Params: ``target`` (``local``: processes on the worker, for laptops and CI; ``knative``:
the cluster), ``experiments`` and ``systems`` to run (default: all). Repeat counts and
parameters come from the experiment catalogue (``FAASM_CATALOGUE_DIR`` adds your own).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, TaskGroup, TriggerRule, task

from house import default_args, get_config, step

# The catalogue shipped in faasm_tasks/experiments (the DAG never imports the task package).
EXPERIMENTS = ["sgd_reuters_svm", "matrix_multiplication", "tf_inference_latency", "tf_inference_throughput"]
SYSTEMS = ["wasm", "native"]
# Timeouts per experiment run (the catalogue's durations plus margin).
RUN_TIMEOUT = {
    "sgd_reuters_svm": timedelta(hours=2),
    "matrix_multiplication": timedelta(hours=2),
    "tf_inference_latency": timedelta(hours=3),
    "tf_inference_throughput": timedelta(hours=6),
}
COMMON = [
    "--target", "{{ params.target }}",
    "--run-id", "{{ run_id }}",
    "--results", f"{get_config().storage_root.rstrip('/')}/faasm_benchmarks",
    "--date", "{{ ds }}",
]

with DAG(
    dag_id="faasm_benchmarks",
    description="Faasm ATC'20 experiments on Knative (or locally): wasm vs native, with mandatory teardown",
    doc_md=__doc__,
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,  # one benchmark on the cluster at a time
    allowed_run_types=["scheduled", "manual"],  # a backfill cannot measure the past
    default_args=default_args(owner="faasm"),
    tags=["faasm", "benchmark"],
    params={
        "target": Param("local", enum=["local", "knative"], title="Target",
                        description="local: worker processes on 127.0.0.1 (pipeline check, not Faasm); "
                                    "knative: the cluster"),
        "experiments": Param(EXPERIMENTS, type="array", items={"type": "string", "enum": EXPERIMENTS},
                             title="Experiments", description="Which catalogue experiments to run."),
        "systems": Param(SYSTEMS, type="array", items={"type": "string", "enum": SYSTEMS},
                         title="Systems", description="wasm (Faasm) and/or native containers."),
    },
) as dag:
    previous = None
    for experiment in EXPERIMENTS:
        for system in SYSTEMS:
            group = f"{experiment}__{system}"
            sel = ["--experiment", experiment, "--system", system]
            with TaskGroup(group_id=group):

                @task(trigger_rule=TriggerRule.NONE_FAILED)
                def prepare(exp: str = experiment, sys_: str = system, **context) -> None:
                    """Setup: skip the group unless selected (nothing deployed, so no teardown)."""
                    from airflow.sdk.exceptions import AirflowSkipException

                    params = context["params"]
                    if exp not in params["experiments"] or sys_ not in params["systems"]:
                        raise AirflowSkipException(f"{exp}/{sys_} not selected")

                setup = prepare().as_setup()
                deploy = step("deploy", package="faasm_tasks", argv=["deploy", *COMMON, *sel],
                              timeout=timedelta(minutes=30))
                wait = step("wait_ready", package="faasm_tasks",
                            argv=["wait-ready", *COMMON, "--timeout", "900"], timeout=timedelta(minutes=20))
                upload = step("upload_data", package="faasm_tasks", argv=["upload-data", *COMMON, *sel],
                              timeout=timedelta(hours=1))
                run = step("run", package="faasm_tasks", preset="cpu-large",
                           argv=["run", *COMMON, *sel, "--keep-billing"], timeout=RUN_TIMEOUT[experiment])
                # collect is a teardown too: it runs after a failed run, so partial results are kept.
                collect = step("collect", package="faasm_tasks", argv=["collect", *COMMON],
                               timeout=timedelta(minutes=20)).as_teardown(setups=setup)
                teardown = step("teardown", package="faasm_tasks", argv=["teardown", *COMMON],
                                timeout=timedelta(minutes=30)).as_teardown(setups=setup)
                # a teardown too: it runs whenever the group was set up, even when the teardown
                # failed or was marked failed by hand (then it finds what was left and fails)
                verify = step("verify_clean", package="faasm_tasks", argv=["verify-clean", *COMMON],
                              timeout=timedelta(minutes=10)).as_teardown(setups=setup)
                setup >> deploy >> wait >> upload >> run >> collect >> teardown >> verify
            if previous is not None:
                previous >> setup
            previous = verify

    summarize = step("summarize", package="faasm_tasks", argv=["summarize", *COMMON],
                     timeout=timedelta(minutes=10), trigger_rule=TriggerRule.ALL_DONE)
    previous >> summarize

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
    def watcher(**context) -> None:
        """Fails the run when any task failed or was marked failed, or a selected group's
        verify_clean did not succeed (it reads the states; trigger rules alone can be fooled)."""
        from airflow.sdk.exceptions import AirflowException

        ti, params = context["ti"], context["params"]
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
        bad = sorted(f"{t} ({s})" for t, s in states.items()
                     if t != ti.task_id and s in ("failed", "upstream_failed"))
        unverified = sorted(f"{e}__{s}.verify_clean ({states.get(f'{e}__{s}.verify_clean')})"
                            for e in params["experiments"] for s in params["systems"]
                            if states.get(f"{e}__{s}.verify_clean") != "success")
        if bad or unverified:
            raise AirflowException("the day's benchmark is not complete: "
                                   + "; ".join(([f"failed: {', '.join(bad)}"] if bad else [])
                                               + ([f"not verified clean: {', '.join(unverified)}"]
                                                  if unverified else [])))

    # Setups are left out: whatever follows a setup directly must use ALL_SUCCESS.
    [t for t in dag.tasks if not t.is_setup] >> watcher()
