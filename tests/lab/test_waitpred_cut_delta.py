"""docs/results/waitpred.md's section "What fitting at the cut changed": the baseline parsed from the
page written by the fit that read outcomes not yet known at the cut (lab/pages/waitpred_before_cut.py)
and the section built from it and the current outputs (lab/pages/mirage_eval_page.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from lab.pages.mirage_eval_page import BEFORE_CUT, ROOT, cut_delta
from lab.pages.waitpred_before_cut import PageError, parse_page, show

# An old-format page; every figure differs from its neighbours, so a column read from the wrong
# place changes some value below.
OLD_PAGE = """# Queue-wait prediction at submission time

## SITE

Calibrated machine: 100 nodes (priority weights: age 29807.8, size 57.4334); 5922 calibration jobs, 7936 scored, 7 larger.
Guard pick: **corrected_q40** (least MAE among the candidates ... at most 5% below zero wait's 62.0%; not eligible: plan).

| predictor | n | MAE h | median abs error h | within 1 h | within 10 min, waited > 1 h | Spearman | 90 % bound coverage | bound median h |
|---|---|---|---|---|---|---|---|---|
| zero | 7936 | 5.23 | 0.07 | 66.9% | 0.0% | - | 89.9% | 16.01 |
| corrected_q40 | 7936 | 3.81 | 0.31 | 64.8% | 1.5% | 0.62 | 90.2% | 5.20 |
| guarded | 7936 | 3.81 | 0.31 | 64.8% | 1.5% | 0.62 | 90.2% | 5.20 |

Per month, guarded (zero wait):

| month | n | MAE h | within 1 h | coverage | bound median h |
|---|---|---|---|---|---|
| 1997-01 | 2931 | 3.13 (4.08) | 65.6% (66.5%) | 91.1% | 5.25 |

Replay fidelity (not a prediction; ...): MAE 5.40 h (zero 5.23), within 1 h 49.8%.

## Summary

| log | pick | MAE h (zero) | MAE vs zero | within 1 h (zero) | within 10 min, waited > 1 h | Spearman | coverage |
|---|---|---|---|---|---|---|---|
| SITE | corrected_q40 | 3.81 (5.23) | -27.2% | 64.8% (66.9%) | 1.5% | 0.62 | 1997-01 91.1% |

## Limits

* Calibration budgets: SITE 13 of 40 trials (stopped by timeout). The search stops.
"""


def test_the_old_page_is_read_figure_by_figure():
    site = parse_page(OLD_PAGE)["SITE"]
    assert (site["nodes"], site["weight_age"], site["weight_size"]) == (100, 29807.8, 57.4334)
    assert (site["n_calibration"], site["n_scored"], site["pick"], site["tail_zero_within_1h"]) == (
        5922,
        7936,
        "corrected_q40",
        0.62,
    )
    assert site["predictors"]["zero"] == {
        "n": 7936,
        "mae_h": 5.23,
        "medae_h": 0.07,
        "within_1h": 0.669,
        "within_10m_waited_over_1h": 0.0,
        "spearman": None,
        "coverage": 0.899,
        "bound_median_h": 16.01,
    }
    assert site["predictors"]["guarded"]["within_1h"] == 0.648 and site["predictors"]["guarded"]["spearman"] == 0.62
    assert site["months"]["1997-01"] == {
        "n": 2931,
        "mae_h": 3.13,
        "zero_mae_h": 4.08,
        "within_1h": 0.656,
        "zero_within_1h": 0.665,
        "coverage": 0.911,
        "bound_median_h": 5.25,
    }
    assert site["replay_fidelity"] == {"mae_h": 5.4, "zero_mae_h": 5.23, "within_1h": 0.498}
    assert site["mae_vs_zero"] == -0.272
    assert site["calibration"] == {"trials_run": 13, "trials": 40, "stopped_by": "timeout"}


def test_a_page_that_does_not_read_as_expected_is_refused_naming_the_section():
    with pytest.raises(PageError, match="section 'SITE'.*month 1997-01 mae_h cell '3.13' is not 'pick \\(zero\\)'"):
        parse_page(OLD_PAGE.replace("3.13 (4.08)", "3.13"))
    with pytest.raises(PageError, match="the guarded row differs from its pick 'corrected_q40'"):
        parse_page(OLD_PAGE.replace("| guarded | 7936 | 3.81 |", "| guarded | 7936 | 3.80 |"))
    with pytest.raises(PageError, match="Summary gives SITE's pick as 'zero'"):
        parse_page(OLD_PAGE.replace("| SITE | corrected_q40 |", "| SITE | zero |"))
    with pytest.raises(PageError, match="no Summary row or calibration budget for \\['SITE'\\]"):
        parse_page(OLD_PAGE.replace("SITE 13 of 40", "OTHER 13 of 40"))


def test_the_committed_baseline_holds_the_old_pages_figures():
    """Figures as the page at the baseline's commit printed them (KTH-SP2's and CEA-Curie's)."""
    doc = json.loads(BEFORE_CUT.read_text())
    kth, cea = doc["logs"]["KTH-SP2"], doc["logs"]["CEA-Curie"]
    assert kth["pick"] == "corrected_q40" and kth["predictors"]["corrected_q40"]["mae_h"] == 3.81
    assert kth["predictors"]["zero"]["mae_h"] == 5.23 and kth["predictors"]["guarded"]["within_1h"] == 0.648
    assert kth["predictors"]["guarded"]["bound_median_h"] == 5.2 and kth["mae_vs_zero"] == -0.272
    assert cea["n_scored"] == 111096 and cea["pick"] == "corrected_q30" and cea["mae_vs_zero"] == -0.072
    assert cea["calibration"] == {"trials_run": 6, "trials": 40, "stopped_by": "timeout"}
    assert list(doc["logs"]) == ["KTH-SP2", "CTC-SP2", "ls6", "CEA-Curie"]


def test_the_committed_baseline_is_what_its_command_extracts():
    doc = json.loads(BEFORE_CUT.read_text())
    try:
        text = show(doc["source"]["commit"], doc["source"]["path"])
    except (PageError, subprocess.CalledProcessError, OSError):
        pytest.skip(f"the baseline's commit {doc['source']['commit'][:7]} is not in this clone's history")
    assert parse_page(text) == doc["logs"]
    assert doc["extracted_by"].startswith("python -m lab.pages.waitpred_before_cut --commit ")
    assert (ROOT / doc["source"]["path"]).exists()


def _before() -> dict:
    logs = parse_page(OLD_PAGE)
    cea = json.loads(json.dumps(logs["SITE"]))  # a second log: a pick of zero wait, another scored set
    cea.update(pick="zero", n_scored=1000, mae_vs_zero=0.0)
    cea["predictors"]["guarded"] = dict(cea["predictors"]["zero"])
    return {
        "source": {"path": "docs/results/waitpred.md", "commit": "1dbc3e0" + "0" * 33},
        "figures_written": {"commit": "4e4afa8" + "0" * 33, "date": "2026-12-02T04:03:20+00:00"},
        "extracted_by": "python -m lab.pages.waitpred_before_cut --commit 1dbc3e0",
        "logs": {"SITE": logs["SITE"], "BUSY": cea},
    }


def _now(pick: str, single: str, n: int, zero_mae: float, never: int = 0) -> dict:
    def row(mae, w, cov, med):
        return {"pooled": {"mae_h": mae, "within_1h": w, "coverage": cov, "bound_median_h": med}}

    oos = {
        "zero": row(zero_mae, 0.6694, 0.8991, 16.254),
        "corrected_q40": row(3.8049, 0.6481, 0.902, 5.11),
        "corrected_q20": row(4.4123, 0.6719, 0.9021, 5.2682),
    }
    oos["guarded"] = oos[pick]
    return {
        "pick": pick,
        "n_scored": n,
        "out_of_sample": oos,
        "criteria": {"mae_reduction_vs_zero": 1 - oos[pick]["pooled"]["mae_h"] / zero_mae},
        "guard": {"single_tail_pick": single},
        "at_cut": {"censored_waits": 6},
        "bound": {"cap_h": 210.5},
        "hygiene": {"never_ran": never},
        "params": {"config": {"nodes": 100, "weight_age": 19.0566, "weight_size": 2610.77}},
    }


def test_the_section_shows_each_figure_before_and_now_with_its_change_and_why():
    searches = {"SITE": {"trials_run": 40, "trials": 40, "stopped_by": "trials"}}
    L = cut_delta(_before(), [("SITE", _now("corrected_q20", "corrected_q40", 7936, 5.2301)), ("NEW", {})], searches)
    assert L[0] == "## What fitting at the cut changed"
    assert "parsed from `docs/results/waitpred.md` at 1dbc3e0 (figures written at 4e4afa8, 2026-12-02)" in L[2]
    assert (
        "| SITE | 7936 (same) | corrected_q40 → corrected_q20 | 3.81 → 4.41 (+0.60) | 5.23 → 5.23 (+0.00) | "
        "-27.2% → -15.6% (+11.6) | 64.8% → 67.2% (+2.4) | 66.9% → 66.9% (+0.0) | 90.2% → 90.2% (+0.0) | "
        "5.20 → 5.27 (+0.07) |"
    ) in L
    assert not any(line.startswith("| NEW") for line in L)  # a log the baseline lacks has no row
    (why,) = [line for line in L if line.startswith("* **SITE**")]
    assert "zero wait, which fits nothing, is unchanged on the same 7936 jobs" in why
    assert (
        "fitted at the cut (6 calibration waits censored there), the single held-back tail still picks "
        "corrected_q40 (corrected_q40 3.81 → 3.80 h), so the guard's folds, not the censored labels, changed "
        "the pick to corrected_q20"
    ) in why
    assert "with 40 of 40 trials (before 13 of 40, stopped by timeout)" in why
    assert "priority weights age 29807.8 → 19.0566, size 57.4334 → 2610.77" in why


def test_a_changed_scored_set_and_a_kept_zero_pick_are_said():
    L = cut_delta(_before(), [("BUSY", _now("zero", "zero", 950, 4.9, never=50))], {})
    assert (
        "| BUSY | 1000 → 950 (-50) | zero (same) | 5.23 → 4.90 (-0.33) | 5.23 → 4.90 (-0.33) | 0.0% → 0.0% "
        "(+0.0) | 66.9% → 66.9% (+0.0) | 66.9% → 66.9% (+0.0) | 89.9% → 89.9% (+0.0) | 16.01 → 16.25 (+0.24) |"
    ) in L
    (why,) = [line for line in L if line.startswith("* **BUSY**")]
    assert "1000 → 950 jobs scored (the 50 jobs that never ran are now queued, not scored)" in why
    assert "moves zero wait's MAE by -0.33 h" in why
    assert "the pick stays zero wait and only its 90 % bound moved (median 16.01 → 16.25 (+0.24) h)" in why
    assert "capped at the calibration period's longest wait known at the cut (210 h)" in why
    assert "one offset per" not in why  # an output whose bound kept one offset for all jobs
    now = _now("zero", "zero", 950, 4.9, never=50)
    now["bound"].update(grouping="job-size class", groups={"zero": {"1": {"source": "calibrated"}}})
    (why,) = [line for line in cut_delta(_before(), [("BUSY", now)], {}) if line.startswith("* **BUSY**")]
    assert "each when its bound runs out, one offset per job-size class" in why


def test_no_log_in_both_gives_no_section():
    assert cut_delta({}, [("SITE", _now("zero", "zero", 1, 1.0))], {}) == []
    assert cut_delta(_before(), [], {}) == []
