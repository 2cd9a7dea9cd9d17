"""The trigger and backfill forms as a user meets them: a real api-server, Airflow's own UI in a
headless Chromium, the runs read back through the REST API.

* Submitting ``mirage_pipeline``'s trigger form unchanged starts exactly one run, manual, with
  the form's defaults as its conf; "Unpause on trigger" (ticked by default) unpauses the DAG but
  schedules nothing before the next cron time (``house.cron_schedule``).
* The Backfill form: Airflow 3.3.2's UI sends the typed params only when "Override parameters
  on existing runs" is ticked (``dag_run_conf: null`` otherwise, so every run gets the
  defaults: the trace typed in the form is silently dropped). With the box ticked, the runs
  carry the typed trace. docs/dags.md ("Backfills, pausing and the trigger form") tells users so.

* ``mirage_evaluation``'s trigger form (a log described field by field) shows every param with
  its description; ``trials`` and ``timeout_s`` typed in the form reach the run's conf, beside
  the other fields' defaults.

No scheduler runs here: these tests check what the forms create, not the runs' work (``make
demo`` runs the form's default configuration end to end; tests/dags/test_mirage_evaluation_e2e.py
runs the evaluation's tasks).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from airflow_ui import api_get, api_put, api_server, api_token, browser_dirs, chromium, login, open_trigger_dialog
from proctree import wait_for

#: a browser element React replaced meanwhile, or not ready yet: looked up again
try:
    from selenium.common.exceptions import ElementNotInteractableException, StaleElementReferenceException

    NOT_YET = (StaleElementReferenceException, ElementNotInteractableException)
except ImportError:  # selenium absent: the module skips below
    NOT_YET = ()

pytestmark = pytest.mark.e2e

TRACE = "/data/traces/typed-in-the-form.swf"


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    home, storage = browser_dirs(tmp_path_factory)
    with api_server(home, storage, dags=True) as server, chromium(tmp_path_factory.mktemp("profile")) as driver:
        login(driver, server["base"], "/")
        server["driver"] = driver
        server["token"] = api_token(server["base"])
        yield server


def _button(dialog, text: str):
    from selenium.webdriver.common.by import By

    return next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == text)


def _click(driver, element) -> None:
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    element.click()


def _runs(ui, dag_id: str) -> list[dict]:
    return api_get(ui["base"], ui["token"], f"/api/v2/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]


def test_trigger_form_defaults_start_one_manual_run_and_no_scheduled_one(ui):
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    dag = api_get(base, ui["token"], "/api/v2/dags/mirage_pipeline")
    assert dag["is_paused"]
    defaults = {
        k: v["value"] for k, v in api_get(base, ui["token"], "/api/v2/dags/mirage_pipeline/details")["params"].items()
    }
    dialog = open_trigger_dialog(driver, base, "mirage_pipeline")
    unpause = dialog.find_element(By.XPATH, ".//label[contains(., 'Unpause mirage_pipeline on trigger')]")
    assert unpause.get_attribute("data-state") == "checked"  # Airflow's default: ticked
    _click(driver, _button(dialog, "Trigger"))
    runs = wait_for(lambda: _runs(ui, "mirage_pipeline"), "the triggered run", retry_on=NOT_YET, poll_s=0.5)
    time.sleep(2)  # give a wrongly scheduled run the chance to appear beside it
    runs = _runs(ui, "mirage_pipeline")
    assert [r["run_type"] for r in runs] == ["manual"], runs
    assert runs[0]["conf"] == defaults and runs[0]["conf"]["size"] == "demo"  # the form's default: minutes
    dag = api_get(base, ui["token"], "/api/v2/dags/mirage_pipeline")
    assert not dag["is_paused"]
    next_run = datetime.fromisoformat(dag["next_dagrun_run_after"].replace("Z", "+00:00"))
    assert next_run > datetime.now(UTC), f"unpausing scheduled a run for {next_run} (past)"


def _type(driver, css: str, text: str) -> bool:
    """Type ``text`` into the visible input matching ``css`` (False while there is none)."""
    from selenium.webdriver.common.by import By

    field = next((i for i in driver.find_elements(By.CSS_SELECTOR, css) if i.is_displayed()), None)
    if field is None:
        return False
    field.send_keys(text)
    return True


def _backfill(ui, dag_id: str, start: str, end: str, *, override: bool) -> None:
    from selenium.webdriver.common.by import By

    driver = ui["driver"]
    dialog = open_trigger_dialog(driver, ui["base"], dag_id)
    _click(driver, dialog.find_element(By.XPATH, ".//*[text()='Backfill']"))
    wait_for(lambda: "Date Range" in dialog.text, "the backfill form", retry_on=NOT_YET, poll_s=0.5)
    for picker, day in zip(dialog.find_elements(By.CSS_SELECTOR, "[data-testid=datetime-input]"), (start, end)):
        _click(driver, picker)
        # B023: wait_for calls it at once, in this iteration
        wait_for(
            lambda: _type(driver, "input[placeholder='YYYY/MM/DD']", day),  # noqa: B023
            "the date typed",
            retry_on=NOT_YET,
            poll_s=0.5,
        )
        wait_for(
            lambda: _type(driver, "input[placeholder='HH:mm']", "00:00"), "the time typed", retry_on=NOT_YET, poll_s=0.5
        )
        _click(driver, dialog.find_element(By.XPATH, ".//*[text()='Date Range']"))  # closes the picker
    trace = dialog.find_element(By.NAME, "element_trace")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", trace)
    trace.send_keys(TRACE)
    _click(driver, dialog.find_element(By.XPATH, ".//*[text()='Date Range']"))  # blur: the form takes the value
    if override:
        _click(driver, dialog.find_element(By.XPATH, ".//label[contains(., 'Override parameters on existing runs')]"))
    button = _button(dialog, "Run Backfill")
    wait_for(lambda: button.is_enabled(), "Run Backfill enabled", retry_on=NOT_YET, poll_s=0.5)
    _click(driver, button)


def test_backfill_form_carries_the_typed_trace_only_with_override_ticked(ui):
    base, token = ui["base"], ui["token"]

    def backfills():
        return api_get(base, token, "/api/v2/backfills?dag_id=mirage_samples")["backfills"]

    _backfill(ui, "mirage_samples", "2023/01/10", "2023/01/11", override=False)
    first = wait_for(backfills, "the first backfill", retry_on=NOT_YET, poll_s=0.5)
    assert first[0]["dag_run_conf"] in (None, {}), first  # Airflow 3.3.2: the typed params are not sent
    runs = wait_for(lambda: _runs(ui, "mirage_samples"), "its runs", retry_on=NOT_YET, poll_s=0.5)
    assert runs and all(r["run_type"] == "backfill" and not (r["conf"] or {}).get("trace") for r in runs), runs
    api_put(base, token, f"/api/v2/backfills/{first[0]['id']}/cancel")  # one active backfill per DAG

    _backfill(ui, "mirage_samples", "2023/01/20", "2023/01/21", override=True)
    both = wait_for(lambda: len(backfills()) == 2 and backfills(), "the second backfill", retry_on=NOT_YET, poll_s=0.5)
    second = max(both, key=lambda b: b["id"])
    assert second["dag_run_conf"]["trace"] == TRACE, second
    # Airflow commits the backfill before it creates its runs (models/backfill.py): wait for both
    new = wait_for(
        lambda: (x := _new_runs(ui)) and len(x) == 2 and x,
        "the second backfill's two runs",
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    assert all(r["conf"]["trace"] == TRACE for r in new), new


def _new_runs(ui) -> list[dict]:
    return [r for r in _runs(ui, "mirage_samples") if "2023-01-2" in (r.get("partition_key") or r["dag_run_id"])]


def _set(driver, dialog, name: str, text: str) -> None:
    """Replace the value of the form field ``element_<name>`` with ``text`` as a user types it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    field = dialog.find_element(By.NAME, f"element_{name}")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", field)
    field.click()
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.BACKSPACE)
    field.send_keys(text, Keys.TAB)  # blur: the form takes it ("Run Parameters" would fold the section)
    wait_for(
        lambda: dialog.find_element(By.NAME, f"element_{name}").get_attribute("value") == text,
        f"{name} = {text}",
        retry_on=NOT_YET,
        poll_s=0.5,
    )


def test_evaluation_form_shows_its_params_and_sends_the_typed_budget(ui):
    from selenium.webdriver.common.by import By

    driver, base, token = ui["driver"], ui["base"], ui["token"]
    params = api_get(base, token, "/api/v2/dags/mirage_evaluation/details")["params"]
    defaults = {k: v["value"] for k, v in params.items()}
    assert {"name", "trace", "calibrate_from", "calibrate_to", "months", "trials", "timeout_s"} <= set(defaults)
    dialog = open_trigger_dialog(driver, base, "mirage_evaluation")
    wait_for(
        lambda: all(dialog.find_elements(By.NAME, f"element_{k}") for k in params),
        "every field",
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    text = dialog.text
    for name, p in params.items():  # each field with its description beside it
        desc = p.get("description") or (p.get("schema") or {}).get("description")
        assert desc and desc in text, f"{name}: description {desc!r} not in the form"
    if not defaults["trace"]:  # no ../shared/traces here: the form's example log is missing, name one
        defaults["trace"] = "/data/traces/KTH-SP2-1996-2.1-cln.swf.gz"
        _set(driver, dialog, "trace", defaults["trace"])
    _set(driver, dialog, "trials", "2")
    _set(driver, dialog, "timeout_s", "10")
    button = _button(dialog, "Trigger")
    wait_for(lambda: button.is_enabled(), "Trigger enabled", retry_on=NOT_YET, poll_s=0.5)
    _click(driver, button)
    runs = wait_for(lambda: _runs(ui, "mirage_evaluation"), "the triggered run", retry_on=NOT_YET, poll_s=0.5)
    assert [r["run_type"] for r in runs] == ["manual"], runs
    assert runs[0]["conf"] == {**defaults, "trials": 2, "timeout_s": 10}, runs[0]["conf"]
    # the run holds the evaluation's tasks (no scheduler here to run them: plan would read this conf)
    run = quote(runs[0]["dag_run_id"], safe="")
    tis = api_get(base, token, f"/api/v2/dags/mirage_evaluation/dagRuns/{run}/taskInstances")["task_instances"]
    assert {"plan", "ingest", "calibrate", "waitpred"} <= {t["task_id"] for t in tis}, tis
