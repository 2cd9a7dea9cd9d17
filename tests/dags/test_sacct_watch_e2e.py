"""Sacct exports dropped into the watched folder start the sampling of the days they complete, under a real Airflow.

PostgreSQL, ``airflow scheduler`` (LocalExecutor), ``airflow triggerer`` (which runs the house
``SacctExportTrigger`` of the ``sacct_exports`` asset) and ``airflow api-server``, with the real
``mirage_samples`` DAG file and ``HOUSE_SACCT_EXPORT_URI`` naming a folder under the allowed
input roots. The test drops a week of daily exports of the Lonestar6 log into the folder
(``ls6-2023-01-04.log.gz`` .. ``ls6-2023-01-10.log.gz``, each written under a ``.part`` name,
then renamed, as an exporter should) and a file whose name has no day, then waits for the
asset-triggered runs of ``mirage_samples`` (the scheduler may give several exports one run):
those whose newest export completes a day before the folder's first skip, and the one of Jan
10's export commits Jan 4's partitions with the folder as the trace (the badly named file skipped by ``ingest``); the triggerer's log names the
days, and no run starts for the badly named file (its reason in the triggerer's log).
Everything started is stopped at the end.
"""

from __future__ import annotations

import gzip
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

#: A week of daily exports; the last completes the day six days before it (a day and the
#: five-day workload: mirage_tasks.run.plan.export_sample_day), the folder's first.
EXPORTS = [f"2023-01-{d:02d}" for d in range(4, 11)]
DAY = "2023-01-04"


def export_of(ls6_log, day: str) -> str:
    """The ls6 log's jobs submitted on local ``day``, as that day's sacct export."""
    lines = gzip.open(ls6_log, "rt").read().splitlines()
    head, rows = lines[1:3], lines[3:]
    return "\n".join([*head, *(r for r in rows if r.split("\t")[4:5] and r.split("\t")[4][:10] == day)]) + "\n"


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

            def drop(day: str) -> None:
                """The exporter writes under a temporary name, then renames: the watcher sees whole files only."""
                part = exports / f"ls6-{day}.log.gz.part"
                part.write_bytes(gzip.compress(export_of(ls6_log, day).encode()))
                os.rename(part, exports / f"ls6-{day}.log.gz")

            def wait(done, why: str) -> list[dict]:
                end = time.monotonic() + 200
                while True:
                    triggered = [r for r in runs() if r["run_type"] == "asset_triggered"]
                    if done(triggered) and all(r["state"] in ("success", "failed") for r in triggered):
                        return triggered
                    dead = [n for n, p in procs.items() if p.poll() is not None]
                    if dead or time.monotonic() > end:
                        fail(f"{', '.join(dead)} exited" if dead else f"{why} in 200 s")
                    time.sleep(2)

            # six days of exports land together: each completes a day before the folder's first
            for day in EXPORTS[:-1]:
                drop(day)
            (exports / "ls6-latest.log.gz").write_bytes(b"no day in this name")
            announced = f"sacct export ls6-{EXPORTS[-2]}.log.gz brings {EXPORTS[-2]}"
            wait(lambda t: t and announced in logs["triggerer"].read_text(errors="replace"), "not announced")

            def sampled() -> int:
                with engine.connect() as c:
                    return c.execute(
                        sa.text(
                            "select count(*) from asset_event e join asset a on a.id = e.asset_id "
                            "where a.name = 'mirage_samples'"
                        )
                    ).scalar()

            # the next day's export completes Jan 4: its run samples it
            drop(EXPORTS[-1])
            triggered = wait(lambda t: sampled(), f"no day sampled from {len(EXPORTS)} exports")
            if not triggered or any(r["state"] != "success" for r in triggered):
                fail(f"expected successful asset-triggered runs: {triggered}")
            with engine.connect() as c:
                tis = c.execute(
                    sa.text(
                        "select run_id, task_id, map_index, state, rendered_map_index from task_instance "
                        "where dag_id = 'mirage_samples' and run_id = any(:ids)"
                    ),
                    {"ids": [r["run_id"] for r in triggered]},
                ).all()
                [extra] = c.execute(
                    sa.text(
                        "select e.extra from asset_event e join asset a on a.id = e.asset_id where a.name = 'mirage_samples'"
                    )
                ).one()
            # the first six exports complete days before the folder's first export: a run of only those skips
            plans = sorted(t.state for t in tis if t.task_id == "plan")
            assert plans == ["skipped"] * (len(triggered) - 1) + ["success"], tis
            # (a skipped run's sample task is skipped unmapped)
            samples = sorted(
                (t.rendered_map_index, t.state) for t in tis if t.task_id == "sample" and t.state != "skipped"
            )
            assert samples == [(f"node 1 · {DAY}", "success"), (f"node 8 · {DAY}", "success")], tis
            # the day's partitions, sampled from the folder, and the event naming the folder as the trace
            parts = sorted(storage.glob(f"mirage/samples/node*-*/day={DAY}/_SUCCESS.json"))
            assert len(parts) == 2, parts
            extra = extra if isinstance(extra, dict) else json.loads(extra)
            assert extra["day"] == DAY and extra["params"]["trace"] == f"file://{exports}", extra
            trig = logs["triggerer"].read_text(errors="replace")
            assert f"sacct export ls6-{EXPORTS[-1]}.log.gz brings {EXPORTS[-1]}" in trig, tail(logs["triggerer"])
            assert "sacct export 'ls6-latest.log.gz': no day (YYYY-MM-DD) in its name" in trig
        finally:
            for name in reversed(list(procs)):
                stop_group(procs[name].pid)
                procs[name].wait(timeout=10)
            engine.dispose()
