"""Every DAG file in ``dags/`` parses cleanly and follows the house rules."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import DAGS

pytestmark = pytest.mark.timeout(120)

DAG_FILES = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
ALLOWED_TAGS = {"mirage", "faasm", "pipeline", "benchmark", "ml", "report"}
MIN_RETRIES = 1


@pytest.fixture(scope="module", params=["local", "kubernetes"])
def dagbags(request):
    """``{file: (DagBag, seconds)}``, each file parsed on its own, in both runner modes."""
    from airflow.dag_processing.dagbag import DagBag

    mp = pytest.MonkeyPatch()
    mp.setenv("HOUSE_RUNNER", request.param)
    if request.param == "kubernetes":
        mp.setenv("HOUSE_STORAGE_ROOT", "s3://house-test/storage")
    bags = {}
    try:
        for path in DAG_FILES:
            start = time.perf_counter()
            bag = DagBag(dag_folder=str(path))
            bags[path] = (bag, time.perf_counter() - start)
    finally:
        mp.undo()
    return request.param, bags


def test_dag_files_exist():
    assert DAG_FILES, f"no DAG files in {DAGS}"


def test_import_without_errors_or_warnings(dagbags):
    mode, bags = dagbags
    for path, (bag, seconds) in bags.items():
        print(f"parse time [{mode}] {path.name}: {seconds:.3f} s, {len(bag.dags)} DAG(s)")
        assert not bag.import_errors, f"{path.name}: {bag.import_errors}"
        assert not any(bag.captured_warnings.values()), f"{path.name}: {bag.captured_warnings}"
        assert bag.dags, f"{path.name} defines no DAG"


def test_old_import_paths_fail_the_tests():
    """The DeprecatedImportWarning filter (tests/conftest.py) is active."""
    from airflow.utils.deprecation_tools import DeprecatedImportWarning

    with pytest.raises(DeprecatedImportWarning):
        from airflow.decorators import task  # noqa: F401


def _dags(bags):
    return [(path, dag) for path, (bag, _) in bags.items() for dag in bag.dags.values()]


def test_dag_rules(dagbags):
    _, bags = dagbags
    for path, dag in _dags(bags):
        where = f"{path.name}:{dag.dag_id}"
        assert dag.dag_id == Path(path).stem or dag.dag_id.startswith(Path(path).stem), where
        assert dag.tags, f"{where}: no tags"
        assert set(dag.tags) <= ALLOWED_TAGS, f"{where}: tags {set(dag.tags) - ALLOWED_TAGS} not in {ALLOWED_TAGS}"
        assert dag.doc_md, f"{where}: no doc_md"
        dag.check_cycle()  # raises on a cycle
        dag.validate()


def test_task_rules(dagbags):
    _, bags = dagbags
    for path, dag in _dags(bags):
        for task in dag.tasks:
            where = f"{path.name}:{dag.dag_id}.{task.task_id}"
            assert task.owner and task.owner != "airflow", f"{where}: owner not set"
            watcher = task.task_id == "watcher"  # fails the run on purpose from the task states: never retried
            assert watcher or task.retries >= MIN_RETRIES, f"{where}: retries={task.retries}"
            assert task.retry_delay, f"{where}: retry_delay not set"
            timeout = task.execution_timeout
            assert isinstance(timeout, timedelta) and timeout > timedelta(0), f"{where}: no execution_timeout"


def test_steps_come_from_the_house_factory(dagbags):
    """Task-package commands run only through the house operators (never ad-hoc Bash/KPO)."""
    from house.local import LocalStepOperator

    mode, bags = dagbags
    house_types = (LocalStepOperator,)
    if mode == "kubernetes":
        from house.pod import HousePodOperator

        house_types = (LocalStepOperator, HousePodOperator)
    # DAGs that only start other DAGs' runs (no task-package work of their own); mirage_monthly
    # has its gate step after the run it starts
    triggers_only: set[str] = set()
    for _, dag in _dags(bags):
        steps = [
            t
            for t in dag.tasks
            # house.approvals' HouseApproval asks a person and runs no task-package command
            if t.task_type
            not in ("_PythonDecoratedOperator", "EmptyOperator", "TriggerDagRunOperator", "HouseApproval")
        ]
        for t in steps:
            operator_class = getattr(t, "operator_class", type(t))
            assert issubclass(operator_class, house_types), f"{dag.dag_id}.{t.task_id}: {operator_class}"
        if dag.dag_id in triggers_only:
            assert not steps and any(t.task_type == "TriggerDagRunOperator" for t in dag.tasks), dag.dag_id
            continue
        runner_cls = house_types[-1]
        assert any(issubclass(getattr(t, "operator_class", type(t)), runner_cls) for t in steps), dag.dag_id


def test_plugin_loader_skips_the_house_package(tmp_path):
    """Airflow's plugin loader honours plugins/.airflowignore: no top-level 'config'/'steps' modules."""
    import os
    import subprocess
    import sys

    from conftest import PLUGINS

    probe = (
        "import sys\n"
        "from airflow import plugins_manager as pm\n"
        "plugins, errors = pm._get_plugins()\n"
        "print(sorted(m for m in ('config', 'steps', 'local', 'pod', '__init__') if m in sys.modules), errors)\n"
    )
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS)}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip().splitlines()[-1] == "[] {}", out.stdout + out.stderr


def test_faasm_dag_follows_the_catalogue():
    """Experiments, systems and run timeouts of faasm_benchmarks match the experiment catalogue."""
    import importlib.util

    from faasm_tasks.catalogue import load_catalogue

    spec = importlib.util.spec_from_file_location("faasm_benchmarks_under_test", DAGS / "faasm_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    catalogue = {
        name: doc for name, doc in load_catalogue().items() if Path(doc["_source"]).parent.name == "experiments"
    }
    assert catalogue, "the packaged catalogue is empty"
    assert set(module.EXPERIMENTS) == set(catalogue)
    assert set(module.RUN_TIMEOUT) == set(catalogue), "RUN_TIMEOUT must name exactly the catalogue experiments"
    groups = {t.task_group.group_id for t in module.dag.tasks if t.task_group and t.task_group.group_id}
    assert groups == {f"{name}__{system}" for name, doc in catalogue.items() for system in doc["systems"]}
    run_timeouts = {
        t.task_id.split(".")[0]: t.execution_timeout for t in module.dag.tasks if t.task_id.endswith(".run")
    }
    for group, timeout in run_timeouts.items():
        assert timeout == module.RUN_TIMEOUT[group.split("__")[0]], group
    from faasm_tasks import workloads

    for name, doc in catalogue.items():  # the registry's time budget, not a second table
        assert module.RUN_TIMEOUT[name].total_seconds() == workloads.run_timeout_s(doc), name


def test_faasm_dag_refuses_an_empty_selection():
    import importlib.util

    from airflow.sdk.exceptions import ParamValidationError

    spec = importlib.util.spec_from_file_location("faasm_benchmarks_params", DAGS / "faasm_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("experiments", "systems"):
        param = module.dag.params.get_param(name)
        with pytest.raises(ParamValidationError, match=r"\[\] should be non-empty"):
            param.resolve([])
        assert param.resolve(param.value) == param.value  # the default, every entry, is accepted


def test_faasm_dag_does_not_import_the_task_package():
    import subprocess
    import sys

    probe = (
        "import runpy, sys\n"
        f"runpy.run_path({str(DAGS / 'faasm_benchmarks.py')!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('faasm_tasks', 'mirage_tasks')))\n"
    )
    import os

    from conftest import PLUGINS

    env = {**os.environ, "PYTHONPATH": str(PLUGINS), "HOUSE_NO_VARIABLES": "1"}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_params_that_may_stay_empty_do_not_block_the_trigger_form(dagbags):
    """A param documented as "empty: <a default>" must accept the form's empty value (null): a
    ``Param("", type="string")`` is a required field in the trigger form, whose Trigger button then
    waits for a value (mirage_service's partition and account did)."""
    _, bags = dagbags
    for path, dag in _dags(bags):
        for name in dag.params.keys():
            p = dag.params.get_param(name)
            desc = str(p.schema.get("description") or "")
            if "(empty:" not in desc and "empty: the" not in desc:
                continue
            types = p.schema.get("type")
            types = types if isinstance(types, list) else [types]
            assert "null" in types, f"{path.name}:{dag.dag_id} param {name}: {desc!r} but type {types}"
            p.resolve(None, suppress_exception=False)  # the form's empty value validates


def test_backfill_commands_in_the_docs_unpause_first(dagbags):
    """A paused DAG's backfill runs stay queued and never start (Airflow 3): every backfill command
    a DAG's in-UI docs give comes after the unpause command."""
    _, bags = dagbags
    for path, dag in _dags(bags):
        doc = dag.doc_md or ""
        at = doc.find("airflow backfill create")
        if at < 0:
            continue
        assert f"airflow dags unpause {dag.dag_id}" in doc[:at], f"{path.name}:{dag.dag_id}: backfill without unpause"
