"""Hyper-parameter search with Optuna, on the training period only.

``train --hpo-trials N --hpo-timeout-s T`` runs an Optuna study (TPE sampler seeded by
``--seed``, at most N trials and T seconds) before the final fit. Every trial fits the
model on the training rows of the chronological split and scores it on that split's
validation rows (the latest samples of the *training* period, after the purge): the mean
absolute error in hours, or the pinball loss at the model's quantile for the quantile
kinds. Nothing of the validation month is seen. The best trial's hyper-parameters are
then used for the model that is saved (fitted on the same training rows).

The study's history is saved beside the model as ``hpo_trials.json`` (one record per
trial: number, state, value, parameters, seconds) and plotted by the report.

Why Optuna: a maintained library made for this (samplers, pruning, time budgets, a study
history), rather than a hand-written random search.
"""

from __future__ import annotations

import logging
import tempfile
import time
from typing import Any

import numpy as np

from stepkit import StepError

log = logging.getLogger(__name__)

HPO_FILE = "hpo_trials.json"


def space(trial: Any, kind: str, hp: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters a trial tries for ``kind`` (on top of the preset's ``hp``)."""
    s: dict[str, Any] = {}
    if kind in ("xgboost", "xgboost_quantile"):
        s = {"n_estimators": trial.suggest_int("n_estimators", 100, 600, step=50),
             "max_depth": trial.suggest_int("max_depth", 2, 8),
             "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.3, log=True),
             "subsample": trial.suggest_float("subsample", 0.5, 1.0),
             "colsample_bytree": trial.suggest_float("colsample_bytree", 0.2, 1.0),
             "min_child_weight": trial.suggest_float("min_child_weight", 0.5, 20.0, log=True)}
    elif kind == "random_forest":
        s = {"n_estimators": trial.suggest_int("n_estimators", 50, 200, step=25),
             "min_samples_leaf": trial.suggest_int("min_samples_leaf", 1, 30, log=True),
             "max_features": trial.suggest_float("max_features", 0.05, 1.0, log=True)}
    elif kind == "linear_quantile":
        s = {"alpha": trial.suggest_float("alpha", 1e-5, 1e-1, log=True)}
    elif kind == "transformer":
        s = {"lr": trial.suggest_float("lr", 2e-4, 5e-3, log=True),
             "d_model": trial.suggest_categorical("d_model", [16, 32, 64]),
             "n_layers": trial.suggest_int("n_layers", 1, 2),
             "dropout": trial.suggest_float("dropout", 0.0, 0.3),
             "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)}
    elif kind == "moe":
        s = {"lr": trial.suggest_float("lr", 2e-4, 5e-3, log=True),
             "expert_lr": trial.suggest_float("expert_lr", 2e-4, 5e-3, log=True),
             "d_model": trial.suggest_categorical("d_model", [8, 16, 32]),
             "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True)}
    else:
        raise StepError(f"no hyper-parameter search space for {kind}")
    if "n_heads" in hp and "d_model" in s and s["d_model"] % int(hp["n_heads"]):
        s["n_heads"] = 1
    return {**hp, **s}


def loss_fn(kind: str, hp: dict[str, Any]) -> tuple[str, Any]:
    """(name, function(pred, y)) the search minimises: pinball at the quantile, else MAE (hours)."""
    q = hp.get("quantile") if kind in ("xgboost_quantile", "linear_quantile", "xgboost") else None
    if q is not None:
        qf = float(q)

        def pinball(pred: np.ndarray, y: np.ndarray) -> float:
            d = np.asarray(y, np.float64) - np.asarray(pred, np.float64)
            return float(np.mean(np.maximum(qf * d, (qf - 1.0) * d)))

        return f"val_pinball_q{qf:g}_h", pinball
    return "val_mae_h", lambda pred, y: float(np.mean(np.abs(np.asarray(pred, np.float64) - y)))


def search(kind: str, hp: dict[str, Any], trial_fit: Any, *, n_trials: int, timeout_s: float | None,
           seed: int) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Run the study; ``trial_fit(hp, workdir) -> predictions on the split's validation rows`` and the
    targets come through ``trial_fit`` too. Returns (best hp, trial history, summary)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, loss = loss_fn(kind, hp)
    records: list[dict[str, Any]] = []

    def objective(trial: Any) -> float:
        t = time.monotonic()
        thp = space(trial, kind, hp)
        with tempfile.TemporaryDirectory(prefix="mirage-hpo-") as tmp:
            pred, y = trial_fit(thp, tmp)
        value = loss(pred, y)
        records.append({"number": trial.number, "value": value, "params": dict(trial.params),
                        "seconds": round(time.monotonic() - t, 2)})
        log.info("hpo %s trial %d: %s=%.4f %s (%.1f s)", kind, trial.number, name, value, trial.params,
                 time.monotonic() - t)
        return value

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    # the preset itself is trial 0: the search can only keep it or improve on it (on the split)
    study.enqueue_trial({k: hp[k] for k in _space_keys(kind, hp)}, skip_if_exists=True)
    t0 = time.monotonic()
    study.optimize(objective, n_trials=n_trials, timeout=timeout_s, catch=(RuntimeError, ValueError))
    history = []
    for tr in study.trials:
        rec = next((r for r in records if r["number"] == tr.number), {})
        history.append({"number": tr.number, "state": tr.state.name, "value": tr.value,
                        "params": dict(tr.params), "seconds": rec.get("seconds")})
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    if not done:
        raise StepError(f"hyper-parameter search for {kind}: no trial completed within {timeout_s} s")
    best = study.best_trial
    best_hp = {**hp, **_from_params(kind, hp, best.params)}
    summary = {"library": f"optuna {optuna.__version__}", "sampler": "TPESampler", "seed": seed,
               "n_trials": len(study.trials), "n_complete": len(done), "trials_asked": n_trials,
               "timeout_s": timeout_s, "seconds": round(time.monotonic() - t0, 1), "objective": name,
               "data": "the training period's chronological split (train rows fit, validation rows score)",
               "best_number": best.number, "best_value": best.value, "best_params": dict(best.params),
               "preset_value": next((t.value for t in study.trials if t.number == 0), None)}
    return best_hp, history, summary


def _space_keys(kind: str, hp: dict[str, Any]) -> list[str]:
    """The names ``space`` suggests for ``kind`` (recorded by a stand-in trial)."""
    keys: list[str] = []

    class _Names:
        def __getattr__(self, method: str) -> Any:
            def suggest(key: str, *a: Any, **kw: Any) -> Any:
                keys.append(key)
                return a[0][0] if method == "suggest_categorical" else a[0]
            return suggest

    space(_Names(), kind, hp)
    return [k for k in keys if k in hp]


def _from_params(kind: str, hp: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    out = dict(params)
    if "n_heads" in hp and "d_model" in out and out["d_model"] % int(hp["n_heads"]):
        out["n_heads"] = 1
    return out
