"""The A/A control through the summarize and check steps over a written history: a run whose
A/A fails is untrustworthy (summary, report, check: its changes not judged as regressions), a
passing one leaves the check as it was, and earlier untrustworthy days leave the trailing
medians."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
from faasm_testutil import cli
from test_trends_history import END, day, write_history

from faasm_tasks.order import AA_ARMS
from faasm_tasks.results import Attempt, point_prefix

EXP, SYSTEM = "matrix_multiplication", "native"
PARAMS = {"n_workers": 2, "matrix_size": 100}  # a point of the written history (test_trends_history.POINTS)


def write_aa(root: str, date: str, run_id: str, factor: float, n: int = 6) -> None:
    """The A/A arms of one point of a written run, A' scaled by ``factor``."""
    rng = np.random.default_rng(int(date[-2:]))
    for arm in AA_ARMS:
        for r in range(n):
            base = {
                "run_id": run_id,
                "date": date,
                "experiment": EXP,
                "system": SYSTEM,
                "target": "local",
                "params": PARAMS,
                "repeat": r,
                "arm": arm,
            }
            att = Attempt(point_prefix(root, date, run_id, EXP, SYSTEM, PARAMS, r, arm), base)
            v = 800 * (1 + 0.01 * rng.standard_normal()) * (factor if arm == AA_ARMS[1] else 1)
            att.finish(True, None, {"run_time_ms": round(v, 3)}, 0)


def _check(root: str, run_id: str, tmp_path, *extra: str):
    return cli(
        "check",
        "--run-id",
        run_id,
        "--results",
        root,
        "--date",
        END,
        *extra,
        state_dir=str(tmp_path / "st"),
        check=False,
    )


def _report(root: str, run_id: str, step: str) -> dict:
    return json.load(open(sorted(glob.glob(os.path.join(root, END, run_id, "_ops", f"{step}-*.json")))[-1]))


def test_a_failed_aa_marks_the_day_untrustworthy_instead_of_a_regression(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=6, last={"p99_us": 1.8})  # three p99 breaches on the last day
    write_aa(root, END, run_id, factor=1.3)
    p = _check(root, run_id, tmp_path, "--p99-increase-pct", "25")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "UNTRUSTWORTHY" in p.stderr and "regression:" not in p.stderr
    assert "A/A fail" in p.stdout and "BREACH" not in p.stdout
    assert p.stdout.count("not judged (untrustworthy day)") == 3
    rep = _report(root, run_id, "check")
    assert rep["trustworthy"] is False and rep["breaches"] == [] and len(rep["not_judged"]) == 3
    assert rep["aa"]["verdict"] == "fail"
    # the summary and the report say so too
    s = cli("summarize", "--run-id", run_id, "--results", root, "--date", END, state_dir=str(tmp_path / "st"))
    assert "UNTRUSTWORTHY day: A/A fail" in s.stdout
    summary = json.load(open(os.path.join(root, END, run_id, "summary", "summary.json")))
    assert summary["trustworthy"] is False and summary["aa_verdict"] == "fail"
    page = open(os.path.join(root, END, run_id, "trends", "trends.md")).read()
    assert "UNTRUSTWORTHY day: A/A fail" in page


def test_a_passing_aa_leaves_the_regression_check_as_it_was(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=6, last={"p99_us": 1.8})
    write_aa(root, END, run_id, factor=1.0)
    p = _check(root, run_id, tmp_path, "--p99-increase-pct", "25")
    assert p.returncode == 1 and "regression:" in p.stderr and "UNTRUSTWORTHY" not in p.stderr
    assert "A/A pass" in p.stdout and p.stdout.count("BREACH") == 3
    assert _report(root, run_id, "check")["trustworthy"] is True


def test_a_previous_untrustworthy_day_is_left_out_of_the_trailing_median(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=6)
    for k in (1, 2, 3):  # three earlier days whose A/A failed
        write_aa(root, day(-k), f"scheduled__{day(-k)}", factor=1.3)
    p = _check(root, run_id, tmp_path, "--min-history", "3")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("left out of the trailing medians") == 3
    rep = _report(root, run_id, "check")
    assert {u["date"] for u in rep["untrustworthy_history"]} == {day(-1), day(-2), day(-3)}
    # only 2 trustworthy previous days remain: every point now lacks history
    assert rep["checked"] == [] and rep["too_little_history"]


def test_aa_rate_over_stored_runs(tmp_path):
    from faasm_tasks.steps.aa_rate import stored

    root = str(tmp_path / "faasm_benchmarks")
    write_history(root, days=5)  # no A/A arms: not counted
    write_aa(root, day(-1), f"scheduled__{day(-1)}", factor=1.3)
    for k in (0, 2, 3):
        write_aa(root, day(-k), f"scheduled__{day(-k)}", factor=1.0)
    res = stored(root, END, 30)
    assert [r["verdict"] for r in res["runs"]] == ["pass", "pass", "fail", "pass"]
    assert res["failed_days"] == 1 and res["false_difference_rate"] == 0.25
    p = cli("aa-rate", "--results", root, "--date", END, "--days", "30", state_dir=str(tmp_path / "st"))
    assert "4 stored run(s) with A/A arms" in p.stdout and "false-difference rate 25.0%" in p.stdout
