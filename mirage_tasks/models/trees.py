"""Tree baselines: XGBoost (saved as UBJ) and a random forest (saved with skops).

Both read the scaled history either flattened (``features="flat"``: W*F columns, as
the reference) or summarised (``features="summary"``: for every feature its last value,
mean, minimum, maximum and change over the last hour: 5*F columns).

Neither format runs code on load: XGBoost's UBJ is a plain data format; skops refuses
any type outside the explicit list in :data:`RF_TRUSTED` (plus skops' own defaults).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from stepkit import StepError

SUMMARY_STATS = ("last", "mean", "min", "max", "delta_1h")

# Types a saved RandomForestRegressor needs beyond skops' defaults (checked at save time).
RF_TRUSTED = ["sklearn.tree._tree.Tree"]


def tree_features(Xs: np.ndarray, mode: str, step_s: int = 600) -> np.ndarray:
    """Table for the trees from scaled histories [n, W, F]."""
    n, W, F = Xs.shape
    if mode == "flat":
        return Xs.reshape(n, W * F)
    if mode == "summary":
        lag = max(1, min(W - 1, int(round(3600 / max(step_s, 1)))))
        parts = [Xs[:, -1], Xs.mean(1), Xs.min(1), Xs.max(1), Xs[:, -1] - Xs[:, -1 - lag]]
        return np.concatenate(parts, axis=1).astype(np.float32)
    raise StepError(f"unknown tree feature mode {mode!r}; use flat or summary")


# ----------------------------------------------------------------------------- XGBoost


def xgb_params(hp: dict[str, Any], seed: int, threads: int | None) -> dict[str, Any]:
    params = {
        "tree_method": "hist",
        "max_depth": int(hp["max_depth"]),
        "eta": float(hp["learning_rate"]),
        "subsample": float(hp["subsample"]),
        "colsample_bytree": float(hp["colsample_bytree"]),
        "min_child_weight": float(hp["min_child_weight"]),
        "seed": int(seed),
        "objective": hp["objective"],
    }
    if hp.get("quantile") is not None:
        q = float(hp["quantile"])
        if not 0.0 < q < 1.0:
            raise StepError(f"quantile must be in (0, 1), got {q}")
        params["objective"] = "reg:quantileerror"
        params["quantile_alpha"] = q
    if threads:
        params["nthread"] = int(threads)
    return params


def fit_xgboost(Xt: np.ndarray, yt: np.ndarray, Xv: np.ndarray, yv: np.ndarray, hp: dict[str, Any],
                seed: int, threads: int | None) -> tuple[Any, list[dict[str, Any]]]:
    import xgboost as xgb

    dtrain, dval = xgb.DMatrix(Xt, label=yt), xgb.DMatrix(Xv, label=yv)
    params = xgb_params(hp, seed, threads)
    params["eval_metric"] = "mae"
    history: dict[str, Any] = {}
    booster = xgb.train(params, dtrain, num_boost_round=int(hp["n_estimators"]),
                        evals=[(dtrain, "train"), (dval, "val")], evals_result=history, verbose_eval=False)
    curves = [{"phase": "xgboost", "round": i + 1, "train_mae_h": float(a), "val_mae_h": float(b)}
              for i, (a, b) in enumerate(zip(history["train"]["mae"], history["val"]["mae"], strict=True))]
    return booster, curves


def xgb_to_bytes(booster: Any) -> bytes:
    return bytes(booster.save_raw(raw_format="ubj"))


def xgb_from_bytes(data: bytes, uri: str) -> Any:
    import xgboost as xgb

    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(data))
    except xgb.core.XGBoostError as exc:
        raise StepError(f"{uri}: not a readable XGBoost model ({str(exc).splitlines()[0]})") from exc
    return booster


def xgb_predict(booster: Any, table: np.ndarray) -> np.ndarray:
    import xgboost as xgb

    return booster.predict(xgb.DMatrix(table)).astype(np.float32)


# ----------------------------------------------------------------------- random forest


def fit_forest(Xt: np.ndarray, yt: np.ndarray, hp: dict[str, Any], seed: int, threads: int | None) -> Any:
    from sklearn.ensemble import RandomForestRegressor

    mf = hp["max_features"]
    model = RandomForestRegressor(
        n_estimators=int(hp["n_estimators"]),
        max_depth=None if hp["max_depth"] is None else int(hp["max_depth"]),
        min_samples_leaf=int(hp["min_samples_leaf"]),
        max_features=mf if isinstance(mf, str) else float(mf),
        n_jobs=threads or 1,
        random_state=int(seed),
    )
    model.fit(Xt, yt)
    return model


@contextlib.contextmanager
def _skops() -> Iterator[Any]:
    """``skops.io``, with warnings silenced: skops looks types up across every loaded module
    (``sys.modules``), which trips unrelated modules' deprecation warnings (e.g. Airflow's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import skops.io as sio

        yield sio


def forest_to_bytes(model: Any) -> bytes:
    with _skops() as sio:
        data = sio.dumps(model)
        untrusted = sio.get_untrusted_types(data=data)
    unknown = [t for t in untrusted if t not in RF_TRUSTED]
    if unknown:  # a scikit-learn upgrade changed what a forest contains: refuse to write it
        raise StepError(f"random forest would need untrusted types {unknown} to load; update RF_TRUSTED")
    return data


def forest_from_bytes(data: bytes, uri: str) -> Any:
    try:
        with _skops() as sio:
            model = sio.loads(data, trusted=RF_TRUSTED)
    except Exception as exc:  # noqa: BLE001 - skops raises UntrustedTypesFoundException, zip errors, ...
        raise StepError(f"{uri}: not a loadable skops random forest ({type(exc).__name__}: {exc})") from exc
    from sklearn.ensemble import RandomForestRegressor

    if not isinstance(model, RandomForestRegressor):
        raise StepError(f"{uri}: holds a {type(model).__name__}, not a RandomForestRegressor")
    _check_forest(model, uri)
    return model


def _check_forest(model: Any, uri: str) -> None:
    """Bounds-check every tree's node arrays: scikit-learn indexes them unchecked at predict time."""
    n_features = int(getattr(model, "n_features_in_", 0))
    for i, est in enumerate(getattr(model, "estimators_", [])):
        t = est.tree_
        n = int(t.node_count)
        left, right, feat = np.asarray(t.children_left), np.asarray(t.children_right), np.asarray(t.feature)
        leaf = left == -1
        parent = np.arange(n)[~leaf]
        ok = (
            n > 0 and left.shape == right.shape == feat.shape == (n,)
            and np.array_equal(leaf, right == -1)
            # children come after their parent (no cycles) and inside the arrays
            and np.all((left[~leaf] > parent) & (left[~leaf] < n) & (right[~leaf] > parent) & (right[~leaf] < n))
            and np.all((feat[~leaf] >= 0) & (feat[~leaf] < n_features))
            and np.asarray(t.value).shape[0] == n
        )
        if not ok:
            raise StepError(f"{uri}: tree {i} of the random forest has inconsistent node arrays")
