"""The fidelity report: a trace the simulator produced itself must replay exactly."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_sim_support import T0, random_trace

from mirage_tasks.steps.fidelity import metrics, replay
from mirage_tasks.schema import TraceMeta, write_trace
from mirage_tasks.sim import SimConfig, Simulator, Workload
from stepkit.cli import main

CFG = SimConfig(nodes=16, backfill="conservative", bf_interval_s=60, priority="age_size", weight_size=0.0,
                max_jobs_per_user=4, warm_start=True)


def _self_made_trace() -> pd.DataFrame:
    """Random jobs whose 'real' start times are this simulator's own schedule."""
    df = random_trace(21, days=70, nodes=16, rate_per_h=3.4)
    wl = Workload.from_frame(df)
    sim = Simulator.from_workload(wl, CFG, int(wl.submit[0]), int(wl.submit[-1]))
    sim.drain()
    start = np.zeros(len(wl), dtype=np.int64)
    for j, tag in enumerate(sim.j_tag):
        start[tag] = sim.j_start[j]
    order = np.argsort(wl.submit, kind="stable")  # df rows are already in submit order
    df = df.iloc[order].reset_index(drop=True)
    df["start"] = pd.to_datetime(start, unit="s", utc=True).astype("datetime64[s, UTC]")
    df["end"] = pd.to_datetime(start + wl.duration, unit="s", utc=True).astype("datetime64[s, UTC]")
    return df


def test_metrics_of_a_perfect_and_a_zero_predictor():
    waits = [0, 3600, 7200, 36000]
    df = pd.DataFrame({"submit": [0, 1, 2, 3], "real_wait_s": waits, "sim_wait_s": waits})
    m = metrics(df)
    assert m["mae_h"] == 0 and m["ks"] == 0 and m["spearman"] == pytest.approx(1.0)
    z = metrics(df.assign(sim_wait_s=0))
    assert z["mae_h"] == pytest.approx(z["zero_mae_h"]) == pytest.approx(df.real_wait_s.mean() / 3600)


def test_self_made_trace_replays_exactly_with_a_warm_start(tmp_path):
    df = _self_made_trace()
    uri = str(tmp_path / "trace")
    write_trace(uri + "/trace.parquet", df, TraceMeta(source="self", format="test", timezone="UTC"))
    (tmp_path / "cfg.json").write_text(json.dumps(CFG.to_dict()))
    t_from = pd.Timestamp(T0 + 20 * 86400, unit="s", tz="UTC")  # mid-trace: needs the warm start
    t_to = pd.Timestamp(T0 + 70 * 86400, unit="s", tz="UTC")
    wl = Workload.from_frame(df)
    rep = replay(wl, CFG, int(t_from.timestamp()), int(t_to.timestamp()))
    assert len(rep) > 1000 and rep["real_wait_s"].mean() > 600
    m = metrics(rep)
    assert m["mae_h"] == 0 and m["ks"] == 0 and m["spearman"] == pytest.approx(1.0)  # exact replay
    out = tmp_path / "fid"
    rc = main("mirage_tasks", {"fidelity": ("mirage_tasks.steps.fidelity", "")},
              ["fidelity", "--trace", uri, "--from", t_from.isoformat(), "--to", t_to.isoformat(),
               "--out", str(out), "--cluster-config", str(tmp_path / "cfg.json"), "--sweep-nodes", "12",
               "--compare", "reference"])
    assert rc == 0
    doc = json.loads((out / "fidelity.json").read_text())
    assert set(doc["reports"]) == {"tested", "reference", "tested@12"}
    tested = doc["reports"]["tested"]
    assert tested["pooled"]["mae_h"] == 0 and len(tested["months"]) >= 2
    assert doc["reports"]["tested@12"]["pooled"]["mae_h"] > tested["pooled"]["mae_h"]
    md = (out / "fidelity.md").read_text()
    assert md.count("| pooled |") == 3 and "ks_1min" in md
