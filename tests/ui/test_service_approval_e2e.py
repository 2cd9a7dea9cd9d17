"""mirage_service on a site's Slurm waits for a person, under a real Airflow and in its real UI.

``airflow api-server`` and ``airflow scheduler`` (LocalExecutor; Airflow 3.3 parks a waiting
approval as ``awaiting_input`` and its scheduler resolves the time-outs, no triggerer needed) run
the real DAG file, alone in its folder. Each run names a site's slurm.conf (a controller on
10.255.0.1, nowhere: nothing can be submitted) allowed by ``HOUSE_INPUT_ROOTS``, so check_conf
passes and ``approve`` asks. Three runs, one after the other (``max_active_runs=1``):

* one left unanswered with ``approval_hours`` = 0.005 (18 s): rejected by the time-out, recorded
  as ``timed out`` by nobody, keep_service skipped, the run a success;
* one approved in headless Chromium (Browse -> Required Actions' page of the task, a comment
  typed in its form): keep_service runs (the untouched form's policy model has no model: the step
  refuses at once, exit 2, so it fails without submitting anything), recorded ``approved`` by the
  signed-in user with the comment;
* one rejected the same way: keep_service skipped (not failed), the run a success, the
  rejection recorded with who, when and the comment, and said in the task's log.

The plan shown on the page is the run's own (its sbatch line and cluster).
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
from pathlib import Path

import pytest
from airflow_ui import REPO, api_get, api_send, api_server, api_token, chromium, login, missing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

DAG = "mirage_service"
#: the time-out run's wait for an answer (h): 18 s
SHORT_H = 0.005


def _get(base: str, token: str, path: str, tries: int = 5) -> dict:
    """``api_get``, again after a time-out (a busy shared machine)."""
    for i in range(tries):
        try:
            return api_get(base, token, path)
        except (TimeoutError, urllib.error.URLError):
            if i == tries - 1:
                raise
            time.sleep(2)
    raise AssertionError("unreachable")


def _states(base: str, token: str, run_id: str) -> dict[str, str | None]:
    tis = _get(base, token, f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {t["task_id"]: t["state"] for t in tis}


def _wait(what: str, check, server, timeout_s: float = 240):
    end = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            log = (Path(server["home"]) / "scheduler.log").read_text(errors="replace")[-3000:]
            raise AssertionError(f"{what}: not in {timeout_s:.0f} s\n{log}")
        time.sleep(1)


def _parked(server, run_id: str) -> bool:
    """The scheduler has seen the approval's first try end parked: an answer before that (a click
    within seconds, on a busy machine) races the worker's exit in Airflow 3.3.2, and the scheduler
    then retries the task as if it had changed state under it (a person takes longer than that)."""
    log = (Path(server["home"]) / "scheduler.log").read_text(errors="replace")
    return f"TaskInstance Finished: dag_id={DAG}, task_id=approve, run_id={run_id}," in log and any(
        f"run_id={run_id}," in line and "state=awaiting_input" in line
        for line in log.splitlines()
        if "TaskInstance Finished" in line
    )


def _run_state(base, token, run_id) -> str:
    return _get(base, token, f"/api/v2/dags/{DAG}/dagRuns/{run_id}")["state"]


def _answer_in_the_ui(driver, base: str, run_id: str, option: str, comment: str) -> str:
    """Open the task's Required Action page, type ``comment``, click ``option``; returns the page text."""
    from proctree import wait_for
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    retry = (StaleElementReferenceException, NoSuchElementException)
    driver.get(f"{base}/dags/{DAG}/runs/{run_id}/tasks/approve/required_actions")
    box = wait_for(lambda: driver.find_element(By.NAME, "element_comment"), "the comment field", retry_on=retry)
    page = wait_for(
        lambda: driver.find_element(By.TAG_NAME, "body").text if "sbatch --parsable" in driver.page_source else None,
        "the plan on the page",
        retry_on=retry,
    )
    box.send_keys(comment)
    button = wait_for(
        lambda: next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text.strip() == option),
        f"the {option} button",
        retry_on=(*retry, StopIteration),
    )
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()
    return page


def test_approve_reject_and_time_out_in_the_ui(tmp_path):
    why = missing()
    if why:
        pytest.skip(why)
    home, storage, dags, site = (tmp_path / n for n in ("home", "storage", "dags", "site"))
    for d in (home, storage, dags, site):
        d.mkdir()
    shutil.copy(REPO / "dags" / f"{DAG}.py", dags)  # the real DAG file, alone in its folder
    conf = site / "slurm.conf"
    conf.write_text("ClusterName=faraway\nSlurmctldHost=ctl(10.255.0.1)\n")
    env = {
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL": "2",  # the time-out sweep
        "HOUSE_INPUT_ROOTS": str(site),
        "HOUSE_DEADLINE_MIRAGE_SERVICE": "off",
    }
    with (
        api_server(home, storage, dags=True, scheduler=True, env=env) as server,
        chromium(tmp_path / "profile") as driver,
    ):
        base = server["base"]
        token = api_token(base)
        login(driver, base, "/")
        runs = {"timeout": {"approval_hours": SHORT_H}, "approve": {}, "reject": {}}
        for run_id, extra in runs.items():  # queued in this order, run one at a time
            api_send(
                base,
                token,
                "POST",
                f"/api/v2/dags/{DAG}/dagRuns",
                {"dag_run_id": run_id, "logical_date": None, "conf": {"slurm_conf": str(conf), **extra}},
            )

        # 1. nobody answers: the time-out rejects it
        _wait("the time-out run finished", lambda: _run_state(base, token, "timeout") in ("success", "failed"), server)
        assert _run_state(base, token, "timeout") == "success"
        states = _states(base, token, "timeout")
        assert states == {"check_conf": "success", "approve": "success", "keep_service": "skipped"}, states

        # 2. approved in the browser: keep_service runs (and refuses the model-less form at once)
        _wait("approve waiting", lambda: _states(base, token, "approve").get("approve") == "awaiting_input", server)
        _wait("approve parked", lambda: _parked(server, "approve"), server, 60)
        page = _answer_in_the_ui(driver, base, "approve", "Approve", "budget ok")
        assert "Submit 2 Slurm jobs of 1 node(s) x 48 h (model)" in page, page[:3000]
        assert "faraway" in page and "ctl(10.255.0.1)" in page and "approve.approval.json" in page
        _wait("the approved run finished", lambda: _run_state(base, token, "approve") in ("success", "failed"), server)
        states = _states(base, token, "approve")
        assert states["approve"] == "success" and states["keep_service"] == "failed", states

        # 3. rejected in the browser: keep_service skipped, not failed; the run ends cleanly
        _wait("reject waiting", lambda: _states(base, token, "reject").get("approve") == "awaiting_input", server)
        _wait("reject parked", lambda: _parked(server, "reject"), server, 60)
        _answer_in_the_ui(driver, base, "reject", "Reject", "not this month")
        _wait("the rejected run finished", lambda: _run_state(base, token, "reject") in ("success", "failed"), server)
        assert _run_state(base, token, "reject") == "success"
        states = _states(base, token, "reject")
        assert states == {"check_conf": "success", "approve": "success", "keep_service": "skipped"}, states

        # the records beside each run's outputs
        records = {r: json.loads((storage / DAG / f"{r}.approval.json").read_text()) for r in runs}
        assert records["timeout"]["decision"] == "timed out" and records["timeout"]["by"] is None
        assert records["timeout"]["within_h"] == SHORT_H
        for run_id, decision, comment in (
            ("approve", "approved", "budget ok"),
            ("reject", "rejected", "not this month"),
        ):
            rec = records[run_id]
            assert rec["run_id"] == run_id and rec["decision"] == decision, rec
            assert rec["by"] and rec["by"]["name"] == "tester" and rec["comment"] == comment, rec
            assert rec["at"] and "sbatch --parsable" in rec["plan"], rec
        # nothing of keep_service's own where it never ran
        assert not (storage / DAG / "reject").exists() and not (storage / DAG / "timeout").exists()

        # the rejection in the approval task's log
        logs = json.dumps(
            _get(base, token, f"/api/v2/dags/{DAG}/dagRuns/reject/taskInstances/approve/logs/1?full_content=true")
        )
        assert "Decision: rejected by tester" in logs and "not this month" in logs, logs[-3000:]
