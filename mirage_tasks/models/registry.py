"""Every model family, declared once (the baselines are the simulator's: sim.probes). Stdlib only.

A :class:`Family` says what the rest of the code needs to know about a model kind: its
name, its weights file, whether it is a policy (and on which base regressor kind), whether
it is a torch net (so it can train on a GPU), and where its fit and load functions live
(``"module:function"``, imported only when called, so this module stays importable by
the plan and by the step parsers without numpy or torch).

Everything else derives from :data:`FAMILIES`: the ``train --model`` choices, the
loader's weights names and dispatch, the presets' kinds, the plan's model lists, and the
DAG's model enum (tested against :data:`KINDS`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..sim.probes import BASELINES  # noqa: F401 - the simulator's rules, re-exported beside the kinds


@dataclass(frozen=True)
class Family:
    kind: str
    weights: str  # file name of the weights inside the model directory
    fit: str  # "module:function" that trains it (see mirage_tasks.models.fit)
    load: str  # "module:function" that rebuilds it from config + weights (see mirage_tasks.models.loader)
    base: str | None = None  # policies: the regressor kind the policy decides on
    torch: bool = False  # a torch net: may train on a GPU

    @property
    def policy(self) -> bool:
        return self.base is not None

    def fit_fn(self) -> Callable[..., Any]:
        return _resolve(self.fit)

    def load_fn(self) -> Callable[..., Any]:
        return _resolve(self.load)


_FIT, _LOAD = "mirage_tasks.models.fit", "mirage_tasks.models.loader"

# The order is the order of the DAG's model list and of the report's tables.
FAMILIES: dict[str, Family] = {f.kind: f for f in (
    Family("xgboost", "model.ubj", f"{_FIT}:fit_trees", f"{_LOAD}:load_trees"),
    Family("random_forest", "model.skops", f"{_FIT}:fit_trees", f"{_LOAD}:load_trees"),
    # XGBoost fitted to the 0.9 quantile of the signed interruption (reg:quantileerror)
    Family("xgboost_quantile", "model.ubj", f"{_FIT}:fit_trees", f"{_LOAD}:load_trees"),
    # the reference baselines script's linear quantile regressor (q = 0.9, highs), coefficients in JSON
    Family("linear_quantile", "model.json", f"{_FIT}:fit_trees", f"{_LOAD}:load_trees"),
    Family("transformer", "model.pt", f"{_FIT}:fit_neural", f"{_LOAD}:load_net", torch=True),
    Family("moe", "model.pt", f"{_FIT}:fit_neural", f"{_LOAD}:load_net", torch=True),
    Family("transformer_policy", "policy.pt", f"{_FIT}:train_policy", f"{_LOAD}:load_policy",
           base="transformer", torch=True),
    Family("moe_policy", "policy.pt", f"{_FIT}:train_policy", f"{_LOAD}:load_policy", base="moe", torch=True),
)}

KINDS: tuple[str, ...] = tuple(FAMILIES)
REGRESSORS: tuple[str, ...] = tuple(k for k, f in FAMILIES.items() if not f.policy)
POLICIES: dict[str, str] = {k: f.base for k, f in FAMILIES.items() if f.base is not None}
NETS: tuple[str, ...] = tuple(k for k in REGRESSORS if FAMILIES[k].torch)  # regressors that can use a GPU



def family(kind: str) -> Family:
    """The family of ``kind``; ``KeyError`` naming the known kinds otherwise."""
    try:
        return FAMILIES[kind]
    except KeyError:
        raise KeyError(f"unknown model kind {kind!r}; known: {', '.join(KINDS)}") from None


def _resolve(ref: str) -> Callable[..., Any]:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)
