"""``mirage_samples`` under ``dag.test()`` (local mode, real child processes): one trace day's
partitions, skipped when complete, an asset event naming the day, and the pipeline's merge
reading the same partitions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import load_dag, task_states

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("airflow_db")]


@pytest.fixture
def storage(local_storage) -> Path:
    return local_storage


def _dag():
    return load_dag("mirage_samples")


_states = task_states


def test_one_day_then_skip_then_next_day(storage, ls6_log):
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    dag = _dag()
    conf = {"trace": str(ls6_log), "trace_timezone": "America/Chicago", "node_sizes": [1]}
    day = datetime(2023, 1, 10, tzinfo=UTC)
    dr = dag.test(logical_date=day, run_conf=conf)
    assert dr.state == "success", _states(dr)
    # the grid labels each instance with the plan's label (node size, day)
    assert [ti.rendered_map_index for ti in dr.get_task_instances() if ti.task_id == "sample"] == [
        "node 1 · 2023-01-10"
    ]
    parts = sorted(storage.glob("mirage/samples/node1-*/day=*"))
    assert [p.name for p in parts] == ["day=2023-01-10"]
    marker = json.loads((parts[0] / "_SUCCESS.json").read_text())
    assert marker["step"] == "sample" and marker["summary"]["n_samples"] == 6  # every 4 h from midnight
    assert len(list(storage.glob("mirage/traces/*/_SUCCESS.json"))) == 1
    stamp = (parts[0] / "_SUCCESS.json").stat().st_mtime_ns

    # the same day again: nothing to sample (the mapped task has no instance), the event still names the day
    dr = dag.test(logical_date=day, run_conf=conf)
    assert dr.state == "success", _states(dr)
    assert _states(dr)["sample"] == "skipped"
    assert (parts[0] / "_SUCCESS.json").stat().st_mtime_ns == stamp

    # the next day: its own partition in the same family, the same ingested trace
    dr = dag.test(logical_date=datetime(2023, 1, 11, tzinfo=UTC), run_conf=conf)
    assert dr.state == "success", _states(dr)
    assert [p.name for p in sorted(storage.glob("mirage/samples/node1-*/day=*"))] == [
        "day=2023-01-10",
        "day=2023-01-11",
    ]
    assert len(list(storage.glob("mirage/traces/*/_SUCCESS.json"))) == 1
    with create_session() as session:
        events = session.query(AssetEvent).filter(AssetEvent.asset.has(name="mirage_samples")).all()
        days = [e.partition_key[:10] for e in events]
    assert days.count("2023-01-10") == 2 and days.count("2023-01-11") == 1

    # the pipeline's merge reads the partitions: a window inside those two days
    import subprocess
    import sys

    family = parts[0].parent
    out = storage / "dataset"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mirage_tasks",
            "merge",
            "--in",
            str(family / "day=2023-01-10"),
            str(family / "day=2023-01-11"),
            "--start",
            "2023-01-10T08:00:00+00:00",
            "--count",
            "8",
            "--interval-hours",
            "4",
            "--out",
            str(out),
        ],
        check=True,
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["n_samples"] == 8 and manifest["sample_start_min_iso"] == "2023-01-10T08:00:00+00:00"
