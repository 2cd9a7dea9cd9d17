"""The fidelity report: a trace the simulator produced itself must replay exactly."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from step_cli import (
    DAY,
    SPAN_DAYS,
    refused,
    trace,  # noqa: F401 (a fixture)
)
from test_sim_support import T0, random_trace

from mirage_tasks.__main__ import STEPS
from mirage_tasks.calibration.fidelity import metrics, node_class, replay, summarize
from mirage_tasks.data.schema import TraceMeta, write_trace
from mirage_tasks.data.times import iso
from mirage_tasks.sim import SimConfig, Simulator, Workload
from stepkit.cli import main

CFG = SimConfig(
    nodes=16,
    backfill="conservative",
    bf_interval_s=60,
    priority="age_size",
    weight_size=0.0,
    max_jobs_per_user=4,
    warm_start=True,
)


def _self_made_trace(cfg: SimConfig = CFG, days: float = 70) -> pd.DataFrame:
    """Random jobs whose 'real' start times are this simulator's own schedule under ``cfg``."""
    df = random_trace(21, days=days, nodes=16, rate_per_h=3.4)
    wl = Workload.from_frame(df)
    sim = Simulator.from_workload(wl, cfg, int(wl.submit[0]), int(wl.submit[-1]))
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
    rc = main(
        "mirage_tasks",
        {"fidelity": ("mirage_tasks.steps.fidelity", "")},
        [
            "fidelity",
            "--trace",
            uri,
            "--from",
            t_from.isoformat(),
            "--to",
            t_to.isoformat(),
            "--out",
            str(out),
            "--cluster-config",
            str(tmp_path / "cfg.json"),
            "--sweep-nodes",
            "12",
            "--compare",
            "reference",
        ],
    )
    assert rc == 0
    doc = json.loads((out / "fidelity.json").read_text())
    assert set(doc["reports"]) == {"tested", "reference", "tested@12"}
    tested = doc["reports"]["tested"]
    assert tested["pooled"]["mae_h"] == 0 and len(tested["months"]) >= 2
    assert doc["reports"]["tested@12"]["pooled"]["mae_h"] > tested["pooled"]["mae_h"]
    md = (out / "fidelity.md").read_text()
    assert md.count("| pooled |") == 3 and "ks_1min" in md


def test_share_within_daily_correlation_and_zero_predictor_figures():
    day = 86400
    df = pd.DataFrame(
        {
            "submit": [T0, T0 + 10, T0 + day, T0 + day + 5, T0 + 2 * day, T0 + 3 * day],
            "real_wait_s": [0, 7200, 600, 4000, 36000, 100],
            "sim_wait_s": [300, 3000, 1300, 4000, 30000, 100],
            "nodes": [1, 2, 4, 8, 1, 3],
        }
    )
    m = metrics(df)
    err_h = np.abs(df.sim_wait_s - df.real_wait_s) / 3600
    assert m["within_1h"] == pytest.approx((err_h <= 1).mean()) == pytest.approx(4 / 6)
    assert m["within_10m"] == pytest.approx((err_h <= 1 / 6).mean()) == pytest.approx(3 / 6)
    assert m["zero_within_1h"] == pytest.approx((df.real_wait_s <= 3600).mean())
    assert m["zero_within_10m"] == pytest.approx((df.real_wait_s <= 600).mean())
    assert m["zero_medae_h"] == pytest.approx(np.median(df.real_wait_s) / 3600)
    daily = df.groupby((df.submit - T0) // day)[["real_wait_s", "sim_wait_s"]].mean()
    assert m["daily_corr"] == pytest.approx(np.corrcoef(daily.real_wait_s, daily.sim_wait_s)[0, 1])
    assert np.isnan(metrics(df.assign(sim_wait_s=0))["daily_corr"])  # a constant series has no correlation
    assert list(node_class(np.array([1, 2, 3, 4, 7, 8, 16, 33]))) == [
        "1",
        "2-3",
        "2-3",
        "4-7",
        "4-7",
        "8-15",
        "16-31",
        "32-63",
    ]
    s = summarize(df)
    assert list(s["node_classes"]) == ["1", "2-3", "4-7", "8-15"]
    assert s["node_classes"]["1"]["n"] == 2 and s["node_classes"]["2-3"]["n"] == 2
    # every line carries the zero-wait predictor's figures
    for line in [s["pooled"], *s["months"].values(), *s["node_classes"].values()]:
        assert {"zero_mae_h", "zero_within_1h", "zero_within_10m", "zero_medae_h"} <= set(line)


def test_months_are_in_the_trace_time_zone():
    # 2023-01-01 03:00 UTC is still December 31 in Chicago
    t = int(pd.Timestamp("2023-01-01T03:00:00Z").timestamp())
    df = pd.DataFrame({"submit": [t, t + 86400], "real_wait_s": [10, 20], "sim_wait_s": [10, 20], "nodes": [1, 1]})
    assert list(summarize(df, "America/Chicago")["months"]) == ["2022-12", "2023-01"]
    assert list(summarize(df, "UTC")["months"]) == ["2023-01"]


def test_cli_writes_per_job_waits_and_skips_a_too_small_comparison(tmp_path):
    df = _self_made_trace()
    uri = str(tmp_path / "trace")
    write_trace(uri + "/trace.parquet", df, TraceMeta(source="self", format="test", timezone="Europe/Stockholm"))
    (tmp_path / "cfg.json").write_text(json.dumps(CFG.to_dict()))
    (tmp_path / "small.json").write_text(json.dumps(CFG.replace(nodes=2).to_dict()))
    t_from = pd.Timestamp(T0 + 20 * 86400, unit="s", tz="UTC")
    t_to = pd.Timestamp(T0 + 30 * 86400, unit="s", tz="UTC")
    out = tmp_path / "fid"
    argv = [
        "fidelity",
        "--trace",
        uri,
        "--from",
        t_from.isoformat(),
        "--to",
        t_to.isoformat(),
        "--out",
        str(out),
        "--cluster-config",
        str(tmp_path / "cfg.json"),
        "--lead-in-days",
        "3",
        "--compare",
        str(tmp_path / "small.json"),
    ]
    assert main("mirage_tasks", {"fidelity": ("mirage_tasks.steps.fidelity", "")}, argv) == 0
    doc = json.loads((out / "fidelity.json").read_text())
    assert "skipped" in doc["reports"]["small"] and doc["reports"]["small"]["largest_nodes"] > 2
    assert doc["timezone"] == "Europe/Stockholm" and doc["lead_in_s"] == 3 * 86400
    tested = doc["reports"]["tested"]
    assert tested["pooled"]["mae_h"] == 0 and tested["pooled"]["within_1h"] == 1.0
    assert tested["node_classes"] and sum(r["n"] for r in tested["node_classes"].values()) == tested["pooled"]["n"]
    waits = pd.read_parquet(out / "waits.parquet")
    assert set(waits.config) == {"tested"} and len(waits) == tested["pooled"]["n"]
    assert (waits.real_wait_s == waits.sim_wait_s).all() and waits.job_id.is_unique
    md = (out / "fidelity.md").read_text()
    assert "Skipped:" in md and "Per node class" in md and "zero_within_1h" in md
    # the tested configuration itself too small: bad input, nothing written
    out2 = tmp_path / "fid2"
    argv2 = argv[:7] + ["--out", str(out2), "--cluster-config", str(tmp_path / "small.json")]
    assert main("mirage_tasks", {"fidelity": ("mirage_tasks.steps.fidelity", "")}, argv2) == 2
    assert not out2.exists() or not any(out2.iterdir())


def test_dispatch_latency_is_added_to_simulated_waits():
    df = _self_made_trace()
    wl = Workload.from_frame(df)
    a, b = T0 + 20 * 86400, T0 + 25 * 86400
    base = replay(wl, CFG, a, b)
    lat = replay(wl, CFG.replace(dispatch_latency_s=7), a, b)
    assert (lat.sim_wait_s - base.sim_wait_s == 7).all()


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


def test_fidelity_window_37_days_past_the_last_submit_exits_2(trace, tmp_path, capsys):
    out = tmp_path / "fid"
    refused(
        capsys,
        out,
        "fidelity",
        "--trace",
        trace,
        "--from",
        iso(T0 + (SPAN_DAYS + 30) * DAY),
        "--to",
        iso(T0 + (SPAN_DAYS + 37) * DAY),
        "--nodes",
        "8",
        "--out",
        out,
        names="--from/--to",
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(a=st.integers(-400, 400), length=st.integers(-3, 400))
def test_any_fidelity_window_is_scored_or_refused_naming_the_window(trace, tmp_path_factory, a, length):
    """Random windows, inside, around and far outside the trace: exit 0 or exit 2 naming the
    window, never a traceback (the class that gave an IndexError in calibrate)."""
    out = tmp_path_factory.mktemp("fid") / "o"
    t0 = T0 + a * DAY // 4
    rc = main(
        "mirage_tasks",
        STEPS,
        [
            "fidelity",
            "--trace",
            trace,
            "--from",
            iso(t0),
            "--to",
            iso(t0 + length * DAY // 4),
            "--nodes",
            "8",
            "--compare",
            "--out",
            str(out),
            "--log-level",
            "ERROR",
        ],
    )
    assert rc in (0, 2)
    if rc == 2:
        assert not out.exists()


def test_a_cluster_size_beyond_any_machine_or_a_local_slurm_is_refused(trace, tmp_path, capsys):
    out = tmp_path / "o"
    refused(
        capsys,
        out,
        "fidelity",
        "--trace",
        trace,
        "--from",
        iso(T0 + DAY),
        "--to",
        iso(T0 + 2 * DAY),
        "--nodes",
        "10000000000",
        "--out",
        out,
        names="--nodes",
    )
