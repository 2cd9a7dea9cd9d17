"""A model's files as the steps meet them: a bad config.json, inputs that were never committed, a truncated checkpoint: exit 2 naming the file, or training set aside and restarted; nothing else written."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil

import pytest
from test_validate_support import CLUSTER, NODE, VAL_COUNT, VAL_START, cli, iso, validate, world  # noqa: F401 - fixtures

from mirage_tasks.models import toy as S
from stepkit import MARKER


def _copy_model(src: str, dst, edit) -> str:
    """A copy of a model with an edited config.json, committed with it (its marker records the
    edited file: a model whose trainer wrote a bad config, not a config changed after the commit,
    which is refused before its content is read; tests/test_lease.py)."""
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    data = json.dumps(cfg).encode()
    (dst / "config.json").write_bytes(data)
    marker = json.loads((dst / MARKER).read_text())
    marker["outputs"]["config.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (dst / MARKER).write_text(json.dumps(marker))
    return str(dst)


def _drop(path: str, key: str):
    def edit(cfg):
        node = cfg
        *parents, last = path.split(".") if path else [key]
        for p in parents:
            node = node[p]
        del node[last]

    return edit


@pytest.mark.parametrize(
    "name, edit, needle",
    [
        ("no_tree_features", _drop("n_tree_features", ""), "'n_tree_features' must be a positive integer"),
        ("no_feature_names", _drop("data.feature_names", ""), "'data.feature_names' must be a non-empty list"),
        (
            "window_lots",
            lambda c: c["data"].update(window="lots"),
            "'data.window' must be a positive integer, got 'lots'",
        ),
        ("weights_outside", lambda c: c.update(weights="../../etc/passwd"), "points outside the model folder"),
        ("weights_absolute", lambda c: c.update(weights="/etc/passwd"), "points outside the model folder"),
        ("weights_other", lambda c: c.update(weights="model.pt"), "is not the 'model.ubj' file"),
    ],
)
def test_bad_model_config_exits_2_naming_the_file(world, tmp_path, capsys, name, edit, needle):
    bad = _copy_model(world["xgb"], tmp_path / name, edit)
    out = tmp_path / "out"
    assert validate(world["trace"], bad, out) == 2
    err = capsys.readouterr().err
    assert f"{bad}/config.json" in err and needle in err and "Traceback" not in err
    assert not out.exists()


def _uncommitted(src: str, dst) -> str:
    shutil.copytree(src, dst)
    os.remove(dst / MARKER)
    return str(dst)


def test_uncommitted_inputs_are_refused(world, tmp_path, capsys):
    trace = _uncommitted(world["trace"], tmp_path / "trace")
    model = _uncommitted(world["xgb"], tmp_path / "xgb")
    dataset = _uncommitted(world["dataset"], tmp_path / "ds")
    out = tmp_path / "out"
    runs = [
        (
            "--trace",
            [
                "sample",
                "--trace",
                trace,
                "--start",
                iso(VAL_START),
                "--count",
                2,
                "--node",
                NODE,
                "--out",
                out,
                *CLUSTER,
            ],
        ),
        (
            "--trace",
            [
                "validate",
                "--trace",
                trace,
                "--model",
                "reactive",
                "--start",
                iso(VAL_START),
                "--count",
                VAL_COUNT,
                "--node",
                NODE,
                "--out",
                out,
                *CLUSTER,
            ],
        ),
        (
            "--model",
            [
                "validate",
                "--trace",
                world["trace"],
                "--model",
                model,
                "--start",
                iso(VAL_START),
                "--count",
                VAL_COUNT,
                "--node",
                NODE,
                "--out",
                out,
                *CLUSTER,
            ],
        ),
        ("--dataset", ["train", "--model", "xgboost", "--dataset", dataset, "--out", out]),
        (
            "--base",
            ["train", "--model", "transformer_policy", "--base", model, "--trace", world["trace"], "--out", out],
        ),
    ]
    for flag, argv in runs:
        assert cli(*argv) == 2, argv
        err = capsys.readouterr().err
        assert f"{flag} {tmp_path}" in err and f"has no {MARKER}" in err, err
        assert not out.exists()
    # a single .parquet file is written atomically: taken as is
    assert validate(os.path.join(world["trace"], "trace.parquet"), "reactive", out, count=2) == 0


TINY_TX = [
    "--param",
    "epochs=4",
    "--param",
    "d_model=8",
    "--param",
    "d_ff=8",
    "--param",
    "patch=4",
    "--threads",
    "1",
    "--purge-days",
    "1",
    "--val-fraction",
    "0.25",
]


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("data") / "ds")
    S.write_synthetic_dataset(uri, n_samples=24, window=16, seed=5)
    return uri


def _train(dataset, out, *extra) -> int:
    return cli("train", "--model", "transformer", "--dataset", dataset, "--out", out, *TINY_TX, *extra)


def test_truncated_checkpoint_is_set_aside_and_training_restarts(small_dataset, tmp_path, capsys):
    ref, out = tmp_path / "ref", tmp_path / "m"
    assert _train(small_dataset, ref) == 0
    # only one checkpoint, truncated: set aside, training restarts from scratch
    assert _train(small_dataset, out, "--stop-after-epochs", "1") == 75
    ck = out / "checkpoints" / "train.pt"
    ck.write_bytes(ck.read_bytes()[:100])
    capsys.readouterr()
    assert _train(small_dataset, out) == 0
    err = capsys.readouterr().err
    aside = glob.glob(str(ck) + ".corrupt-*")
    assert len(aside) == 1 and os.path.getsize(aside[0]) == 100  # renamed, not deleted
    assert "unreadable" in err and f"set aside as {aside[0]}" in err
    assert (out / "model.pt").read_bytes() == (ref / "model.pt").read_bytes()  # same model as a clean run


def test_truncated_checkpoint_resumes_from_the_previous_one(small_dataset, tmp_path, capsys):
    ref, out = tmp_path / "ref", tmp_path / "m"
    assert _train(small_dataset, ref) == 0
    assert _train(small_dataset, out, "--stop-after-epochs", "3") == 75
    ck = out / "checkpoints" / "train.pt"
    assert (out / "checkpoints" / "train.prev.pt").exists()
    ck.write_bytes(b"")
    capsys.readouterr()
    assert _train(small_dataset, out) == 0
    assert "resuming from the previous checkpoint" in capsys.readouterr().err
    assert glob.glob(str(ck) + ".corrupt-*")
    assert not (out / "checkpoints" / "train.pt").exists() and not (out / "checkpoints" / "train.prev.pt").exists()
    ref_curves = json.loads((ref / "curves.json").read_text())
    assert json.loads((out / "curves.json").read_text()) == ref_curves
