"""A run made late really raises its deadline under a real Airflow.

PostgreSQL (a throw-away cluster: the scheduler refuses SQLite for anything but the
SequentialExecutor's single process), then ``airflow scheduler`` (LocalExecutor), ``airflow
triggerer`` (where the house deadline callback, an ``AsyncCallback``, runs) and ``airflow
api-server`` (the execution API the task processes talk to), all on 127.0.0.1 with the
repository's plugins and one real DAG file alone in its folder (``services.real_airflow``). The
deadline interval comes from the house setting ``HOUSE_DEADLINE_<DAG>``. Each test waits for the
callback's record under ``_deadlines/<dag>/`` and checks it names the run, still running, and
fired after the deadline, and that the triggerer logged it. The deadline counts from the queue
time (``house.deadlines``): on a busy machine it may fire before the scheduler has started the
run's first step; what is proved is that a run still at work past its interval is reported.

* ``faasm_benchmarks``: ``HOUSE_DEADLINE_FAASM_BENCHMARKS=10s``, and the run's first step made
  slow the way a site could: ``HOUSE_PYTHON`` is a wrapper that waits four minutes before it
  starts Python, so the run cannot finish in time however fast this machine is (and nothing is
  deployed).

Everything started is stopped at the end (each service's and the slow step's process group,
PostgreSQL last).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta

import pytest
from services import RealAirflow, real_airflow, stop_group

pytestmark = pytest.mark.timeout(300)

RUN_ID = "deadline_e2e"


def await_deadline(af: RealAirflow, dag_id: str, run_id: str, interval: timedelta) -> dict:
    """The deadline record of ``run_id`` once the triggerer has written it, checked: it names the
    run, still running, with the configured interval, fired after the deadline, and the
    triggerer's log has the callback's line."""
    record = af.storage / "_deadlines" / dag_id / f"{run_id}.json"
    af.wait(f"the deadline record {record.name}", record.exists, 200)
    rec = json.loads(record.read_text())
    assert rec["dag_id"] == dag_id and rec["run_id"] == run_id, rec
    assert rec["run_state"] == "running", rec
    queued, deadline = _ts(rec["queued_at"]), _ts(rec["deadline"])
    assert deadline - queued == interval, rec
    assert _ts(rec["fired_at"]) >= deadline, rec
    assert rec["interval_s"] == interval.total_seconds()
    # the triggerer ran the house callback (its log line)
    line = f"deadline missed: {dag_id} run {run_id}"
    af.wait("the triggerer's deadline line", lambda: line in af.logs["triggerer"].read_text(errors="replace"), 30)
    return rec


def test_a_late_run_raises_its_deadline_under_a_real_scheduler(tmp_path):
    interval = timedelta(seconds=10)
    pidfile = tmp_path / "slow-step.pid"
    slow = tmp_path / "slow-python"
    # the slow step: records its process group (the house runner starts each step in its own),
    # waits, then runs the step as usual
    slow.write_text(f'#!/bin/sh\necho $$ > "{pidfile}"\nsleep 240\nexec "{sys.executable}" "$@"\n')
    slow.chmod(0o755)
    env = {
        "HOUSE_DEADLINE_FAASM_BENCHMARKS": f"{int(interval.total_seconds())}s",
        "HOUSE_PYTHON": str(slow),
        "FAASM_TASKS_STATE_DIR": str(tmp_path / "faasm-state"),
    }
    # one experiment on one system, the local target: a small selection (the step never gets that far)
    conf = {"target": "local", "experiments": ["sgd_reuters_svm"], "systems": ["native"]}
    try:
        with real_airflow(tmp_path, "faasm_benchmarks.py", env) as af:
            af.cli("dags", "trigger", "faasm_benchmarks", "--run-id", RUN_ID, "--conf", json.dumps(conf))
            await_deadline(af, "faasm_benchmarks", RUN_ID, interval)
    finally:
        if pidfile.exists():
            stop_group(int(pidfile.read_text()))


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
