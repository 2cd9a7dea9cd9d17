"""``mirage_monthly``'s gate the way its user meets it: a real Airflow (api-server and scheduler
with the LocalExecutor, the steps as local processes), the real DAG, Airflow's own UI and the
results view in a headless Chromium.

The months' pipeline outputs are stored beforehand (``ui_fixtures.make_gate_months``: validate
outputs on seeded episodes, their ``metrics`` made by the real ``metrics`` step, the plan's
``_runs`` record of each month's ``samples_complete__<M>`` run): two earlier months, January
as usual, February regressed (the rule interrupts ~60 % more than reactive). The month's
``mirage_pipeline`` runs exist already (made through the REST API, finished), so
``start_pipeline`` is skipped, as for a month whose run was made before, and the gate judges the
stored metrics. What starts each ``mirage_monthly`` run is what starts it in production: one
``mirage_samples`` asset event per day of the month, partition key the day, params in its extra.

* February's ``gate`` task is failed in the grid (after its retry, which gives the committed
  verdict again) and its log in the UI shows the rule's hours with their interval, reactive's and
  avg's, every bar's interval and limit, and the margin;
* January's ``gate`` passed;
* the results view's gate table lists February as FAILED with its numbers and January as PASSED,
  each with the mirage_monthly run of that month (from Airflow's database) and its state;
* the February run's "Results" view shows its verdict.
"""

from __future__ import annotations

import calendar
import os
import re
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from airflow_ui import api_get, api_send, api_server, api_token, browser_dirs, chromium, login
from proctree import wait_for
from ui_fixtures import GATE_FAIL, GATE_PASS, make_gate_months

#: a browser element React replaced meanwhile, or not there yet: looked up again
try:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    NOT_YET = (StaleElementReferenceException, NoSuchElementException)
except ImportError:  # selenium absent: the module skips below
    NOT_YET = ()

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DAG = "mirage_monthly"


def _shot(driver, name: str) -> Path:
    out = Path(os.environ.get("UI_SCREENSHOT_DIR", tempfile.gettempdir())) / f"monthly-gate-{name}.png"
    driver.save_screenshot(str(out))
    return out


def _day_extra(day: str) -> dict:
    """The extra mirage_samples' ``publish`` gives a day's event: the day and the family params
    (here the pipeline's defaults), which the month's pipeline run is started with."""
    from mirage_tasks.run.runconf import FAMILY_PARAMS, MirageRun

    run = MirageRun.from_params({})
    return {"day": day, "params": {k: getattr(run, k) for k in FAMILY_PARAMS}}


def _month_events(base: str, token: str, asset_id: int, month: str) -> None:
    """One mirage_samples event per day of ``month`` (partition key: the day, as publish adds it)."""
    year, mon = map(int, month.split("-"))
    for d in range(1, calendar.monthrange(year, mon)[1] + 1):
        day = f"{month}-{d:02d}"
        body = {"asset_id": asset_id, "partition_key": f"{day}T00:00:00", "extra": _day_extra(day)}
        _send(base, token, "POST", "/api/v2/assets/events", body)


def _send(base: str, token: str, method: str, path: str, body: dict) -> dict:
    """``api_send``, again after a "Database error" (a write that lost a race with the scheduler's;
    a day's event sent twice is the same partition key)."""
    for attempt in range(5):
        try:
            return api_send(base, token, method, path, body)
        except AssertionError as exc:
            if attempt and "HTTP 409" in str(exc):
                return {}  # the try before did make it
            if "Database error" not in str(exc) or attempt == 4:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def _pipeline_run_done(base: str, token: str, month: str) -> None:
    """The month's mirage_pipeline run, made before (as mirage_monthly names it) and finished."""
    from mirage_tasks.run.plan import month_run

    run = month_run(month, [_day_extra(f"{month}-01")])
    _send(
        base,
        token,
        "POST",
        "/api/v2/dags/mirage_pipeline/dagRuns",
        {"dag_run_id": run["run_id"], "logical_date": run["logical_date"], "conf": run["conf"]},
    )
    path = f"/api/v2/dags/mirage_pipeline/dagRuns/{quote(run['run_id'], safe='')}"
    _send(base, token, "PATCH", path, {"state": "success"})


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    home, storage = browser_dirs(tmp_path_factory)
    make_gate_months(storage)
    with (
        api_server(home, storage, dags=True, scheduler=True) as server,
        chromium(tmp_path_factory.mktemp("profile")) as driver,
    ):
        base = server["base"]
        token = server["token"] = api_token(base)
        for month in (GATE_PASS, GATE_FAIL):
            _pipeline_run_done(base, token, month)
        _send(base, token, "PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})
        assets = api_get(base, token, "/api/v2/assets?name_pattern=mirage_samples")["assets"]
        asset_id = next(a["id"] for a in assets if a["name"] == "mirage_samples")
        for month in (GATE_PASS, GATE_FAIL):
            _month_events(base, token, asset_id, month)

        def finished():
            runs = api_get(base, token, f"/api/v2/dags/{DAG}/dagRuns?limit=100")["dag_runs"]
            by_month = {r.get("partition_key"): r for r in runs}
            done = all(by_month.get(m, {}).get("state") in ("success", "failed") for m in (GATE_PASS, GATE_FAIL))
            return by_month if done else None

        server["runs"] = wait_for(
            finished,
            "both months' mirage_monthly runs finished",
            deadline_s=300,
            poll_s=2,
            explain=lambda: (Path(home) / "scheduler.log").read_text()[-3000:],
        )
        login(driver, base, "/")
        server["driver"] = driver
        yield server


def _states(ui, run_id: str) -> dict[str, str | None]:
    path = f"/api/v2/dags/{DAG}/dagRuns/{quote(run_id, safe='')}/taskInstances?limit=100"
    return {t["task_id"]: t["state"] for t in api_get(ui["base"], ui["token"], path)["task_instances"]}


def test_the_regressed_month_fails_its_gate_in_the_grid_with_the_numbers_in_its_log(ui):
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    bad, good = ui["runs"][GATE_FAIL], ui["runs"][GATE_PASS]
    assert bad["state"] == "failed" and good["state"] == "success", (bad, good)
    # the pipeline runs existed: start_pipeline skipped, the gate judged the stored metrics
    assert _states(ui, bad["dag_run_id"]) == {"month": "success", "start_pipeline": "skipped", "gate": "failed"}
    assert _states(ui, good["dag_run_id"])["gate"] == "success"
    # its one retry found the committed verdict and failed again: a retry never turns it into a pass
    ti = api_get(
        base, ui["token"], f"/api/v2/dags/{DAG}/dagRuns/{quote(bad['dag_run_id'], safe='')}/taskInstances/gate"
    )
    assert ti["try_number"] == 2, ti

    # the grid: the failed month's gate cell is failed, the passing month's succeeded
    driver.get(f"{base}/dags/{DAG}")
    cells = {}
    for run in (bad, good):
        tid = f"grid-{run['dag_run_id']}-gate"
        cells[run["dag_run_id"]] = wait_for(
            lambda tid=tid: driver.find_element(By.CSS_SELECTOR, f"[data-testid='{tid}']"),
            f"the gate cell of {run['dag_run_id']} in the grid",
            deadline_s=90,
            poll_s=1,
            retry_on=NOT_YET,
        )
    _shot(driver, "grid")

    def hover_text(run: dict) -> str:
        """What the grid says of a cell when the user points at it (its tooltip: task, state, run)."""
        from selenium.webdriver.common.action_chains import ActionChains

        cell = driver.find_element(By.CSS_SELECTOR, f"[data-testid='grid-{run['dag_run_id']}-gate']")
        ActionChains(driver).move_to_element(cell).perform()
        return wait_for(
            lambda: next(
                (
                    t.text
                    for t in driver.find_elements(By.CSS_SELECTOR, "[role=tooltip], [data-part=content]")
                    if run["dag_run_id"] in t.text
                ),
                None,
            ),
            f"the tooltip of {run['dag_run_id']}'s gate cell",
            deadline_s=30,
            poll_s=0.5,
            retry_on=NOT_YET,
        )

    said = hover_text(bad)
    assert "Task ID: gate" in said and "State: Failed" in said, said
    said = hover_text(good)
    assert "Task ID: gate" in said and "State: Success" in said, said
    _shot(driver, "grid-hover")

    # a click on the failed cell opens the task instance, its log first: the numbers are there
    cells[bad["dag_run_id"]].click()
    try:
        text = wait_for(
            lambda: (t := driver.find_element(By.TAG_NAME, "body").text) and f"gate {GATE_FAIL}: FAILED" in t and t,
            "the failed gate's log in the UI",
            deadline_s=90,
            poll_s=1,
            retry_on=NOT_YET,
        )
    finally:
        _shot(driver, "failed-gate-log")
    assert f"gate {GATE_FAIL}: rule xgboost, margin 0.100" in text, text[-3000:]
    for node in (1, 8):
        # the rule's objective with its interval, reactive's and avg's hours
        h = r"\+\d+\.\d{3} h"
        objective = rf"node {node}: xgboost {h} \[\+[\d.]+, \+[\d.]+\] interruption, .*; reactive {h}; avg {h}"
        assert re.search(objective, text), text[-3000:]
        for bar in ("reactive", "avg", "earlier months"):
            # the bar's value, its interval and the limit
            check = rf"\[FAIL\] node {node} vs {bar}: [+-]\d\.\d{{3}} \[[+-][\d.]+, [+-][\d.]+\], limit [+-][\d.]+"
            assert re.search(check, text), (check, text[-3000:])
    assert "limit -0.100: the reduction against reactive has its upper bound below -margin" in text, text[-3000:]
    assert "earlier months 2022-11, 2022-12, 2023-01" in text, text[-3000:]


def test_the_results_view_lists_the_failed_month_with_its_numbers_and_the_passed_one(ui):
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    driver.get(f"{base}/results/#mirage_gate")
    rows = wait_for(
        lambda: (
            {
                r.get_attribute("data-key"): r
                for r in driver.find_elements(By.CSS_SELECTOR, "table[data-kind=mirage_gate] tbody tr")
            }
            or None
        ),
        "the gate table's rows",
        deadline_s=60,
        poll_s=1,
        retry_on=NOT_YET,
    )
    _shot(driver, "results-gate-table")
    assert set(rows) == {GATE_PASS, GATE_FAIL}, sorted(rows)
    bad, good = rows[GATE_FAIL].text, rows[GATE_PASS].text
    assert "FAILED" in bad and "PASSED" not in bad, bad
    assert "PASSED" in good and "FAILED" not in good, good
    # the failed month's numbers in the table: rule and margin, the rule's hours, each failed bar
    assert "xgboost" in bad and "margin 0.1" in bad, bad
    for node in (1, 8):
        assert f"node {node}" in bad, bad
    for bar in ("reactive", "avg", "earlier months"):
        assert f"vs {bar}" in bad, bad
    # the verdict's numbers page opens from the row
    # the month's mirage_monthly run, from Airflow's database, with its state and a link to it
    link = rows[GATE_FAIL].find_element(By.CSS_SELECTOR, "td.run-id a.run-link")
    assert link.text == ui["runs"][GATE_FAIL]["dag_run_id"], link.text
    assert rows[GATE_FAIL].find_element(By.CSS_SELECTOR, "td.state").text == "failed"
    assert rows[GATE_PASS].find_element(By.CSS_SELECTOR, "td.state").text == "success"
    rows[GATE_FAIL].find_element(By.CSS_SELECTOR, "a.report-link").click()
    wait_for(
        lambda: f"gate {GATE_FAIL}: FAILED" in driver.find_element(By.TAG_NAME, "body").text,
        "the failed month's gate.md",
        deadline_s=60,
        poll_s=1,
        retry_on=NOT_YET,
    )


def test_the_months_run_has_its_verdict_in_its_results_tab(ui):
    """The Results tab of a mirage_monthly run (the view it frames) shows its month's verdict."""
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    run_id = ui["runs"][GATE_FAIL]["dag_run_id"]
    driver.get(f"{base}/results/dag-run/{DAG}/{quote(run_id, safe='')}")
    text = wait_for(
        lambda: (t := driver.find_element(By.TAG_NAME, "body").text) and "Verdict" in t and t,
        "the run's results",
        deadline_s=60,
        poll_s=1,
        retry_on=NOT_YET,
    )
    assert GATE_FAIL in text and "FAILED (6 of 6 checks failed)" in text and "FAIL vs reactive" in text, text
