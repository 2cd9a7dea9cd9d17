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
* ``mirage_service``: ``HOUSE_DEADLINE_MIRAGE_SERVICE=20s`` and a keeper that really keeps: the
  deployment's code root holds make slurm's ``var/slurm/slurm.conf`` (a controller on
  localhost: no approval asked, as on the local demo), and the Slurm client on ``PATH`` is the
  test suite's fake (``tests/mirage/fake_slurm``: a job starts at once and runs its limit). The
  ``reactive`` keeper of a 1 h service submits its first job and watches it, its next decision
  (the successor, at the job's end) an hour away. Once the deadline is recorded and the keeper
  is seen at work, the run is marked failed through the REST API, as a person would stop it: the
  task stops its step (no ``keep-service`` process left), which submitted nothing more and
  cancelled nothing.

Everything started is stopped at the end (each service's and each step's process group,
PostgreSQL last).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import REPO
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


#: make slurm's slurm.conf as the approval's criterion reads it: a controller on this machine
LOCAL_CONF = "ClusterName=local\nSlurmctldHost=localhost(127.0.0.1)\n"
#: a keeper that keeps for an hour: the reactive rule decides on the successor at its job's end
KEEPER = {"policy": "reactive", "service_hours": 1, "links": 1}


def _keepers(storage: Path) -> list[int]:
    """The ``keep-service`` step processes of this test (their ``--out`` under its storage root)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"keep-service" in argv and any(str(storage).encode() in a for a in argv):
            found.append(int(entry.name))
    return found


def test_an_overdue_keeper_raises_its_deadline_under_a_real_scheduler(tmp_path):
    from mirage_tasks.run.forms import LOCAL_SLURM_CONF

    interval = timedelta(seconds=20)
    checkout = tmp_path / "checkout"  # the deployment's code root (the steps' working directory)
    (checkout / LOCAL_SLURM_CONF).parent.mkdir(parents=True)
    (checkout / LOCAL_SLURM_CONF).write_text(LOCAL_CONF)
    slurm = tmp_path / "slurm"  # the fake Slurm's queue
    slurm.mkdir()
    fake = REPO / "tests" / "mirage" / "fake_slurm"
    env = {
        "HOUSE_DEADLINE_MIRAGE_SERVICE": f"{int(interval.total_seconds())}s",
        "HOUSE_CODE_ROOT": str(checkout),
        "PATH": f"{fake}:{os.environ['PATH']}",
        "FAKE_SLURM_DIR": str(slurm),
        "FAKE_SLURM_PYTHON": sys.executable,
    }
    run = f"/api/v2/dags/mirage_service/dagRuns/{RUN_ID}"

    def jobs() -> list[str]:
        path = slurm / "jobs.jsonl"
        return [json.loads(ln)["name"] for ln in path.read_text().splitlines()] if path.exists() else []

    try:
        with real_airflow(tmp_path, "mirage_service.py", env) as af:
            af.cli("dags", "trigger", "mirage_service", "--run-id", RUN_ID, "--conf", json.dumps(KEEPER))
            rec = await_deadline(af, "mirage_service", RUN_ID, interval)

            # the keeper at work: its first job in the queue, no successor decided (an hour off)
            def keeping():
                states = {t["task_id"]: t["state"] for t in af.api("GET", f"{run}/taskInstances")["task_instances"]}
                if states.get("keep_service") in ("failed", "upstream_failed", "skipped", "success"):
                    af.fail(f"keep_service ended instead of keeping: {states}")
                return states if states.get("keep_service") == "running" and jobs() else None

            states = af.wait("keep_service running with its first job submitted", keeping, 120)
            assert states == {"check_conf": "success", "approve": "skipped", "keep_service": "running"}, states
            assert jobs() == ["svc-reactive-0"]
            assert af.api("GET", run)["state"] == "running", rec
            assert _keepers(af.storage), "keep_service runs, but no keep-service step process was found"

            # stopped as a person stops it: the run marked failed; the task stops its step
            af.api("PATCH", run, {"state": "failed"})
            af.wait("the keeper's step stopped", lambda: not _keepers(af.storage), 90)
            ti = af.api("GET", f"{run}/taskInstances/keep_service")
            assert ti["state"] == "failed", ti
            # the step submitted nothing more and cancelled nothing (its job is the service's)
            assert jobs() == ["svc-reactive-0"] and not (slurm / "cancelled").exists()
    finally:
        for pid in _keepers(tmp_path / "storage"):  # what a failure above left running
            with contextlib.suppress(ProcessLookupError):
                stop_group(os.getpgid(pid))


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
