"""Hyper-parameters of the built-in model kinds (:data:`.registry.KINDS`), in two presets
(each family's row names where its presets are: these, for the built-in ones).

``quick`` (default) trains every model on a 4,788-example ls6-sized dataset on 2 CPU
cores in minutes: small transformers over 36 patches of 4 snapshots, summary features
for the trees. Measured on the ls6 node-1 dataset (4,788 x 144 x 44, 2 shared cores,
``bench/train.py``): transformer 22 s, MoE 56 s, XGBoost 3 s, random forest 6 s;
policies on the simulator 40 s (transformer) and 110 s (MoE); up to ~4x longer when
the cores are busy.

``paper`` follows the reference sizes (embedding 512, feed-forward 128, 1 layer/1 head
per expert, 2 layers/2 heads for the single transformer, 300 epochs, lr 1e-5 (MoE) /
1e-4 (transformer), batch 64 (experts) / 128, 10 experts) and is meant for a GPU: one
joint MoE epoch on ls6 is estimated at ~8 minutes on 2 CPU cores. The policies'
``paper`` preset is the reference's ls6 budget (lr 0.01, 32 episodes per update, 60
epochs for the transformer policy, 20 for the MoE policy); ``quick`` is 12 updates of
16 episodes (lr 0.05).

``xgboost_quantile`` is XGBoost with ``reg:quantileerror`` at q = 0.9; ``linear_quantile``
the reference's ``QuantileRegressor(quantile=0.9, solver="highs")`` on the trees' summary
table (quick: at most 3,000 training rows in the LP). Policies train with 8 clipped PPO
steps per batch and an entropy bonus decaying to 0 (``ppo_epochs=1 entropy_final=0.1`` is
the seed's REINFORCE). The paper presets' neural nets use ``amp=auto`` (bfloat16 autocast
on CUDA).

Any value can be overridden with ``--param key=value``.
"""

from __future__ import annotations

import copy
from typing import Any

from stepkit import StepError

from .registry import FAMILIES, family

# amp: "off" (float32), "bf16" (autocast to bfloat16 on any device) or "auto" (bfloat16 on CUDA only)
_COMMON_TORCH = {"checkpoint_every": 1, "weight_decay": 0.0, "grad_clip": 1.0, "lr_schedule": "cosine", "amp": "off"}

_QUICK_TX = {
    "d_model": 32,
    "n_heads": 2,
    "n_layers": 1,
    "d_ff": 64,
    "patch": 4,
    "dropout": 0.1,
    "head": "pool",
    "loss": "huber",
}

# The reference's QuantileRegressor(quantile=0.9, solver="highs") keeps scikit-learn's alpha=1.0;
# on standardised features that L1 penalty zeroes every coefficient (a constant quantile), so the
# default here is small and HPO may tune it. max_rows bounds the LP (0 = every training row).
_LINEAR_Q = {"features": "summary", "quantile": 0.9, "alpha": 1e-3, "solver": "highs"}

_POLICY = {
    # PPO-style clipped updates (8 per batch) and an entropy bonus decaying to 0: trained with one
    # REINFORCE step per batch (ppo_epochs=1, entropy_final=0.1: the seed), the policies' greedy action
    # never submitted (see mirage_tasks.models.policy)
    "entropy": 0.1,
    "entropy_final": 0.0,
    "hidden": 0,
    "init_submit_prob": 0.005,
    "parallel_envs": 8,
    "eval_mode": "sample",
    "checkpoint_every": 1,
    "ppo_epochs": 8,
    "clip": 0.2,
}

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "quick": {
        "transformer": {**_COMMON_TORCH, **_QUICK_TX, "epochs": 40, "lr": 1e-3, "batch_size": 64, "weight_decay": 1e-4},
        "moe": {
            **_COMMON_TORCH,
            **_QUICK_TX,
            "d_model": 16,
            "n_heads": 1,
            "d_ff": 32,
            "n_experts": 10,
            "expert_fraction": 0.5,
            "expert_epochs": 10,
            "expert_lr": 1e-3,
            "expert_batch_size": 32,
            "epochs": 20,
            "lr": 1e-3,
            "batch_size": 64,
            "gate_hidden": 32,
            "weight_decay": 1e-4,
        },
        "xgboost": {
            "features": "summary",
            "n_estimators": 300,
            "max_depth": 4,
            "learning_rate": 0.05,
            "subsample": 0.8,
            "colsample_bytree": 0.5,
            "min_child_weight": 1.0,
            "objective": "reg:absoluteerror",
            "quantile": None,
        },
        "random_forest": {
            "features": "summary",
            "n_estimators": 100,
            "max_depth": None,
            "min_samples_leaf": 2,
            "max_features": 0.3,
        },
        "xgboost_quantile": {
            "features": "summary",
            "n_estimators": 300,
            "max_depth": 4,
            "learning_rate": 0.05,
            "subsample": 0.8,
            "colsample_bytree": 0.5,
            "min_child_weight": 1.0,
            "objective": "reg:quantileerror",
            "quantile": 0.9,
        },
        "linear_quantile": {**_LINEAR_Q, "max_rows": 3000},
        "moe_policy": {**_POLICY, "epochs": 12, "episodes_per_epoch": 16, "eval_episodes": 8, "lr": 0.05},
        "transformer_policy": {**_POLICY, "epochs": 12, "episodes_per_epoch": 16, "eval_episodes": 8, "lr": 0.05},
    },
    "paper": {
        "transformer": {
            **_COMMON_TORCH,
            "d_model": 512,
            "n_heads": 2,
            "n_layers": 2,
            "d_ff": 128,
            "patch": 1,
            "dropout": 0.1,
            "head": "flatten",
            "loss": "l1",
            "epochs": 300,
            "lr": 1e-4,
            "lr_schedule": "constant",
            "batch_size": 128,
            "checkpoint_every": 5,
            "amp": "auto",
        },
        "moe": {
            **_COMMON_TORCH,
            "d_model": 512,
            "n_heads": 1,
            "n_layers": 1,
            "d_ff": 128,
            "patch": 1,
            "dropout": 0.1,
            "head": "flatten",
            "loss": "mse",
            "lr_schedule": "constant",
            "n_experts": 10,
            "expert_fraction": 0.5,
            "expert_epochs": 300,
            "expert_lr": 1e-5,
            "expert_batch_size": 64,
            "epochs": 300,
            "lr": 1e-5,
            "batch_size": 128,
            "gate_hidden": 32,
            "checkpoint_every": 5,
            "amp": "auto",
        },
        "xgboost": {
            "features": "flat",
            "n_estimators": 1000,
            "max_depth": 6,
            "learning_rate": 0.03,
            "subsample": 0.8,
            "colsample_bytree": 0.3,
            "min_child_weight": 1.0,
            "objective": "reg:absoluteerror",
            "quantile": None,
        },
        "random_forest": {
            "features": "flat",
            "n_estimators": 100,
            "max_depth": None,
            "min_samples_leaf": 1,
            "max_features": 1.0,
        },
        "xgboost_quantile": {
            "features": "flat",
            "n_estimators": 1000,
            "max_depth": 6,
            "learning_rate": 0.03,
            "subsample": 0.8,
            "colsample_bytree": 0.3,
            "min_child_weight": 1.0,
            "objective": "reg:quantileerror",
            "quantile": 0.9,
        },
        "linear_quantile": {**_LINEAR_Q, "max_rows": 0},
        "moe_policy": {**_POLICY, "epochs": 20, "episodes_per_epoch": 32, "eval_episodes": 32, "lr": 0.01},
        "transformer_policy": {**_POLICY, "epochs": 60, "episodes_per_epoch": 32, "eval_episodes": 32, "lr": 0.01},
    },
}


def _coerce(old: Any, text: str) -> Any:
    if text.lower() in ("none", "null"):
        return None
    if isinstance(old, bool):
        if text.lower() in ("1", "true", "yes"):
            return True
        if text.lower() in ("0", "false", "no"):
            return False
        raise ValueError(text)
    if isinstance(old, int):
        return int(text)
    if isinstance(old, float) or old is None:
        try:
            return int(text) if old is None and text.lstrip("-").isdigit() else float(text)
        except ValueError:
            if old is None:
                return text
            raise
    return text


def resolve(preset: str, kind: str, overrides: dict[str, Any] | list[str] | None = None) -> dict[str, Any]:
    """The hyper-parameters of ``kind`` in ``preset`` with ``overrides`` (dict or ``key=value`` strings)."""
    if preset not in PRESETS:
        raise StepError(f"unknown preset {preset!r}; choose from {', '.join(PRESETS)}")
    if kind not in FAMILIES:
        raise StepError(f"unknown model {kind!r}; choose from {', '.join(FAMILIES)}")
    table = family(kind).presets_of()  # the family's own presets (registry ``presets``)
    if preset not in table:
        raise StepError(f"preset {preset!r} has no hyper-parameters for {kind!r}")
    hp = copy.deepcopy(table[preset])
    items: list[tuple[str, Any]] = []
    if isinstance(overrides, dict):
        items = list(overrides.items())
    elif overrides:
        for text in overrides:
            if "=" not in text:
                raise StepError(f"--param expects key=value, got {text!r}")
            k, v = text.split("=", 1)
            items.append((k.strip(), v.strip()))
    for k, v in items:
        if k not in hp:
            raise StepError(f"unknown parameter {k!r} for {kind}; known: {', '.join(sorted(hp))}")
        if isinstance(v, str):
            try:
                v = _coerce(hp[k], v)
            except ValueError as exc:
                raise StepError(f"parameter {k}: cannot read {v!r} as {type(hp[k]).__name__}") from exc
        hp[k] = v
    return hp
