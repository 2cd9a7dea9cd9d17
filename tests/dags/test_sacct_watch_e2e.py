"""Sacct exports dropped into the watched folder at once get every day they complete sampled, under a real Airflow.

PostgreSQL, ``airflow scheduler`` (LocalExecutor), ``airflow triggerer`` (which runs the house
``SacctExportTrigger`` of the ``sacct_exports`` asset) and ``airflow api-server``, with the real
``mirage_samples`` DAG file and ``HOUSE_SACCT_EXPORT_URI`` naming a folder under the allowed
input roots. The test drops nine daily exports of the Lonestar6 log into the folder at once
(``ls6-2023-01-04.log.gz`` .. ``ls6-2023-01-12.log.gz``, each written under a ``.part`` name,
then renamed, as an exporter should) and a file whose name has no day. The triggerer announces
one export per look; the scheduler gives each run the events queued when its first one came
and leaves the events that came while the DAG was at ``max_active_runs`` to the next export's
run (none here), so a run samples every day the folder's exports complete that is not
committed: the three exports of Jan 10-12 complete Jan 4-6 (a day and the five-day workload),
and the test waits until each of those days has its two partitions committed (each sampled
once) and its ``mirage_samples`` event (partition key the day) published, with the folder as
the trace; no other day is published and no run fails. The triggerer's log names the exports,
and no run starts for the badly named file (its reason in the triggerer's log). Then the
next day's export arrives: its run consumes the export events no run was given (each event
is consumed once in all) and samples Jan 7 alone. Everything started is stopped at the end.
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

#: Nine daily exports; each completes the day six days before it (a day and the five-day
#: workload: mirage_tasks.run.plan.export_sample_day): the last three complete the folder's first three days.
EXPORTS = [f"2023-01-{d:02d}" for d in range(4, 13)]
DAYS = ["2023-01-04", "2023-01-05", "2023-01-06"]


def export_of(ls6_log, day: str) -> str:
    """The ls6 log's jobs submitted on local ``day``, as that day's sacct export."""
    lines = gzip.open(ls6_log, "rt").read().splitlines()
    head, rows = lines[1:3], lines[3:]
    return "\n".join([*head, *(r for r in rows if r.split("\t")[4:5] and r.split("\t")[4][:10] == day)]) + "\n"


def test_exports_dropped_at_once_get_every_day_they_complete_sampled(tmp_path, ls6_log):
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

            def published() -> dict[str, dict]:
                with engine.connect() as c:
                    rows = c.execute(
                        sa.text(
                            "select e.partition_key, e.extra from asset_event e join asset a on a.id = e.asset_id "
                            "where a.name = 'mirage_samples'"
                        )
                    ).all()
                return {k: (x if isinstance(x, dict) else json.loads(x)) for k, x in rows}

            def wait(done, why: str, limit: float) -> list[dict]:
                end = time.monotonic() + limit
                while True:
                    triggered = [r for r in runs() if r["run_type"] == "asset_triggered"]
                    if done(triggered) and all(r["state"] in ("success", "failed") for r in triggered):
                        return triggered
                    dead = [n for n, p in procs.items() if p.poll() is not None]
                    if dead or time.monotonic() > end:
                        fail(f"{', '.join(dead)} exited" if dead else f"{why} in {limit:.0f} s")
                    time.sleep(2)

            # nine exports land together, and a file whose name has no day
            for day in EXPORTS:
                drop(day)
            (exports / "ls6-latest.log.gz").write_bytes(b"no day in this name")
            keys = [f"{d}T00:00:00" for d in DAYS]
            triggered = wait(lambda t: set(keys) <= set(published()), f"not every day of {DAYS} published", 240)
            if not triggered or any(r["state"] != "success" for r in triggered):
                fail(f"expected successful asset-triggered runs: {triggered}")

            def sample_tis(triggered: list[dict]) -> list:
                with engine.connect() as c:
                    return c.execute(
                        sa.text(
                            "select run_id, task_id, map_index, state, rendered_map_index from task_instance "
                            "where dag_id = 'mirage_samples' and run_id = any(:ids)"
                        ),
                        {"ids": [r["run_id"] for r in triggered]},
                    ).all()

            def export_events() -> tuple[int, dict[str, list[str]]]:
                """(the sacct_exports events, the export days each run consumed)."""
                with engine.connect() as c:
                    n = c.execute(
                        sa.text(
                            "select count(*) from asset_event e join asset a on a.id = e.asset_id "
                            "where a.name = 'sacct_exports'"
                        )
                    ).scalar()
                    rows = c.execute(
                        sa.text(
                            "select r.run_id, e.extra from dagrun_asset_event x join asset_event e on e.id = x.event_id "
                            "join asset a on a.id = e.asset_id join dag_run r on r.id = x.dag_run_id "
                            "where a.name = 'sacct_exports' order by e.id"
                        )
                    ).all()
                by_run: dict[str, list[str]] = {}
                for run_id, extra in rows:
                    extra = extra if isinstance(extra, dict) else json.loads(extra)
                    by_run.setdefault(run_id, []).append(extra["payload"]["day"])
                return n, by_run

            tis = sample_tis(triggered)
            n, by_run = export_events()
            print(f"{len(EXPORTS)} exports, {n} events, {len(triggered)} runs consumed: {by_run}")
            # every eligible day sampled once per node size, by whichever run planned after its export landed
            samples = sorted(
                (t.rendered_map_index, t.state) for t in tis if t.task_id == "sample" and t.state != "skipped"
            )
            assert samples == sorted((f"node {n} · {d}", "success") for d in DAYS for n in (1, 8)), tis
            # each day's partitions, sampled from the folder, and one event per day naming the folder as the trace
            for d in DAYS:
                parts = sorted(storage.glob(f"mirage/samples/node*-*/day={d}/_SUCCESS.json"))
                assert len(parts) == 2, (d, parts)
            events = published()
            assert sorted(events) == keys, sorted(events)  # no day before the folder's first export
            for key, extra in events.items():
                assert extra["params"]["trace"] == f"file://{exports}", extra
                assert key[:10] in extra["days"] and len(extra["days"][key[:10]]["partitions"]) == 2, extra

            # every export announced (the days may be sampled before the last is); the events that came
            # while the DAG was at max_active_runs wait, not lost, for the next export's run, which
            # consumes them with its own (each event once)
            end = time.monotonic() + 60
            while export_events()[0] < len(EXPORTS):
                if time.monotonic() > end:
                    fail(f"{export_events()} export events, {len(EXPORTS)} expected")
                time.sleep(2)
            trig = logs["triggerer"].read_text(errors="replace")
            for day in EXPORTS:
                assert f"sacct export ls6-{day}.log.gz brings {day}" in trig, tail(logs["triggerer"])
            assert "sacct export 'ls6-latest.log.gz': no day (YYYY-MM-DD) in its name" in trig
            drop("2023-01-13")  # completes Jan 7
            key = "2023-01-07T00:00:00"
            every = len(EXPORTS) + 1

            def consumed(_t) -> bool:
                return key in published() and sum(map(len, export_events()[1].values())) >= every

            triggered = wait(consumed, "Jan 13's export: Jan 7 unpublished or events left unconsumed", 120)
            n, by_run = export_events()
            print(f"then Jan 13's: {len(triggered)} runs consumed: {by_run}")
            days = sorted(d for ds in by_run.values() for d in ds)
            assert days == sorted([*EXPORTS, "2023-01-13"]), by_run
            samples = sorted(
                t.rendered_map_index for t in sample_tis(triggered) if t.task_id == "sample" and t.state == "success"
            )
            assert samples == sorted(f"node {n} · {d}" for d in [*DAYS, "2023-01-07"] for n in (1, 8)), samples
        finally:
            for name in reversed(list(procs)):
                stop_group(procs[name].pid)
                procs[name].wait(timeout=10)
            engine.dispose()
