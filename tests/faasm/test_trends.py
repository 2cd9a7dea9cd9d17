"""summarize's trend report and the check step, on a history written through the results API."""

from __future__ import annotations

import base64
import json
import os
import re

from faasm_testutil import cli
from test_trends_history import END, POINTS, day, write_aa_run, write_history, write_run

from faasm_tasks import trends


def _common(root: str, run_id: str, date: str = END) -> list[str]:
    return ["--run-id", run_id, "--results", root, "--date", date]


def test_summarize_writes_trend_report_with_every_plot(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=6)
    write_aa_run(root, END, run_id, fail=False)  # the A/A arms, for the A/A rate's plot
    p = cli("summarize", *_common(root, run_id), "--days", "30", state_dir=str(tmp_path / "st"))
    out = os.path.join(root, END, run_id, "trends")
    assert "trend report over 30 days" in p.stdout
    page = open(os.path.join(out, "trends.html"), encoding="utf-8").read()
    md = open(os.path.join(out, "trends.md"), encoding="utf-8").read()
    marker = json.load(open(os.path.join(out, "_SUCCESS.json")))
    assert marker["step"] == "trends" and "trends.html" in marker["outputs"]
    # self-contained: every figure embedded as a PNG, no external references
    imgs = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    names = [
        "latency_tf_inference_latency",
        "latency_tf_inference_throughput",
        "throughput_latency",
        "sgd_workers",
        "matrix_size",
        "billing",
        "aa_rate",
    ]
    assert len(imgs) == len(names)
    for b64 in imgs:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    assert "src='http" not in page and "<script" not in page
    for n in names:
        assert os.path.getsize(os.path.join(out, "figures", f"{n}.png")) > 2000
        assert f"](figures/{n}.png)" in md
    assert "No data for this plot" not in page
    # the tables: this run's points and the latest value against the days before
    assert "6 days with results" in page and page.count("<tr>") >= 2 * len(POINTS)
    tj = json.load(open(os.path.join(out, "trends.json")))
    assert tj["dates"] == [day(-k) for k in range(5, -1, -1)] and len(tj["trend"]) == len(POINTS)
    assert all(r["days"] == 6 for r in tj["trend"])
    # a rerun with the same records skips; a new day's run in the window changes the report
    p2 = cli("summarize", *_common(root, run_id), state_dir=str(tmp_path / "st"))
    assert "trends: skipped" in p2.stdout
    write_run(root, END, "manual__again")
    p3 = cli("summarize", *_common(root, run_id), state_dir=str(tmp_path / "st"))
    assert "trend report over 30 days" in p3.stdout
    # --days narrows the window
    cli("summarize", *_common(root, run_id), "--days", "2", state_dir=str(tmp_path / "st"))
    assert json.load(open(os.path.join(out, "trends.json")))["dates"] == [day(-1), day(0)]


def test_summarize_with_no_history_still_writes_a_page(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    os.makedirs(os.path.join(root, END, "r1"))
    cli("summarize", *_common(root, "r1"), state_dir=str(tmp_path / "st"))
    page = open(os.path.join(root, END, "r1", "trends", "trends.html"), encoding="utf-8").read()
    assert "0 days with results" in page and "No data.</p>" in page
    assert page.count("No data for this plot") == 5  # throughput/latency, sgd, matrix, billing, A/A rate


def test_summarize_bad_days_is_bad_input(tmp_path):
    p = cli("summarize", *_common(str(tmp_path), "r1"), "--days", "0", state_dir=str(tmp_path / "st"), check=False)
    assert p.returncode == 2 and "--days must be at least 1" in p.stderr


def test_check_breached_p99_fails_and_names_the_breach(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=6, last={"p99_us": 1.8})
    p = cli("check", *_common(root, run_id), "--p99-increase-pct", "25", state_dir=str(tmp_path / "st"), check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    breaches = [ln for ln in p.stdout.splitlines() if "BREACH" in ln]
    assert len(breaches) == 3  # the three inference points
    line = next(b for b in breaches if "tf_inference_latency/native" in b)
    # experiment, system, point, metric, value, trailing median, threshold
    assert "point cold_start_interval-5_duration_s-3" in line and "p99_us = " in line
    assert "trailing median" in line and "of 5 previous days" in line and "(threshold +25%)" in line
    value = float(re.search(r"p99_us = ([0-9.]+)", line).group(1))
    median = float(re.search(r"trailing median ([0-9.]+)", line).group(1))
    assert value > 1.25 * median and 11000 < median < 13000
    assert "regression:" in p.stderr
    ops = os.listdir(os.path.join(root, END, run_id, "_ops"))
    rep = json.load(open(os.path.join(root, END, run_id, "_ops", next(o for o in ops if o.startswith("check-")))))
    assert len(rep["breaches"]) == 3 and rep["thresholds"]["p99_increase_pct"] == 25.0
    # the same run passes with a looser threshold
    assert (
        cli(
            "check", *_common(root, run_id), "--p99-increase-pct", "100", state_dir=str(tmp_path / "st"), check=False
        ).returncode
        == 0
    )


def test_check_throughput_drop_and_run_time_increase(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=5, last={"throughput_ok": 0.5, "run_time_ms": 2.0})
    p = cli(
        "check",
        *_common(root, run_id),
        "--throughput-drop-pct",
        "20",
        "--run-time-increase-pct",
        "50",
        state_dir=str(tmp_path / "st"),
        check=False,
    )
    assert p.returncode == 1
    text = "\n".join(ln for ln in p.stdout.splitlines() if "BREACH" in ln)
    assert text.count("throughput_ok") == 3 and text.count("run_time_ms") == 4
    assert "(threshold -20%)" in text and "(threshold +50%)" in text
    # thresholds turned off (negative): passes
    assert (
        cli(
            "check",
            *_common(root, run_id),
            "--throughput-drop-pct",
            "-1",
            "--run-time-increase-pct",
            "-1",
            state_dir=str(tmp_path / "st"),
            check=False,
        ).returncode
        == 0
    )


def test_check_clean_history_passes(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=8)  # +-4 % noise only
    p = cli(
        "check",
        *_common(root, run_id),
        "--p99-increase-pct",
        "10",
        "--throughput-drop-pct",
        "10",
        "--run-time-increase-pct",
        "10",
        state_dir=str(tmp_path / "st"),
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "0 breaches" in p.stdout and "comparisons" in p.stdout
    n = int(re.search(r"check: (\d+) comparisons", p.stdout).group(1))
    assert n == 3 * 2 + 4  # p99 and throughput of 3 inference points, run time of 4 call points


def test_check_too_little_history_says_so_and_passes(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=2, last={"p99_us": 5.0})  # one previous day only
    p = cli("check", *_common(root, run_id), "--min-history", "3", state_dir=str(tmp_path / "st"), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "too little history for tf_inference_latency/native" in p.stdout
    assert "1 previous day(s) with results, need 3" in p.stdout and "0 comparisons" in p.stdout
    # failed days are not history: five failed days before still leave too little
    root2 = str(tmp_path / "b")
    for k in range(5, 0, -1):
        write_run(root2, day(-k), f"scheduled__{day(-k)}", failed=tuple(e for e, *_ in POINTS))
    write_run(root2, END, "today", {"p99_us": 5.0})
    p2 = cli("check", *_common(root2, "today"), state_dir=str(tmp_path / "st"), check=False)
    assert p2.returncode == 0 and "0 previous day(s)" in p2.stdout


def test_check_run_without_measurements_passes_and_says_so(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    write_history(root, days=4)
    p = cli("check", *_common(root, "never-ran"), state_dir=str(tmp_path / "st"), check=False)
    assert p.returncode == 0 and "has no measured points" in p.stdout


def test_check_bad_threshold_is_bad_input(tmp_path):
    p = cli(
        "check", *_common(str(tmp_path), "r"), "--p99-increase-pct", "lots", state_dir=str(tmp_path / "st"), check=False
    )
    assert p.returncode == 2 and "--p99-increase-pct" in p.stderr


def test_compare_uses_only_days_before_the_run():
    df = _p99_rows({day(k - 3): [v] for k, v in enumerate([100, 100, 100, 300])})  # runs r0..r3, oldest first
    res = trends.compare(df, df[df["run_id"] == "r3"], END, trends.Thresholds(p99_increase_pct=50, min_history=3))
    assert [b["trailing_median"] for b in res.breaches] == [100.0]
    assert res.breaches[0]["change_pct"] == 200.0


def test_system_comparison_sets_wasm_beside_native_with_the_papers_ratio():
    import pandas as pd

    from faasm_tasks.trends import render, system_comparison

    def row(system, point, **m):
        base = {
            "date": "2026-11-29",
            "run_id": "r",
            "experiment": "sgd_reuters_svm",
            "system": system,
            "point": point,
            "repeat": 0,
            "attempt": 1,
            "status": "succeeded",
            "measured": True,
            "params": "",
            "uri": "u",
            "n_workers": 2.0,
            "matrix_size": None,
            "p50_us": None,
            "p99_us": None,
            "throughput_ok": None,
            "run_time_ms": None,
            "memory_gb_s": None,
        }
        return {**base, **m}

    df = pd.DataFrame(
        [
            row("wasm", "n_workers=2", run_time_ms=100.0),
            row("wasm", "n_workers=4", run_time_ms=300.0),
            row("native", "n_workers=2", run_time_ms=400.0),
            row("native", "n_workers=9", run_time_ms=1.0, measured=False),
        ]
    )
    cmp = system_comparison(df)
    assert cmp == [
        {
            "experiment": "sgd_reuters_svm",
            "metric": "run_time_ms",
            "wasm": 100.0,
            "native": 400.0,
            "ratio": 0.25,
            "ratio_lo": None,
            "ratio_hi": None,
            "n_wasm": 1,
            "n_native": 1,
            "paired": True,
            "verdict": "fewer than 3 runs per side: no interval",
            "effect_99": "fewer than 3 runs per side: no interval",
            "points": "shared",
            "paper": "0.5 (2x speed-up)",
        }
    ]
    md = render(df, "r", "2026-11-29", 30)["trends.md"].decode()
    assert "## wasm against native in this run" in md and "| sgd_reuters_svm | run_time_ms | 100 | 400 | 0.25 |" in md
    assert system_comparison(df[df["system"] == "wasm"]) == []  # one system: nothing to set beside it


def test_summarize_names_the_code_that_made_the_report(tmp_path, monkeypatch):
    """The page's header, its Markdown and trends.json name the run's bundle and version."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("HOUSE_BUNDLE_NAME", "house-dags")
    monkeypatch.setenv("HOUSE_BUNDLE_VERSION", sha)
    root = str(tmp_path / "faasm_benchmarks")
    os.makedirs(os.path.join(root, END, "r1"))
    cli("summarize", *_common(root, "r1"), state_dir=str(tmp_path / "st"))
    out = os.path.join(root, END, "r1", "trends")
    page = open(os.path.join(out, "trends.html"), encoding="utf-8").read()
    assert f"Made by <code>bundle house-dags at {sha}</code>." in page.split("<h2", 1)[0]  # in the header
    assert f"Made by `bundle house-dags at {sha}`." in open(os.path.join(out, "trends.md"), encoding="utf-8").read()
    code = json.load(open(os.path.join(out, "trends.json")))["code"]
    assert code == {"bundle_name": "house-dags", "bundle_version": sha, "source": "env"}


def _p99_rows(day_values: dict[str, list[float]]):
    import pandas as pd

    rows = []
    for k, (date, values) in enumerate(sorted(day_values.items())):
        for r, v in enumerate(values):
            rows.append(
                {
                    "date": date,
                    "run_id": f"r{k}",
                    "experiment": "e",
                    "system": "wasm",
                    "point": "p",
                    "repeat": r,
                    "attempt": 1,
                    "status": "succeeded",
                    "measured": True,
                    "params": "",
                    "uri": "",
                    "n_workers": None,
                    "matrix_size": None,
                    "p50_us": None,
                    "p99_us": float(v),
                    "throughput_ok": None,
                    "run_time_ms": None,
                    "memory_gb_s": None,
                }
            )
    return pd.DataFrame(rows)


def test_a_change_within_the_days_noise_is_not_a_regression():
    """Today's median is about 70 % above the trailing median, past the 50 % threshold, but the
    values scatter as widely as the days': the interval of today's repeats against the trailing values includes 1,
    so it is listed as within the noise, not a breach; a change as large over quiet days is one."""
    import numpy as np

    rng = np.random.default_rng(4)
    noisy = {f"2026-11-{20 + d:02d}": list(100 * np.exp(0.6 * rng.standard_normal(6))) for d in range(5)}
    today = "2026-11-29"
    noisy[today] = [40.0, 90.0, 160.0, 170.0, 250.0, 400.0]
    df = _p99_rows(noisy)
    th = trends.Thresholds(p99_increase_pct=50, min_history=3)
    res = trends.compare(df, df[df["date"] == today], today, th)
    assert (
        not res.breaches
        and res.within_noise
        and res.within_noise[0]["ratio_lo"] <= 1 <= res.within_noise[0]["ratio_hi"]
    )
    quiet = {f"2026-11-{20 + d:02d}": [99.0, 100.0, 101.0, 100.0, 100.5, 99.5] for d in range(5)}
    quiet[today] = [158.0, 159.0, 160.0, 161.0, 162.0, 160.5]
    df = _p99_rows(quiet)
    res = trends.compare(df, df[df["date"] == today], today, th)
    assert [round(b["change_pct"]) for b in res.breaches] == [60] and res.breaches[0]["ratio_lo"] > 1
    assert "at 95 %" in trends.breach_text(res.breaches[0])
