"""One loader for every model kind: :func:`load_model` -> :class:`DecisionFunction`.

A model directory (the ``train`` step's ``--out``) holds ``config.json``, which fully
describes how to rebuild the model, and one weights file named in it:

| kind                           | weights       | format                                      |
|--------------------------------|---------------|---------------------------------------------|
| ``transformer``, ``moe``       | ``model.pt``  | torch state dict, ``torch.load(weights_only=True)`` |
| ``xgboost``                    | ``model.ubj`` | XGBoost universal binary JSON               |
| ``random_forest``              | ``model.skops`` | skops, explicit trusted types only        |
| ``xgboost_quantile``           | ``model.ubj`` | XGBoost UBJ (``reg:quantileerror``, q = 0.9) |
| ``linear_quantile``            | ``model.json`` | coefficients, intercept and quantile as JSON |
| ``*_policy``                   | ``policy.pt`` | policy head state dict; the frozen base model in ``base/`` |

Every kind answers the same calls on raw histories ``X`` float32 [n, W, F]:
``predict(X)`` -> float32 [n] signed interruption in hours (for a policy, its base
regressor's), and ``decide(X)`` -> :class:`Decision` (``submit`` bool [n] and the raw
score: hours for regressors, P(submit) for policies). A regressor submits when
``low_h <= prediction <= high_h`` (default -0.5 and 500 h: unless more than 30 minutes
of overlap is predicted); a policy submits with probability P(submit) when given a
seeded ``rng`` (as trained and selected), else greedily when P(submit) > 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepkit import StepError, storage
from stepkit.safeload import read_document

from .datasets import FeatureScaler
from .registry import FAMILIES, family
from .thresholds import submit_mask

FORMAT = "mirage-model"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
BASE_DIR = "base"
DEFAULT_DECISION = {"low_h": -0.5, "high_h": 500.0}
WEIGHTS = {kind: f.weights for kind, f in FAMILIES.items()}  # derived from the registry


@dataclass
class Decision:
    submit: np.ndarray  # bool [n]
    raw: np.ndarray  # float32 [n]: hours (regressors) or P(submit) (policies)


class DecisionFunction:
    """A loaded model; build with :func:`load_model`."""

    def __init__(self, uri: str, config: dict[str, Any], impl: Any):
        self.uri = uri
        self.config = config
        self.kind: str = config["kind"]
        self.window: int = int(config["data"]["window"])
        self.feature_names: list[str] = list(config["data"]["feature_names"])
        self.decision_rule: dict[str, Any] = dict(config.get("decision", DEFAULT_DECISION))
        self._impl = impl

    @property
    def is_policy(self) -> bool:
        return family(self.kind).policy

    def _check(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float32)
        if X.ndim == 2:
            X = X[None]
        if X.ndim != 3 or X.shape[1:] != (self.window, len(self.feature_names)):
            raise StepError(
                f"{self.uri}: model expects histories [n, {self.window}, {len(self.feature_names)}], "
                f"got {list(X.shape)}"
            )
        return X

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Signed interruption in hours for each history (a policy answers with its base regressor)."""
        return self._impl.predict(self._check(X)).astype(np.float32)

    def decide(self, X: np.ndarray, rng: np.random.Generator | None = None) -> Decision:
        """Submit now or wait, per history.

        Regressors: ``low_h <= prediction <= high_h`` (``rng`` unused). Policies: with
        ``rng``, submit with probability P(submit) (how they are trained and selected;
        pass a seeded generator for reproducible validation); without, greedily when
        P(submit) > 0.5.
        """
        X = self._check(X)
        if self.is_policy:
            p = self._impl.submit_probability(X).astype(np.float32)
            submit = rng.random(p.shape[0]) < p if rng is not None else self._greedy(p, X)
            return Decision(submit, p)
        hours = self._impl.predict(X).astype(np.float32)
        low = self.decision_rule.get("low_h")
        if low is None:  # calibrated to never submit before the predecessor ends
            return Decision(np.zeros(hours.shape[0], bool), hours)
        # low_h, moved by the load at the decision when calibrated so (decision.load)
        ok = submit_mask(hours, X, low, self.decision_rule.get("load"))
        return Decision(ok & (hours <= self.decision_rule.get("high_h", 500.0)), hours)

    def _greedy(self, p: np.ndarray, X: np.ndarray) -> np.ndarray:
        """Greedy policy decision: P(submit) >= the calibrated threshold (``decision.threshold``, moved by
        the load at the decision when ``decision.load`` says so), or P(submit) > 0.5 (argmax) when none was
        calibrated; never when calibrated to None."""
        if "threshold" not in self.decision_rule:
            return p > 0.5
        return submit_mask(p, X, self.decision_rule["threshold"], self.decision_rule.get("load"))

    def features(self, X: np.ndarray) -> np.ndarray:
        """Policy inputs from a neural regressor: its outputs in scaled units, float32 [n, k]."""
        if not hasattr(self._impl, "features"):
            raise StepError(f"{self.uri}: a {self.kind} model has no policy features")
        return self._impl.features(self._check(X)).astype(np.float32)

    def __call__(self, X: np.ndarray) -> np.ndarray:
        return self.decide(X).submit

    def __repr__(self) -> str:
        return f"DecisionFunction(kind={self.kind!r}, uri={self.uri!r})"


class _Torch:
    def __init__(self, model: Any, scaler: FeatureScaler, target: dict[str, float], device: Any):
        import torch

        self.torch, self.model, self.scaler, self.device = torch, model.to(device).eval(), scaler, device
        self.center, self.scale = float(target["center"]), float(target["scale"])

    def _run(self, X: np.ndarray, fn: Any) -> np.ndarray:
        torch = self.torch
        Xs = torch.from_numpy(self.scaler.transform(X))
        outs = []
        with torch.no_grad():
            for i in range(0, Xs.shape[0], 512):
                outs.append(fn(Xs[i : i + 512].to(self.device)).float().cpu().numpy())
        return np.concatenate(outs) if outs else np.zeros((0,), np.float32)

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self._run(X, self.model) * self.scale + self.center

    def features(self, X: np.ndarray) -> np.ndarray:
        torch = self.torch

        def fn(x: Any) -> Any:
            if hasattr(self.model, "parts"):
                preds, weights = self.model.parts(x)
                return torch.cat([preds, (preds * weights).sum(-1, keepdim=True)], dim=1)
            return self.model(x)[:, None]

        return self._run(X, fn)


class _Policy:
    def __init__(self, head: Any, base: DecisionFunction):
        import torch

        self.torch, self.head, self.base = torch, head.eval(), base

    def predict(self, X: np.ndarray) -> np.ndarray:
        return self.base.predict(X)

    def submit_probability(self, X: np.ndarray) -> np.ndarray:
        z = self.torch.from_numpy(self.base.features(X))
        with self.torch.no_grad():
            return self.torch.softmax(self.head(z), -1)[:, 1].numpy()


def read_config(uri: str) -> dict[str, Any]:
    """The model config in ``uri``, checked: every field a loader or a step reads is present and
    of the right type, and the weights file lies inside the model folder. A
    :class:`StepError` naming the file and the field otherwise."""
    path = storage.join(uri, CONFIG_FILE)
    if not storage.exists(path):
        raise StepError(f"model config not found: {path}")
    cfg = read_document(path, "json")  # bounded: size, nesting (stepkit.safeload)
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        fmt = cfg.get("format") if isinstance(cfg, dict) else None
        raise StepError(f"{path}: not a Mirage model config (format {fmt!r})")
    if cfg.get("format_version") != FORMAT_VERSION:
        raise StepError(f"{path}: model format version {cfg.get('format_version')} is not {FORMAT_VERSION}")
    if cfg.get("kind") not in FAMILIES:
        raise StepError(f"{path}: unknown model kind {cfg.get('kind')!r}; known: {', '.join(FAMILIES)}")
    for key in ("data", "weights"):
        if key not in cfg:
            raise StepError(f"{path}: missing {key!r}")
    fam = family(cfg["kind"])
    _check_weights(path, cfg["weights"], fam.weights)
    data = cfg["data"]
    if not isinstance(data, dict):
        raise StepError(f"{path}: 'data' must be an object, got {type(data).__name__}")
    _positive_int(path, "data.window", data.get("window"))
    _positive_int(path, "data.step_s", data.get("step_s"))
    names = data.get("feature_names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise StepError(f"{path}: 'data.feature_names' must be a non-empty list of names, got {names!r}")
    check = fam.check_fn()  # the fields this family's loader reads (registry ``check``)
    if check is not None:
        check(path, cfg)
    return cfg


def check_policy(path: str, cfg: dict[str, Any]) -> None:
    arch = cfg.get("arch")
    if not isinstance(arch, dict):
        raise StepError(f"{path}: missing 'arch' (the policy head's n_inputs and hidden)")
    _positive_int(path, "arch.n_inputs", arch.get("n_inputs"))
    _nonnegative_int(path, "arch.hidden", arch.get("hidden"))


def check_net(path: str, cfg: dict[str, Any]) -> None:
    for key in ("arch", "target"):
        if not isinstance(cfg.get(key), dict):
            raise StepError(f"{path}: missing {key!r} (an object)")
    for key in ("center", "scale"):
        if not _is_number(cfg["target"].get(key)):
            raise StepError(f"{path}: 'target.{key}' must be a number, got {cfg['target'].get(key)!r}")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive_int(path: str, key: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise StepError(f"{path}: {key!r} must be a positive integer, got {v!r}")


def _nonnegative_int(path: str, key: str, v: Any) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise StepError(f"{path}: {key!r} must be an integer >= 0, got {v!r}")


def _check_weights(path: str, weights: Any, expected: str) -> None:
    """The weights must be the family's file, inside the model folder (never ``../..`` or absolute)."""
    if not isinstance(weights, str) or not weights:
        raise StepError(f"{path}: 'weights' must be a file name, got {weights!r}")
    parts = weights.replace("\\", "/").split("/")
    if "://" in weights or weights.startswith(("/", "~")) or ".." in parts or ":" in parts[0]:
        raise StepError(f"{path}: 'weights' {weights!r} points outside the model folder; refused")
    if weights != expected:
        raise StepError(f"{path}: 'weights' {weights!r} is not the {expected!r} file of this model kind")


def load_model(uri: str, device: str = "cpu") -> DecisionFunction:
    """Rebuild the model in ``uri`` (a ``train`` output) from its config and weights."""
    cfg = read_config(uri)
    kind = cfg["kind"]
    wuri = storage.join(uri, cfg["weights"])
    if not storage.exists(wuri):
        raise StepError(f"model weights not found: {wuri}")
    try:
        scaler = FeatureScaler.from_dict(cfg["scaler"]) if "scaler" in cfg else None
    except (KeyError, ValueError, TypeError) as exc:
        raise StepError(f"{storage.join(uri, CONFIG_FILE)}: bad scaler ({exc})") from exc
    if scaler is not None and scaler.mean.shape[0] != len(cfg["data"]["feature_names"]):
        raise StepError(
            f"{storage.join(uri, CONFIG_FILE)}: scaler has {scaler.mean.shape[0]} features, "
            f"data has {len(cfg['data']['feature_names'])}"
        )
    return DecisionFunction(uri, cfg, family(kind).load_fn()(uri, cfg, wuri, scaler, device))


# Rebuild functions of the torch families (named in mirage_tasks.models.registry; the table
# families' are in mirage_tasks.models.trees): config + weights -> implementation.


def load_net(uri: str, cfg: dict[str, Any], wuri: str, scaler: FeatureScaler, device: str) -> _Torch:
    """A torch regressor, built by its family's net module (registry ``net``)."""
    from . import torchutil

    net = family(cfg["kind"]).net_module()
    dev = torchutil.pick_device(device)
    try:
        model = net.build(cfg["arch"])
    except (KeyError, TypeError, ValueError) as exc:
        raise StepError(f"{storage.join(uri, CONFIG_FILE)}: bad architecture ({exc})") from exc
    torchutil.load_state(model, torchutil.load_tensors(wuri), wuri)
    return _Torch(model, scaler, cfg["target"], dev)


def load_policy(uri: str, cfg: dict[str, Any], wuri: str, scaler: FeatureScaler | None, device: str) -> _Policy:
    from . import policy, torchutil

    base = load_model(storage.join(uri, BASE_DIR), device=device)
    head = policy.PolicyHead(int(cfg["arch"]["n_inputs"]), int(cfg["arch"]["hidden"]))
    torchutil.load_state(head, torchutil.load_tensors(wuri), wuri)
    return _Policy(head, base)
