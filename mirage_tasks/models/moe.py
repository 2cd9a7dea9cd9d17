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
        return cls(expert=transformer.arch_from(hp, n_features, window), n_experts=int(hp["n_experts"]),
                   gate_hidden=int(hp["gate_hidden"]), n_features=n_features, window=window)


class MixtureOfExperts(nn.Module):
    def __init__(self, experts: list[nn.Module], n_features: int, window: int, gate_hidden: int):
        super().__init__()
        self.experts = nn.ModuleList(experts)
        k = len(experts)
        self.gate = nn.Sequential(nn.Flatten(), nn.Linear(window * n_features, gate_hidden), nn.ReLU(),
                                  nn.Linear(gate_hidden, k))
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
