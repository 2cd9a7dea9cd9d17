"""The fitted synthetic generator: determinism, schema, closeness to the real trace."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from step_cli import DAY, refused, run_step
from test_sim_support import T0 as SIM_T0

from mirage_tasks.__main__ import STEPS
from mirage_tasks.data.schema import TraceMeta, read_trace
from mirage_tasks.data.synth import fit_profile, generate, load_profile, month_stats
from mirage_tasks.data.times import iso
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


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


def test_a_100_year_synth_window_is_refused_at_once(tmp_path, capsys):
    out = tmp_path / "o"
    refused(
        capsys,
        out,
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2000-01-01",
        "--to",
        "2100-01-01",
        "--out",
        out,
        names="--from",
    )
    # ten years at x1000: the span is allowed, the expected number of jobs is not
    refused(
        capsys,
        out,
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2000-01-01",
        "--to",
        "2009-01-01",
        "--load-scale",
        "1000",
        "--out",
        out,
        names="--load-scale",
    )


def _profile(tmp_path, edit) -> str:
    from importlib import resources

    from mirage_tasks.data.synth import PACKAGED

    doc = json.loads(resources.files("mirage_tasks.data.profiles").joinpath(PACKAGED["ls6-a100"]).read_text())
    edit(doc)
    p = tmp_path / "profile.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize(
    "key,edit",
    [
        ("machine_nodes", lambda d: d.update(machine_nodes=-4)),
        ("machine_nodes", lambda d: d.update(machine_nodes=2.5)),
        ("batch_gap_s", lambda d: d.update(batch_gap_s=-1)),
        ("shape_nodes_limit_counts", lambda d: d["shape_nodes_limit_counts"][0].__setitem__(0, 1.5)),
        ("shape_nodes_limit_counts", lambda d: d["shape_nodes_limit_counts"][0].__setitem__(1, 0)),
        ("arrivals.batch_size_pmf", lambda d: d["arrivals"]["batch_size_pmf"][0].__setitem__(0, 2.5)),
        (
            "arrivals.batch_rate_per_hour_of_week",
            lambda d: d["arrivals"]["batch_rate_per_hour_of_week"].__setitem__(0, 1e12),
        ),
        ("arrivals.intra_batch_gap_quantiles_s", lambda d: d["arrivals"]["intra_batch_gap_quantiles_s"].reverse()),
        (
            "runtime_by_limit_class.0.ratio_quantiles",
            lambda d: d["runtime_by_limit_class"]["0"].__setitem__(
                "ratio_quantiles", [2.0] * len(d["runtime_by_limit_class"]["0"]["ratio_quantiles"])
            ),
        ),
    ],
)
def test_profile_values_are_checked_in_profile_mode(tmp_path, capsys, key, edit):
    out = tmp_path / "o"
    prof = _profile(tmp_path, edit)
    refused(
        capsys, out, "synth", "--profile", prof, "--from", "2024-01-01", "--to", "2024-01-03", "--out", out, names=key
    )


def test_the_packaged_profile_still_generates(tmp_path, capsys):
    rc, err = run_step(
        capsys, "synth", "--profile", "ls6-a100", "--from", "2024-01-01", "--to", "2024-01-03", "--out", tmp_path / "o"
    )
    assert rc == 0, err[-2000:]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    start_day=st.integers(-40_000, 40_000),
    days=st.one_of(st.integers(-5, 30), st.integers(36_610, 600_000)),
    load=st.one_of(st.floats(-10, 50), st.sampled_from([float("nan"), float("inf"), 1e4])),
    seed=st.integers(-5, 2**33),
)
def test_any_synth_request_generates_or_is_refused_quickly(tmp_path_factory, start_day, days, load, seed):
    """Random spans (up to three days, or more than ten years up to 160), load scales and seeds
    for ``synth --profile``: exit 0 or exit 2, never a traceback; a refusal comes before anything
    is generated (within seconds, nothing written)."""
    import time

    out = tmp_path_factory.mktemp("synth") / "o"
    a = SIM_T0 + start_day * DAY // 10
    t = time.monotonic()
    rc = main(
        "mirage_tasks",
        STEPS,
        [
            "synth",
            "--profile",
            "ls6-a100",
            "--from",
            iso(max(a, 0)),
            "--to",
            iso(max(a, 0) + days * DAY // 10),
            "--load-scale",
            str(load),
            "--seed",
            str(seed),
            "--out",
            str(out),
            "--log-level",
            "ERROR",
        ],
    )
    assert rc in (0, 2)
    if rc == 2:
        assert not out.exists()
        assert time.monotonic() - t < 60
