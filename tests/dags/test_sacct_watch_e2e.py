"""A sacct export dropped into the watched folder starts the sampling of its day, under a real Airflow.

PostgreSQL, ``airflow scheduler`` (LocalExecutor), ``airflow triggerer`` (which runs the house
``SacctExportTrigger`` of the ``sacct_exports`` asset) and ``airflow api-server``, with the real
``mirage_samples`` DAG file and ``HOUSE_SACCT_EXPORT_URI`` naming a folder under the allowed
input roots. The test drops the Lonestar6 log into the folder as ``ls6-2023-01-10.log.gz``
(written under a ``.part`` name, then renamed, as an exporter should) and a file whose name has
no day, then waits for an asset-triggered run of ``mirage_samples`` whose ``sample`` tasks
commit the day's partitions with the folder as the trace (the badly named file skipped by
``ingest``), the triggerer's log naming the day, and no run for
the badly named file (its reason in the triggerer's log). Everything started is stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tests" / "ui"))
from airflow_ui import airflow_env, free_port
from services import postgres, start_services, stop_group, tail

pytestmark = pytest.mark.timeout(480)

DAY = "2023-01-10"


def test_an_export_dropped_in_the_folder_samples_its_day(tmp_path, ls6_log):
    import sqlalchemy as sa

    home, storage, dags, site = (tmp_path / n for n in ("home", "storage", "dags", "site"))
    exports = site / "exports"
    for d in (home, storage, dags, exports):
        d.mkdir(parents=True)
    shutil.copy(REPO / "dags" / "mirage_samples.py", dags)  # the real DAG file, alone in its folder
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
                "AIRFLOW__CORE__PARALLELISM": "3",
                "HOUSE_INPUT_ROOTS": str(site),
                "HOUSE_SACCT_EXPORT_URI": f"file://{exports}",
                "HOUSE_SACCT_EXPORT_POLL": "2",
                "HOUSE_SACCT_EXPORT_TIMEZONE": "America/Chicago",
            }
        )
        airflow = [sys.executable, "-m", "airflow"]
        engine = sa.create_engine(db_url)

        def cli(*argv: str) -> str:
            p = subprocess.run([*airflow, *argv], env=env, cwd=home, capture_output=True, text=True, timeout=240)
            assert p.returncode == 0, f"airflow {' '.join(argv)}: {p.stderr[-3000:]}"
            return p.stdout

        def runs() -> list[dict]:
            with engine.connect() as c:
                rows = c.execute(sa.text("select run_id, run_type, state from dag_run where dag_id = 'mirage_samples'"))
                return [dict(r._mapping) for r in rows]

        def fail(why: str):
            pytest.fail(why + f"\nruns: {runs()}\n" + "\n".join(tail(p) for p in logs.values()))

        try:
            cli("db", "migrate")
            cli("dags", "reserialize")
            cli("dags", "unpause", "mirage_samples")
            # a paused DAG's assets have no watcher: parsed again once unpaused (a dag-processor would)
            cli("dags", "reserialize")
            start_services(airflow, env, home, port, procs, logs)

            # the exporter writes under a temporary name, then renames: the watcher sees whole files only
            part = exports / f"ls6-{DAY}.log.gz.part"
            shutil.copy(ls6_log, part)
            os.rename(part, exports / f"ls6-{DAY}.log.gz")
            (exports / "ls6-latest.log.gz").write_bytes(b"no day in this name")

            end = time.monotonic() + 200
            while True:
                triggered = [r for r in runs() if r["run_type"] == "asset_triggered"]
                if any(r["state"] in ("success", "failed") for r in triggered):
                    break
                dead = [n for n, p in procs.items() if p.poll() is not None]
                if dead or time.monotonic() > end:
                    fail(f"{', '.join(dead)} exited" if dead else "no asset-triggered run finished in 200 s")
                time.sleep(2)
            if [r["state"] for r in triggered] != ["success"]:
                fail(f"expected one successful asset-triggered run: {triggered}")
            run_id = triggered[0]["run_id"]
            with engine.connect() as c:
                tis = c.execute(
                    sa.text(
                        "select task_id, map_index, state, rendered_map_index from task_instance "
                        "where dag_id = 'mirage_samples' and run_id = :r"
                    ),
                    {"r": run_id},
                ).all()
                [extra] = c.execute(
                    sa.text(
                        "select e.extra from asset_event e join asset a on a.id = e.asset_id where a.name = 'mirage_samples'"
                    )
                ).one()
            samples = sorted((t.rendered_map_index, t.state) for t in tis if t.task_id == "sample")
            assert samples == [(f"node 1 · {DAY}", "success"), (f"node 8 · {DAY}", "success")], tis
            # the day's partitions, sampled from the dropped file, and the event naming both
            parts = sorted(storage.glob(f"mirage/samples/node*-*/day={DAY}/_SUCCESS.json"))
            assert len(parts) == 2, parts
            extra = extra if isinstance(extra, dict) else json.loads(extra)
            # the folder is the run's trace (one family for every watched day; mirage_monthly's month)
            assert extra["day"] == DAY and extra["params"]["trace"] == f"file://{exports}", extra
            trig = logs["triggerer"].read_text(errors="replace")
            assert f"sacct export ls6-{DAY}.log.gz brings {DAY}" in trig, tail(logs["triggerer"])
            assert "sacct export 'ls6-latest.log.gz': no day (YYYY-MM-DD) in its name" in trig
        finally:
            for name in reversed(list(procs)):
                stop_group(procs[name].pid)
                procs[name].wait(timeout=10)
            engine.dispose()
