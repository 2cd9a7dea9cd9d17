"""Intervals of benchmark figures: order-statistic median, Student-t mean, bootstrap ratios."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats as st
from scipy.stats import beta

from faasm_tasks import stats


def test_median_interval_is_the_order_statistic_one_and_refused_under_six():
    assert stats.min_n_for_median() == 6
    assert stats.median_ci(range(5)) is None
    assert stats.median_ci(range(6)) == (0.0, 5.0, pytest.approx(1 - 2 / 64))
    # n = 30: the 10th and 21st smallest (the textbook table), coverage >= 95 %
    lo, hi, cov = stats.median_ci(np.arange(1, 31))
    assert (lo, hi) == (10.0, 21.0) and cov >= 0.95
    d = stats.describe([3.0, 1.0, 2.0])
    assert d["n"] == 3 and d["median"] == 2.0 and "no 95% interval of the median" in d["median_ci_note"]
    assert d["mean_lo"] < 2.0 < d["mean_hi"]


def test_median_interval_covers_at_its_level():
    rng = np.random.default_rng(3)
    hits = sum(
        lo <= 0 <= hi for lo, hi, _ in (stats.median_ci(rng.standard_exponential(25) - np.log(2)) for _ in range(2000))
    )
    assert hits / 2000 >= 0.94


def test_mean_interval_is_student_t():
    x = [1.0, 2.0, 4.0, 7.0]
    lo, hi = stats.mean_ci(x)
    half = st.t.ppf(0.975, 3) * np.std(x, ddof=1) / 2
    assert (lo, hi) == pytest.approx((3.5 - half, 3.5 + half))
    assert stats.mean_ci([5.0]) is None


def test_ratio_interval_paired_and_unpaired_and_its_verdict():
    rng = np.random.default_rng(1)
    native = rng.normal(100, 10, 12)
    wasm = native * 0.5 + rng.normal(0, 1, 12)  # paired: the same repeat's noise on both sides
    r = stats.ratio_ci(wasm, native, paired=True)
    assert r["ratio_lo"] < r["ratio"] < r["ratio_hi"] < 1 and r["verdict"] == "below 1"
    same = stats.ratio_ci(rng.normal(100, 10, 12), rng.normal(100, 10, 12), paired=False)
    assert same["verdict"] == "includes 1"
    assert "fewer than 3" in stats.ratio_ci([1.0, 2.0], [1.0, 2.0], paired=True)["ci_note"]


def test_trend_page_gives_n_intervals_and_ratio_intervals():
    from faasm_tasks import trends

    rows = []
    for system, scale in (("wasm", 0.5), ("native", 1.0)):
        for rep in range(8):
            rows.append(
                {
                    "date": "2026-12-01",
                    "run_id": "r",
                    "experiment": "sgd_reuters_svm",
                    "system": system,
                    "point": "n_workers-2",
                    "repeat": rep,
                    "attempt": 1,
                    "status": "succeeded",
                    "measured": True,
                    "params": "n_workers=2",
                    "uri": "u",
                    "n_workers": 2.0,
                    "matrix_size": None,
                    "p50_us": None,
                    "p99_us": None,
                    "throughput_ok": None,
                    "run_time_ms": scale * (1000 + 10 * rep),
                    "memory_gb_s": None,
                }
            )
    rows.append({**rows[0], "repeat": 9, "status": "failed", "measured": False, "run_time_ms": 1.0})
    df = pd.DataFrame(rows)
    cis = trends.point_intervals(df)
    w = next(r for r in cis if r["system"] == "wasm" and r["metric"] == "run_time_ms")
    assert w["n"] == 8 and w["median_lo"] <= w["median"] <= w["median_hi"] and w["mean_lo"] < w["mean_hi"]
    cmp = next(r for r in trends.system_comparison(df) if r["metric"] == "run_time_ms")
    assert cmp["paired"] and cmp["ratio"] == pytest.approx(0.5) and cmp["verdict"] == "below 1"
    page = trends.render(df, "r", "2026-12-01", 1)["trends.md"].decode()
    assert "median 95 % low" in page and "Student-t" in page and "95 % low" in page


def test_the_rank_statistics_null_distributions_are_exact():
    """The Mann-Whitney and signed-rank null distributions the ratio intervals cut from agree with
    scipy's exact tests (and with the counts: 1 of C(12, 6) = 924 interleavings has U = 0)."""
    assert stats._mwu_cdf(6, 6)[0] * 924 == pytest.approx(1)
    assert stats._signed_rank_cdf(6)[0] * 64 == pytest.approx(1)
    rng = np.random.default_rng(2)
    for n, m in [(4, 5), (6, 6), (7, 3)]:
        x, y = rng.normal(size=n), rng.normal(size=m)
        u = int(sum(xi > yj for xi in x for yj in y))
        assert stats._mwu_cdf(n, m)[u] == pytest.approx(
            st.mannwhitneyu(x, y, alternative="less", method="exact").pvalue
        )


@pytest.mark.parametrize("paired", [False, True])
def test_identical_systems_are_called_different_at_most_as_often_as_the_level_says(paired):
    """At the daily run's 6 repeats (8 paired) the 95 % ratio interval excludes 1 for two samples
    of one distribution in at most 5 % of days (a percentile bootstrap of medians: about 7 %)."""
    rng = np.random.default_rng(11)
    n, days = (8 if paired else 6), 1500
    wrong = 0
    for _ in range(days):
        a, b = 100 * np.exp(0.05 * rng.standard_normal((2, n)))
        wrong += stats.ratio_ci(a, b, paired=paired)["verdict"] != "includes 1"
    assert wrong / days <= 0.05


def test_a_value_that_is_not_positive_has_no_ratio_interval():
    r = stats.ratio_ci([1.0, 2.0, 0.0, 3.0], [1.0, 2.0, 3.0, 4.0], paired=False)
    assert "ratio_lo" not in r and "not a positive number" in r["ci_note"]


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The textbook form, from the beta distribution (not scipy's binomtest the code uses)."""
    a = 1 - level
    lo = 0.0 if k == 0 else beta.ppf(a / 2, k, n - k + 1)
    hi = 1.0 if k == n else beta.ppf(1 - a / 2, k + 1, n - k)
    return float(lo), float(hi)


@pytest.mark.parametrize("k,n", [(0, 1), (0, 30), (1, 4), (3, 10), (2, 20), (7, 7), (5, 100)])
def test_rate_interval_is_clopper_pearson(k, n):
    lo, hi = stats.rate_ci(k, n)
    want = clopper_pearson(k, n)
    assert lo == pytest.approx(want[0], abs=1e-9) and hi == pytest.approx(want[1], abs=1e-9)
    assert lo <= k / n <= hi


def test_rate_interval_known_values_and_bad_input():
    # no failure in n days: the upper bound is 1 - (alpha/2)^(1/n)
    assert stats.rate_ci(0, 30)[1] == pytest.approx(1 - 0.025 ** (1 / 30), abs=1e-12)
    assert stats.rate_ci(0, 30, level=0.9)[1] == pytest.approx(1 - 0.05 ** (1 / 30), abs=1e-12)
    for k, n in ((1, 0), (-1, 5), (6, 5)):
        with pytest.raises(ValueError, match="0 <= failed <= n"):
            stats.rate_ci(k, n)


def test_false_difference_rate_against_the_target():
    met = stats.false_difference_rate(0, 100)  # 0 of 100: the interval reaches 3.6 %
    assert met["target"] == 0.05 and met["target_status"] == "met" and met["rate_hi"] < 0.05
    not_met = stats.false_difference_rate(10, 30)
    assert not_met["target_status"] == "not met" and not_met["rate_lo"] > 0.05
    und = stats.false_difference_rate(0, 30)  # no failure yet, but 30 days cannot show <= 5 %
    assert und["target_status"] == "undecided" and und["false_difference_rate"] == 0.0
    assert und["rate_lo"] == 0.0 and und["rate_hi"] > 0.05
    none = stats.false_difference_rate(0, 0)
    assert none["target_status"] == "no verdicts" and none["false_difference_rate"] is None
    assert "n/a (no A/A verdict)" in stats.rate_text(none)
    # the stated level sets the target: 90 % allows 10 %
    assert stats.false_difference_rate(1, 100, level=0.9)["target"] == 0.1
    text = stats.rate_text(stats.false_difference_rate(3, 10))
    assert text.startswith("3 of 10 A/A verdict(s) failed: false-difference rate 30.0% (95% Clopper-Pearson")
    assert "6.7% to 65.2%" in text and "target at most 5% at the 95% level: not met" in text
