"""Table families: XGBoost (saved as UBJ), a random forest (saved with skops) and the linear
quantile regressor (coefficients as JSON). Each family's fit, load, search space and config
check are here (``fit_xgb``, ``load_xgb``, ``xgb_space``, ...), named by its row in
:mod:`mirage_tasks.models.registry`.

Both read the scaled history either flattened (``features="flat"``: W*F columns, as
the reference) or summarised (``features="summary"``: for every feature its last value,
mean, minimum, maximum and change over the last hour: 5*F columns).

Neither format runs code on load: XGBoost's UBJ is a plain data format; skops refuses
any type outside the explicit list in :data:`RF_TRUSTED` (plus skops' own defaults).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from stepkit import StepError

log = logging.getLogger(__name__)

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


def fit_xgboost(
    Xt: np.ndarray, yt: np.ndarray, Xv: np.ndarray, yv: np.ndarray, hp: dict[str, Any], seed: int, threads: int | None
) -> tuple[Any, list[dict[str, Any]]]:
    import xgboost as xgb

    dtrain, dval = xgb.DMatrix(Xt, label=yt), xgb.DMatrix(Xv, label=yv)
    params = xgb_params(hp, seed, threads)
    params["eval_metric"] = "mae"
    history: dict[str, Any] = {}
    booster = xgb.train(
        params,
        dtrain,
        num_boost_round=int(hp["n_estimators"]),
        evals=[(dtrain, "train"), (dval, "val")],
        evals_result=history,
        verbose_eval=False,
    )
    curves = [
        {"phase": "xgboost", "round": i + 1, "train_mae_h": float(a), "val_mae_h": float(b)}
        for i, (a, b) in enumerate(zip(history["train"]["mae"], history["val"]["mae"], strict=True))
    ]
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
    except Exception as exc:  # skops raises UntrustedTypesFoundException, zip errors, ...
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
            n > 0
            and left.shape == right.shape == feat.shape == (n,)
            and np.array_equal(leaf, right == -1)
            # children come after their parent (no cycles) and inside the arrays
            and np.all((left[~leaf] > parent) & (left[~leaf] < n) & (right[~leaf] > parent) & (right[~leaf] < n))
            and np.all((feat[~leaf] >= 0) & (feat[~leaf] < n_features))
            and np.asarray(t.value).shape[0] == n
        )
        if not ok:
            raise StepError(f"{uri}: tree {i} of the random forest has inconsistent node arrays")


# ---------------------------------------------------------------- linear quantile regression


def fit_linear_quantile(Xt: np.ndarray, yt: np.ndarray, hp: dict[str, Any], seed: int) -> tuple[Any, dict]:
    """scikit-learn ``QuantileRegressor`` (pinball loss at ``hp["quantile"]``, L1 penalty
    ``hp["alpha"]``, ``highs`` LP solver) on the tree table; at most ``hp["max_rows"]``
    training rows, drawn uniformly with ``seed`` (the LP grows with the rows)."""
    from sklearn.linear_model import QuantileRegressor

    q = float(hp["quantile"])
    if not 0.0 < q < 1.0:
        raise StepError(f"quantile must be in (0, 1), got {q}")
    n = Xt.shape[0]
    cap = int(hp.get("max_rows") or 0)
    rows = np.arange(n)
    if cap and n > cap:
        rows = np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))
    model = QuantileRegressor(quantile=q, alpha=float(hp["alpha"]), solver=hp.get("solver", "highs"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(Xt[rows].astype(np.float64), yt[rows].astype(np.float64))
    return model, {"n_fit_rows": int(len(rows)), "n_nonzero_coef": int(np.count_nonzero(model.coef_))}


def linear_to_bytes(model: Any, quantile: float, alpha: float) -> bytes:
    """Coefficients as JSON (no pickle): ``{"coef": [...], "intercept": x, "quantile": q, "alpha": a}``."""
    import json

    doc = {
        "format": "mirage-linear-quantile",
        "coef": [float(c) for c in model.coef_],
        "intercept": float(model.intercept_),
        "quantile": float(quantile),
        "alpha": float(alpha),
    }
    return (json.dumps(doc) + "\n").encode()


class LinearQuantile:
    """A fitted linear quantile model rebuilt from its JSON coefficients."""

    def __init__(self, coef: np.ndarray, intercept: float, quantile: float):
        self.coef = np.asarray(coef, np.float64)
        self.intercept = float(intercept)
        self.quantile = float(quantile)

    def num_features(self) -> int:
        return int(self.coef.shape[0])

    def predict(self, table: np.ndarray) -> np.ndarray:
        return (np.asarray(table, np.float64) @ self.coef + self.intercept).astype(np.float32)


def linear_from_bytes(data: bytes, uri: str) -> LinearQuantile:
    import json

    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StepError(f"{uri}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != "mirage-linear-quantile":
        raise StepError(
            f"{uri}: not a linear quantile model (format {doc.get('format') if isinstance(doc, dict) else None!r})"
        )
    coef, icpt, q = doc.get("coef"), doc.get("intercept"), doc.get("quantile")
    if (
        not isinstance(coef, list)
        or not coef
        or not all(isinstance(c, (int, float)) and not isinstance(c, bool) for c in coef)
    ):
        raise StepError(f"{uri}: 'coef' must be a non-empty list of numbers")
    if not isinstance(icpt, (int, float)) or isinstance(icpt, bool) or not np.isfinite(icpt):
        raise StepError(f"{uri}: 'intercept' must be a finite number, got {icpt!r}")
    if not isinstance(q, (int, float)) or not 0.0 < float(q) < 1.0:
        raise StepError(f"{uri}: 'quantile' must be in (0, 1), got {q!r}")
    if not np.all(np.isfinite(coef)):
        raise StepError(f"{uri}: 'coef' holds NaN or infinity")
    return LinearQuantile(np.asarray(coef), float(icpt), float(q))


class ForestArrays:
    """A fitted random forest's trees as flat NumPy arrays, predicted by walking all trees at
    once (one vectorised step per tree level).

    Online validation asks the model one history at a time, about 290 times per episode;
    scikit-learn's ``predict`` costs tens of milliseconds per call for 100 trees (per-call
    input validation and a per-tree Python loop), this a fraction of a millisecond. Same
    numbers as ``RandomForestRegressor.predict`` (tested); built from the bounds-checked trees."""

    def __init__(self, model: Any):
        lefts, rights, feats, thrs, vals, roots = [], [], [], [], [], []
        off = 0
        for est in model.estimators_:
            t = est.tree_
            n = int(t.node_count)
            left, right = np.asarray(t.children_left, np.int64), np.asarray(t.children_right, np.int64)
            leaf = left == -1
            lefts.append(np.where(leaf, np.arange(n), left) + off)  # leaves point to themselves
            rights.append(np.where(leaf, np.arange(n), right) + off)
            feats.append(np.where(leaf, 0, np.asarray(t.feature, np.int64)))
            thrs.append(np.asarray(t.threshold, np.float64))
            vals.append(np.asarray(t.value, np.float64).reshape(n, -1)[:, 0])
            roots.append(off)
            off += n
        self.left, self.right = np.concatenate(lefts), np.concatenate(rights)
        self.feature, self.threshold = np.concatenate(feats), np.concatenate(thrs)
        self.value, self.roots = np.concatenate(vals), np.asarray(roots, np.int64)
        self.depth = max(int(est.tree_.max_depth) for est in model.estimators_)
        self.n_features_in_ = int(model.n_features_in_)

    def predict(self, table: np.ndarray) -> np.ndarray:
        x = np.asarray(table, np.float32)  # scikit-learn compares float32 inputs with float64 thresholds
        rows = np.arange(x.shape[0])[:, None]
        node = np.broadcast_to(self.roots, (x.shape[0], len(self.roots))).copy()
        for _ in range(self.depth):
            go_left = x[rows, self.feature[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        return self.value[node].mean(axis=1).astype(np.float32)


# ----------------------------------------------------------------------------- the families


def _table(kind: str, ds: Any, split: Any, Xs: np.ndarray, hp: dict[str, Any], cfg: dict[str, Any]):
    """(train table, train y, validation table, validation y) of the scaled histories; records
    the table's mode and width in ``cfg`` (what the loader rebuilds it with)."""
    table = tree_features(Xs, hp["features"], int(ds.manifest["step_s"]))
    cfg["tree_features"] = hp["features"]
    cfg["n_tree_features"] = int(table.shape[1])
    log.info("%s: %d training rows x %d columns (%s features)", kind, len(split.train), table.shape[1], hp["features"])
    return table[split.train], ds.y[split.train], table[split.val], ds.y[split.val]


def fit_xgb(
    kind: str,
    ds: Any,
    split: Any,
    Xs: np.ndarray,
    hp: dict[str, Any],
    cfg: dict[str, Any],
    step: Any,
    *,
    seed: int,
    threads: int | None,
    **_: Any,
) -> list:
    """``xgboost`` and ``xgboost_quantile`` (CPU; the device and epoch stop do not apply)."""
    Xt, yt, Xv, yv = _table(kind, ds, split, Xs, hp, cfg)
    booster, curves = fit_xgboost(Xt, yt, Xv, yv, hp, seed, threads)
    cfg["xgb_params"] = xgb_params(hp, seed, None)
    step.write_bytes(cfg["weights"], xgb_to_bytes(booster))
    return curves


def fit_rf(
    kind: str,
    ds: Any,
    split: Any,
    Xs: np.ndarray,
    hp: dict[str, Any],
    cfg: dict[str, Any],
    step: Any,
    *,
    seed: int,
    threads: int | None,
    **_: Any,
) -> list:
    Xt, yt, _, _ = _table(kind, ds, split, Xs, hp, cfg)
    t = time.monotonic()
    forest = fit_forest(Xt, yt, hp, seed, threads)
    log.info("random_forest: %d trees in %.1f s", len(forest.estimators_), time.monotonic() - t)
    step.write_bytes(cfg["weights"], forest_to_bytes(forest))
    return [{"phase": "random_forest", "n_estimators": len(forest.estimators_)}]


def fit_linear(
    kind: str,
    ds: Any,
    split: Any,
    Xs: np.ndarray,
    hp: dict[str, Any],
    cfg: dict[str, Any],
    step: Any,
    *,
    seed: int,
    **_: Any,
) -> list:
    Xt, yt, _, _ = _table(kind, ds, split, Xs, hp, cfg)
    t = time.monotonic()
    model, info = fit_linear_quantile(Xt, yt, hp, seed)
    cfg["quantile"] = float(hp["quantile"])
    log.info(
        "linear_quantile: q=%.2f alpha=%g on %d rows, %d non-zero coefficients in %.1f s",
        hp["quantile"],
        hp["alpha"],
        info["n_fit_rows"],
        info["n_nonzero_coef"],
        time.monotonic() - t,
    )
    step.write_bytes(cfg["weights"], linear_to_bytes(model, hp["quantile"], hp["alpha"]))
    return [{"phase": "linear_quantile", **info, "fit_s": round(time.monotonic() - t, 2)}]


class TableModel:
    """A table family's model on raw histories: scale, build the table, predict."""

    def __init__(self, predict_table: Any, scaler: Any, mode: str, step_s: int):
        self.predict_table, self.scaler, self.mode, self.step_s = predict_table, scaler, mode, step_s

    def predict(self, X: np.ndarray) -> np.ndarray:
        return np.asarray(
            self.predict_table(tree_features(self.scaler.transform(X), self.mode, self.step_s)), np.float32
        )


def _loaded(model: Any, got: int, cfg: dict[str, Any], wuri: str, scaler: Any, predict_table: Any) -> TableModel:
    if got != cfg["n_tree_features"]:
        raise StepError(f"{wuri}: model has {got} input columns, config says {cfg['n_tree_features']}")
    return TableModel(predict_table, scaler, cfg["tree_features"], int(cfg["data"]["step_s"]))


def load_xgb(uri: str, cfg: dict[str, Any], wuri: str, scaler: Any, device: str) -> TableModel:
    from stepkit import storage

    booster = xgb_from_bytes(storage.read_bytes(wuri), wuri)
    return _loaded(booster, booster.num_features(), cfg, wuri, scaler, lambda t: xgb_predict(booster, t))


def load_rf(uri: str, cfg: dict[str, Any], wuri: str, scaler: Any, device: str) -> TableModel:
    from stepkit import storage

    forest = ForestArrays(forest_from_bytes(storage.read_bytes(wuri), wuri))
    return _loaded(forest, forest.n_features_in_, cfg, wuri, scaler, forest.predict)


def load_linear(uri: str, cfg: dict[str, Any], wuri: str, scaler: Any, device: str) -> TableModel:
    from stepkit import storage

    model = linear_from_bytes(storage.read_bytes(wuri), wuri)
    return _loaded(model, model.num_features(), cfg, wuri, scaler, model.predict)


def check_table(path: str, cfg: dict[str, Any]) -> None:
    """The config fields a table family's loader reads."""
    n = cfg.get("n_tree_features")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise StepError(f"{path}: 'n_tree_features' must be a positive integer, got {n!r}")
    if cfg.get("tree_features") not in ("summary", "flat"):
        raise StepError(f"{path}: 'tree_features' must be summary or flat, got {cfg.get('tree_features')!r}")


# Optuna search spaces (train --hpo-trials; mirage_tasks.models.hpo)


def xgb_space(trial: Any) -> dict[str, Any]:
    return {
        "n_estimators": trial.suggest_int("n_estimators", 100, 600, step=50),
        "max_depth": trial.suggest_int("max_depth", 2, 8),
        "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.3, log=True),
        "subsample": trial.suggest_float("subsample", 0.5, 1.0),
        "colsample_bytree": trial.suggest_float("colsample_bytree", 0.2, 1.0),
        "min_child_weight": trial.suggest_float("min_child_weight", 0.5, 20.0, log=True),
    }


def rf_space(trial: Any) -> dict[str, Any]:
    return {
        "n_estimators": trial.suggest_int("n_estimators", 50, 200, step=25),
        "min_samples_leaf": trial.suggest_int("min_samples_leaf", 1, 30, log=True),
        "max_features": trial.suggest_float("max_features", 0.05, 1.0, log=True),
    }


def linear_space(trial: Any) -> dict[str, Any]:
    return {"alpha": trial.suggest_float("alpha", 1e-5, 1e-1, log=True)}
