"""Faasm (ATC'20) benchmarks, daily: deploy, wait, upload, drive load, collect, **always tear down**.

A ``preflight`` first checks once that the target can run the selected experiments at all
(the local target: the built functions, redis-server); when it cannot, it fails naming what is
missing (``run `make functions` first``) and no group starts, instead of every group failing
at its deploy in turn. Then one task group per experiment and system, run one after another so
that nothing of one experiment bleeds into the next. Inside a group::

    prepare (setup) >> deploy >> wait_ready >> upload_data >> run >> collect, teardown (teardowns) >> verify_clean

``prepare`` is a cheap setup that cannot fail (it only checks the selection), so the
teardowns (``collect``, then ``teardown``) run whenever anything was attempted, even
when deploy or the run failed: partial results are kept (marked failed) and the
deployment is removed. ``verify_clean`` is a teardown as well: it runs whenever the group was set up, even when
the teardown failed or was marked failed by hand, and a ``verify_clean`` failure stops the
following experiments. A final ``summarize`` writes the
day's table (it fails when the day had any failure: a failed point, a group that failed before
its first point, an unreadable result; one quick retry covers a storage hiccup) and the trend report over ``trend_days`` days (its "Report" link opens it in the results
view), and ``check`` fails when a point regressed past a threshold (p99 latency, throughput, run time against
the trailing median of the previous days). The ``watcher`` always runs
(``all_done``) and fails the DAG run when any task of the run failed or was marked failed
(by hand too), or when a selected experiment's ``verify_clean`` did not succeed: a
teardown's success never hides a failure. A point recorded ``invalid`` (its measurement
cannot be trusted) makes ``run`` exit 1, so an invalid point fails the day the same way.
A run not finished ``HOUSE_DEADLINE_FAASM_BENCHMARKS`` (default 20 h) after it was queued misses
its deadline: the triggerer logs it, records it under ``_deadlines/faasm_benchmarks/`` in storage
and tells the site's notifier, if one is set (``house.deadlines``).

Every step is ``python -m faasm_tasks <step>`` through the house factory. Results:
``<HOUSE_STORAGE_ROOT>/faasm_benchmarks/<date>/<run id>/...`` (see faasm_tasks).

Params: ``target`` (``local``: processes on the worker, for laptops and CI; ``knative``:
the cluster; the default follows ``HOUSE_RUNNER``: ``knative`` on ``kubernetes``),
``experiments`` and ``systems`` to run (default: all), ``release`` (the Faasm images:
``0.1.3``, the experiments manual's, or ``0.6.7``), ``replicas`` (``per-point``: SGD and
matrix redeploy with N replicas for each ``N_WORKERS`` value, as the manual does;
``fixed``: the catalogue's counts) and ``tf_sweep`` (``default``: the manual's TF
throughput sweep; ``extended``: the longer one). How the run steps measure comes from the typed configuration
``faasm_tasks.forms.Measurement``: ``repeats`` per point (default 6, the fewest with a 95 %
interval of the median), ``time_budget_min`` (0: the experiment's budget, also the cap),
``seed`` of each run step's randomized interleaved order (empty: from the run id, so a retry
measures in the same order) and the A/A control (``aa_control``, ``aa_system``: that system's
groups measure it as two arms A and A'; a day whose A/A ratio interval excludes 1 is
untrustworthy in the summary and the check). See docs/faasm.md.

On the kubernetes runner every step pod runs under the ``faasm-benchmark`` ServiceAccount
(``deploy/rbac/faasm-benchmark.yaml``) and the steps share nothing but storage and the
cluster: ``deploy`` starts the per-node billing sampler DaemonSet (this package's image)
that writes to the results prefix, ``collect`` removes it and summarizes per host. The experiments and
their systems are those of the catalogue shipped in ``faasm_tasks/experiments`` (read as
YAML here, without importing the task package); parameters come from it too
(``FAASM_CATALOGUE_DIR`` adds your own to the steps), the repeat count from the form's
``repeats``. The run steps' timeouts are
the experiments' time budgets from the workload registry (``faasm_tasks/workloads.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import timedelta
from pathlib import Path

import yaml
from airflow.sdk import DAG, Param, TaskGroup, TriggerRule, task

from house import MACROS, cron_schedule, default_args, get_config, steps_for
from house.deadlines import deadline_alert
from stepkit.forms import class_params

_step, _ = steps_for("faasm_tasks")
CFG = get_config()
#: The ServiceAccount of deploy/rbac/faasm-benchmark.yaml: Faasm step pods run under it (the
#: knative target creates Knative Services, pods, a DaemonSet ... in the benchmark namespace).
SERVICE_ACCOUNT = "faasm-benchmark"
#: On Kubernetes the benchmark runs on the cluster: a local target would start benchmark processes
#: inside short-lived step pods.
DEFAULT_TARGET = "knative" if CFG.runner == "kubernetes" else "local"


def step(task_id: str, **kw):
    """The house factory with the Faasm steps' ServiceAccount (kubernetes runner only)."""
    return _step(task_id, pod_overrides={"service_account_name": SERVICE_ACCOUNT}, **kw)


def _package_dir() -> Path:
    """The installed ``faasm_tasks`` folder, located without running its code."""
    spec = importlib.util.find_spec("faasm_tasks")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("faasm_tasks is not installed (pip install -e . from the repository root)")
    return Path(next(iter(spec.submodule_search_locations)))


def _by_path(name: str):
    """``faasm_tasks/<name>.py`` (stdlib and stepkit only) loaded by path, not as part of the package."""
    path = _package_dir() / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_faasm_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _workload_registry():
    """``faasm_tasks/workloads.py``: the workload registry (the run steps' time budgets)."""
    return _by_path("workloads")


def catalogue() -> dict[str, dict]:
    """``{experiment: document}`` of the packaged catalogue, read as YAML (no task-package import)."""
    folder = _package_dir() / "experiments"
    out = {}
    for path in sorted(folder.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        out[doc["name"]] = doc
    if not out:
        raise RuntimeError(f"no experiments in {folder}")
    return out


CATALOGUE = catalogue()
EXPERIMENTS = list(CATALOGUE)
SYSTEMS = list(dict.fromkeys(s for doc in CATALOGUE.values() for s in doc["systems"]))
# Airflow timeout of each experiment's run step: its time budget from the workload registry
# (faasm_tasks/workloads.py: the kind's time_budget_h, or the experiment's own) plus the
# margin of run_timeout_s; the run step bounds its repeats by the same budget.
_REGISTRY = _workload_registry()
RUN_TIMEOUT = {name: timedelta(seconds=_REGISTRY.run_timeout_s(doc)) for name, doc in CATALOGUE.items()}
COMMON = [
    "--target",
    "{{ params.target }}",
    "--run-id",
    "{{ run_id }}",
    "--results",
    "{{ house_storage_prefix(dag.dag_id) }}",  # resolved at run time, as in mirage_pipeline
    "--date",
    "{{ ds }}",
    "--release",
    "{{ params.release }}",
]
if CFG.runner == "kubernetes":
    # the per-node billing sampler DaemonSet runs this package's image, with the storage Secret
    # (which the platform copies into the benchmark namespace, docs/deploy.md)
    COMMON += ["--billing-image", CFG.image_for("faasm_tasks"), "--billing-secret", CFG.storage_secret]
# the manual's releases (faasm_tasks/targets/knative.py RELEASES), its first entry the default
RELEASES = ["0.1.3", "0.6.7"]
# how the run steps measure (repeats, time budget, order seed, A/A control): the typed configuration
_FORMS = _by_path("forms")
#: the trigger form: faasm_tasks.forms' typed configurations, with the choices the catalogue knows
FORM = {
    **class_params(
        _FORMS.Deployment,
        defaults={"target": DEFAULT_TARGET, "release": RELEASES[0], "experiments": EXPERIMENTS, "systems": SYSTEMS},
        choices={"release": RELEASES, "experiments": EXPERIMENTS, "systems": SYSTEMS},
    ),
    **class_params(_FORMS.Measurement, choices={"aa_system": SYSTEMS}),
    **class_params(_FORMS.Check),
}


def measure_argv(system: str) -> list[str]:
    """The run step's measurement flags from the form (faasm_tasks.forms.Measurement): the
    group of the A/A system measures it as two arms."""
    return [
        "--repeats",
        "{{ params.repeats }}",
        "--time-budget-min",
        "{{ params.time_budget_min }}",
        "--seed={{ params.seed if params.seed is not none else '' }}",
        "{{ '--aa-control' if params.aa_control and params.aa_system == '" + system + "' else '--no-aa-control' }}",
    ]


with DAG(
    dag_id="faasm_benchmarks",
    description="Faasm ATC'20 experiments on Knative (or locally): wasm vs native, with mandatory teardown",
    doc_md=__doc__,
    schedule=cron_schedule("@daily"),  # first run: the next midnight (UTC) after unpausing
    catchup=False,
    max_active_runs=1,  # one benchmark on the cluster at a time
    # the day's run still going HOUSE_DEADLINE_FAASM_BENCHMARKS after it was queued is reported (house.deadlines)
    deadline=deadline_alert("faasm_benchmarks"),
    allowed_run_types=["scheduled", "manual"],  # a backfill cannot measure the past
    default_args=default_args(owner="faasm"),
    tags=["faasm", "benchmark"],
    user_defined_macros=dict(MACROS),
    params={name: Param(**kw) for name, kw in FORM.items()},
) as dag:
    # once, before any group: a target that cannot run anything fails here (exit 2: not retried)
    preflight = step(
        "preflight",
        argv=[
            "preflight",
            *COMMON,
            "--experiments",
            "{{ params.experiments | join(',') }}",
            "--systems",
            "{{ params.systems | join(',') }}",
        ],
        timeout=timedelta(minutes=5),
    )
    previous = None
    for experiment in EXPERIMENTS:
        for system in CATALOGUE[experiment]["systems"]:
            group = f"{experiment}__{system}"
            sel = ["--experiment", experiment, "--system", system]
            shape = ["--replicas", "{{ params.replicas }}"] + (
                ["--sweep-variant", "{{ params.tf_sweep }}"] if CATALOGUE[experiment].get("sweep_variants") else []
            )
            with TaskGroup(group_id=group):

                @task(trigger_rule=TriggerRule.NONE_FAILED)
                def prepare(exp: str = experiment, sys_: str = system, **context) -> None:
                    """Setup: skip the group unless selected (nothing deployed, so no teardown)."""
                    from airflow.sdk.exceptions import AirflowSkipException

                    params = context["params"]
                    if exp not in params["experiments"] or sys_ not in params["systems"]:
                        raise AirflowSkipException(f"{exp}/{sys_} not selected")

                setup = prepare().as_setup()
                # a retry adopts the Knative Services an earlier try announced (faasm_tasks deploy)
                deploy = step(
                    "deploy",
                    argv=["deploy", *COMMON, *sel, *shape],
                    timeout=timedelta(minutes=30),
                    adopt_flag="--adopt-services",
                )
                wait = step(
                    "wait_ready", argv=["wait-ready", *COMMON, "--timeout", "900"], timeout=timedelta(minutes=20)
                )
                upload = step("upload_data", argv=["upload-data", *COMMON, *sel], timeout=timedelta(hours=1))
                run = step(
                    "run",
                    preset="cpu-large",
                    argv=["run", *COMMON, *sel, *shape, *measure_argv(system), "--keep-billing"],
                    timeout=RUN_TIMEOUT[experiment],
                )
                # collect is a teardown too: it runs after a failed run, so partial results are kept.
                collect = step("collect", argv=["collect", *COMMON], timeout=timedelta(minutes=20)).as_teardown(
                    setups=setup
                )
                # --full: the Redis and upload pods and Services go too (the next group deploys its own),
                # so nothing of the benchmark is left in the namespace once the day is done
                teardown = step(
                    "teardown", argv=["teardown", *COMMON, "--full"], timeout=timedelta(minutes=30)
                ).as_teardown(setups=setup)
                # a teardown too: it runs whenever the group was set up, even when the teardown
                # failed or was marked failed by hand (then it finds what was left and fails)
                verify = step(
                    "verify_clean", argv=["verify-clean", *COMMON, "--full"], timeout=timedelta(minutes=10)
                ).as_teardown(setups=setup)
                setup >> deploy >> wait >> upload >> run >> collect >> teardown >> verify
                # every group's setup (NONE_FAILED): a failed preflight skips each group, not only the first
                preflight >> setup
            if previous is not None:
                previous >> setup
            previous = verify

    summarize = step(
        "summarize",
        argv=["summarize", *COMMON, "--days", "{{ params.trend_days }}"],
        timeout=timedelta(minutes=10),
        trigger_rule=TriggerRule.ALL_DONE,
        retries=1,
        retry_delay=timedelta(seconds=30),
    )
    # The regression check: after the teardowns and summarize; a breach (exit 1) fails the run (one quick retry
    # covers a storage hiccup; a breach fails again).
    check = step(
        "check",
        argv=[
            "check",
            *COMMON,
            "--days",
            "{{ params.trend_days }}",
            "--p99-increase-pct",
            "{{ params.p99_increase_pct }}",
            "--throughput-drop-pct",
            "{{ params.throughput_drop_pct }}",
            "--run-time-increase-pct",
            "{{ params.run_time_increase_pct }}",
        ],
        timeout=timedelta(minutes=10),
        trigger_rule=TriggerRule.ALL_DONE,
        retries=1,
        retry_delay=timedelta(seconds=30),
    )
    previous >> summarize >> check

    @task(trigger_rule=TriggerRule.ALL_DONE, retries=0)
    def watcher(**context) -> None:
        """Fails the run when any task failed or was marked failed, or a selected group's
        verify_clean did not succeed (it reads the states; trigger rules alone can be fooled)."""
        from airflow.sdk.exceptions import AirflowException

        ti, params = context["ti"], context["params"]
        states = ti.get_task_states(dag_id=ti.dag_id, run_ids=[ti.run_id]).get(ti.run_id, {})
        bad = sorted(f"{t} ({s})" for t, s in states.items() if t != ti.task_id and s in ("failed", "upstream_failed"))
        unverified = sorted(
            f"{e}__{s}.verify_clean ({states.get(f'{e}__{s}.verify_clean')})"
            for e in params["experiments"]
            for s in params["systems"]
            if states.get(f"{e}__{s}.verify_clean") != "success"
        )
        if bad or unverified:
            raise AirflowException(
                "the day's benchmark is not complete: "
                + "; ".join(
                    ([f"failed: {', '.join(bad)}"] if bad else [])
                    + ([f"not verified clean: {', '.join(unverified)}"] if unverified else [])
                )
            )

    # Setups are left out: whatever follows a setup directly must use ALL_SUCCESS.
    [t for t in dag.tasks if not t.is_setup] >> watcher()
