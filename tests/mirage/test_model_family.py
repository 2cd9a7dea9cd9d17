"""A model family added without editing any other file: "Adding a model" in docs/mirage-steps.md.

This file plays the family's own module and its test at once: ``ridge`` (closed-form ridge
regression on the trees' summary table, numpy only) declares its fit, load, presets, search
space and config check here, is registered for the test only (the one row a real family
adds to ``FAMILIES`` in ``models/registry.py``), and then goes through the normal paths: the
``train`` step (with a hyper-parameter search), :func:`load_model`, ``validate`` online in
the simulator, and the rerun skip.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_validate_support import NODE, validate, world  # noqa: F401 - the world fixture

from mirage_tasks.data.artifacts import ROWS_FILE
from mirage_tasks.models import load_model, registry, trees
from mirage_tasks.models.loader import read_config
from stepkit import StepError, storage

KIND = "ridge"

# ----------------------------------------------------------------------------- the family's own module

PRESETS = {"quick": {KIND: {"features": "summary", "alpha": 1.0}}, "paper": {KIND: {"features": "flat", "alpha": 10.0}}}


def fit(
    kind: str,
    ds: Any,
    split: Any,
    Xs: np.ndarray,
    hp: dict[str, Any],
    cfg: dict[str, Any],
    step: Any,
    *,
    seed: int,
    **_: Any,
) -> list:
    table = trees.tree_features(Xs, hp["features"], int(ds.manifest["step_s"]))
    cfg["tree_features"], cfg["n_tree_features"] = hp["features"], int(table.shape[1])
    A = np.c_[table[split.train], np.ones(len(split.train))].astype(np.float64)
    y = ds.y[split.train].astype(np.float64)
    w = np.linalg.solve(A.T @ A + float(hp["alpha"]) * np.eye(A.shape[1]), A.T @ y)
    step.write_bytes(cfg["weights"], json.dumps({"w": w.tolist()}).encode())
    val = np.c_[table[split.val], np.ones(len(split.val))] @ w
    return [{"phase": KIND, "val_mae_h": float(np.mean(np.abs(val - ds.y[split.val])))}]


def load(uri: str, cfg: dict[str, Any], wuri: str, scaler: Any, device: str) -> trees.TableModel:
    w = np.asarray(json.loads(storage.read_bytes(wuri))["w"], np.float64)
    if w.shape[0] != cfg["n_tree_features"] + 1:
        raise StepError(f"{wuri}: {w.shape[0] - 1} coefficients, config says {cfg['n_tree_features']}")
    return trees.TableModel(
        lambda t: np.c_[t, np.ones(len(t))] @ w, scaler, cfg["tree_features"], int(cfg["data"]["step_s"])
    )


def space(trial: Any) -> dict[str, Any]:
    return {"alpha": trial.suggest_float("alpha", 1e-3, 1e2, log=True)}


# ----------------------------------------------------------------------------- its registry row (test only)

ROW = registry.Family(
    KIND,
    "model.json",
    f"{__name__}:fit",
    f"{__name__}:load",
    presets=f"{__name__}:PRESETS",
    hpo=f"{__name__}:space",
    check="mirage_tasks.models.trees:check_table",
)


@pytest.fixture
def ridge():
    registry.register(ROW)
    yield ROW
    registry.unregister(KIND)


def _train(world, out, *extra) -> int:
    from test_validate_support import cli

    return cli(
        "train",
        "--model",
        KIND,
        "--dataset",
        world["dataset"],
        "--out",
        out,
        "--val-fraction",
        "0.25",
        "--purge-days",
        "0",
        "--threads",
        "1",
        *extra,
    )


def test_a_registered_family_trains_loads_and_validates_through_the_normal_paths(ridge, world, tmp_path):
    out = tmp_path / "ridge"
    assert _train(world, out, "--hpo-trials", "3", "--param", "alpha=2") == 0
    cfg = read_config(str(out))
    assert cfg["kind"] == KIND and cfg["preset_hp"]["features"] == "summary" and cfg["hpo"]["n_trials"] == 3
    assert (out / "hpo_trials.json").exists() and (out / "metrics.json").exists()
    model = load_model(str(out))
    from mirage_tasks.models import datasets as D

    ds = D.load_dataset(world["dataset"])
    pred = model.predict(ds.X[:5])
    assert pred.shape == (5,) and pred.dtype == np.float32 and np.isfinite(pred).all()
    assert model.decide(ds.X[:5]).submit.dtype == bool  # the calibrated threshold applies as for any regressor
    assert _train(world, out, "--hpo-trials", "3", "--param", "alpha=2") == 0  # unchanged: the rerun skips
    # validated online in the simulator as any model, in this process (the family is registered here only)
    v = tmp_path / "v"
    assert validate(world["trace"], str(out), v, "--decide-every-minutes", "240", "--workers", "1") == 0
    rows = pd.read_parquet(v / ROWS_FILE)
    assert (rows["model"] == KIND).all() and (rows["node"] == NODE).all() and len(rows) > 0


def test_without_its_row_the_kind_is_unknown_everywhere(world, tmp_path, capsys):
    with pytest.raises(KeyError, match="unknown model kind 'ridge'"):
        registry.family(KIND)
    assert _train(world, tmp_path / "x") == 2  # argparse: not among --model's choices
    assert "invalid choice: 'ridge'" in capsys.readouterr().err


def test_a_torch_kind_without_a_net_module_is_an_error_not_the_moe_branch(world, tmp_path):
    """Before the registry named each net's module, any torch regressor that was not the
    transformer was built as a mixture of experts."""
    registry.register(
        registry.Family(
            "tiny_net",
            "model.pt",
            "mirage_tasks.models.fit:fit_neural",
            "mirage_tasks.models.loader:load_net",
            presets=f"{__name__}:NET_PRESETS",
            torch=True,
        )
    )
    try:
        with pytest.raises(KeyError, match="'tiny_net' is not a torch regressor"):
            registry.family("tiny_net").net_module()
        from mirage_tasks.models.fit import train_regressor
        from stepkit import Step

        step = Step("train", str(tmp_path / "net"), "test", {})
        with pytest.raises(KeyError, match="'tiny_net' is not a torch regressor"):
            train_regressor(
                "tiny_net",
                world["dataset"],
                step,
                NET_PRESETS["quick"]["tiny_net"],
                threads=1,
                val_fraction=0.25,
                purge_days=0,
            )
    finally:
        registry.unregister("tiny_net")


NET_PRESETS = {"quick": {"tiny_net": {"epochs": 1}}, "paper": {"tiny_net": {"epochs": 1}}}


def test_register_refuses_a_kind_twice_and_an_unknown_base():
    with pytest.raises(ValueError, match="exists already"):
        registry.register(registry.FAMILIES["xgboost"])
    with pytest.raises(ValueError, match="exists already"):
        registry.register(registry.Family("avg", "m.json", "a:b", "a:b", presets="a:B"))
    with pytest.raises(ValueError, match="unknown base kind 'lstm'"):
        registry.register(registry.Family("lstm_policy", "p.pt", "a:b", "a:b", presets="a:B", base="lstm"))
    with pytest.raises(ValueError, match="built-in"):
        registry.unregister("xgboost")
