"""mirage_tasks.slurm.keeper_stats: the kept chains' summary with intervals, on hand-made links."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from mirage_tasks.slurm.keeper_stats import interrupted_h, jsonable, markdown, summary


def _links(rng, runs=2, chains=4, links=2):
    """reactive: interrupted 0.5 h on every link; avg: 1 h early (1 node-h wasted) on every link;
    model: on time on every link but chain 0's, where it is 2 h late."""
    rows = []
    for r in range(runs):
        for c in range(chains):
            for k in range(links):
                for p, s in (("reactive", 0.5), ("avg", -1.0), ("model", 2.0 if c == 0 else 0.0)):
                    rows.append(
                        {
                            "run": f"w{r}",
                            "chain": c,
                            "link": k,
                            "policy": p,
                            "signed_interruption_h": s,
                            "wasted_node_h": max(-s, 0.0),
                            "forced": p == "reactive",
                            "sim_signed_interruption_h": s if k == 0 else math.nan,
                        }
                    )
    return pd.DataFrame(rows)


def test_summary_pairs_links_and_bootstraps_over_chains():
    f = _links(np.random.default_rng(0))
    rows = {r["policy"]: r for r in summary(f, factor=180, node=1, n_boot=500)}
    m, re, av = rows["model"], rows["reactive"], rows["avg"]
    assert (m["links"], m["chains"], m["runs"]) == (16, 8, 2)
    assert re["interruption_h"] == pytest.approx(0.5) and re["interrupted"] == 1.0
    assert av["wasted_node_h"] == pytest.approx(1.0) and av["objective"] == pytest.approx(0.1)
    # model: 2 of 8 chains 2 h late: mean interruption 0.5 h, objective 0.5, interrupted 25 %
    assert m["interruption_h"] == pytest.approx(0.5) and m["interrupted"] == pytest.approx(0.25)
    assert m["interrupted_lo"] < 0.25 < m["interrupted_hi"]
    # against reactive the mean difference is 0 and the interval (over chains) spans it
    assert m["vs_reactive"] == pytest.approx(0.0) and m["vs_reactive_lo"] < 0 < m["vs_reactive_hi"]
    assert m["vs_reactive_verdict"] == "no difference shown" and m["vs_reactive_n"] == 16
    # avg beats reactive on every link: its interval excludes 0
    assert (
        av["vs_reactive"] == pytest.approx(-0.4) and av["vs_reactive_hi"] < 0 and av["vs_reactive_verdict"] == "better"
    )
    assert "vs_avg" not in av and "vs_reactive" not in re
    # the simulator's figures cover link 0 only, set beside the real ones on the same links
    assert m["sim_links"] == 8 and m["sim_objective"] == pytest.approx(m["real_objective_same_links"])
    # every link of one chain resampled together: a single chain gives no interval
    one = {r["policy"]: r for r in summary(f[(f["run"] == "w0") & (f["chain"] == 1)], 180, 1)}
    assert math.isnan(one["avg"]["vs_reactive_lo"]) and one["avg"]["vs_reactive_verdict"] == "one chain: no interval"
    text = "\n".join(markdown(list(rows.values())))
    assert "| model | 2 | 8 | 16 |" in text and "(better)" in text and "6 trace min" in text
    assert all(v is None or v == v for r in jsonable(list(rows.values())) for v in r.values() if isinstance(v, float))


def test_the_bootstrap_resamples_chains_not_links():
    """One chain much worse than the rest: with its 10 links drawn as one unit the interval is
    wider than a link-level bootstrap would give (20 chains of 10 links)."""
    rows = []
    for c in range(20):
        for k in range(10):
            s = 5.0 if c == 0 else 0.0
            rows += [
                {
                    "chain": c,
                    "link": k,
                    "policy": "model",
                    "signed_interruption_h": s,
                    "wasted_node_h": 0.0,
                    "forced": False,
                },
                {
                    "chain": c,
                    "link": k,
                    "policy": "reactive",
                    "signed_interruption_h": 0.0,
                    "wasted_node_h": 0.0,
                    "forced": True,
                },
            ]
    (m, _) = summary(pd.DataFrame(rows), factor=1, node=1, n_boot=2000)
    assert m["vs_reactive"] == pytest.approx(0.25)
    assert m["vs_reactive_lo"] == pytest.approx(0.0)  # 36 % of resamples miss chain 0 entirely
    assert m["vs_reactive_verdict"] == "no difference shown"


def test_interrupted_threshold_is_a_minute_or_two_real_seconds():
    assert interrupted_h(1) == pytest.approx(1 / 60)
    assert interrupted_h(180) == pytest.approx(0.1)
    assert summary(pd.DataFrame(), 180, 1) == []


def test_avg_cal_is_a_reference_with_a_column_of_its_own_where_it_was_run():
    """protocol v2 judges every rule against reactive and avg-cal: with avg-cal among the policies
    each other policy gets its paired difference to it and the table a "vs avg-cal" column;
    without it no such column."""
    f = _links(np.random.default_rng(0))
    cal = f[f["policy"] == "reactive"].assign(policy="avg-cal", signed_interruption_h=0.0)
    rows = {r["policy"]: r for r in summary(pd.concat([f, cal], ignore_index=True), 180, 1, n_boot=200)}
    assert rows["reactive"]["vs_avg-cal"] == pytest.approx(0.5) and rows["reactive"]["vs_avg-cal_verdict"] == "worse"
    assert rows["avg"]["vs_avg-cal"] == pytest.approx(0.1) and "vs_avg-cal" not in rows["avg-cal"]
    head = markdown(list(rows.values()))[2]
    assert "| vs reactive | vs avg-cal | vs avg |" in head
    assert "vs avg-cal" not in markdown(summary(f, 180, 1, n_boot=50))[2]
