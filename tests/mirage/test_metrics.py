"""``metrics``: hand-checked numbers, the load-level split, bootstrap intervals, errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_validate_support import NODE, VAL_COUNT, cli, world  # noqa: F401 - fixture

from mirage_tasks.evaluation import metrics as M
from stepkit import StepError


def frame(spec: dict[tuple[str, int], list[float]], backfilled: dict | None = None) -> pd.DataFrame:
    out = []
    for (model, node), signed in spec.items():
        for i, s in enumerate(signed):
            out.append(
                {
                    "model": model,
                    "node": node,
                    "sample": i,
                    "sample_start": 10_000 + 14_400 * i,
                    "signed_interruption_h": float(s),
                    "interruption_h": max(s, 0.0),
                    "overlap_h": max(-s, 0.0),
                    "wasted_node_h": node * max(-s, 0.0),
                    "backfilled": bool((backfilled or {}).get((model, node, i), False)),
                    "forced": model == "reactive",
                }
            )
    return pd.DataFrame(out)


REACT = [0.0, 1.0, 3.0, 13.0, 20.0, 2.0]  # levels: low low medium heavy heavy low(2.0 is low)
MODEL = [-1.0, 0.0, 2.0, 10.0, 30.0, -4.0]


def get(table: pd.DataFrame, model: str, level: str, node: int = 8) -> dict:
    r = table[(table["model"] == model) & (table["level"] == level) & (table["node"] == node)]
    assert len(r) == 1
    return r.iloc[0].to_dict()


def test_hand_checked_metrics_and_load_levels():
    table, samples, counts = M.compute(frame({("reactive", 8): REACT, ("m", 8): MODEL}), n_boot=0)
    assert counts == {"8": {"low": 3, "medium": 1, "heavy": 2}}
    lv = samples[samples["model"] == "m"].sort_values("sample")["level"].tolist()
    assert lv == ["low", "low", "medium", "heavy", "heavy", "low"]  # from the reactive row, not the model's
    a = get(table, "m", "all")
    assert a["n"] == 6
    assert a["mean_signed_h"] == pytest.approx(37 / 6)
    assert a["mean_interruption_h"] == pytest.approx(42 / 6)  # 0+0+2+10+30+0
    assert a["median_interruption_h"] == pytest.approx(1.0)  # median of 0,0,0,2,10,30
    assert a["mean_overlap_h"] == pytest.approx(5 / 6)
    assert a["mean_wasted_node_h"] == pytest.approx(8 * 5 / 6)
    assert a["zero_share"] == pytest.approx(3 / 6)  # -1, 0, -4
    assert a["reduction_vs_reactive"] == pytest.approx(1 - 7.0 / (39 / 6))
    low = get(table, "m", "low")
    assert low["n"] == 3 and low["mean_interruption_h"] == 0.0 and low["zero_share"] == 1.0
    assert low["reduction_vs_reactive"] == pytest.approx(1.0)
    assert low["mean_wasted_node_h"] == pytest.approx(8 * 5 / 3)
    heavy = get(table, "m", "heavy")
    assert heavy["mean_interruption_h"] == 20.0 and heavy["reduction_vs_reactive"] == pytest.approx(1 - 20 / 16.5)
    r = get(table, "reactive", "all")
    assert r["reduction_vs_reactive"] == 0.0 and r["zero_share"] == pytest.approx(1 / 6) and r["forced_share"] == 1.0
    # order: baselines first; every (model, level) with samples, none without
    assert table["model"].tolist()[:4] == ["reactive"] * 4
    assert set(table["level"]) == {"all", "low", "medium", "heavy"}


def test_reduction_is_undefined_when_reactive_has_no_interruption():
    table, _, counts = M.compute(frame({("reactive", 1): [0.0, 0.0, 0.0], ("m", 1): [-1.0, 0.5, 0.0]}), n_boot=100)
    assert counts == {"1": {"low": 3, "medium": 0, "heavy": 0}}
    a = get(table, "m", "all", node=1)
    assert a["reduction_vs_reactive"] is None or np.isnan(a["reduction_vs_reactive"])
    assert pd.isna(a["reduction_ci_lo"]) and pd.isna(a["reduction_ci_hi"])
    assert set(table["level"]) == {"all", "low"}


def test_bootstrap_intervals_are_sane_and_seeded():
    rng = np.random.default_rng(0)
    react = rng.exponential(4.0, 60)
    model = react * 0.5 - 0.2
    df = frame({("reactive", 1): list(react), ("m", 1): list(model)})
    t1, _, _ = M.compute(df, n_boot=500, seed=1)
    t2, _, _ = M.compute(df, n_boot=500, seed=1)
    t3, _, _ = M.compute(df, n_boot=500, seed=2)
    pd.testing.assert_frame_equal(t1, t2)
    assert not t1.equals(t3)
    a = get(t1, "m", "all", node=1)
    for v, lo, hi in (
        ("mean_interruption_h", "mean_interruption_ci_lo", "mean_interruption_ci_hi"),
        ("zero_share", "zero_share_ci_lo", "zero_share_ci_hi"),
        ("reduction_vs_reactive", "reduction_ci_lo", "reduction_ci_hi"),
    ):
        assert a[lo] <= a[v] <= a[hi]
        assert a[hi] - a[lo] > 0
    # paired: the model is close to half the reactive interruption on every draw
    assert 0.4 < a["reduction_ci_lo"] and a["reduction_ci_hi"] < 0.75
    # a single sample has no interval
    one, _, _ = M.compute(frame({("reactive", 1): [3.0], ("m", 1): [1.0]}), n_boot=100)
    assert pd.isna(get(one, "m", "all", node=1)["mean_interruption_ci_lo"])


def test_missing_reactive_rows_are_named():
    with pytest.raises(StepError, match=r"node 8: no reactive baseline rows \(have \['m'\]\).*--node 8"):
        M.compute(frame({("reactive", 1): [0.0], ("m", 1): [0.0], ("m", 8): [1.0]}), n_boot=0)
    df = frame({("reactive", 1): [0.0, 1.0], ("m", 1): [0.0, 1.0, 2.0]})
    with pytest.raises(StepError, match=r"node 1: 1 sample\(s\) of \['m'\] have no reactive row"):
        M.compute(df, n_boot=0)


def test_cli_writes_every_output(world, tmp_path, capsys):
    out = tmp_path / "m"
    assert (
        cli("metrics", "--in", world["v_xgb"], world["v_reactive"], world["v_avg"], "--out", out, "--bootstrap", "200")
        == 0
    )
    doc = json.load(open(out / "metrics.json"))
    assert doc["level_counts"][str(NODE)] and sum(doc["level_counts"][str(NODE)].values()) == VAL_COUNT
    alls = {r["model"]: r for r in doc["rows"] if r["level"] == "all"}
    assert set(alls) == {"reactive", "avg", "xgboost"} and all(r["n"] == VAL_COUNT for r in alls.values())
    v = pd.read_parquet(f"{world['v_avg']}/validation.parquet")
    assert alls["avg"]["mean_interruption_h"] == pytest.approx(v["interruption_h"].mean())
    assert len(pd.read_parquet(out / "metrics.parquet")) == len(doc["rows"]) == len(pd.read_csv(out / "metrics.csv"))
    md = (out / "metrics.md").read_text()
    assert f"## {NODE}-node jobs" in md and "| avg | all |" in md
    s = pd.read_parquet(out / "samples.parquet")
    assert len(s) == 3 * VAL_COUNT and {"level", "reactive_interruption_h"} <= set(s.columns)
    # the same validate output twice, or no reactive rows: exit 2 with the reason
    assert cli("metrics", "--in", world["v_avg"], world["v_avg"], "--out", tmp_path / "d") == 2
    assert "duplicated" in capsys.readouterr().err
    assert cli("metrics", "--in", world["v_avg"], "--out", tmp_path / "d") == 2
    assert "no reactive baseline rows" in capsys.readouterr().err


def test_paired_difference_against_avg_and_never_submits():
    avg = [0.5, 0.0, 1.0, 12.0, 10.0, -1.0]
    df = frame({("reactive", 8): REACT, ("avg", 8): avg, ("m", 8): MODEL})
    df.loc[df["model"] == "m", "forced"] = True  # every submission of m forced
    table, samples, _ = M.compute(df, n_boot=500, seed=0)
    a = get(table, "m", "all")
    # interruption: m 0,0,2,10,30,0 vs avg 0.5,0,1,12,10,0 -> differences -0.5,0,1,-2,20,0
    assert a["diff_vs_avg_h"] == pytest.approx(18.5 / 6)
    # wasted node-h: m 8,0,0,0,0,32 vs avg 0,0,0,0,0,8
    assert a["wasted_diff_vs_avg"] == pytest.approx(32 / 6)
    assert a["diff_vs_avg_ci_lo"] <= a["diff_vs_avg_h"] <= a["diff_vs_avg_ci_hi"]
    heavy = get(table, "m", "heavy")
    assert heavy["diff_vs_avg_h"] == pytest.approx((-2 + 20) / 2)
    assert get(table, "avg", "all")["diff_vs_avg_h"] == 0.0
    assert M.never_submits(table) == [{"model": "m", "node": 8, "n": 6}]
    assert "**m never submitted before the predecessor ended**" in M.markdown(table, {})
    # without avg rows the paired columns are empty, not wrong
    t2, _, _ = M.compute(frame({("reactive", 8): REACT, ("m", 8): MODEL}), n_boot=50)
    assert pd.isna(get(t2, "m", "all")["diff_vs_avg_h"])
