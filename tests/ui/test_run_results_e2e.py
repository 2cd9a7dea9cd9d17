"""What a new user meets in the real UI: a real api-server with the DAGs parsed, Airflow's
own UI in a headless Chromium, DAG runs made and marked through the REST API (no scheduler).

* A DAG run's "Results" tab is there and opens that run's reports (it was dropped: the tab shared
  its ``url_route`` with the Browse entry).
* The results list shows each report's DAG run state from Airflow, the tasks that did not finish,
  the trigger from Airflow's run type, and links the run id to the run's page; the compare view
  shows n and the 95 % intervals and says that the changed seed also changed the workload.
* ``mirage_service`` triggers from its form untouched: model, partition and account left empty
  (they were required fields).
"""

from __future__ import annotations

import shutil
from urllib.parse import quote, unquote

import pytest
from airflow_ui import api_get, api_send, api_server, api_token, browser_dirs, chromium, login, open_trigger_dialog
from proctree import wait_for
from ui_fixtures import END, MIRAGE_KEY, MIRAGE_KEY_B, MIRAGE_RUNS, make_reports

#: a browser element React replaced meanwhile, or not ready yet: looked up again
try:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    NOT_YET = (StaleElementReferenceException, NoSuchElementException)
except ImportError:  # selenium absent: the module skips below
    NOT_YET = ()

pytestmark = pytest.mark.e2e

RUN_B = MIRAGE_RUNS[MIRAGE_KEY_B]  # manual__2026-11-30T09:15:00+00:00
FAASM_RUN = f"manual__{END}T06:00:00+00:00"


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    home, storage = browser_dirs(tmp_path_factory)
    pages = make_reports(storage, tmp_path_factory.mktemp("state"))
    # the fixture's Faasm day again under a manual run id (Airflow reserves scheduled__ ids for the
    # scheduler, and this test makes its runs through the REST API)
    day = storage / "faasm_benchmarks" / END
    shutil.copytree(day / pages["faasm_run"].split("/", 1)[1], day / FAASM_RUN)
    _site_evaluation(storage)
    with api_server(home, storage, dags=True) as server, chromium(tmp_path_factory.mktemp("profile")) as driver:
        login(driver, server["base"], "/")
        server["driver"] = driver
        server["token"] = api_token(server["base"])
        # the DAG run behind the fixture's second Mirage report, failed at its report step
        base, token = server["base"], server["token"]
        api_send(
            base,
            token,
            "POST",
            "/api/v2/dags/mirage_pipeline/dagRuns",
            {"dag_run_id": RUN_B, "logical_date": "2026-11-30T09:15:00Z", "conf": {}},
        )
        run = f"/api/v2/dags/mirage_pipeline/dagRuns/{quote(RUN_B, safe='')}"
        api_send(base, token, "PATCH", f"{run}/taskInstances/report", {"new_state": "failed"})
        api_send(base, token, "PATCH", run, {"state": "failed"})
        # the Faasm day behind the fixture's summary ("7 points, 0 failed"): one experiment's run failed
        api_send(
            base,
            token,
            "POST",
            "/api/v2/dags/faasm_benchmarks/dagRuns",
            {"dag_run_id": FAASM_RUN, "logical_date": f"{END}T00:00:00Z", "conf": {}},
        )
        frun = f"/api/v2/dags/faasm_benchmarks/dagRuns/{quote(FAASM_RUN, safe='')}"
        tis = api_get(base, token, f"{frun}/taskInstances?limit=1000")["task_instances"]
        failed = sorted(t["task_id"] for t in tis if t["task_id"].endswith(".run"))[0]
        server["faasm_failed"] = failed
        api_send(base, token, "PATCH", f"{frun}/taskInstances/{failed}", {"new_state": "failed"})
        api_send(base, token, "PATCH", frun, {"state": "failed"})
        yield server


#: a site's log through mirage_evaluation: the wait predictor's page, as its step writes it (Markdown)
EVAL_PAGE = """# Wait prediction at submission: mysite.swf

Guard pick: **corrected_q40** (within 1 h of zero wait's share on the calibration tail).

Per month (guarded beside zero wait):

| month | n | MAE h | zero MAE h | within 1 h | zero within 1 h | coverage |
|---|---|---|---|---|---|---|
| 1997-01 | 2113 | 3.61 | 5.02 | 65.1% | 66.8% | 90.1% |
| 1997-02 | 1987 | 3.90 | 5.40 | 64.2% | 66.3% | 89.8% |
"""


def _site_evaluation(storage) -> None:
    from stepkit import Step

    step = Step("waitpred", str(storage / "mirage_evaluation" / "mysite" / "waitpred"), "test", {})
    step.write_bytes("waitpred.md", EVAL_PAGE.encode())
    step.write_json("waitpred.json", {"pick": "corrected_q40"})
    step.commit(
        {
            "pick": "corrected_q40",
            "criteria": {"mae_at_or_below_zero": True, "coverage_months": {"1997-01": 0.901, "1997-02": 0.898}},
        }
    )


def test_dag_run_has_a_results_tab_that_opens_its_reports(ui):
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    driver.get(f"{base}/dags/mirage_pipeline/runs/{quote(RUN_B, safe='')}")
    tab = wait_for(
        lambda: next(
            (a for a in driver.find_elements(By.CSS_SELECTOR, "a, button, [role=tab]") if a.text.strip() == "Results"),
            None,
        ),
        "the run's Results tab",
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", tab)
    tab.click()
    wait_for(
        lambda: driver.current_url.rstrip("/").endswith("/plugin/run-results"),
        "the tab's route",
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    frame = wait_for(
        lambda: driver.find_element(By.TAG_NAME, "iframe"), "the tab's frame", retry_on=NOT_YET, poll_s=0.5
    )
    driver.switch_to.frame(frame)
    try:
        link = wait_for(
            lambda: driver.find_element(By.CSS_SELECTOR, "a.report-link"),
            "the run's report link",
            retry_on=NOT_YET,
            poll_s=0.5,
        )
        assert unquote(link.get_attribute("href")).endswith(f"mirage_pipeline/{MIRAGE_KEY_B}/report/report.html")
        assert RUN_B in driver.find_element(By.TAG_NAME, "h1").text
        assert "Run state: failed" in driver.find_element(By.CSS_SELECTOR, "p.run-state").text
        link.click()  # opens the report itself
        wait_for(
            lambda: "Held-out scores" in driver.find_element(By.TAG_NAME, "body").text,
            "the report",
            retry_on=NOT_YET,
            poll_s=0.5,
        )
    finally:
        driver.switch_to.default_content()


def test_results_list_shows_run_state_unfinished_tasks_trigger_and_links(ui):
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    driver.get(f"{base}/results/")
    rows = wait_for(
        lambda: (
            {
                r.get_attribute("data-key"): r
                for r in driver.find_elements(By.CSS_SELECTOR, "table[data-kind=mirage_report] tbody tr")
            }
            or None
        ),
        "the Mirage rows",
        retry_on=NOT_YET,
        poll_s=0.5,
    )

    def cell(key, cls):
        return rows[key].find_element(By.CSS_SELECTOR, f"td.{cls}").text

    assert cell(MIRAGE_KEY_B, "state") == "failed"
    assert "failed: report" in cell(MIRAGE_KEY_B, "unfinished")
    assert cell(MIRAGE_KEY_B, "trigger") == "manual"
    # a run Airflow does not know (this database never ran it) says so instead of guessing a state
    assert cell(MIRAGE_KEY, "state") == "not in Airflow's database"
    assert not rows[MIRAGE_KEY].find_elements(By.CSS_SELECTOR, "a.run-link")
    link = rows[MIRAGE_KEY_B].find_element(By.CSS_SELECTOR, "td.run-id a.run-link")
    assert link.text == RUN_B
    assert unquote(link.get_attribute("href")) == f"{base}/dags/mirage_pipeline/runs/{RUN_B}"

    # the failed Faasm day: its state and the experiment that did not finish, beside "7 points, 0 failed"
    faasm = {
        r.get_attribute("data-key"): r
        for r in driver.find_elements(By.CSS_SELECTOR, "table[data-kind=faasm_summary] tbody tr")
    }
    row = faasm[f"{END}/{FAASM_RUN}"]
    # (marked failed by hand, a run with teardowns waits for them: no scheduler here, so Airflow
    # still calls it queued; the list shows what Airflow says)
    said = api_get(base, ui["token"], f"/api/v2/dags/faasm_benchmarks/dagRuns/{quote(FAASM_RUN, safe='')}")["state"]
    assert row.find_element(By.CSS_SELECTOR, "td.state").text == said
    assert row.find_element(By.CSS_SELECTOR, "td.trigger").text == "manual"
    group = ui["faasm_failed"].split(".", 1)[0]
    unfinished = row.find_element(By.CSS_SELECTOR, "td.unfinished").text
    assert f"experiments/groups not finished: {group}" in unfinished and ui["faasm_failed"] in unfinished, unfinished
    assert row.find_element(By.CSS_SELECTOR, "a.run-link").text == FAASM_RUN

    # the compare view: n and intervals of each metric, and the inputs that differ
    for key in (MIRAGE_KEY, MIRAGE_KEY_B):
        rows[key].find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    driver.find_element(By.CSS_SELECTOR, "form#compare button[type=submit]").click()
    wait_for(
        lambda: driver.find_element(By.CSS_SELECTOR, "table.compare"), "the comparison", retry_on=NOT_YET, poll_s=0.5
    )
    cmp_rows = {
        tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td")[:2]): tr
        for tr in driver.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")
    }
    mae = cmp_rows[("xgboost@1", "mean_interruption_h")]
    got = {c: mae.find_element(By.CSS_SELECTOR, f"td.{c}").text for c in ("a", "a-ci", "a-n", "b", "b-ci", "b-n")}
    assert got["a-n"] == got["b-n"] == "6", got
    assert {got["a-ci"], got["b-ci"]} == {"[2.21, 4.71]", "[1.5, 4]"}, got
    differs = driver.find_element(By.CSS_SELECTOR, "ul.differs").text
    assert "param seed: A" in differs and "changing the seed also changed the workload" in differs, differs

    # the run link leaves the view for the run's page in Airflow
    driver.get(f"{base}/results/")
    wait_for(
        lambda: driver.find_element(By.CSS_SELECTOR, "a.run-link"), "the run link", retry_on=NOT_YET, poll_s=0.5
    ).click()
    wait_for(
        lambda: driver.current_url.startswith(f"{base}/dags/mirage_pipeline/runs/"),
        "the run's page",
        retry_on=NOT_YET,
        poll_s=0.5,
    )


def test_run_link_inside_the_uis_frame_opens_the_run_page(ui):
    """Inside the Airflow UI the list is an iframe whose sandbox forbids top navigation, so a plain
    ``target=_top`` link does nothing there: the link must still lead the whole window to the run."""
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    driver.get(f"{base}/plugin/results")
    frame = wait_for(
        lambda: driver.find_element(By.TAG_NAME, "iframe"), "the view's frame", retry_on=NOT_YET, poll_s=0.5
    )
    assert "allow-top-navigation" not in (frame.get_attribute("sandbox") or "")
    driver.switch_to.frame(frame)
    try:
        link = wait_for(
            lambda: next((a for a in driver.find_elements(By.CSS_SELECTOR, "a.run-link") if a.text == RUN_B), None),
            "a run link in the frame",
            retry_on=NOT_YET,
            poll_s=0.5,
        )
        link.click()
    finally:
        driver.switch_to.default_content()
    wait_for(
        lambda: unquote(driver.current_url) == f"{base}/dags/mirage_pipeline/runs/{RUN_B}",
        "the run's page in the whole window",
        deadline_s=30,
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    # the UI shows the run (not the list in a frame any more)
    wait_for(
        lambda: RUN_B in driver.find_element(By.TAG_NAME, "body").text,
        "the run's page rendered",
        deadline_s=60,
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    assert not [
        f
        for f in driver.find_elements(By.TAG_NAME, "iframe")
        if "/results/" in (f.get_attribute("src") or "") and not f.get_attribute("src").endswith("/results/")
    ]


def test_a_sites_wait_prediction_is_readable_in_the_ui(ui):
    """mirage_evaluation wrote its tables to storage only: the list inside the UI shows the site's
    log with the guard's pick and coverage, and its page the per-month table."""
    from selenium.webdriver.common.by import By

    driver, base = ui["driver"], ui["base"]
    driver.get(f"{base}/plugin/results")
    driver.switch_to.frame(
        wait_for(lambda: driver.find_element(By.TAG_NAME, "iframe"), "the view's frame", retry_on=NOT_YET, poll_s=0.5)
    )
    try:
        row = wait_for(
            lambda: driver.find_element(By.CSS_SELECTOR, "table[data-kind=mirage_evaluation] tr[data-key=mysite]"),
            "the evaluation row",
            retry_on=NOT_YET,
            poll_s=0.5,
        )
        summary = row.find_element(By.CSS_SELECTOR, "td.summary").text
        assert "guard pick corrected_q40" in summary and "1997-01 90%" in summary, summary
        row.find_element(By.CSS_SELECTOR, "a.report-link").click()
        cells = wait_for(
            lambda: [td.text for td in driver.find_elements(By.CSS_SELECTOR, "td")],
            "the per-month table",
            retry_on=NOT_YET,
            poll_s=0.5,
        )
        assert "1997-01" in cells and "90.1%" in cells and "3.61" in cells, cells
        assert "corrected_q40" in driver.find_element(By.TAG_NAME, "strong").text
    finally:
        driver.switch_to.default_content()


def test_mirage_service_triggers_from_its_form_untouched(ui):
    from selenium.webdriver.common.by import By

    driver, base, token = ui["driver"], ui["base"], ui["token"]
    dialog = open_trigger_dialog(driver, base, "mirage_service")
    # the form untouched: model (policy model without one fails in the step, exit 2 naming --model),
    # partition and account all empty
    for name in ("element_model", "element_partition", "element_account"):
        assert dialog.find_element(By.NAME, name).get_attribute("value") == ""
    button = next(b for b in dialog.find_elements(By.TAG_NAME, "button") if b.text.strip() == "Trigger")
    wait_for(lambda: button.is_enabled(), "Trigger enabled", retry_on=NOT_YET, poll_s=0.5)
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()
    runs = wait_for(
        lambda: api_get(base, token, "/api/v2/dags/mirage_service/dagRuns")["dag_runs"],
        "the triggered run",
        retry_on=NOT_YET,
        poll_s=0.5,
    )
    assert [r["run_type"] for r in runs] == ["manual"], runs
    conf = runs[0]["conf"]
    assert (
        conf["policy"] == "model"
        and conf.get("model") is None
        and conf.get("partition") is None
        and conf.get("account") is None
    ), conf
