"""The MoE's expert slicing: which training rows pre-train which expert.

Expert ``i`` of ``n_experts`` is first trained alone on the ``i``-th consecutive
chronological slice of the earliest ``expert_fraction`` of the training samples (cut on
sample boundaries, so a sample's probes stay with one expert); then the mixture is
trained on every training row (:mod:`.moe`, :mod:`.training`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepkit import StepError

from ..data.times import iso
from .training import Phase


def sample_slices(sample: np.ndarray, rows: np.ndarray, k: int) -> list[np.ndarray]:
    """Cut ``rows`` (chronological) into ``k`` consecutive slices along sample boundaries
    (``sample[r]`` is the sample of row ``r``)."""
    samples = sample[rows]
    uniq, first = np.unique(samples, return_index=True)
    ordered = uniq[np.argsort(first)]
    if len(ordered) < k:
        raise StepError(
            f"{len(ordered)} samples cannot be cut into {k} expert slices; lower n_experts or expert_fraction"
        )
    parts = np.array_split(ordered, k)
    return [rows[np.isin(samples, p)] for p in parts]


def expert_rows(sample: np.ndarray, train: np.ndarray, n_experts: int, expert_fraction: float) -> list[np.ndarray]:
    """The rows of each expert: the earliest ``expert_fraction`` of the training samples
    (at least one sample per expert), cut into ``n_experts`` consecutive slices."""
    firsts = np.unique(sample[train], return_index=True)
    n_first = max(n_experts, int(round(len(firsts[0]) * float(expert_fraction))))
    ordered = firsts[0][np.argsort(firsts[1])][:n_first]
    early = train[np.isin(sample[train], ordered)]
    return sample_slices(sample, early, n_experts)


def expert_phases(
    model: Any, sample: np.ndarray, sample_start: np.ndarray, train: np.ndarray, hp: dict[str, Any]
) -> tuple[list[Phase], list[dict[str, Any]]]:
    """One pre-training :class:`Phase` per expert of ``model`` and what each saw (for the config)."""
    slices = expert_rows(sample, train, len(model.experts), hp["expert_fraction"])
    wd = float(hp.get("weight_decay", 0.0))
    phases = [
        Phase(
            f"expert {i + 1}/{len(slices)}",
            model.experts[i],
            rows,
            int(hp["expert_epochs"]),
            float(hp["expert_lr"]),
            int(hp["expert_batch_size"]),
            wd,
            hp["lr_schedule"],
        )
        for i, rows in enumerate(slices)
    ]
    info = [
        {
            "rows": int(len(r)),
            "sample_start_min": iso(sample_start[r].min()),
            "sample_start_max": iso(sample_start[r].max()),
        }
        for r in slices
    ]
    return phases, info
