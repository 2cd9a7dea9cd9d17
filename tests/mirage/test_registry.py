"""One registry per concept: every list of model kinds and baselines derives from models.registry."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from mirage_tasks.models import presets, registry


def _parser(module: str) -> argparse.ArgumentParser:
    import importlib

    p = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(p)
    return p


def _choices(parser: argparse.ArgumentParser, flag: str) -> tuple:
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return tuple(action.choices)


def test_every_family_is_complete_and_resolvable():
    assert registry.KINDS == tuple(registry.FAMILIES)
    for kind, fam in registry.FAMILIES.items():
        assert fam.kind == kind and fam.weights
        assert callable(fam.fit_fn()) and callable(fam.load_fn())
        if fam.policy:
            assert fam.base in registry.REGRESSORS and fam.torch
    assert set(registry.POLICIES) | set(registry.REGRESSORS) == set(registry.KINDS)
    assert set(registry.NETS) == {"transformer", "moe"}
    assert not set(registry.BASELINES) & set(registry.KINDS)
    with pytest.raises(KeyError, match="unknown model kind 'lstm'"):
        registry.family("lstm")
    for kind, fam in registry.FAMILIES.items():  # the rest of the row: presets, search space, check, net
        assert set(fam.presets_of()) == set(presets.PRESETS), kind
        assert fam.policy or callable(fam.hpo_fn()), kind
        assert fam.check_fn() is None or callable(fam.check_fn())
        if kind in registry.NETS:
            net = fam.net_module()
            assert all(callable(getattr(net, f)) for f in ("arch_from", "build", "phases")), kind
        else:
            with pytest.raises(KeyError, match="not a torch regressor"):
                fam.net_module()


def test_no_model_kind_is_compared_outside_the_registry():
    """A family's behaviour comes from its row: no ``kind == "moe"`` (or ``in ("xgboost", ...)``)
    anywhere in the task package, so a new family cannot fall into another's branch."""
    import ast
    from pathlib import Path

    root = Path(registry.__file__).resolve().parents[1]
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "registry.py" and path.parent.name == "models":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in [node.left, *node.comparators]:
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(v, ast.Constant) and v.value in registry.KINDS for v in values):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def test_presets_loader_train_and_sample_derive_from_the_registry():
    from mirage_tasks.models import loader

    # the shared table holds exactly the families that name it (a family with presets of its own,
    # as docs/mirage-steps.md's "Adding a model" recipe writes one, is not in it), and every
    # family, wherever its presets live, has its kind under every preset train --preset offers
    shared = {k for k, f in registry.FAMILIES.items() if f.presets == f"{presets.__name__}:PRESETS"}
    for name, kinds in presets.PRESETS.items():
        assert set(kinds) == shared, name
    for kind, fam in registry.FAMILIES.items():
        assert set(fam.presets_of()) == set(presets.PRESETS), kind
    assert loader.WEIGHTS == {k: f.weights for k, f in registry.FAMILIES.items()}
    assert _choices(_parser("mirage_tasks.steps.train"), "--model") == registry.KINDS
    assert _choices(_parser("mirage_tasks.steps.sample"), "--baseline") == ("default", *registry.BASELINES)
    from mirage_tasks.evaluation import metrics

    assert metrics.model_order(["xgboost", "avg", "reactive"]) == [*registry.BASELINES, "xgboost"]


def test_step_parsers_import_without_numpy_pandas_or_torch():
    code = (
        "import sys, importlib\n"
        "for s in ('sample', 'merge', 'train', 'validate', 'metrics', 'report', 'synth'):\n"
        "    importlib.import_module('mirage_tasks.steps.' + s)\n"
        "import mirage_tasks.models.registry\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
