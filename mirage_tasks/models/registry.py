"""Every model family, declared once, in one row. Stdlib only.

A :class:`Family` is everything the rest of the code needs to know about a model kind; its
functions are named as ``"module:function"`` and imported only when called, so this module
stays importable by the plan, the DAG files and the step parsers without numpy or torch:

* ``kind`` and ``weights`` (the weights file inside the model folder);
* ``fit``: trains it. A regressor's is ``fit(kind, ds, split, Xs, hp, cfg, step, *, seed,
  device, threads, stop_after) -> curves`` (writes its weights through ``step`` and what its
  loader needs into ``cfg``; :func:`mirage_tasks.models.fit.train_regressor` does the rest:
  split, scaler, search, threshold, metrics); a policy's is
  :func:`mirage_tasks.models.fit.train_policy`;
* ``load``: ``load(uri, cfg, weights_uri, scaler, device)`` -> an object with
  ``predict(X)`` (and ``features(X)`` for a base a policy head can use; a policy's
  ``submit_probability(X)``), wrapped by :func:`mirage_tasks.models.loader.load_model`;
* ``presets``: a mapping ``{preset: {kind: hyper-parameters}}`` holding this kind under
  every preset of ``train --preset`` (the built-in families share ``models/presets.PRESETS``);
* ``hpo``: ``space(trial) -> {name: value}``, the Optuna search space of ``train
  --hpo-trials`` (None: no search);
* ``check``: ``check(path, cfg)`` of the config fields its loader reads (None: none beyond
  the common ones);
* ``net``: a torch regressor's module, with ``arch_from(hp, n_features, window)``,
  ``build(arch, seed)`` and ``phases(model, ds, split, hp, cfg)``
  (:func:`~mirage_tasks.models.fit.fit_neural` and :func:`~mirage_tasks.models.loader.load_net`);
* the policy head: ``base``, the regressor kind whose features a policy decides on
  (:class:`mirage_tasks.models.policy.PolicyHead`); ``torch``: may train on a GPU.

Everything else derives from :data:`FAMILIES`: the ``train --model`` choices, the loader's
weights names and dispatch, the presets' kinds, the search spaces, the plan's model lists
and the DAG's model enum (tested against :data:`KINDS`). "Adding a model" (docs/mirage-steps.md)
shows a new family: its own file, its row here, its test.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..sim.probes import BASELINES  # the simulator's rules, re-exported beside the kinds


@dataclass(frozen=True)
class Family:
    kind: str
    weights: str  # file name of the weights inside the model directory
    fit: str  # "module:function" that trains it
    load: str  # "module:function" that rebuilds it from config + weights
    presets: str  # "module:NAME" of {preset: {kind: hyper-parameters}}
    hpo: str | None = None  # "module:function": the Optuna search space; None: no search
    check: str | None = None  # "module:function": checks the config fields its loader reads
    net: str | None = None  # torch regressors: the module with arch_from, build and phases
    base: str | None = None  # policies: the regressor kind the policy head decides on
    torch: bool = False  # a torch net: may train on a GPU

    @property
    def policy(self) -> bool:
        return self.base is not None

    def fit_fn(self) -> Callable[..., Any]:
        return _resolve(self.fit)

    def load_fn(self) -> Callable[..., Any]:
        return _resolve(self.load)

    def presets_of(self) -> dict[str, dict[str, Any]]:
        """``{preset: hyper-parameters}`` of this kind."""
        return {name: table[self.kind] for name, table in _resolve(self.presets).items() if self.kind in table}

    def hpo_fn(self) -> Callable[..., Any] | None:
        return _resolve(self.hpo) if self.hpo else None

    def check_fn(self) -> Callable[..., Any] | None:
        return _resolve(self.check) if self.check else None

    def net_module(self) -> Any:
        if not self.net:
            raise KeyError(f"model kind {self.kind!r} is not a torch regressor (its family names no net module)")
        return importlib.import_module(self.net)


_M = "mirage_tasks.models"
_FIT, _LOAD, _TREES, _PRESETS = f"{_M}.fit", f"{_M}.loader", f"{_M}.trees", f"{_M}.presets:PRESETS"
_NET = {
    "fit": f"{_FIT}:fit_neural",
    "load": f"{_LOAD}:load_net",
    "presets": _PRESETS,
    "check": f"{_LOAD}:check_net",
    "torch": True,
}
_POLICY = {
    "fit": f"{_FIT}:train_policy",
    "load": f"{_LOAD}:load_policy",
    "presets": _PRESETS,
    "check": f"{_LOAD}:check_policy",
    "torch": True,
}
_TABLE = {"presets": _PRESETS, "check": f"{_TREES}:check_table"}

# The order is the order of the DAG's model list and of the report's tables.
FAMILIES: dict[str, Family] = {
    f.kind: f
    for f in (
        Family("xgboost", "model.ubj", f"{_TREES}:fit_xgb", f"{_TREES}:load_xgb", hpo=f"{_TREES}:xgb_space", **_TABLE),
        Family(
            "random_forest", "model.skops", f"{_TREES}:fit_rf", f"{_TREES}:load_rf", hpo=f"{_TREES}:rf_space", **_TABLE
        ),
        # XGBoost fitted to the 0.9 quantile of the signed interruption (reg:quantileerror)
        Family(
            "xgboost_quantile",
            "model.ubj",
            f"{_TREES}:fit_xgb",
            f"{_TREES}:load_xgb",
            hpo=f"{_TREES}:xgb_space",
            **_TABLE,
        ),
        # the reference baselines script's linear quantile regressor (q = 0.9, highs), coefficients in JSON
        Family(
            "linear_quantile",
            "model.json",
            f"{_TREES}:fit_linear",
            f"{_TREES}:load_linear",
            hpo=f"{_TREES}:linear_space",
            **_TABLE,
        ),
        Family("transformer", "model.pt", net=f"{_M}.transformer", hpo=f"{_M}.transformer:hpo_space", **_NET),
        Family("moe", "model.pt", net=f"{_M}.moe", hpo=f"{_M}.moe:hpo_space", **_NET),
        Family("transformer_policy", "policy.pt", base="transformer", **_POLICY),
        Family("moe_policy", "policy.pt", base="moe", **_POLICY),
    )
}

KINDS: tuple[str, ...] = tuple(FAMILIES)
REGRESSORS: tuple[str, ...] = tuple(k for k, f in FAMILIES.items() if not f.policy)
POLICIES: dict[str, str] = {k: f.base for k, f in FAMILIES.items() if f.base is not None}
NETS: tuple[str, ...] = tuple(k for k in REGRESSORS if FAMILIES[k].torch)  # regressors that can use a GPU


def family(kind: str) -> Family:
    """The family of ``kind``; ``KeyError`` naming the known kinds otherwise."""
    try:
        return FAMILIES[kind]
    except KeyError:
        raise KeyError(f"unknown model kind {kind!r}; known: {', '.join(FAMILIES)}") from None


def register(fam: Family) -> Family:
    """Add a family at run time (a test's or a plug-in's own family; the built-in ones are the
    rows above). ``train --model`` offers it from then on; the tuples above (the DAG's model
    list) keep the built-in kinds."""
    if fam.kind in FAMILIES or fam.kind in BASELINES:
        raise ValueError(f"model kind {fam.kind!r} exists already")
    if fam.base is not None and fam.base not in FAMILIES:
        raise ValueError(f"policy {fam.kind!r}: unknown base kind {fam.base!r}")
    FAMILIES[fam.kind] = fam
    return fam


def unregister(kind: str) -> None:
    """Remove a family :func:`register` added (the built-in kinds stay)."""
    if kind in KINDS:
        raise ValueError(f"{kind!r} is a built-in model kind")
    FAMILIES.pop(kind, None)


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)
