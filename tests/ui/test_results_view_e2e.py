"""The results view in a real headless browser, behind Airflow's login.

Starts ``airflow api-server`` on a free 127.0.0.1 port (SimpleAuthManager, one test user),
logs in through the login form with Debian's chromium driven by selenium, opens the view
(directly and inside the Airflow UI), finds the reports made by the fixture, opens them and
checks their content; screenshots go to ``$UI_SCREENSHOT_DIR`` (default: the system temp dir).
Skips with a clear message when chromium, chromedriver or selenium is missing
(``make system-deps`` installs the Debian packages).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from airflow_ui import PASSWORD, USER, api_server, browser_dirs, chromium
from ui_fixtures import END, MIRAGE_KEY, MIRAGE_KEY_B, MIRAGE_RUNS, MIRAGE_TITLE, make_reports

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home, storage = browser_dirs(tmp_path_factory)
    pages = make_reports(storage, tmp_path_factory.mktemp("state"))
    # a committed report folder whose report.html is a link to a secret outside the root
    secret = tmp_path_factory.mktemp("outside") / "shadow"
    secret.write_text("SECRET-MARKER-19")
    evil = storage / "mirage_pipeline" / "evil" / "report"
    evil.mkdir(parents=True)
    (evil / "_SUCCESS.json").write_text(json.dumps({"finished": "x"}))
    (evil / "report.html").symlink_to(secret)
    with api_server(home, storage) as srv:
        yield {"base": srv["base"], "pages": pages, "log": srv["log"], "storage": storage}


@pytest.fixture(scope="module")
def browser(server, tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium-profile")) as driver:
        yield driver


def _shot(driver, name: str) -> Path:
    out = Path(os.environ.get("UI_SCREENSHOT_DIR", tempfile.gettempdir())) / f"results-view-{name}.png"
    driver.save_screenshot(str(out))
    return out


def test_view_is_behind_login_lists_and_opens_reports(server, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    base, pages = server["base"], server["pages"]
    wait = WebDriverWait(browser, 60)
    # without a login the API refuses and the page sends the browser to Airflow's login form
    req = urllib.request.Request(f"{base}/results/api/reports")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 401
    browser.get(f"{base}/results/")
    user = wait.until(EC.visibility_of_element_located((By.NAME, "username")))
    assert "/auth/login" in browser.current_url
    user.send_keys(USER)
    pw = browser.find_element(By.NAME, "password")
    pw.send_keys(PASSWORD)
    pw.send_keys(Keys.ENTER)
    # back on the view, logged in: both pipelines' reports listed
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table.reports")))
    assert browser.current_url.rstrip("/").endswith("/results"), browser.current_url
    assert browser.find_element(By.TAG_NAME, "h1").text == "Pipeline results"
    _shot(browser, "list")
    links = {
        unquote(a.get_attribute("href").split("/results/", 1)[1]): a
        for a in browser.find_elements(By.CSS_SELECTOR, "a.report-link")
    }
    assert "report/" + pages["mirage"] in links, links.keys()
    assert "report/" + pages["faasm_trends"] in links
    assert any(k.startswith("summary/") for k in links)
    # runs by DAG run id, logical date, trigger and the params that differ from the defaults
    rows = {
        r.get_attribute("data-key"): r
        for r in browser.find_elements(By.CSS_SELECTOR, "table[data-kind=mirage_report] tbody tr")
    }
    assert set(rows) == {MIRAGE_KEY, MIRAGE_KEY_B}

    def cell(key, cls):
        return rows[key].find_element(By.CSS_SELECTOR, f"td.{cls}").text

    assert cell(MIRAGE_KEY, "run-id") == MIRAGE_RUNS[MIRAGE_KEY] and cell(MIRAGE_KEY, "trigger") == "scheduled"
    assert cell(MIRAGE_KEY, "logical-date").startswith("2023-03-01T00:00:00")
    assert "train_count=42" in cell(MIRAGE_KEY, "params")
    assert cell(MIRAGE_KEY_B, "run-id") == MIRAGE_RUNS[MIRAGE_KEY_B] and cell(MIRAGE_KEY_B, "trigger") == "manual"
    assert cell(MIRAGE_KEY_B, "params") == "seed=7"
    faasm_row = browser.find_element(By.CSS_SELECTOR, "table[data-kind=faasm_trends] tbody tr")
    assert faasm_row.find_element(By.CSS_SELECTOR, "td.trigger").text == "scheduled"
    assert faasm_row.find_element(By.CSS_SELECTOR, "td.logical-date").text == END
    # the API shows paths relative to the storage root, never the root itself
    token = browser.get_cookie("_token")["value"]
    req = urllib.request.Request(f"{base}/results/api/reports", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        api = r.read().decode()
    assert json.loads(api)["reports"] and not any(x["path"].startswith("/") for x in json.loads(api)["reports"])
    assert "storage_root" not in api and str(server["storage"]) not in api

    # compare the two Mirage runs side by side
    for key in (MIRAGE_KEY, MIRAGE_KEY_B):
        rows[key].find_element(By.CSS_SELECTOR, "input[type=checkbox]").click()
    browser.find_element(By.CSS_SELECTOR, "form#compare button[type=submit]").click()
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table.compare")))
    assert "/results/compare?" in browser.current_url
    runs_text = browser.find_element(By.CSS_SELECTOR, "table.runs").text
    assert MIRAGE_RUNS[MIRAGE_KEY] in runs_text and MIRAGE_RUNS[MIRAGE_KEY_B] in runs_text and "seed=7" in runs_text
    cmp_rows = {
        tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td")[:2]): tr
        for tr in browser.find_elements(By.CSS_SELECTOR, "table.compare tbody tr")
    }
    mae = cmp_rows[("xgboost@1", "mean_interruption_h")]
    vals = {c: mae.find_element(By.CSS_SELECTOR, f"td.{c}").text for c in ("a", "b", "diff")}
    assert {vals["a"], vals["b"]} == {"3.21", "2.5"} and vals["diff"] in ("-0.71", "0.71"), vals
    _shot(browser, "compare")
    browser.get(f"{base}/results/")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table.reports")))
    links = {
        unquote(a.get_attribute("href").split("/results/", 1)[1]): a
        for a in browser.find_elements(By.CSS_SELECTOR, "a.report-link")
    }

    # open the Mirage report from the list
    links["report/" + pages["mirage"]].click()
    wait.until(EC.title_contains(MIRAGE_TITLE))
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Held-out scores" in body and "3.21" in body and "Training curves" in body
    imgs = browser.find_elements(By.TAG_NAME, "img")
    assert imgs and all(browser.execute_script("return arguments[0].naturalWidth", i) > 100 for i in imgs)
    _shot(browser, "mirage-report")

    # the Faasm trend report: tables and every embedded plot rendered
    browser.get(f"{base}/results/")
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table[data-kind=faasm_trends] a.report-link"))).click()
    wait.until(EC.title_contains("Faasm benchmarks: trends"))
    body = browser.find_element(By.TAG_NAME, "body").text
    assert f"trends over 30 days to {END}" in body and "Latest value against the days before" in body
    imgs = browser.find_elements(By.TAG_NAME, "img")
    assert len(imgs) == 6 and all(browser.execute_script("return arguments[0].naturalWidth", i) > 100 for i in imgs)
    _shot(browser, "faasm-trends")

    # the run summary page
    browser.get(f"{base}/results/summary/{quote(pages['faasm_run'])}")
    rows = wait.until(EC.presence_of_all_elements_located((By.CSS_SELECTOR, "tbody tr")))
    assert len(rows) == 7 and "succeeded" in rows[0].text

    # a report page that is a symbolic link out of the storage root is neither listed nor served
    for path in ("report/mirage_pipeline/evil/report/report.html", ""):
        req = urllib.request.Request(f"{base}/results/{path}", headers={"Authorization": f"Bearer {token}"})
        if path:
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(req, timeout=30)
            assert err.value.code == 404 and b"SECRET-MARKER-19" not in err.value.read()
        else:
            with urllib.request.urlopen(req, timeout=30) as r:
                page = r.read()
            assert b"evil" not in page and b"SECRET-MARKER-19" not in page
    # a file outside the reports is not served, even when logged in
    browser.get(f"{base}/results/report/mirage_pipeline/2023-03-01T000000Z/train/xgboost-n1/metrics.json")
    assert "no report file" in browser.find_element(By.TAG_NAME, "body").text

    # inside the Airflow UI: the Browse menu's "Pipeline results" page shows the list in a frame
    browser.get(f"{base}/plugin/results")
    frame = wait.until(EC.presence_of_element_located((By.TAG_NAME, "iframe")))
    time.sleep(2)
    _shot(browser, "airflow-ui")
    browser.switch_to.frame(frame)
    wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "table[data-kind=mirage_report]")))
    browser.switch_to.default_content()

    # a task instance's "Report" tab (where the step's Report link leads): the report inside the UI
    run_b = MIRAGE_RUNS[MIRAGE_KEY_B]
    browser.get(f"{base}/dags/mirage_pipeline/runs/{quote(run_b, safe='')}/tasks/report/plugin/report")
    frame = wait.until(EC.presence_of_element_located((By.TAG_NAME, "iframe")))
    browser.switch_to.frame(frame)  # (a page title is the top document's, so the heading is checked)
    wait.until(EC.text_to_be_present_in_element((By.TAG_NAME, "h1"), MIRAGE_TITLE))
    assert "2.5" in browser.find_element(By.TAG_NAME, "body").text
    browser.switch_to.default_content()
    _shot(browser, "task-report-tab")
    # a DAG run's "Results" tab lists that run's reports
    browser.get(f"{base}/results/dag-run/mirage_pipeline/{quote(run_b, safe='')}")
    link = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "a.report-link")))
    assert unquote(link.get_attribute("href")).endswith(f"mirage_pipeline/{MIRAGE_KEY_B}/report/report.html")
