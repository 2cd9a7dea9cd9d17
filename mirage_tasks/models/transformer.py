"""Transformer regressor over the snapshot history: the model and its configuration.

Input: scaled features [B, W, F]. Consecutive snapshots are grouped into patches of
``patch`` snapshots (``patch=1`` is one token per snapshot, as in the reference),
linearly embedded, given sinusoidal positional encodings, passed through a transformer
encoder, and reduced to one number by either a flattening head (reference-like) or a
pooling head (mean and last token, then a small MLP). Output: the target in *scaled*
units (``(hours - center) / scale``); :mod:`.loader` converts back to hours. The epoch
loop that trains it is :mod:`.training`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class TransformerConfig:
    """The architecture, as stored in a model's ``config.json`` (``arch``)."""

    n_features: int
    window: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    patch: int = 1  # snapshots per token
    dropout: float = 0.1
    head: str = "pool"  # pool (mean and last token, MLP) or flatten (reference-like)

    @classmethod
    def from_hp(cls, hp: dict[str, Any], n_features: int, window: int) -> TransformerConfig:
        return cls(**{**{k: hp[k] for k in ARCH_KEYS if k in hp}, "n_features": n_features, "window": window})


ARCH_KEYS = tuple(f.name for f in dataclasses.fields(TransformerConfig))


class PositionalEncoding(nn.Module):
    """Fixed sinusoidal encodings added to the token embeddings."""

    def __init__(self, d_model: int, length: int):
        super().__init__()
        pos = torch.arange(length, dtype=torch.float32).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(length, d_model)
        pe[:, 0::2] = torch.sin(pos * div)
        pe[:, 1::2] = torch.cos(pos * div[: d_model // 2])
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.pe[: h.shape[1]]


class TransformerRegressor(nn.Module):
    def __init__(
        self,
        n_features: int,
        window: int,
        d_model: int,
        n_heads: int,
        n_layers: int,
        d_ff: int,
        patch: int = 1,
        dropout: float = 0.1,
        head: str = "pool",
    ):
        super().__init__()
        if window % patch:
            raise ValueError(f"window {window} is not a multiple of patch {patch}")
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of n_heads {n_heads}")
        if head not in ("pool", "flatten"):
            raise ValueError(f"head must be pool or flatten, got {head!r}")
        self.patch, self.tokens, self.head_kind = patch, window // patch, head
        self.embed = nn.Linear(n_features * patch, d_model)
        self.pos = PositionalEncoding(d_model, self.tokens)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout, activation="relu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        if head == "flatten":
            self.head = nn.Linear(self.tokens * d_model, 1)
        else:
            self.head = nn.Sequential(nn.Linear(2 * d_model, d_model), nn.ReLU(), nn.Linear(d_model, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, w, f = x.shape
        h = self.embed(x.reshape(b, self.tokens, self.patch * f))
        h = self.encoder(self.pos(h))
        if self.head_kind == "flatten":
            z = h.reshape(b, -1)
        else:
            z = torch.cat([h.mean(1), h[:, -1]], dim=1)
        return self.head(z).squeeze(-1)


def build(arch: dict[str, Any], seed: int = 0) -> TransformerRegressor:
    """The model of an ``arch`` dict (a :class:`TransformerConfig` as stored in ``config.json``);
    ``seed`` is not used (the caller seeds torch), it is the net interface's (registry)."""
    return TransformerRegressor(**dataclasses.asdict(TransformerConfig(**{k: arch[k] for k in ARCH_KEYS})))


def arch_from(hp: dict[str, Any], n_features: int, window: int) -> dict[str, Any]:
    return dataclasses.asdict(TransformerConfig.from_hp(hp, n_features, window))


def phases(model: TransformerRegressor, ds: Any, split: Any, hp: dict[str, Any], cfg: dict[str, Any]) -> list:
    """One training phase over the training rows."""
    from .training import Phase

    return [
        Phase(
            "transformer",
            model,
            split.train,
            int(hp["epochs"]),
            float(hp["lr"]),
            int(hp["batch_size"]),
            float(hp.get("weight_decay", 0.0)),
            hp["lr_schedule"],
        )
    ]


def hpo_space(trial: Any) -> dict[str, Any]:
    """The Optuna search space of ``train --hpo-trials`` (mirage_tasks.models.hpo)."""
    return {
        "lr": trial.suggest_float("lr", 2e-4, 5e-3, log=True),
        "d_model": trial.suggest_categorical("d_model", [16, 32, 64]),
        "n_layers": trial.suggest_int("n_layers", 1, 2),
        "dropout": trial.suggest_float("dropout", 0.0, 0.3),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
    }
