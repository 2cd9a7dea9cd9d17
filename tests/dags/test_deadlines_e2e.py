"""A ``faasm_benchmarks`` run made late really raises its deadline under a real Airflow.

PostgreSQL (a throw-away cluster: the scheduler refuses SQLite for anything but the
SequentialExecutor's single process), then ``airflow scheduler`` (LocalExecutor), ``airflow
triggerer`` (where the house deadline callback, an ``AsyncCallback``, runs) and ``airflow
api-server`` (the execution API the task processes talk to), all on 127.0.0.1 with the
repository's plugins and the real DAG file. The deadline interval comes from the house
setting (``HOUSE_DEADLINE_FAASM_BENCHMARKS=10s``), and the run's first step is made slow the
way a site could: ``HOUSE_PYTHON`` is a wrapper that waits four minutes before it starts Python,
so the run cannot finish in time however fast this machine is (and nothing is deployed). The
test waits for the callback's record under ``_deadlines/faasm_benchmarks/`` and checks it names
the run, still running, and fired after the deadline, and that the triggerer logged it. (On a
busy machine the scheduler may take longer than the interval to start that first step: the
deadline counts from the queue time either way.) Everything started is
stopped at the end (each service's and the slow step's process group, PostgreSQL last).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "ui"))
from airflow_ui import airflow_env, free_port
from services import postgres, start_services, stop_group, tail

pytestmark = pytest.mark.timeout(300)

INTERVAL = timedelta(seconds=10)
RUN_ID = "deadline_e2e"
#: one experiment on one system, the local target: a small selection (the step never gets that far)
CONF = {"target": "local", "experiments": ["sgd_reuters_svm"], "systems": ["native"]}


def test_a_late_run_raises_its_deadline_under_a_real_scheduler(tmp_path):
    home, storage, dags = tmp_path / "home", tmp_path / "storage", tmp_path / "dags"
    for d in (home, storage, dags):
        d.mkdir()
    shutil.copy(REPO / "dags" / "faasm_benchmarks.py", dags)  # the real DAG file, alone in its folder
    pidfile = tmp_path / "slow-step.pid"
    slow = tmp_path / "slow-python"
    # the slow step: records its process group (the house runner starts each step in its own),
    # waits, then runs the step as usual
    slow.write_text(f'#!/bin/sh\necho $$ > "{pidfile}"\nsleep 240\nexec "{sys.executable}" "$@"\n')
    slow.chmod(0o755)
    procs: dict[str, subprocess.Popen] = {}
    logs: dict[str, Path] = {}
    with postgres() as db_url:
        port = free_port()
        env = airflow_env(home, storage, port)
        env.update(
            {
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__CORE__PARALLELISM": "2",
                "HOUSE_DEADLINE_FAASM_BENCHMARKS": f"{int(INTERVAL.total_seconds())}s",
                "HOUSE_PYTHON": str(slow),
                "FAASM_TASKS_STATE_DIR": str(tmp_path / "faasm-state"),
            }
        )
        airflow = [sys.executable, "-m", "airflow"]

        def cli(*argv: str) -> str:
            p = subprocess.run([*airflow, *argv], env=env, cwd=home, capture_output=True, text=True, timeout=240)
            assert p.returncode == 0, f"airflow {' '.join(argv)}: {p.stderr[-3000:]}"
            return p.stdout

        try:
            cli("db", "migrate")
            cli("dags", "reserialize")
            cli("dags", "unpause", "faasm_benchmarks")
            start_services(airflow, env, home, port, procs, logs)
            cli("dags", "trigger", "faasm_benchmarks", "--run-id", RUN_ID, "--conf", json.dumps(CONF))

            record = storage / "_deadlines" / "faasm_benchmarks" / f"{RUN_ID}.json"
            end = time.monotonic() + 200
            while not record.exists():
                dead = [n for n, p in procs.items() if p.poll() is not None]
                if dead or time.monotonic() > end:
                    why = f"{', '.join(dead)} exited" if dead else "no deadline record in 200 s"
                    pytest.fail(why + "\n" + "\n".join(tail(p) for p in logs.values()))
                time.sleep(1)
            rec = json.loads(record.read_text())
            assert rec["dag_id"] == "faasm_benchmarks" and rec["run_id"] == RUN_ID, rec
            assert rec["run_state"] == "running", rec
            queued, deadline = _ts(rec["queued_at"]), _ts(rec["deadline"])
            assert deadline - queued == INTERVAL, rec
            assert _ts(rec["fired_at"]) >= deadline, rec
            assert rec["interval_s"] == INTERVAL.total_seconds()
            # the triggerer ran the house callback (its log line) and Airflow counted the callback done
            end = time.monotonic() + 30
            while f"deadline missed: faasm_benchmarks run {RUN_ID}" not in logs["triggerer"].read_text(
                errors="replace"
            ):
                assert time.monotonic() < end, tail(logs["triggerer"])
                time.sleep(1)
        finally:
            for name in reversed(list(procs)):
                stop_group(procs[name].pid)
                procs[name].wait(timeout=10)
            if pidfile.exists():
                stop_group(int(pidfile.read_text()))


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
