"""``devtools/backfill.py``: a backfill of a paused DAG fails at once with a message that says
how to unpause (Airflow 3 would leave its runs queued forever); with ``--unpause`` it unpauses
and creates the backfill. Through the real airflow CLI on the test database."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HOUSE_NO_VARIABLES="1", HOUSE_RUNNER="local")
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_backfill_of_a_paused_dag_is_refused_then_runs_with_unpause(airflow_db):
    from airflow.models.backfill import Backfill, BackfillDagRun
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    p = _run("-m", "airflow", "dags", "reserialize")
    assert p.returncode == 0, p.stderr[-2000:]
    assert DagModel.get_dagmodel("mirage_samples").is_paused  # paused at creation

    dates = ["--from-date", "2023-01-01", "--to-date", "2023-01-02"]
    refused = _run("devtools/backfill.py", "--dag-id", "mirage_samples", *dates)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "airflow dags unpause mirage_samples" in refused.stderr and "Nothing was created" in refused.stderr
    with create_session() as session:
        assert not session.scalars(select(Backfill).where(Backfill.dag_id == "mirage_samples")).all()

    unknown = _run("devtools/backfill.py", "--dag-id", "no_such_dag", *dates)
    assert unknown.returncode == 2 and "no DAG 'no_such_dag'" in unknown.stderr

    made = _run(
        "devtools/backfill.py",
        "--dag-id",
        "mirage_samples",
        "--unpause",
        *dates,
        "--dag-run-conf",
        '{"node_sizes": [1]}',
    )
    assert made.returncode == 0, made.stderr[-2000:]
    assert not DagModel.get_dagmodel("mirage_samples").is_paused
    with create_session() as session:
        backfills = session.scalars(select(Backfill).where(Backfill.dag_id == "mirage_samples")).all()
        assert len(backfills) == 1 and backfills[0].dag_run_conf == {"node_sizes": [1]}
        runs = session.scalars(select(BackfillDagRun).where(BackfillDagRun.backfill_id == backfills[0].id)).all()
        assert len([r for r in runs if r.dag_run_id is not None]) == 2
