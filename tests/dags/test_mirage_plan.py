"""The command lines of a mirage_pipeline run (house.mirage_plan): windows and fan-out."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from house.mirage_plan import plan, windows

BASE = dict(trace="", synth_profile="ls6-a100", cluster_config="ls6", train_start=None, train_count=684,
            val_start=None, val_count=None, interval_hours=4, warmup_days=2, workload_days=5, probes=7,
            node_sizes=[1, 8], shards=4, preset="quick", device="cpu", seed=0, train_params={},
            models=["xgboost", "random_forest", "transformer", "moe", "transformer_policy", "moe_policy"])
APRIL = datetime(2023, 4, 1, tzinfo=timezone.utc)


def test_default_windows_validate_the_month_before():
    w = windows(BASE, APRIL)
    assert w["val_start"] == "2023-03-01T00:00:00+00:00"
    assert w["val_count"] == 156  # March, every workload ending inside the month: the seed's count
    # the last training sample's 5-day workload ends right before validation starts
    assert w["train_start"] == "2022-11-02T00:00:00+00:00" and w["train_count"] == 684


def test_pendulum_logical_date():
    import pendulum

    assert windows(BASE, pendulum.datetime(2023, 4, 1, tz="UTC"))["val_count"] == 156


def test_seed_configuration_and_leakage_refused():
    seed = dict(BASE, train_start="2022-11-01", val_start="2023-03-01", val_count=156)
    assert windows(seed, None)["train_start"] == "2022-11-01T00:00:00+00:00"
    with pytest.raises(ValueError, match="after val_start"):
        windows(dict(seed, train_start="2022-11-05"), None)
    with pytest.raises(ValueError, match="ISO 8601"):
        windows(dict(seed, val_start="March"), None)
    with pytest.raises(ValueError, match="logical date"):
        windows(BASE, None)


def test_fan_out_and_gpu_split():
    p = plan(BASE, "s3://b/run", APRIL)
    assert len(p["sample"]) == 8 and len(p["merge"]) == 2
    assert len(p["train_cpu"]) == 8 and not p["train_gpu"] and len(p["policy_cpu"]) == 4
    assert len(p["validate"]) == (6 + 2) * 2 * 4  # models + reactive/avg, node sizes, shards
    assert p["sample"][0][p["sample"][0].index("--shard") + 1] == "0/4"
    assert p["trace_argv"][0] == "synth"
    g = plan(dict(BASE, device="cuda", train_params={"moe": ["epochs=3"]}), "s3://b/run", APRIL)
    assert {a[a.index("--model") + 1] for a in g["train_gpu"]} == {"transformer", "moe"}
    assert {a[a.index("--model") + 1] for a in g["train_cpu"]} == {"xgboost", "random_forest"}
    moe = next(a for a in g["train_gpu"] if "moe" in a)
    assert moe[moe.index("--param") + 1] == "epochs=3" and moe[moe.index("--device") + 1] == "cuda"
    sampled = [a for a in p["validate"] if "--stochastic" in a]
    assert {a[a.index("--name") + 1] for a in sampled} == {"transformer_policy", "moe_policy"}
    assert not any("--stochastic" in a for a in plan(dict(BASE, policy_eval="greedy"), "/r", APRIL)["validate"])
    assert p["fidelity"][p["fidelity"].index("--to") + 1] == "2023-03-27T00:00:00+00:00"  # 156 x 4 h
    assert "s3://b/run/fidelity" in p["report"]
    policy = g["policy_gpu"][0]
    assert policy[policy.index("--base") + 1].startswith("s3://b/run/models/")


def test_real_trace_and_bad_models():
    p = plan(dict(BASE, trace="/data/ls6.log", trace_timezone="America/Chicago", window_from="2022-11-01"),
             "/r", APRIL)
    assert p["trace_argv"] == ["ingest", "--trace", "/data/ls6.log", "--out", "/r/trace",
                               "--from", "2022-11-01", "--timezone", "America/Chicago"]
    with pytest.raises(ValueError, match="unknown"):
        plan(dict(BASE, models=["lstm"]), "/r", APRIL)
    with pytest.raises(ValueError, match="base model"):
        plan(dict(BASE, models=["moe_policy"]), "/r", APRIL)
