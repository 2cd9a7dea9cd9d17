"""Mirage models: one module per family, one loader returning a decision function.

| module           | what                                                                 |
|------------------|----------------------------------------------------------------------|
| ``registry``     | every model family in one row (kind, weights, fit, load, presets, search space, net, policy base) |
| ``datasets``     | dataset reading, chronological split by sample, feature scaler       |
| ``presets``      | the ``quick`` and ``paper`` hyper-parameters of every model kind      |
| ``transformer``  | transformer regressor (positional encoding) and its config           |
| ``moe``          | mixture of transformer experts with a non-linear gate, and its config |
| ``experts``      | which training rows pre-train which MoE expert                       |
| ``training``     | the epoch loop (phases, checkpoints, resume) of the neural models    |
| ``fit``          | what ``train`` runs: fit a regressor or a policy, write its files    |
| ``thresholds``   | the decision threshold of a model, chosen on its training split      |
| ``trees``        | the table families: XGBoost (UBJ), random forest (skops), linear quantile |
| ``env``          | the environment protocol (``Env``) a policy is trained in            |
| ``policy``       | REINFORCE wait/submit policies on a frozen regressor                 |
| ``simenv``       | ``SimEnv``: the simulator's ``DecisionEpisode`` as an ``Env``        |
| ``toy``          | toy datasets and a toy ``Env`` with a known signal (tests, benches)  |
| ``torchutil``    | device choice, seeding, weights-only checkpoints, progress lines     |
| ``loader``       | :func:`load_model` -> :class:`DecisionFunction`, for every kind      |

Importing this package is cheap: torch, xgboost and scikit-learn are imported by the
family modules only when a model of that family is trained or loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .registry import BASELINES, KINDS, POLICIES, REGRESSORS


class StopRequested(Exception):
    """Training stopped on request after a number of epochs; its checkpoint allows resuming."""


if TYPE_CHECKING:  # pragma: no cover
    from .env import Env
    from .loader import Decision, DecisionFunction, load_model


def __getattr__(name: str) -> Any:
    if name in ("load_model", "DecisionFunction", "Decision"):
        from . import loader

        return getattr(loader, name)
    if name == "Env":
        from .env import Env

        return Env
    raise AttributeError(name)


__all__ = [
    "BASELINES",
    "KINDS",
    "POLICIES",
    "REGRESSORS",
    "Decision",
    "DecisionFunction",
    "Env",
    "StopRequested",
    "load_model",
]
