"""The trend page tracks the A/A false-difference rate over stored runs: per day its verdict,
the running rate with its Clopper-Pearson interval against the 5 % target, in words and as a
plot; ``aa-rate --results`` says the same (one computation)."""

from __future__ import annotations

import base64
import json
import os
import re

import pytest
from faasm_testutil import cli
from test_stats import clopper_pearson
from test_trends_history import END, day, write_aa_run, write_history

# 12 days to END: the first without A/A arms (not listed), one with 2 values per arm (no interval:
# listed, not counted), three whose A/A fails; so 3 of 10 counted verdicts fail.
FAILING = {-10, -6, -2}
NO_INTERVAL = -8


def _write_days(root: str) -> list[tuple[str, str]]:
    write_history(root, days=12)
    listed = []
    for k in range(-10, 1):
        if k == NO_INTERVAL:
            write_aa_run(root, day(k), f"scheduled__{day(k)}", fail=False, n=2)
            listed.append((day(k), "no interval"))
        else:
            write_aa_run(root, day(k), f"scheduled__{day(k)}", fail=k in FAILING)
            listed.append((day(k), "fail" if k in FAILING else "pass"))
    return listed


def test_trend_page_tracks_the_aa_false_difference_rate_over_the_days(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    listed = _write_days(root)
    run_id = f"scheduled__{END}"
    p = cli(
        "summarize",
        "--run-id",
        run_id,
        "--results",
        root,
        "--date",
        END,
        "--days",
        "30",
        state_dir=str(tmp_path / "st"),
    )
    out = os.path.join(root, END, run_id, "trends")
    tj = json.load(open(os.path.join(out, "trends.json")))
    rate = tj["aa_rate"]
    # per day its verdict, oldest first; the day without A/A arms is not there
    assert [(r["date"], r["verdict"]) for r in rate["runs"]] == listed
    assert rate["verdicts"] == 10 and rate["failed_days"] == 3
    assert rate["false_difference_rate"] == pytest.approx(0.3)
    lo, hi = clopper_pearson(3, 10)
    assert rate["rate_lo"] == pytest.approx(lo, abs=1e-9) and rate["rate_hi"] == pytest.approx(hi, abs=1e-9)
    assert rate["target"] == 0.05 and rate["level"] == 0.95 and rate["target_status"] == "not met"  # lo 6.7 %
    # the running rate: failed verdicts so far over verdicts so far, each with its interval
    k = n = 0
    for r, (_date, verdict) in zip(rate["runs"], listed, strict=True):
        if verdict == "no interval":
            assert "running_rate" not in r
            continue
        n += 1
        k += verdict == "fail"
        assert (r["running_failed"], r["running_n"]) == (k, n)
        assert r["running_rate"] == pytest.approx(k / n)
        assert (r["running_lo"], r["running_hi"]) == pytest.approx(clopper_pearson(k, n), abs=1e-9)
    # stated in words on the page (HTML and Markdown) and charted among the plots
    line = (
        f"Over the 30 days to {END}: 3 of 10 A/A verdict(s) failed: false-difference rate 30.0% "
        f"(95% Clopper-Pearson interval {lo:.1%} to {hi:.1%}); target at most 5% at the 95% level: not met"
    )
    page = open(os.path.join(out, "trends.html"), encoding="utf-8").read()
    md = open(os.path.join(out, "trends.md"), encoding="utf-8").read()
    assert line in page and line in md
    assert "A/A false-difference rate over the days" in page
    assert page.count("<td>fail</td>") == 3 and page.count("<td>no interval</td>") == 1
    assert "](figures/aa_rate.png)" in md and "No data for this plot" not in page
    png = open(os.path.join(out, "figures", "aa_rate.png"), "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 2000
    assert base64.b64encode(png).decode() in page  # embedded, the page self-contained
    assert "trend report over 30 days" in p.stdout
    # aa-rate over the same stored days says the same: one computation
    a = cli("aa-rate", "--results", root, "--date", END, "--days", "30", state_dir=str(tmp_path / "st"))
    assert "10 stored run(s) with A/A arms in 30 days to " + END + " (1 more without an interval" in a.stdout
    assert line.split(": ", 1)[1] in a.stdout
    # a shorter window counts only its days: the last 3 (days -2 to 0: fail, pass, pass)
    cli(
        "summarize", "--run-id", run_id, "--results", root, "--date", END, "--days", "3", state_dir=str(tmp_path / "st")
    )
    short = json.load(open(os.path.join(out, "trends.json")))["aa_rate"]
    assert [r["verdict"] for r in short["runs"]] == ["fail", "pass", "pass"]
    assert (short["failed_days"], short["verdicts"]) == (1, 3)


def test_trend_page_without_aa_arms_says_there_is_no_rate(tmp_path):
    root = str(tmp_path / "faasm_benchmarks")
    run_id = write_history(root, days=3)
    cli("summarize", "--run-id", run_id, "--results", root, "--date", END, state_dir=str(tmp_path / "st"))
    out = os.path.join(root, END, run_id, "trends")
    page = open(os.path.join(out, "trends.html"), encoding="utf-8").read()
    assert "false-difference rate n/a (no A/A verdict); target at most 5% at the 95% level" in page
    assert re.search(r"A/A false-difference rate over the days: running rate[^<]*</h3>\s*<p class='empty'>", page)
    tj = json.load(open(os.path.join(out, "trends.json")))
    assert tj["aa_rate"]["verdicts"] == 0 and tj["aa_rate"]["runs"] == []
