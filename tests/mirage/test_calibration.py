"""calibrate: what it reads from a trace, and the step end to end on small synthetic traces."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from step_cli import (
    DAY,
    refused,
    run_step,
    trace,  # noqa: F401 (a fixture)
)
from test_fidelity import CFG, _self_made_trace
from test_sim_support import T0, frame

from mirage_tasks.__main__ import STEPS
from mirage_tasks.calibration.calibrate import month_windows, objective_value, sustained_max, trace_facts
from mirage_tasks.data.schema import TraceMeta, write_trace
from mirage_tasks.data.times import iso
from mirage_tasks.sim import SimConfig, Workload
from mirage_tasks.sim.config import load_config
from stepkit.cli import main

H = 3600


def _cli(*argv: str) -> int:
    return main("mirage_tasks", {"calibrate": ("mirage_tasks.steps.calibrate", "")}, ["calibrate", *argv])


def test_trace_facts_sustained_concurrency_and_dispatch_latency():
    rows = []
    # user a: 3 jobs of 2 nodes together for 2 h; user b: a burst of 10 one-node jobs for 60 s
    for _ in range(3):
        rows.append({"submit": T0, "start": T0 + 4, "end": T0 + 2 * H, "limit": 3 * H, "nodes": 2, "user": "a"})
    for _ in range(10):
        rows.append(
            {"submit": T0 + 5 * H, "start": T0 + 5 * H + 2, "end": T0 + 5 * H + 62, "limit": H, "nodes": 1, "user": "b"}
        )
    rows.append({"submit": T0, "start": T0 + 9 * H, "end": T0 + 10 * H, "limit": H, "nodes": 1, "user": "c"})
    wl = Workload.from_frame(frame(rows))
    f = trace_facts(wl, T0, T0 + 12 * H)
    assert f.user_max_jobs == 3 and f.user_max_nodes == 6  # b's one-minute burst of 10 does not count
    assert f.peak_busy_nodes == 6 and f.instant_max_busy_nodes == 10 and f.max_job_nodes == 2
    assert f.dispatch_latency_s == 2  # median of the waits <= 60 s: 4, 4, 4, 2 x 10
    assert f.jobs == 14 and f.has_priority is False
    assert f.quick_start_share == pytest.approx(13 / 14, abs=1e-4)


def test_sustained_max_ignores_spikes():
    t = np.array([0, 10, 20, 5000])
    level = np.array([5, 50, 5, 0])
    assert sustained_max(t, level, 10000, 3600) == 5
    assert sustained_max(t, level, 10000, 5) == 50


def test_month_windows_follow_the_trace_time_zone():
    a = int(pd.Timestamp("2022-11-15T00:00", tz="America/Chicago").timestamp())
    b = int(pd.Timestamp("2023-01-10T00:00", tz="America/Chicago").timestamp())
    w = month_windows(a, b, "America/Chicago")
    local = [pd.Timestamp(x, unit="s", tz="UTC").tz_convert("America/Chicago").strftime("%m-%d %H") for x, _ in w]
    assert local == ["11-15 00", "12-01 00", "01-01 00"] and w[-1][1] == b
    assert all(x < y for x, y in w)


def test_objective_prefers_the_exact_replay():
    perfect = {"n": 10, "mae_h": 0.0, "zero_mae_h": 2.0, "within_1h": 1.0, "daily_corr": 1.0}
    zero = {"n": 10, "mae_h": 2.0, "zero_mae_h": 2.0, "within_1h": 0.6, "daily_corr": float("nan")}
    assert objective_value(perfect) == 0.0 and objective_value(zero) == pytest.approx(1 + 0.4 + 0.25)
    assert objective_value({"n": 0}) == float("inf")


@pytest.fixture(scope="module")
def self_made(tmp_path_factory):
    """A 70-day trace whose real starts are CFG's own schedule (16 nodes, 4 jobs per user)."""
    d = tmp_path_factory.mktemp("cal")
    df = _self_made_trace()
    uri = str(d / "trace")
    write_trace(uri + "/trace.parquet", df, TraceMeta(source="self", format="test", timezone="UTC"))
    (d / "cfg.json").write_text(json.dumps(CFG.to_dict()))
    return d, uri


def _day(k: int) -> str:
    return pd.Timestamp(T0 + k * 86400, unit="s", tz="UTC").isoformat()


def test_calibrate_recovers_the_configuration_that_made_the_trace(self_made, tmp_path):
    d, uri = self_made
    out = tmp_path / "cal"
    rc = _cli(
        "--trace",
        uri,
        "--calibrate-from",
        _day(20),
        "--calibrate-to",
        _day(40),
        "--score-from",
        _day(40),
        "--score-to",
        _day(60),
        "--out",
        str(out),
        "--trials",
        "4",
        "--start-config",
        str(d / "cfg.json"),
        "--lead-in-days",
        "3",
    )
    assert rc == 0
    doc = json.loads((out / "calibration.json").read_text())
    for block in ("in_sample", "out_of_sample"):
        assert {"mae_h", "zero_mae_h", "within_1h", "spearman", "daily_corr"} <= set(doc[block])
    # the generating configuration wins: exact in sample, within seconds out of sample (month cuts)
    assert doc["in_sample"]["mae_h"] == 0 and doc["out_of_sample"]["mae_h"] < 0.01
    assert doc["out_of_sample"]["zero_mae_h"] > 0.1 and doc["beats_zero_wait"] is True and not doc["warnings"]
    assert doc["mae_reduction_vs_zero"]["out_of_sample"] > 0.99
    assert doc["trace_facts"]["user_max_jobs"] <= CFG.max_jobs_per_user
    assert doc["search"]["trials_run"] == 4 and doc["search"]["stopped_by"] == "trials"
    chosen = SimConfig.from_dict(load_config(str(out / "config.json")))  # usable as --cluster-config
    assert chosen.nodes == CFG.nodes and chosen.max_jobs_per_user == CFG.max_jobs_per_user
    trials = pd.read_parquet(out / "trials.parquet")
    assert len(trials) == 4 and trials.objective.min() == pytest.approx(0, abs=1e-12)
    md = (out / "calibration.md").read_text()
    assert "WARNING" not in md and "out of sample" in md
    # the same inputs again: skipped
    assert (
        _cli(
            "--trace",
            uri,
            "--calibrate-from",
            _day(20),
            "--calibrate-to",
            _day(40),
            "--score-from",
            _day(40),
            "--score-to",
            _day(60),
            "--out",
            str(out),
            "--trials",
            "4",
            "--start-config",
            str(d / "cfg.json"),
            "--lead-in-days",
            "3",
        )
        == 0
    )


def test_calibrate_warns_when_it_cannot_beat_zero_wait(tmp_path):
    rows = [
        {
            "submit": T0 + k * 1800,
            "start": T0 + k * 1800,
            "end": T0 + k * 1800 + 7200,
            "limit": 7200,
            "nodes": 1 + k % 3,
            "user": f"u{k % 4}",
        }
        for k in range(40 * 48)
    ]
    uri = str(tmp_path / "trace")
    write_trace(uri + "/trace.parquet", frame(rows), TraceMeta(source="idle", format="test", timezone="UTC"))
    out = tmp_path / "cal"
    assert (
        _cli(
            "--trace",
            uri,
            "--calibrate-from",
            _day(2),
            "--calibrate-to",
            _day(15),
            "--score-from",
            _day(15),
            "--score-to",
            _day(30),
            "--out",
            str(out),
            "--trials",
            "2",
            "--lead-in-days",
            "1",
        )
        == 0
    )
    doc = json.loads((out / "calibration.json").read_text())
    assert doc["beats_zero_wait"] is False and doc["out_of_sample"]["zero_mae_h"] == 0
    md = (out / "calibration.md").read_text()
    assert "WARNING" in md and "does NOT beat predicting zero wait" in md and "worse or equal on MAE" in md


@pytest.mark.parametrize(
    "windows, needle",
    [
        ((10, 30, 20, 40), "--score-from"),  # overlapping
        ((30, 20, 40, 50), "--calibrate-to"),  # reversed
        ((10, 20, 80, 90), "--score-from/--score-to"),  # no job submitted there
    ],
)
def test_calibrate_bad_windows_exit_2_and_write_nothing(self_made, tmp_path, capsys, windows, needle):
    _, uri = self_made
    a, b, c, d = (_day(k) for k in windows)
    out = tmp_path / "cal"
    assert (
        _cli(
            "--trace",
            uri,
            "--calibrate-from",
            a,
            "--calibrate-to",
            b,
            "--score-from",
            c,
            "--score-to",
            d,
            "--out",
            str(out),
            "--trials",
            "1",
        )
        == 2
    )
    assert needle in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def test_swf_without_node_counts_ingest_warns_and_calibrate_names_the_flag(tmp_path, capsys):
    """A processor-only SWF log (MaxProcs != MaxNodes): ingest warns and names --procs-per-node;
    calibrate without it exits 2 naming the flag, and works with it."""
    rows = []
    t = 0
    for k in range(1, 1200):
        procs = 16 * (1 + k % 4)
        t += 1500
        rows.append(
            f"{k} {t} {(k * 37) % 5000} {3000 + (k * 13) % 4000} {procs} -1 -1 {procs} 7200 -1 1 "
            f"{k % 5} 1 -1 -1 1 -1 -1"
        )
    text = "\n".join(
        ["; UnixStartTime: 1000000000", "; TimeZoneString: Europe/Paris", "; MaxNodes: 8", "; MaxProcs: 128", *rows]
    )
    path = tmp_path / "t.swf"
    path.write_text(text + "\n")
    out = tmp_path / "trace"
    assert (
        main(
            "mirage_tasks",
            {"ingest": ("mirage_tasks.steps.ingest", "")},
            ["ingest", "--trace", str(path), "--out", str(out)],
        )
        == 0
    )
    printed = capsys.readouterr()
    assert "--procs-per-node" in printed.out and "16.0 per node" in printed.out
    assert json.loads((out / "ingest_report.json").read_text())["jobs_without_node_count"] == 1199
    windows = [
        "--calibrate-from",
        "2001-09-09T12:00:00",
        "--calibrate-to",
        "2001-09-16T00:00:00",
        "--score-from",
        "2001-09-16T00:00:00",
        "--score-to",
        "2001-09-23T00:00:00",
        "--trials",
        "2",
        "--lead-in-days",
        "1",
    ]
    assert _cli("--trace", str(out), "--out", str(tmp_path / "c1"), *windows) == 2
    err = capsys.readouterr().err
    assert "--procs-per-node" in err and "procs_per_node" not in err
    assert _cli("--trace", str(out), "--out", str(tmp_path / "c2"), *windows, "--procs-per-node", "16") == 0
    doc = json.loads((tmp_path / "c2" / "calibration.json").read_text())
    assert doc["config"]["procs_per_node"] == 16 and doc["trace_facts"]["max_job_nodes"] == 4


def _idle_workload() -> Workload:
    rows = [
        {
            "submit": T0 + k * 1800,
            "start": T0 + k * 1800,
            "end": T0 + k * 1800 + 3600,
            "limit": 7200,
            "nodes": 1 + k % 3,
            "user": f"u{k % 4}",
        }
        for k in range(10 * 48)
    ]
    return Workload.from_frame(frame(rows))


def test_calibration_budget_is_its_trials_with_progress_and_a_wall_limit_fails_clearly(monkeypatch, caplog):
    import time

    from mirage_tasks.calibration import calibrate as cal_mod

    wl = _idle_workload()
    real_replay = cal_mod.replay_months

    def busy_replay(*a, **kw):  # a busy machine: every replay is slow
        time.sleep(0.05)
        return real_replay(*a, **kw)

    monkeypatch.setattr(cal_mod, "replay_months", busy_replay)
    kw = dict(tz="UTC", lead_in_s=86400, trials=3, seed=0)
    with caplog.at_level("INFO", logger="mirage_tasks.calibration.calibrate"):
        res = cal_mod.calibrate(wl, T0 + 2 * 86400, T0 + 8 * 86400, **kw)  # no wall limit by default
    assert len(res.trials) == 3 and res.stopped_by == "trials"
    lines = [r.getMessage() for r in caplog.records if "trial" in r.getMessage()]
    assert any("trial 1 of 3" in m and "elapsed" in m and "ETA" in m for m in lines), lines
    assert any("trial 3 of 3" in m and "ETA 0s" in m for m in lines), lines
    # an explicit wall limit reached before the trials ran: a clear failure, never a smaller search's answer
    with pytest.raises(cal_mod.CalibrationTimeout, match=r"--timeout-s 0\.01: .* after 1 of 3 trials"):
        cal_mod.calibrate(wl, T0 + 2 * 86400, T0 + 8 * 86400, timeout_s=0.01, **kw)


def test_calibrate_step_has_no_wall_limit_unless_asked():
    import argparse

    from mirage_tasks.run import evalplan
    from mirage_tasks.steps import calibrate as step

    p = argparse.ArgumentParser()
    step.add_arguments(p)
    args = p.parse_args("--trace t --calibrate-from a --calibrate-to b --score-from c --score-to d --out o".split())
    assert args.timeout_s == 0
    spec = evalplan.LogSpec.from_dict(
        {"name": "s", "trace": "/x.swf", "calibrate": ["2024-01-01", "2024-02-01"], "months": ["2024-02"]}
    )
    cal = dict(evalplan.waitpred_argvs(spec, "/r"))["calibrate"]
    assert "--timeout-s" not in cal
    cal = dict(evalplan.waitpred_argvs(spec, "/r", evalplan.Budget(timeout_s=60.0)))["calibrate"]
    assert cal[cal.index("--timeout-s") + 1] == "60"


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


def test_calibrate_windows_outside_the_trace_exit_2_naming_the_flags(trace, tmp_path, capsys):
    out = tmp_path / "cal"
    past = [
        "--calibrate-from",
        iso(T0 + DAY),
        "--calibrate-to",
        iso(T0 + 3 * DAY),
        "--score-from",
        iso(T0 + 3 * DAY),
        "--score-to",
        iso(T0 + 40 * DAY),
    ]
    err = refused(capsys, out, "calibrate", "--trace", trace, *past, "--out", out, names="--score-from/--score-to")
    assert "past the trace's last submit" in err
    before = [
        "--calibrate-from",
        iso(T0 - 90 * DAY),
        "--calibrate-to",
        iso(T0 - 60 * DAY),
        "--score-from",
        iso(T0 + DAY),
        "--score-to",
        iso(T0 + 3 * DAY),
    ]
    err = refused(
        capsys, out, "calibrate", "--trace", trace, *before, "--out", out, names="--calibrate-from/--calibrate-to"
    )
    assert "ends before the trace begins" in err


def test_calibrate_with_a_month_before_the_trace_runs_instead_of_an_index_error(trace, tmp_path, capsys):
    """The calibration window's first month holds no job (it starts 20 days before the trace):
    its replay is empty, which raised IndexError in calibration/fidelity.py."""
    rc, err = run_step(
        capsys,
        "calibrate",
        "--trace",
        trace,
        "--calibrate-from",
        iso(T0 - 20 * DAY),
        "--calibrate-to",
        iso(T0 + DAY),
        "--score-from",
        iso(T0 + 3 * DAY),
        "--score-to",
        iso(T0 + 4 * DAY),
        "--trials",
        "2",
        "--out",
        tmp_path / "o",
        "--log-level",
        "ERROR",
    )
    assert rc == 0, err[-3000:]


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(a=st.integers(-60, 30), la=st.integers(-1, 40), gap=st.integers(0, 20), lc=st.integers(-1, 40))
def test_any_calibrate_windows_are_calibrated_or_refused(trace, tmp_path_factory, a, la, gap, lc):
    """Random calibration and scoring windows (quarter days) around and outside the trace:
    exit 0 or 2, never a traceback."""
    out = tmp_path_factory.mktemp("cal") / "o"
    t = [
        T0 + a * DAY // 4,
        T0 + (a + la) * DAY // 4,
        T0 + (a + la + gap) * DAY // 4,
        T0 + (a + la + gap + lc) * DAY // 4,
    ]
    rc = main(
        "mirage_tasks",
        STEPS,
        [
            "calibrate",
            "--trace",
            trace,
            "--calibrate-from",
            iso(t[0]),
            "--calibrate-to",
            iso(t[1]),
            "--score-from",
            iso(t[2]),
            "--score-to",
            iso(t[3]),
            "--trials",
            "1",
            "--out",
            str(out),
            "--log-level",
            "ERROR",
        ],
    )
    assert rc in (0, 2)
