"""Mixture of transformer experts with a non-linear gate.

K experts (:class:`.transformer.TransformerRegressor`), each created from its own seed
(so they start from different weights) and first trained alone on its own consecutive
chronological slice of the earliest ``expert_fraction`` of the training samples. Then
the gate, ``Linear(W*F -> hidden) -> ReLU -> Linear(hidden -> K) -> softmax`` over the
flattened scaled history, and the experts are trained jointly on all training rows;
the output is the gate-weighted sum of the expert outputs. The gate's last layer
starts at zero, so the mixture starts as the plain average of the pre-trained experts.
Which rows each expert is pre-trained on is :mod:`.experts`; the loop is :mod:`.training`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import transformer


@dataclass(frozen=True)
class MoEConfig:
    """The architecture, as stored in a model's ``config.json`` (``arch``)."""

    expert: dict[str, Any]  # a transformer.TransformerConfig as a dict
    n_experts: int
    gate_hidden: int
    n_features: int
    window: int

    @classmethod
    def from_hp(cls, hp: dict[str, Any], n_features: int, window: int) -> MoEConfig:
        return cls(
            expert=transformer.arch_from(hp, n_features, window),
            n_experts=int(hp["n_experts"]),
            gate_hidden=int(hp["gate_hidden"]),
            n_features=n_features,
            window=window,
        )


class MixtureOfExperts(nn.Module):
    def __init__(self, experts: list[nn.Module], n_features: int, window: int, gate_hidden: int):
        super().__init__()
        self.experts = nn.ModuleList(experts)
        k = len(experts)
        self.gate = nn.Sequential(
            nn.Flatten(), nn.Linear(window * n_features, gate_hidden), nn.ReLU(), nn.Linear(gate_hidden, k)
        )
        nn.init.zeros_(self.gate[-1].weight)
        nn.init.zeros_(self.gate[-1].bias)

    def parts(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Expert outputs [B, K] and gate weights [B, K]."""
        preds = torch.stack([e(x) for e in self.experts], dim=-1)
        weights = torch.softmax(self.gate(x), dim=-1)
        return preds, weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        preds, weights = self.parts(x)
        return (preds * weights).sum(-1)


def arch_from(hp: dict[str, Any], n_features: int, window: int) -> dict[str, Any]:
    return dataclasses.asdict(MoEConfig.from_hp(hp, n_features, window))


def build(arch: dict[str, Any], seed: int = 0) -> MixtureOfExperts:
    """A mixture whose expert ``i`` is initialised from seed ``seed * 7919 + i`` (distinct per expert)."""
    arch = dataclasses.asdict(MoEConfig(**{f.name: arch[f.name] for f in dataclasses.fields(MoEConfig)}))
    experts = []
    for i in range(arch["n_experts"]):
        torch.manual_seed(seed * 7919 + i)
        experts.append(transformer.build(arch["expert"]))
    torch.manual_seed(seed * 7919 + arch["n_experts"])
    return MixtureOfExperts(experts, arch["n_features"], arch["window"], arch["gate_hidden"])


def phases(model: MixtureOfExperts, ds: Any, split: Any, hp: dict[str, Any], cfg: dict[str, Any]) -> list:
    """One pre-training phase per expert on its slice of the early samples (what each saw goes
    into ``cfg["expert_slices"]``), then the whole mixture on every training row."""
    from .experts import expert_phases
    from .training import Phase

    out, cfg["expert_slices"] = expert_phases(model, ds.sample, ds.sample_start, split.train, hp)
    out.append(
        Phase(
            "mixture",
            model,
            split.train,
            int(hp["epochs"]),
            float(hp["lr"]),
            int(hp["batch_size"]),
            float(hp.get("weight_decay", 0.0)),
            hp["lr_schedule"],
        )
    )
    return out


def hpo_space(trial: Any) -> dict[str, Any]:
    """The Optuna search space of ``train --hpo-trials`` (mirage_tasks.models.hpo)."""
    return {
        "lr": trial.suggest_float("lr", 2e-4, 5e-3, log=True),
        "expert_lr": trial.suggest_float("expert_lr", 2e-4, 5e-3, log=True),
        "d_model": trial.suggest_categorical("d_model", [8, 16, 32]),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
    }
