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
    """The hyper-parameters a trial tries for ``kind`` (its family's ``hpo`` space, on top of
    the preset's ``hp``)."""
    from .registry import family

    suggest = family(kind).hpo_fn()
    if suggest is None:
        raise StepError(f"no hyper-parameter search space for {kind}")
    s = suggest(trial)
    if "n_heads" in hp and "d_model" in s and s["d_model"] % int(hp["n_heads"]):
        s["n_heads"] = 1
    return {**hp, **s}


def loss_fn(kind: str, hp: dict[str, Any]) -> tuple[str, Any]:
    """(name, function(pred, y)) the search minimises: pinball at the model's quantile (an
    ``hp["quantile"]`` that is set), else MAE (hours)."""
    q = hp.get("quantile")
    if q is not None:
        qf = float(q)

        def pinball(pred: np.ndarray, y: np.ndarray) -> float:
            d = np.asarray(y, np.float64) - np.asarray(pred, np.float64)
            return float(np.mean(np.maximum(qf * d, (qf - 1.0) * d)))

        return f"val_pinball_q{qf:g}_h", pinball
    return "val_mae_h", lambda pred, y: float(np.mean(np.abs(np.asarray(pred, np.float64) - y)))


def search(
    kind: str, hp: dict[str, Any], trial_fit: Any, *, n_trials: int, timeout_s: float | None, seed: int
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
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
        records.append(
            {
                "number": trial.number,
                "value": value,
                "params": dict(trial.params),
                "seconds": round(time.monotonic() - t, 2),
            }
        )
        log.info(
            "hpo %s trial %d: %s=%.4f %s (%.1f s)", kind, trial.number, name, value, trial.params, time.monotonic() - t
        )
        return value

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.TPESampler(seed=seed))
    # the preset itself is trial 0: the search can only keep it or improve on it (on the split)
    study.enqueue_trial({k: hp[k] for k in _space_keys(kind, hp)}, skip_if_exists=True)
    t0 = time.monotonic()
    study.optimize(objective, n_trials=n_trials, timeout=timeout_s, catch=(RuntimeError, ValueError))
    history = []
    for tr in study.trials:
        rec = next((r for r in records if r["number"] == tr.number), {})
        history.append(
            {
                "number": tr.number,
                "state": tr.state.name,
                "value": tr.value,
                "params": dict(tr.params),
                "seconds": rec.get("seconds"),
            }
        )
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    if not done:
        raise StepError(f"hyper-parameter search for {kind}: no trial completed within {timeout_s} s")
    best = study.best_trial
    best_hp = {**hp, **_from_params(kind, hp, best.params)}
    summary = {
        "library": f"optuna {optuna.__version__}",
        "sampler": "TPESampler",
        "seed": seed,
        "n_trials": len(study.trials),
        "n_complete": len(done),
        "trials_asked": n_trials,
        "timeout_s": timeout_s,
        "seconds": round(time.monotonic() - t0, 1),
        "objective": name,
        "data": "the training period's chronological split (train rows fit, validation rows score)",
        "best_number": best.number,
        "best_value": best.value,
        "best_params": dict(best.params),
        "preset_value": next((t.value for t in study.trials if t.number == 0), None),
    }
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
