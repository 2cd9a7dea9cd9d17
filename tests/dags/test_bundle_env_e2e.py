"""Through ``dag.test()`` (``airflow dags test``, ``make demo``): a step's marker names the bundle
the DAG came from and that folder's commit.

Airflow 3.3.2 runs ``dag.test()`` tasks in process without a bundle instance; the house finds the
configured ``LocalDagBundle`` holding the DAG file and, as it has no version, the git commit of its
folder. A real ``mirage_tasks synth`` step records them in its ``_SUCCESS.json``.
"""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

import pytest
from conftest import bundle_dags, fake_bundle

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("airflow_db")]

DAG_SOURCE = """
import os
from datetime import timedelta

from airflow.sdk import DAG

from house import steps_for

step, _ = steps_for("mirage_tasks")
with DAG("house_bundle_env", schedule=None):
    step(
        "synth",
        argv=["synth", "--profile", "ls6-a100", "--from", "2023-01-01", "--to", "2023-01-02",
              "--out", os.environ["HOUSE_STORAGE_ROOT"] + "/synth"],
        timeout=timedelta(minutes=5),
    )
"""


def test_dag_test_step_records_its_bundle_and_folder_commit(tmp_path, monkeypatch):
    _, dags, _ = fake_bundle(
        tmp_path, monkeypatch, package="unused", main_source="", dags_source=DAG_SOURCE, bundle="house-dags-local"
    )
    git = ["git", "-C", str(dags), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "the DAG"]):
        subprocess.run([*git, *args], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    root = tmp_path / "storage"
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(root))

    dr = bundle_dags(dags)["house_bundle_env"].test(logical_date=datetime(2026, 12, 1, tzinfo=UTC))
    assert dr.state == "success", {ti.task_id: ti.state for ti in dr.get_task_instances()}
    marker = json.loads((root / "synth" / "_SUCCESS.json").read_text())
    assert marker["code"] == {"bundle_name": "house-dags-local", "bundle_version": sha, "source": "env"}
    assert marker["command"]["package"] == "mirage_tasks" and marker["command"]["argv"][0] == "synth"
