"""``validate``: online decisions in the simulator, baselines equal to the offline probes, leakage guard."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from test_sim_support import T0, random_trace
from test_validate_support import (  # noqa: F401 - fixtures
    CLUSTER,
    NODE,
    VAL_COUNT,
    VAL_START,
    cli,
    iso,
    policy_world,
    validate,
    world,
)

from mirage_tasks.data import artifacts as A
from mirage_tasks.data.artifacts import load_shard
from mirage_tasks.evaluation import validate as V
from mirage_tasks.sim import PRESETS, DecisionEpisode, EpisodeSpec, Workload, simulate_sample
from stepkit import StepError

CFG = PRESETS["ls6"].replace(nodes=16, max_jobs_per_user=3)


def rows(uri: str) -> pd.DataFrame:
    return pd.read_parquet(f"{uri}/{A.ROWS_FILE}")


@pytest.mark.parametrize("baseline", ["reactive", "avg"])
def test_baselines_online_equal_the_offline_probes_of_sample(world, baseline, tmp_path):
    out = tmp_path / "s"
    assert (
        cli(
            "sample",
            "--trace",
            world["trace"],
            "--start",
            iso(VAL_START),
            "--count",
            VAL_COUNT,
            "--node",
            NODE,
            "--baseline",
            baseline,
            "--out",
            out,
            "--cluster-config",
            "ls6",
            "--nodes",
            "16",
            "--max-jobs-per-user",
            "3",
        )
        == 0
    )
    _, probes, _ = load_shard(str(out))
    online = rows(world[f"v_{baseline}"])
    assert len(online) == len(probes) == VAL_COUNT
    assert list(online["sample"]) == list(probes["sample"]) == list(range(VAL_COUNT))
    np.testing.assert_array_equal(online["decision_time"], probes["probe_time"])
    np.testing.assert_array_equal(online["succ_start"], probes["succ_start"])
    np.testing.assert_allclose(online["signed_interruption_h"], probes["interruption_s"] / 3600.0)
    np.testing.assert_array_equal(online["backfilled"], probes["backfilled"])
    if baseline == "reactive":
        assert online["forced"].all() and (online["decision_time"] == online["pred_end"]).all()


@pytest.mark.parametrize("node", [1, 4, 8])
def test_online_baselines_match_offline_on_a_loaded_cluster(node):
    """The episode driver itself, on more node sizes (several samples show gaps and backfill)."""
    wl = Workload.from_frame(random_trace(11, days=14, nodes=16))
    spec = EpisodeSpec(2, 5, 144, 600)
    for k in range(3):
        t0 = T0 + 86400 + k * 4 * 3600
        for b in ("reactive", "avg"):
            off = simulate_sample(wl, CFG, t0, node, spec, 7, b, with_features=False)[0].meta
            res, trace = V.run_episode(DecisionEpisode(wl, CFG, t0, node), None, b, 600, k)
            assert trace == [] and res["n_decisions"] == 0
            assert res["succ_submit"] == off["probe_time"]
            assert res["signed_interruption_h"] == pytest.approx(off["interruption_s"] / 3600)


def test_rows_schema_and_derived_columns(world):
    for key in ("v_reactive", "v_avg", "v_xgb"):
        df = rows(world[key])
        assert list(df.columns) == list(V.ROW_COLUMNS)
        assert list(df["sample"]) == list(range(VAL_COUNT))
        s = df["signed_interruption_h"]
        np.testing.assert_allclose(df["interruption_h"], s.clip(lower=0))
        np.testing.assert_allclose(df["overlap_h"], (-s).clip(lower=0))
        np.testing.assert_allclose(df["wasted_node_h"], NODE * df["overlap_h"])
        assert ((df["succ_start"] - df["pred_end"]) / 3600 == s).all()
        assert (df["sample_start"] == VAL_START + df["sample"] * 4 * 3600).all()
        assert (df["pred_submit"] == df["sample_start"] + 2 * 86400).all()
        assert (df["decision_time"] >= df["pred_submit"]).all() and (df["decision_time"] <= df["pred_end"]).all()
        assert not (np.signbit(df["overlap_h"]) | np.signbit(df["interruption_h"])).any()  # no -0.0
    info = json.load(open(f"{world['v_xgb']}/{A.VALIDATE_INFO_FILE}"))
    assert info["leakage_check"]["validation_start"] == iso(VAL_START)
    assert info["params"]["window"] == 12 and info["model_fingerprint"]


def test_shards_and_workers_give_the_same_rows(world, tmp_path):
    parts = []
    for i in range(2):
        assert validate(world["trace"], "reactive", tmp_path / f"r{i}", "--shard", f"{i}/2", "--workers", "2") == 0
        parts.append(rows(str(tmp_path / f"r{i}")))
    both = pd.concat(parts).sort_values("sample").reset_index(drop=True)
    pd.testing.assert_frame_equal(both, rows(world["v_reactive"]))


def test_model_in_worker_processes_gives_the_same_rows(world, tmp_path):
    """--workers 2 in a fresh process (as in a pod): the model loads per worker, rows keep their order."""
    out = tmp_path / "par"
    argv = [
        sys.executable,
        "-m",
        "mirage_tasks",
        "validate",
        "--trace",
        world["trace"],
        "--model",
        world["xgb"],
        "--start",
        iso(VAL_START),
        "--count",
        str(VAL_COUNT),
        "--node",
        str(NODE),
        "--decide-every-minutes",
        "240",
        "--workers",
        "2",
        "--out",
        str(out),
        *CLUSTER,
        "--log-level",
        "WARNING",
    ]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pd.testing.assert_frame_equal(rows(str(out)), rows(world["v_xgb"]))
    pd.testing.assert_frame_equal(
        pd.read_parquet(out / A.DECISIONS_FILE), pd.read_parquet(f"{world['v_xgb']}/{A.DECISIONS_FILE}")
    )


def test_regressor_decides_online(world, tmp_path):
    df = rows(world["v_xgb"])
    dec = pd.read_parquet(f"{world['v_xgb']}/{A.DECISIONS_FILE}")
    assert (df["n_decisions"] > 0).all()
    assert int(df["n_decisions"].sum()) == len(dec)
    # the 240-minute grid from the predecessor's submission
    first = dec.groupby("sample")["time"].min().to_numpy()
    np.testing.assert_array_equal(first, df["pred_submit"].to_numpy())
    assert (dec.groupby("sample")["time"].diff().dropna() == 14400).all()
    # the submit flag follows the model's own calibrated threshold: low_h <= prediction <= 500
    rule = json.load(open(f"{world['xgb']}/config.json"))["decision"]
    low, load = rule["low_h"], rule.get("load")
    low = math.inf if low is None else low
    if load is None:
        np.testing.assert_array_equal(dec["submit"], (dec["output"] >= low) & (dec["output"] <= 500))
    else:  # load-aware: the threshold lies between its values at the split's load extremes
        ends = [low + load["slope"] * z for z in (load["z_min"], load["z_max"])]
        assert (dec["output"][dec["submit"]] >= min(ends) - 1e-9).all()
        waited = dec["output"][~dec["submit"]]
        assert ((waited < max(ends) + 1e-9) | (waited > 500)).all()
        low = min(ends) - 1e-9
    for _, r in df.iterrows():
        if r["forced"]:
            assert math.isnan(r["model_output"]) and r["decision_time"] == r["pred_end"]
        else:
            assert r["model_output"] >= low
    # --threshold-h overrides it
    out = tmp_path / "fixed"
    assert validate(world["trace"], world["xgb"], out, "--threshold-h", "-0.5", "--name", "fixed") == 0
    dec = pd.read_parquet(out / A.DECISIONS_FILE)
    np.testing.assert_array_equal(dec["submit"], (dec["output"] >= -0.5) & (dec["output"] <= 500))
    # a threshold no prediction misses: submit at the first decision, with the predecessor
    out = tmp_path / "eager"
    assert validate(world["trace"], world["xgb"], out, "--threshold-h", "-1000", "--name", "eager") == 0
    eager = rows(str(out))
    assert (eager["model"] == "eager").all() and (eager["n_decisions"] == 1).all() and not eager["forced"].any()
    assert (eager["decision_time"] == eager["pred_submit"]).all() and eager["model_output"].notna().all()
    assert (eager["signed_interruption_h"] < 0).all() and (eager["wasted_node_h"] > 0).all()


def test_policy_greedy_and_seeded_stochastic(policy_world, tmp_path):
    w = policy_world
    every = ["--decide-every-minutes", "120"]
    assert validate(w["trace"], w["pol"], tmp_path / "g", *every) == 0
    dec = pd.read_parquet(tmp_path / "g" / A.DECISIONS_FILE)
    assert ((dec["output"] >= 0) & (dec["output"] <= 1)).all()
    thr = json.load(open(f"{w['pol']}/config.json"))["decision"]["threshold"]
    # greedy: P(submit) >= the policy's threshold, calibrated on its base's validation split
    np.testing.assert_array_equal(dec["submit"], dec["output"] >= (math.inf if thr is None else thr))
    outs = []
    for name in ("s1", "s2"):
        assert validate(w["trace"], w["pol"], tmp_path / name, *every, "--stochastic", "--seed", "3") == 0
        outs.append(rows(str(tmp_path / name)))
    pd.testing.assert_frame_equal(outs[0], outs[1])
    d1 = pd.read_parquet(tmp_path / "s1" / A.DECISIONS_FILE)
    assert len(d1) == int(outs[0]["n_decisions"].sum())


def test_leakage_guard_refuses_overlapping_validation(world, tmp_path, capsys):
    manifest = json.load(open(f"{world['dataset']}/manifest.json"))
    early = VAL_START - 2 * 86400  # before the training data's end
    assert validate(world["trace"], world["xgb"], tmp_path / "leak", start=early) == 2
    err = capsys.readouterr().err
    assert "leakage guard" in err and manifest["data_end"] in err and iso(early) in err
    assert not (tmp_path / "leak" / "_SUCCESS.json").exists()
    with pytest.raises(StepError, match="records no training data window"):
        V.training_data_end({"data": {}})
    end, key = V.training_data_end(
        {"data": {"data_end": "2023-01-02T00:00:00+00:00", "train_data_end": "2023-01-01T00:00:00+00:00"}}
    )
    assert key == "data_end" and end == int(pd.Timestamp("2023-01-02", tz="UTC").timestamp())


def test_bad_flags_exit_2(world, tmp_path, capsys):
    assert validate(world["trace"], "reactive", tmp_path / "x", "--stochastic") == 2
    assert validate(world["trace"], "reactive", tmp_path / "x", "--shard", "2/2") == 2
    assert (
        cli(
            "validate",
            "--trace",
            world["trace"],
            "--model",
            world["xgb"],
            "--start",
            iso(VAL_START),
            "--count",
            1,
            "--node",
            4,
            "--out",
            tmp_path / "x",
            "--cluster-config",
            "ls6",
            "--nodes",
            "16",
        )
        == 2
    )
    assert "trained for 2-node jobs" in capsys.readouterr().err
    assert validate(world["trace"], world["xgb"], tmp_path / "x", "--window", "144") == 2


def test_policy_argmax_ignores_the_calibrated_threshold(policy_world, tmp_path):
    w = policy_world
    every = ["--decide-every-minutes", "120"]
    assert validate(w["trace"], w["pol"], tmp_path / "a", *every, "--argmax") == 0
    dec = pd.read_parquet(tmp_path / "a" / A.DECISIONS_FILE)
    np.testing.assert_array_equal(dec["submit"], dec["output"] > 0.5)
    assert validate(w["trace"], w["pol"], tmp_path / "b", *every, "--argmax", "--stochastic") == 2


def test_end_spaced_model_is_asked_only_within_its_training_span(world, tmp_path):
    """A model trained on ``--probe-spacing end`` samples saw states 24 h or less before the
    predecessor's end; online it is asked only there (``--decide-within trained``, the default),
    as the probe replay scores it. A threshold every prediction passes shows where the first ask
    falls: the first grid point at or after the pre-simulated end minus 24 h; with ``all``, the
    predecessor's submission."""
    d = tmp_path
    assert (
        cli(
            "sample",
            "--trace",
            world["trace"],
            "--start",
            iso(T0 + 86400),
            "--count",
            8,
            "--node",
            NODE,
            "--probe-spacing",
            "end",
            "--window",
            12,
            "--out",
            d / "s",
            *CLUSTER,
        )
        == 0
    )
    assert cli("merge", "--in", d / "s", "--out", d / "ds") == 0
    assert (
        cli(
            "train",
            "--model",
            "xgboost",
            "--dataset",
            d / "ds",
            "--out",
            d / "m",
            "--param",
            "n_estimators=5",
            "--val-fraction",
            "0.25",
            "--purge-days",
            "0",
            "--threads",
            "1",
        )
        == 0
    )
    cfg = json.load(open(d / "m" / "config.json"))
    assert cfg["data"]["sample_params"]["probe_spacing"] == "end"
    every = ["--threshold-h", "-1000", "--decide-every-minutes", "60", "--decide-at", "grid"]
    assert validate(world["trace"], str(d / "m"), d / "in", *every) == 0
    got = rows(str(d / "in"))
    assert not got["forced"].any() and (got["n_decisions"] == 1).all()
    lead = (got["pred_end"] - got["decision_time"]).to_numpy()
    assert ((lead <= 86400) & (lead > 86400 - 3600)).all(), lead
    params = json.load(open(d / "in" / A.VALIDATE_INFO_FILE))["params"]
    assert params["decide_within_s"] == 86400
    assert validate(world["trace"], str(d / "m"), d / "all", *every, "--decide-within", "all") == 0
    eager = rows(str(d / "all"))
    assert (eager["decision_time"] == eager["pred_submit"]).all() and (
        eager["pred_end"] - eager["pred_submit"] > 86400
    ).all()
    assert "decide_within_s" not in json.load(open(d / "all" / A.VALIDATE_INFO_FILE))["params"]
    # a uniform model spans the whole predecessor: nothing bounds its asks (the key stays out)
    assert "decide_within_s" not in json.load(open(f"{world['v_xgb']}/{A.VALIDATE_INFO_FILE}"))["params"]

    # --decide-at probes: asked only at the training probes' times, the online decider IS the probe
    # replay: on the validation samples drawn with the same spacing, the first probe whose answer passes
    # the rule (else the end) has exactly the online outcome. The threshold is a high quantile of the
    # answers, so the samples submit at different probes.
    from mirage_tasks.models.loader import load_model

    assert (
        cli(
            "sample",
            "--trace",
            world["trace"],
            "--start",
            iso(VAL_START),
            "--count",
            VAL_COUNT,
            "--node",
            NODE,
            "--probe-spacing",
            "end",
            "--window",
            12,
            "--out",
            d / "vs",
            *CLUSTER,
        )
        == 0
    )
    arrays, probes, _ = load_shard(str(d / "vs"))
    raw = load_model(str(d / "m")).predict(arrays["X"])
    thr = float(np.quantile(raw, 0.85))
    assert validate(world["trace"], str(d / "m"), d / "at", "--decide-at", "probes", "--threshold-h", repr(thr)) == 0
    at = rows(str(d / "at")).set_index("sample")
    end = probes["probe_time"] == probes.groupby("sample")["probe_time"].transform("max")
    probes = probes.assign(ok=((raw >= thr) & (raw <= 500)) | end, y=arrays["y"])
    first = probes[probes["ok"]].sort_values("probe_time").groupby("sample").first()
    assert len(first) == VAL_COUNT and (at["pred_end"] - at["decision_time"]).nunique() >= 2, at  # not all alike
    np.testing.assert_array_equal(at.loc[first.index, "decision_time"], first["probe_time"])
    np.testing.assert_allclose(at.loc[first.index, "signed_interruption_h"], first["y"], atol=1e-6)
    dec = pd.read_parquet(d / "at" / A.DECISIONS_FILE)
    lead = (at.loc[dec["sample"], "pred_end"].to_numpy() - dec["time"].to_numpy()) // 60
    assert set(lead) <= {1440, 960, 480, 240, 120, 60, 30, 10}
    # the default (auto) asks an end-spaced model at its probes' times: the same decisions
    assert validate(world["trace"], str(d / "m"), d / "auto", "--threshold-h", repr(thr)) == 0
    pd.testing.assert_frame_equal(rows(str(d / "auto")).set_index("sample"), at)
    assert json.load(open(d / "auto" / A.VALIDATE_INFO_FILE))["params"]["decide_at"].startswith("probes")
    # a uniform model has no probes at fixed times before the end: auto asks it on the grid (no key, as
    # before), and probes is refused, naming the flag
    assert "decide_at" not in json.load(open(f"{world['v_xgb']}/{A.VALIDATE_INFO_FILE}"))["params"]
    assert validate(world["trace"], world["xgb"], d / "u", "--decide-at", "probes") == 2
    assert not (d / "u").exists()
