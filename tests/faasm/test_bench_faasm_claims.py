"""bench/faasm_local.py's verdicts: a claim is confirmed only when the ratio's interval lies on
its side of 1, and a failed check leaves a run out of the pair."""

from __future__ import annotations

import importlib.util
import os

import pytest
from faasm_testutil import ROOT


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("faasm_local_bench", os.path.join(ROOT, "bench", "faasm_local.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(
    "lo, hi, side, factor, want",
    [
        (0.2, 0.4, "below", 0.5, "confirmed, at the paper's factor"),
        (0.6, 0.8, "below", 0.5, "confirmed, short of the paper's factor"),
        (0.4, 0.8, "below", 0.5, "confirmed, the paper's factor inside the interval"),
        (0.8, 1.2, "below", 0.5, "not shown (interval includes 1)"),
        (1.1, 1.3, "below", 0.5, "**refuted**"),
        (2.1, 2.5, "above", 2.0, "confirmed, at the paper's factor"),
        (0.7, 0.9, "above", 2.0, "**refuted**"),
        (1.2, 1.5, "above", None, "confirmed"),
    ],
)
def test_claim_verdict_reads_the_interval(bench, lo, hi, side, factor, want):
    assert bench.claim_verdict({"ratio": (lo + hi) / 2, "ratio_lo": lo, "ratio_hi": hi}, side, factor) == want


def test_no_interval_is_not_shown(bench):
    assert bench.claim_verdict({"ratio": 0.5, "ci_note": "fewer than 3 runs"}, "below", 0.5).startswith("not shown")
    assert bench.claim_verdict(None, "below", 0.5).startswith("not shown")


def test_a_failed_run_leaves_its_pair_out(bench):
    pts = bench.Points()
    for w, n in ((1.0, 2.0), (1.1, 2.1), (0.9, 1.9), (1.0, 2.0)):
        pts.add("t", "wasm", w)
        pts.add("t", "native", n)
    pts.add("t", "wasm", 50.0, failed="final loss off")  # a broken run: not averaged in
    pts.add("t", "native", 2.0)
    s = bench.summary(pts.figs["t"])
    assert s["wasm"]["n"] == 4 and s["native"]["n"] == 5
    assert s["ratio"]["n_a"] == s["ratio"]["n_b"] == 4 and s["ratio"]["ratio"] == pytest.approx(0.5)
    assert pts.figs["t"]["failed"] == {"wasm": ["final loss off"]}


def test_each_round_measures_every_system_once_in_a_seeded_shuffled_order(bench):
    systems = ["wasm", "native"]
    orders = [bench.round_order(systems, 0, k) for k in range(40)]
    assert all(sorted(o) == sorted(systems) for o in orders)  # paired: each system once per round
    assert orders == [bench.round_order(systems, 0, k) for k in range(40)]  # reproducible from the seed
    firsts = [o[0] for o in orders]
    assert 10 < firsts.count("wasm") < 30  # neither system always goes first


def _run(bench, label: str, ratios: dict[str, tuple[float, float]]) -> dict:
    """A run whose figures have the wasm/native ratios given (wasm = ratio x native, each repeat paired)."""
    cfg = {"sgd": {"workers": [1, 4]}, "inference": {"intervals": [5, 500]}}
    pts = bench.Points()
    for _claim, key, *_ in bench.claim_list({"config": cfg}):
        lo, hi = ratios.get(key, (0.9, 1.1))
        for i in range(12):
            native = 10.0 + i
            pts.add(key, "native", native)
            pts.add(key, "wasm", native * (lo + (hi - lo) * i / 11))
    return {"label": label, "load_before": "0.1 0.1 0.1", "config": cfg, "points": pts.figs}


def test_the_answer_states_the_claims_tables_verdicts_and_ratios(bench):
    quiet = _run(bench, "quiet", {"cold_ms": (0.001, 0.002), "sgd4_time_s": (1.2, 1.4)})
    busy = _run(
        bench,
        "busy",
        {k: (0.01, 0.02) if side == "below" else (3.0, 4.0) for _c, k, side, *_ in bench.claim_list(quiet)},
    )
    [text, _] = bench.answer([quiet, busy])
    table = "\n".join(bench.claims_table([quiet, busy]))
    assert text.startswith("**Answer.**")
    for run in (quiet, busy):
        verdicts = [v for *_, v in bench.claim_verdicts(run)]
        conf = sum(v.startswith("confirmed") for v in verdicts)
        ref = verdicts.count("**refuted**")
        assert f"{run['label']}: {conf} of 8 confirmed" in text and f"{ref} refuted" in text
        for key in ("cold_ms", "sgd4_time_s"):
            cell = bench.fmt_ratio(bench.figure(run, key)["ratio"])
            assert cell in text and cell in table  # the answer's ratio is the table's
    assert "quiet: 1 of 8 confirmed" in text and "1 refuted" in text  # SGD slower: refuted; the rest include 1
    assert "busy: 8 of 8 confirmed" in text
