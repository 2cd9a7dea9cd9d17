"""The A/A control: one system measured as two arms A and A'. Its ratio intervals must contain
1 (faasm_tasks.stats.aa_verdict, Bonferroni over the figures); a run whose A/A fails is
untrustworthy in the summary, the report and the regression check, which then lists its
changes as not judged instead of raising a regression, and leaves it out of later trailing
medians (the steps: test_aa_control_e2e.py)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from faasm_tasks import stats, trends
from faasm_tasks.order import AA_ARMS

EXP, SYSTEM = "matrix_multiplication", "native"


def test_an_identical_pair_contains_1_and_a_shifted_pair_is_flagged():
    rng = np.random.default_rng(1)
    a = 800 * (1 + 0.03 * rng.standard_normal(6))
    same = stats.aa_verdict([("run time", a, rng.permutation(a))])
    assert same["verdict"] == "pass" and same["excluding_1"] == []
    assert same["figures"][0]["ratio_lo"] <= 1 <= same["figures"][0]["ratio_hi"]
    shifted = stats.aa_verdict([("run time", a, a * 1.3)])
    assert shifted["verdict"] == "fail" and shifted["excluding_1"] == ["run time"]
    assert shifted["figures"][0]["verdict"] == "below 1"


def test_the_intervals_are_bonferroni_over_the_figures_and_too_few_values_say_so():
    rng = np.random.default_rng(2)
    figs = [(f"f{i}", rng.normal(100, 3, 8), rng.normal(100, 3, 8)) for i in range(5)]
    v = stats.aa_verdict(figs)
    assert v["comparisons"] == 5 and abs(v["level_each"] - (1 - 0.05 / 5)) < 1e-12
    few = stats.aa_verdict([("f", [1.0, 2.0], [1.0, 2.0])])
    assert few["verdict"] == "no interval" and few["comparisons"] == 0


def _rows(factor: float, n: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    rows = []
    for arm in AA_ARMS:
        for r in range(n):
            v = 800 * (1 + 0.02 * rng.standard_normal()) * (factor if arm == AA_ARMS[1] else 1)
            rows.append(
                {
                    "experiment": EXP,
                    "system": SYSTEM,
                    "point": "p",
                    "repeat": r,
                    "arm": arm,
                    "measured": True,
                    "run_time_ms": v,
                    "p99_us": None,
                    "throughput_ok": None,
                }
            )
    return pd.DataFrame(rows)


def test_aa_control_of_a_run():
    assert trends.aa_control(_rows(1.0))["verdict"] == "pass"
    bad = trends.aa_control(_rows(1.25))
    assert bad["verdict"] == "fail" and bad["excluding_1"] == [f"{EXP}/{SYSTEM} p run_time_ms"]
    assert "excluding 1" in trends.aa_text(bad)
    assert trends.aa_control(_rows(1.0).assign(arm=None))["verdict"] == "none"


def test_effect_reads_as_percent_faster_with_its_99_percent_half_width():
    rng = np.random.default_rng(4)
    native = 1000 * (1 + 0.02 * rng.standard_normal(12))
    wasm = 600 * (1 + 0.02 * rng.standard_normal(12))
    e = stats.effect(wasm, native, paired=True)
    m = re.fullmatch(r"(\d+\.\d) % faster \(± (\d+\.\d) %\) at 99 %", e["text"])
    assert m and abs(float(m.group(1)) - (1 - e["ratio"]) * 100) < 0.051 and 35 < float(m.group(1)) < 45
    assert 0 < float(m.group(2)) < 10
    assert (
        e["ratio_lo"] <= e["ratio"] <= e["ratio_hi"]
        and abs(e["half_width_pct"] - (e["ratio_hi"] - e["ratio_lo"]) * 50) < 1e-9
    )
    wider = stats.ratio_ci(wasm, native, paired=True)  # the 95 % interval lies inside the 99 % one
    assert e["ratio_lo"] <= wider["ratio_lo"] and wider["ratio_hi"] <= e["ratio_hi"]
    higher = stats.effect(native * 1.25, native, paired=True, lower_is_better=False, words=("higher", "lower"))
    assert higher["text"] == "25.0 % higher (± 0.0 %) at 99 %"
    assert stats.effect(native * 1.25, native, paired=True)["text"].startswith("25.0 % slower")
    assert stats.effect([1.0, 2.0], [1.0, 2.0], paired=True)["text"] is None


def test_aa_false_difference_rate_stays_near_the_level_and_a_sequential_order_with_drift_does_not():
    from faasm_tasks.steps.aa_rate import synthetic

    randomized = synthetic(days=40, figures=2, repeats=8, drift=0.3, seed=1)
    sequential = synthetic(days=40, figures=2, repeats=8, drift=0.3, sequential=True, seed=1)
    assert randomized["order"] == "randomized" and sequential["order"] == "sequential"
    assert randomized["false_difference_rate"] <= 0.15  # 5 % stated; drift spread over both arms
    assert sequential["false_difference_rate"] >= 0.8  # A before A': the drift becomes a "difference"


def _compare(n: int) -> dict:
    aa = _rows(1.5, n)  # native: arms A and A' (A' 1.5x: it must not enter the comparison)
    wasm = aa[aa["arm"] == AA_ARMS[0]].assign(system="wasm", arm=None, run_time_ms=lambda d: d["run_time_ms"] * 0.5)
    [row] = trends.system_comparison(pd.concat([aa, wasm]).assign(experiment=EXP, memory_gb_s=None, p50_us=None))
    return row


def test_wasm_against_native_uses_arm_a_only_and_shows_the_effect():
    row = _compare(8)
    assert row["n_native"] == 8 and row["n_wasm"] == 8 and row["paired"] is True
    assert 0.45 < row["ratio"] < 0.55  # against arm A alone; with A' it would be near 0.4
    assert re.fullmatch(r"\d+\.\d % faster \(± \d+\.\d %\) at 99 %", row["effect_99"])
    # 6 pairs give a 95 % signed-rank interval but none at 99 % (its smallest tail is 2/64): said
    six = _compare(6)
    assert six["ratio_lo"] is not None and "too few runs for a 99% rank interval" in six["effect_99"]
