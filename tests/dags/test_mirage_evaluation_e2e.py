"""``mirage_evaluation`` from its form: a log described by the params is ingested, calibrated and its
waits predicted at submission time; a description that cannot be used fails at ``plan``
naming the field. ``dag.test()`` does not raise when a task fails: every test checks ``dr.state``."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, load_dag, task_states

sys.path.insert(0, str(REPO / "tests" / "mirage"))
from test_waitpred import _log  # the simulated log of the wait predictor's tests

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 12, 1, tzinfo=UTC)
START = 1_700_000_400  # test_sim_support.T0: 2023-11-14 22:20 UTC


def _swf(path: Path) -> Path:
    """A 60-day SWF log of 900 jobs on 16 nodes whose starts are a simulator's own schedule. Give it a
    path under the storage root: a form's trace is read only there or in the shipped traces."""
    path.parent.mkdir(parents=True, exist_ok=True)
    submit, start, dur, nodes, limit, user = _log(seed=5, n=900, days=60)
    lines = [f"; UnixStartTime: {START}", "; TimeZoneString: UTC", "; MaxNodes: 16", "; MaxProcs: 16"]
    for i in range(len(submit)):
        lines.append(
            " ".join(
                str(int(v))
                for v in (
                    i + 1,
                    submit[i] - START,
                    start[i] - submit[i],
                    dur[i],
                    nodes[i],
                    -1,
                    -1,
                    nodes[i],
                    limit[i],
                    -1,
                    1,
                    user[i] + 1,
                    1,
                    -1,
                    1,
                    -1,
                    -1,
                    -1,
                )
            )
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _conf(trace: Path, **over) -> dict:
    conf = {
        "name": "tiny",
        "trace": str(trace),
        "timezone": None,
        "procs_per_node": 1,
        "machine_nodes": None,
        "calibrate_from": "2023-11-15",
        "calibrate_to": "2023-12-01",
        "months": ["2023-12"],
        "trials": 2,
        "timeout_s": 30,
    }
    conf.update(over)
    return conf


def test_a_log_from_the_form_is_scored_at_submission(local_storage, tmp_path):
    dr = load_dag("mirage_evaluation").test(
        logical_date=LOGICAL_DATE, run_conf=_conf(_swf(local_storage / "inputs" / "tiny.swf"))
    )
    assert str(dr.state) == "success", task_states(dr)
    out = local_storage / "mirage_evaluation" / "tiny"
    doc = json.loads((out / "waitpred" / "waitpred.json").read_text())
    assert doc["n_scored"] > 100 and doc["pick"] in doc["tail"]
    cov = doc["out_of_sample"]["guarded"]["pooled"]["coverage"]
    assert 0.5 < cov <= 1.0 and np.isfinite(doc["out_of_sample"]["zero"]["pooled"]["mae_h"])
    cfg = json.loads((out / "cal" / "config.json").read_text())
    assert cfg["nodes"] <= 16  # never above the log's stated machine
    # a second run of the name with other inputs (another calibration budget) is refused at calibrate
    # (exit 2, not retried): the log's trace, calibration and wait predictor stay the ones that belong together
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    dr = load_dag("mirage_evaluation").test(
        logical_date=datetime(2026, 12, 2, tzinfo=UTC),
        run_conf=_conf(local_storage / "inputs" / "tiny.swf", trials=3),
    )
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["ingest"] == "success" and states["calibrate"] == "failed", states
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_a_description_that_cannot_be_used_fails_at_plan_naming_the_field(local_storage, tmp_path):
    conf = _conf(_swf(local_storage / "inputs" / "tiny.swf"), months=["2023-11"])  # before the calibration period ends
    dr = load_dag("mirage_evaluation").test(logical_date=LOGICAL_DATE, run_conf=conf)
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["plan"] == "failed", states
    assert states["ingest"] in ("upstream_failed", "None"), states
    assert not (local_storage / "mirage_evaluation" / "tiny").exists()
