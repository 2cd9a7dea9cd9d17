"""Two trips a new user met in the real UI, each seen the way that user sees it: a real Airflow
(api-server and scheduler with the LocalExecutor, the steps as local processes), the DAG
triggered from its form in a headless Chromium, the run's failure read in the failed task's log
in Airflow's own UI.

* ``faasm_benchmarks`` on the local target before ``make functions`` (the deployment's
  ``FAASM_FUNCTIONS_BUILD_DIR`` an empty folder): the run fails at its first task,
  ``preflight``, whose log names the missing build and the command that makes it; no task of
  any experiment group runs, so there is nothing to tear down (before, every selected group
  deployed in turn and failed deep inside, minutes each, and the cause was read from a deploy's
  log).
* ``mirage_service`` triggered untouched on a machine where ``make slurm`` never ran (the
  deployment's ``HOUSE_CODE_ROOT`` a checkout without ``var/slurm/slurm.conf``): its first task,
  ``check_conf``, fails saying that the DAG needs a Slurm and that ``make slurm`` starts one
  (before, ``keep_service`` ran and said only that no model was given).

tests/dags/test_faasm_benchmarks_e2e.py and tests/dags/test_mirage_service_form.py check the
same with ``dag.test()``; this file checks what reaches the user through the scheduler, the
task log and the UI. Screenshots go to ``$UI_SCREENSHOT_DIR`` (default: the system temp dir).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
from airflow_ui import api_get, api_server, api_token, browser_dirs, chromium, login, open_trigger_dialog
from proctree import wait_for

#: a browser element React replaced meanwhile, or not there yet: looked up again
try:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    NOT_YET = (StaleElementReferenceException, NoSuchElementException)
except ImportError:  # selenium absent: the module skips below
    NOT_YET = ()

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: states of a task instance that never started
NOT_RUN = {None, "upstream_failed", "skipped", "removed"}
FINISHED = {"success", "failed"}


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    home, storage = browser_dirs(tmp_path_factory)
    build = tmp_path_factory.mktemp("faasm-build-empty")  # a checkout before `make functions`
    checkout = tmp_path_factory.mktemp("checkout-without-slurm")  # `make slurm` never ran here
    deployment = {
        "FAASM_FUNCTIONS_BUILD_DIR": str(build),
        "FAASM_TASKS_STATE_DIR": str(tmp_path_factory.mktemp("faasm-state")),
        "HOUSE_CODE_ROOT": str(checkout),
    }
    with (
        api_server(home, storage, dags=True, scheduler=True, env=deployment) as server,
        chromium(tmp_path_factory.mktemp("profile")) as driver,
    ):
        login(driver, server["base"], "/")
        server["driver"] = driver
        server["token"] = api_token(server["base"])
        yield server


def _scheduler_log_tail(ui) -> str:
    return (Path(ui["home"]) / "scheduler.log").read_text()[-3000:]


def _shot(driver, name: str) -> Path:
    out = Path(os.environ.get("UI_SCREENSHOT_DIR", tempfile.gettempdir())) / f"ui-trips-{name}.png"
    driver.save_screenshot(str(out))
    return out


def _trigger_untouched(ui, dag_id: str) -> dict:
    """Open ``dag_id``'s trigger form, press Trigger without changing anything; the run it made."""
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    dialog = open_trigger_dialog(driver, base, dag_id)
    button = next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Trigger")
    wait_for(lambda: button.is_enabled(), "Trigger enabled", poll_s=1, retry_on=NOT_YET)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()  # "Unpause on trigger" is ticked by default: the scheduler takes the run
    runs = wait_for(
        lambda: _get(ui, f"/api/v2/dags/{dag_id}/dagRuns")["dag_runs"], "the triggered run", poll_s=1, retry_on=NOT_YET
    )
    assert [r["run_type"] for r in runs] == ["manual"], runs
    return runs[0]


def _get(ui, path: str) -> dict:
    return api_get(ui["base"], ui["token"], path)


def _states(ui, dag_id: str, run_id: str) -> dict[str, str | None]:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances?limit=1000"
    return {t["task_id"]: t["state"] for t in _get(ui, path)["task_instances"]}


def _first_failure(ui, dag_id: str, run_id: str, timeout: float) -> tuple[str, dict]:
    """Wait for the run's first failed task (or one failed and waiting for its retry); its id and
    the run's task states at that moment."""

    def failed():
        states = _states(ui, dag_id, run_id)
        bad = [t for t, s in states.items() if s in ("failed", "up_for_retry")]
        return (bad, states) if bad else None

    bad, states = wait_for(
        failed,
        f"a failed task in {dag_id}'s run",
        deadline_s=timeout,
        poll_s=1,
        retry_on=NOT_YET,
        explain=lambda: _scheduler_log_tail(ui),
    )
    assert len(bad) == 1, states
    return bad[0], states


def _run_finished(ui, dag_id: str, run_id: str, timeout: float) -> str:
    path = f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}"
    return wait_for(
        lambda: _get(ui, path)["state"] in FINISHED and _get(ui, path)["state"],
        f"{dag_id}'s run finished",
        deadline_s=timeout,
        poll_s=1,
        retry_on=NOT_YET,
        explain=lambda: _scheduler_log_tail(ui),
    )


def _log_in_ui(ui, dag_id: str, run_id: str, task_id: str, name: str) -> str:
    """Open the failed task instance's page in the UI (its Logs tab comes first) and wait for its
    log to show the failure; the page's text, screenshot ``name``."""
    from selenium.webdriver.common.by import By

    driver = ui["driver"]
    driver.get(f"{ui['base']}/dags/{dag_id}/runs/{quote(run_id, safe='')}/tasks/{task_id}")
    try:
        return wait_for(
            lambda: (t := driver.find_element(By.TAG_NAME, "body").text) and "Task failed with exception" in t and t,
            f"{task_id}'s log in the UI",
            deadline_s=90,
            poll_s=1,
            retry_on=NOT_YET,
        )
    finally:
        _shot(driver, name)


def test_faasm_local_without_built_functions_fails_at_preflight_saying_make_functions(ui):
    dag_id = "faasm_benchmarks"
    run = _trigger_untouched(ui, dag_id)
    assert run["conf"]["target"] == "local", run["conf"]  # the form's default under HOUSE_RUNNER=local
    run_id = run["dag_run_id"]
    # the run's first failure is its first task, before any group deployed anything (before the
    # preflight, the first failure was the first selected group's deploy, and the next group followed)
    first, states = _first_failure(ui, dag_id, run_id, timeout=240)
    text = _log_in_ui(ui, dag_id, run_id, first, "faasm-first-failure-log")
    ran = {t: s for t, s in states.items() if "." in t and s not in NOT_RUN}
    assert first == "preflight" and not ran, (first, ran, text[-2500:])
    # one message, in the UI: what is missing and the command that builds it
    assert "the local target cannot run any of the" in text, text[-2500:]
    assert "functions are not built" in text and "sgd.wasm missing" in text, text[-2500:]
    assert "make functions" in text, text[-2500:]

    assert _run_finished(ui, dag_id, run_id, timeout=240) == "failed"
    states = _states(ui, dag_id, run_id)
    # no task of any group ran: nothing was set up, so no teardown or verify_clean had anything to do
    groups = {t: s for t, s in states.items() if "." in t}
    assert groups and all(s in NOT_RUN for s in groups.values()), groups
    assert {t.rsplit(".", 1)[1] for t in groups} >= {"prepare", "deploy", "teardown", "verify_clean"}
    # the day says it failed: summarize (all_done) counts the stopped groups, the watcher fails the run
    assert states["summarize"] == "failed" and states["watcher"] == "failed", states


def test_mirage_service_untouched_without_a_slurm_says_make_slurm(ui):
    dag_id = "mirage_service"
    run = _trigger_untouched(ui, dag_id)
    run_id = run["dag_run_id"]
    assert _run_finished(ui, dag_id, run_id, timeout=240) == "failed"
    states = _states(ui, dag_id, run_id)
    failed = [t for t, s in states.items() if s == "failed"]
    assert len(failed) == 1, states
    text = _log_in_ui(ui, dag_id, run_id, failed[0], "mirage-service-failed-task-log")
    # the first task says it; the service's step never starts (before: check_conf passed and
    # keep_service failed saying only that no --model was given)
    assert failed == ["check_conf"] and states["keep_service"] in NOT_RUN, (states, text[-2500:])
    assert "there is none here" in text and "make slurm" in text and "slurm_conf" in text, text[-2500:]
