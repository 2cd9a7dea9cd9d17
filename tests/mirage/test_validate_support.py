"""A tiny end-to-end fixture for the validate/metrics/report tests (no tests here).

One random 14-day trace on 16 nodes; a few 2-node training samples with 12-snapshot
histories (sample -> merge), a tiny XGBoost regressor, a tiny transformer and a
one-update transformer policy on it; baselines and models validated on four later
samples, 2 h apart from the training data's end; a fidelity run. All through the CLI.
"""

from __future__ import annotations

import pandas as pd
import pytest
from test_sim_support import T0, random_trace, write_committed_trace

from mirage_tasks.__main__ import STEPS
from stepkit.cli import main

CLUSTER = ["--cluster-config", "ls6", "--nodes", "16", "--max-jobs-per-user", "3"]
NODE = 2
TRAIN_START = T0 + 86400  # 8 samples, 4 h apart: data end = last start + 5 days
VAL_START = T0 + 7 * 86400 + 6 * 3600  # after the training data's end (T0 + 6 d + 4 h)
VAL_COUNT = 4
QUIET = ["--log-level", "WARNING"]


def iso(epoch: int) -> str:
    return pd.Timestamp(int(epoch), unit="s", tz="UTC").isoformat()


def cli(*argv: str) -> int:
    return main("mirage_tasks", STEPS, [str(a) for a in argv] + QUIET)


def validate(trace: str, model: str, out, *extra: str, start: int = VAL_START, count: int = VAL_COUNT) -> int:
    return cli(
        "validate",
        "--trace",
        trace,
        "--model",
        model,
        "--start",
        iso(start),
        "--count",
        count,
        "--node",
        NODE,
        "--out",
        out,
        *CLUSTER,
        *extra,
    )


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("validate_world")
    trace = d / "trace"
    write_committed_trace(trace, random_trace(11, days=14, nodes=16))
    w = {"dir": d, "trace": str(trace)}
    assert (
        cli(
            "sample",
            "--trace",
            trace,
            "--start",
            iso(TRAIN_START),
            "--count",
            8,
            "--node",
            NODE,
            "--probes",
            3,
            "--window",
            12,
            "--out",
            d / "s0",
            *CLUSTER,
        )
        == 0
    )
    assert cli("merge", "--in", d / "s0", "--out", d / "ds") == 0
    w["dataset"] = str(d / "ds")
    assert (
        cli(
            "train",
            "--model",
            "xgboost",
            "--dataset",
            d / "ds",
            "--out",
            d / "xgb",
            "--param",
            "n_estimators=10",
            "--val-fraction",
            "0.25",
            "--purge-days",
            "0",
            "--threads",
            "1",
        )
        == 0
    )
    w["xgb"] = str(d / "xgb")
    for b in ("reactive", "avg"):
        assert validate(w["trace"], b, d / f"v_{b}") == 0
        w[f"v_{b}"] = str(d / f"v_{b}")
    # every 4 h: a dozen model calls per sample keep the test fast
    assert validate(w["trace"], w["xgb"], d / "v_xgb", "--decide-every-minutes", "240") == 0
    w["v_xgb"] = str(d / "v_xgb")
    return w


@pytest.fixture(scope="session")
def policy_world(world) -> dict:
    d = world["dir"]
    assert (
        cli(
            "train",
            "--model",
            "transformer",
            "--dataset",
            world["dataset"],
            "--out",
            d / "tx",
            "--param",
            "epochs=2",
            "--param",
            "d_model=8",
            "--param",
            "n_heads=1",
            "--param",
            "d_ff=16",
            "--val-fraction",
            "0.25",
            "--purge-days",
            "0",
            "--threads",
            "1",
        )
        == 0
    )
    assert (
        cli(
            "train",
            "--model",
            "transformer_policy",
            "--base",
            d / "tx",
            "--trace",
            world["trace"],
            "--out",
            d / "pol",
            "--param",
            "epochs=1",
            "--param",
            "episodes_per_epoch=2",
            "--param",
            "eval_episodes=2",
            "--param",
            "parallel_envs=1",
            "--threads",
            "1",
        )
        == 0
    )
    return {**world, "tx": str(d / "tx"), "pol": str(d / "pol")}


@pytest.fixture(scope="session")
def fidelity_out(world) -> str:
    out = world["dir"] / "fid"
    assert (
        cli(
            "fidelity",
            "--trace",
            world["trace"],
            "--from",
            iso(T0 + 86400),
            "--to",
            iso(T0 + 3 * 86400),
            "--out",
            out,
            "--compare",
            *CLUSTER,
        )
        == 0
    )
    return str(out)
