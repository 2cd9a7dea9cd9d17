"""The fitted synthetic generator: determinism, schema, closeness to the real trace."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from mirage_tasks.data.schema import TraceMeta, read_trace
from mirage_tasks.data.synth import fit_profile, generate, load_profile, month_stats
from stepkit import StepError
from stepkit.cli import main

STEPS = {"synth": ("mirage_tasks.steps.synth", "")}
T0, T1 = pd.Timestamp("2023-02-01", tz="UTC"), pd.Timestamp("2023-03-01", tz="UTC")


def test_packaged_profile_generates_a_valid_trace(tmp_path):
    out = tmp_path / "syn"
    argv = [
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2023-02-01",
        "--to",
        "2023-02-08",
        "--seed",
        "3",
        "--out",
        str(out),
    ]
    assert main("mirage_tasks", STEPS, argv) == 0
    df, meta = read_trace(str(out))
    assert meta.format == "synthetic" and len(df) > 500
    assert df["submit"].min() >= pd.Timestamp("2023-02-01", tz="UTC")
    assert df["submit"].max() < pd.Timestamp("2023-02-08", tz="UTC")
    assert (df["nodes"] >= 1).all() and df["job_id"].is_unique
    run = (df["end"] - df["start"]).dt.total_seconds()
    assert (run > 0).all() and (run <= df["time_limit_s"]).all()
    assert (df["start"] >= df["submit"]).all()


def test_same_seed_same_trace_other_seed_other_trace():
    prof = load_profile("ls6-a100")
    a = generate(prof, T0, T0 + pd.Timedelta(days=3), seed=7)
    b = generate(prof, T0, T0 + pd.Timedelta(days=3), seed=7)
    c = generate(prof, T0, T0 + pd.Timedelta(days=3), seed=8)
    pd.testing.assert_frame_equal(a, b)
    assert not a["submit"].equals(c["submit"])


def test_refit_recovers_the_profile():
    """Fitting a generated trace gives back statistics close to the generating profile."""
    prof = load_profile("ls6-a100")
    gen = generate(prof, T0, T1, seed=1)
    refit = fit_profile(gen, TraceMeta(source="gen", format="synthetic", timezone="UTC"))
    again = generate(refit, T0, T1, seed=2)
    s1, s2 = month_stats(gen), month_stats(again)
    assert s2["jobs_per_day"] == pytest.approx(s1["jobs_per_day"], rel=0.2)
    assert s2["share_1_node"] == pytest.approx(s1["share_1_node"], abs=0.05)
    assert s2["runtime_over_limit_mean"] == pytest.approx(s1["runtime_over_limit_mean"], abs=0.1)


def test_fit_on_ls6_is_close_to_the_real_month(ls6_parquet, tmp_path):
    out = tmp_path / "fit"
    assert (
        main(
            "mirage_tasks", STEPS, ["synth", "--fit", str(ls6_parquet), "--out", str(out), "--compare-month", "2023-02"]
        )
        == 0
    )
    rows = {r["statistic"]: r for r in json.loads((out / "fit_report.json").read_text())["rows"]}
    assert (out / "fit_report.md").read_text().startswith("# Synthetic vs real: 2023-02")
    for stat, rel in [
        ("jobs_per_day", 0.3),
        ("node_hours_per_day", 0.35),
        ("share_1_node", 0.1),
        ("runtime_over_limit_mean", 0.2),
    ]:
        assert rows[stat]["synthetic"] == pytest.approx(rows[stat]["real"], rel=rel), stat
    profile = json.loads((out / "profile.json").read_text())
    assert "job_id" not in json.dumps(profile)  # numbers only


def test_bad_profile_is_refused(tmp_path, capsys):
    bad = tmp_path / "p.json"
    bad.write_text(json.dumps({"profile_version": 1, "arrivals": {"batch_rate_per_hour_of_week": [1.0] * 10}}))
    with pytest.raises(StepError, match="168"):
        load_profile(str(bad))
    bad.write_text("{oops")
    argv = ["synth", "--profile", str(bad), "--from", "2023-01-01", "--to", "2023-01-02", "--out", str(tmp_path / "o")]
    assert main("mirage_tasks", STEPS, argv) == 2
    assert "not valid JSON" in capsys.readouterr().err
    argv = [
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2023-01-02",
        "--to",
        "2023-01-01",
        "--out",
        str(tmp_path / "o"),
    ]
    assert main("mirage_tasks", STEPS, argv) == 2


def test_generated_arrivals_follow_the_week():
    prof = load_profile("ls6-a100")
    gen = generate(prof, T0, T0 + pd.Timedelta(days=56), seed=0)
    rate = np.asarray(prof["arrivals"]["batch_rate_per_hour_of_week"])
    busiest, quietest = int(rate.argmax()), int(rate.argmin())
    how = gen["submit"].dt.day_of_week * 24 + gen["submit"].dt.hour
    assert (how == busiest).sum() > (how == quietest).sum()
