"""``train``: fit one Mirage model on a ``merge`` dataset (or a policy on a trained base model).

    python -m mirage_tasks train --model transformer --dataset DATA --out MODEL
        [--preset quick|paper] [--device cpu|cuda] [--seed S] [--param key=value ...]
    python -m mirage_tasks train --model moe_policy --base MOE_MODEL --trace TRACE --out POLICY

Regressors (``transformer``, ``moe``, ``xgboost``, ``random_forest``) are trained on the
earliest samples of the dataset and validated on the latest (chronological split by
sample, see :mod:`mirage_tasks.models.data`). Features are ``log1p``-scaled and
standardised with statistics of the training rows only; targets (hours) are centred and
scaled for the neural models. Outputs under ``--out``:

* ``config.json``: kind, architecture, hyper-parameters, scaler, target scaling, the
  decision rule, the dataset's window and the train/validation windows (for leakage
  checks), the weights file name;
* the weights (``model.pt`` / ``model.ubj`` / ``model.skops`` / ``policy.pt``);
* ``curves.json``: per-epoch (or per-round) training and validation loss and MAE;
* ``metrics.json``: train and validation MAE in hours, the constant-predictor baseline,
  wall time;
* ``_SUCCESS.json`` last.

Neural training checkpoints to ``checkpoints/`` under ``--out``; a killed run started again
with the same flags resumes from the last checkpoint (removed after a successful run).
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

import numpy as np

from stepkit import Step, StepError, read_marker, storage

from . import __version__
from .models import KINDS, POLICIES, StopRequested
from .models import presets as presets_mod

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoints/train.pt"
EXIT_STOPPED = 75  # stopped on request (--stop-after-epochs); rerun to resume
ENVS = ("sim", "toy")  # policy environments: the simulator replaying --trace, or the synthetic toy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, choices=KINDS, help="model kind")
    p.add_argument("--out", required=True, help="output prefix (URI) for the model")
    p.add_argument("--dataset", help="merge output (URI with dataset.npz and manifest.json); regressors")
    p.add_argument("--base", help="trained base model (moe for moe_policy, transformer for transformer_policy)")
    p.add_argument("--trace", help="normalised trace (ingest output) the policy's simulator replays")
    p.add_argument("--preset", default="quick", choices=sorted(presets_mod.PRESETS),
                   help="hyper-parameter preset (default quick: minutes on 2 CPU cores)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="override one preset hyper-parameter (repeatable)")
    p.add_argument("--quantile", type=float, default=None,
                   help="xgboost only: fit this quantile with reg:quantileerror instead of the median")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (neural models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.2, help="latest share of samples used for validation")
    p.add_argument("--purge-days", type=float, default=None,
                   help="drop training samples starting less than this before the first validation sample "
                        "(default: the dataset's workload span, params.workload_days, else 5)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch/xgboost/sklearn")
    p.add_argument("--env", default="sim", choices=ENVS,
                   help="policies: sim (the trace replayed by the simulator) or toy (synthetic smoke test)")
    p.add_argument("--stop-after-epochs", type=int, default=None,
                   help="stop (exit 75) after this many epochs in this run; rerunning resumes")


def run(args: argparse.Namespace) -> int:
    hp = presets_mod.resolve(args.preset, args.model, args.param)
    if args.quantile is not None:
        if args.model != "xgboost":
            raise StepError("--quantile applies to --model xgboost only")
        hp["quantile"] = args.quantile
    if args.model in POLICIES:
        return run_policy(args, hp)
    if not args.dataset:
        raise StepError(f"--dataset is required for --model {args.model}")
    params = {"model": args.model, "preset": args.preset, "hp": hp, "seed": args.seed, "device": args.device,
              "val_fraction": args.val_fraction, "purge_days": args.purge_days}
    step = Step("train", args.out, __version__, params, inputs=[args.dataset])
    if step.skip():
        return 0
    try:
        result = train_regressor(args.model, args.dataset, step, hp, seed=args.seed, device=args.device,
                                 val_fraction=args.val_fraction, purge_days=args.purge_days,
                                 threads=args.threads, stop_after=args.stop_after_epochs, preset=args.preset)
    except StopRequested as exc:
        print(f"train: {exc}", flush=True)
        return EXIT_STOPPED
    step.commit(summary=result)
    _remove_checkpoints(step)
    return 0


def _remove_checkpoints(step: Step) -> None:
    storage.remove(step.path(CHECKPOINT))
    fs, path = storage.filesystem(step.path("checkpoints"))
    try:
        if fs.isdir(path) and not fs.ls(path):
            fs.rmdir(path)
    except OSError:  # not empty or not removable: harmless
        pass


def train_regressor(kind: str, dataset: str, step: Step, hp: dict[str, Any], *, seed: int = 0,
                    device: str = "cpu", val_fraction: float = 0.2, purge_days: float | None = None,
                    threads: int | None = None, stop_after: int | None = None,
                    preset: str | None = None) -> dict[str, Any]:
    """Fit ``kind`` on ``dataset`` and write its files through ``step`` (not committed). Returns metrics."""
    from .models import data as D
    from .models.loader import CONFIG_FILE, DEFAULT_DECISION, FORMAT, FORMAT_VERSION, WEIGHTS, load_model

    t0 = time.monotonic()
    ds = D.load_dataset(dataset)
    if purge_days is None:  # an episode's labels depend on the trace up to workload_days after its start
        purge_days = float((ds.manifest.get("params") or {}).get("workload_days", 5.0))
    split = D.chronological_split(ds, val_fraction, purge_days)
    log.info("dataset %s: %d examples [%d x %d]; train %d rows (%d samples), validation %d rows (%d samples), "
             "%d samples purged", ds.uri, ds.n, ds.window, ds.n_features, split.info["n_train"],
             split.info["n_train_samples"], split.info["n_val"], split.info["n_val_samples"],
             split.info["n_purged_samples"])
    scaler = D.FeatureScaler.fit(ds.X[split.train])
    Xs = scaler.transform(ds.X)
    cfg: dict[str, Any] = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "version": __version__,
        "preset": preset, "preset_hp": hp, "seed": seed, "weights": WEIGHTS[kind], "scaler": scaler.to_dict(),
        "decision": dict(DEFAULT_DECISION), "data": D.data_window(ds, split),
    }
    if kind in ("transformer", "moe"):
        curves = _fit_neural(kind, ds, split, Xs, hp, cfg, step, seed=seed, device=device, threads=threads,
                             stop_after=stop_after)
    else:
        curves = _fit_trees(kind, ds, split, Xs, hp, cfg, step, seed=seed, threads=threads)
    del Xs
    step.write_json(CONFIG_FILE, cfg)
    step.write_json("curves.json", curves)
    # Metrics from the saved files, so they describe exactly what a reader will load.
    model = load_model(step.out, device=device if kind in ("transformer", "moe") else "cpu")
    pred_tr = _batched_predict(model, ds.X, split.train)
    pred_va = _batched_predict(model, ds.X, split.val)
    yt, yv = ds.y[split.train], ds.y[split.val]
    const = D.constant_baseline(yt, yv)
    metrics = {
        "model": kind,
        "train_mae_h": D.mae(pred_tr, yt),
        "val_mae_h": D.mae(pred_va, yv),
        "val_rmse_h": float(np.sqrt(np.mean((pred_va.astype(np.float64) - yv) ** 2))),
        "val_constant_mae_h": const["val_mae_h"],
        "constant_h": const["value_h"],
        "val_submit_share": float(model.decide(ds.X[split.val]).submit.mean()),
        "n_train": split.info["n_train"],
        "n_val": split.info["n_val"],
        "wall_s": round(time.monotonic() - t0, 2),
    }
    step.write_json("metrics.json", metrics)
    log.info("%s: validation MAE %.3f h (constant predictor %.3f h), train MAE %.3f h, %.1f s",
             kind, metrics["val_mae_h"], metrics["val_constant_mae_h"], metrics["train_mae_h"], metrics["wall_s"])
    print(f"train {kind}: val_mae_h={metrics['val_mae_h']:.4f} constant={metrics['val_constant_mae_h']:.4f} "
          f"wall_s={metrics['wall_s']}", flush=True)
    return metrics


def _batched_predict(model: Any, X: np.ndarray, rows: np.ndarray, batch: int = 1024) -> np.ndarray:
    return np.concatenate([model.predict(X[rows[i:i + batch]]) for i in range(0, len(rows), batch)])


def _fit_neural(kind: str, ds: Any, split: Any, Xs: np.ndarray, hp: dict[str, Any], cfg: dict[str, Any],
                step: Step, *, seed: int, device: str, threads: int | None, stop_after: int | None) -> list:
    import torch

    from .models import data as D
    from .models import moe, torchutil, transformer

    if threads:
        torch.set_num_threads(threads)
    dev = torchutil.pick_device(device)
    torchutil.seed_everything(seed, dev)
    yt = ds.y[split.train].astype(np.float64)
    center = float(np.median(yt))
    scale = float(yt.std()) if yt.std() > 1e-6 else 1.0
    cfg["target"] = {"center": center, "scale": scale}
    X = torch.from_numpy(Xs)
    y = torch.from_numpy(((ds.y - center) / scale).astype(np.float32))
    if dev.type == "cuda":  # the whole dataset fits on a GPU; avoids per-batch copies
        X, y = X.to(dev), y.to(dev)
    wd = float(hp.get("weight_decay", 0.0))
    if kind == "transformer":
        arch = transformer.arch_from(hp, ds.n_features, ds.window)
        model = transformer.build(arch)
        phases = [transformer.Phase("transformer", model, split.train, int(hp["epochs"]), float(hp["lr"]),
                                    int(hp["batch_size"]), wd, hp["lr_schedule"])]
    else:
        arch = moe.arch_from(hp, ds.n_features, ds.window)
        model = moe.build(arch, seed)
        n_s = split.info["n_train_samples"]
        n_first = max(arch["n_experts"], int(round(n_s * float(hp["expert_fraction"]))))
        first_samples = np.unique(ds.sample[split.train], return_index=True)
        ordered = first_samples[0][np.argsort(first_samples[1])][:n_first]
        early = split.train[np.isin(ds.sample[split.train], ordered)]
        slices = D.sample_slices(ds, early, arch["n_experts"])
        phases = [transformer.Phase(f"expert {i + 1}/{len(slices)}", model.experts[i], rows,
                                    int(hp["expert_epochs"]), float(hp["expert_lr"]),
                                    int(hp["expert_batch_size"]), wd,
                                    hp["lr_schedule"])
                  for i, rows in enumerate(slices)]
        phases.append(transformer.Phase("mixture", model, split.train, int(hp["epochs"]), float(hp["lr"]),
                                        int(hp["batch_size"]), wd, hp["lr_schedule"]))
        cfg["expert_slices"] = [
            {"rows": int(len(r)), "sample_start_min": D._iso(ds.sample_start[r].min()),
             "sample_start_max": D._iso(ds.sample_start[r].max())} for r in slices]
    cfg["arch"] = arch
    n_params = sum(p.numel() for p in model.parameters())
    cfg["n_parameters"] = int(n_params)
    log.info("%s: %d parameters on %s", kind, n_params, dev)
    curves = transformer.fit_phases(
        model, phases, X, y, split.val, loss=hp["loss"], y_scale=scale, device=dev, seed=seed,
        grad_clip=float(hp.get("grad_clip", 0.0)), checkpoint_every=int(hp["checkpoint_every"]),
        ckpt_uri=step.path(CHECKPOINT), fingerprint=step.fingerprint, stop_after=stop_after)
    torchutil.save_tensors(step.record(cfg["weights"]),
                           {k: v.detach().cpu() for k, v in model.state_dict().items()})
    return curves


def _fit_trees(kind: str, ds: Any, split: Any, Xs: np.ndarray, hp: dict[str, Any], cfg: dict[str, Any],
               step: Step, *, seed: int, threads: int | None) -> list:
    from .models import trees

    step_s = int(ds.manifest["step_s"])
    table = trees.tree_features(Xs, hp["features"], step_s)
    cfg["tree_features"] = hp["features"]
    cfg["n_tree_features"] = int(table.shape[1])
    Xt, yt = table[split.train], ds.y[split.train]
    Xv, yv = table[split.val], ds.y[split.val]
    log.info("%s: %d training rows x %d columns (%s features)", kind, Xt.shape[0], Xt.shape[1], hp["features"])
    if kind == "xgboost":
        booster, curves = trees.fit_xgboost(Xt, yt, Xv, yv, hp, seed, threads)
        cfg["xgb_params"] = trees.xgb_params(hp, seed, None)
        step.write_bytes(cfg["weights"], trees.xgb_to_bytes(booster))
        return curves
    t = time.monotonic()
    forest = trees.fit_forest(Xt, yt, hp, seed, threads)
    log.info("random_forest: %d trees in %.1f s", len(forest.estimators_), time.monotonic() - t)
    step.write_bytes(cfg["weights"], trees.forest_to_bytes(forest))
    return [{"phase": "random_forest", "n_estimators": len(forest.estimators_)}]


# ------------------------------------------------------------------------------ policies

def run_policy(args: argparse.Namespace, hp: dict[str, Any]) -> int:
    """Train a wait/submit policy on the frozen ``--base`` model in an environment."""
    from .models.loader import BASE_DIR, CONFIG_FILE, FORMAT, FORMAT_VERSION, WEIGHTS, load_model, read_config

    if not args.base:
        raise StepError(f"--base (a trained {args.model.removesuffix('_policy')} model) is required for {args.model}")
    env_kind = getattr(args, "env", "sim")
    base_cfg = read_config(args.base)
    want = args.model.removesuffix("_policy")
    if base_cfg["kind"] != want:
        raise StepError(f"{args.base}: is a {base_cfg['kind']} model; {args.model} needs a {want} model")
    inputs = [args.base]
    if env_kind == "sim":
        if not args.trace:
            raise StepError("--trace is required for the simulator environment (or use --env toy)")
        inputs.append(args.trace)
    params = {"model": args.model, "preset": args.preset, "hp": hp, "seed": args.seed, "device": args.device,
              "env": env_kind}
    step = Step("train", args.out, __version__, params, inputs=inputs)
    if step.skip():
        return 0
    t0 = time.monotonic()
    import torch

    from .models import policy as P
    from .models import torchutil

    if args.threads:
        torch.set_num_threads(args.threads)
    torchutil.seed_everything(args.seed, torchutil.pick_device(args.device))
    base = load_model(args.base, device=args.device)
    env, val_env, env_info = _make_envs(env_kind, args, base_cfg)
    k = max(1, int(hp["parallel_envs"]))
    envs, val_envs = [env] + [env.copy() for _ in range(k - 1)], [val_env] + [val_env.copy() for _ in range(k - 1)]
    probe = env.reset(np.random.default_rng([args.seed, 99]))
    n_inputs = int(base.features(probe[None]).shape[1])
    try:
        head, curves, summary = P.train_reinforce(
            base.features, n_inputs, envs, val_envs, hp, seed=args.seed, ckpt_uri=step.path(CHECKPOINT),
            fingerprint=step.fingerprint, stop_after=args.stop_after_epochs)
    except StopRequested as exc:
        print(f"train: {exc}", flush=True)
        return EXIT_STOPPED
    torchutil.save_tensors(step.record(WEIGHTS[args.model]),
                           {k: v.detach().cpu() for k, v in head.state_dict().items()})
    for rel in (CONFIG_FILE, base_cfg["weights"]):  # the frozen base travels with the policy
        step.write_bytes(f"{BASE_DIR}/{rel}", storage.read_bytes(storage.join(args.base, rel)))
    base_marker = read_marker(args.base)
    cfg = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "kind": args.model, "version": __version__,
        "preset": args.preset, "preset_hp": hp, "seed": args.seed, "weights": WEIGHTS[args.model],
        "arch": {"n_inputs": n_inputs, "hidden": int(hp["hidden"])},
        "decision": {"rule": "policy", "eval_mode": hp["eval_mode"],
                     "sample": "submit with probability P(submit) (decide(X, rng))",
                     "greedy": "submit if P(submit) > 0.5 (decide(X))"},
        "base": {"uri": storage.normalize(args.base), "kind": base_cfg["kind"], "dir": BASE_DIR,
                 "fingerprint": base_marker["fingerprint"] if base_marker else None},
        "data": base_cfg["data"], "env": env_info, "training": summary,
    }
    step.write_json(CONFIG_FILE, cfg)
    step.write_json("curves.json", curves)
    metrics = {"model": args.model, **summary, "wall_s": round(time.monotonic() - t0, 2),
               "episodes": int(hp["epochs"]) * int(hp["episodes_per_epoch"])}
    step.write_json("metrics.json", metrics)
    print(f"train {args.model}: val_return {summary['initial_val_return']:.1f} -> "
          f"best {summary['best_val_return']:.1f} "
          f"(epoch {summary['best_epoch']}) wall_s={metrics['wall_s']}", flush=True)
    step.commit(summary=metrics)
    _remove_checkpoints(step)
    return 0


def _make_envs(kind: str, args: argparse.Namespace, base_cfg: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    data = base_cfg["data"]
    window, n_features = int(data["window"]), len(data["feature_names"])
    if kind == "toy":
        from .models.synthetic import FEATURE_NAMES, ToyQueueEnv

        if n_features != len(FEATURE_NAMES):
            raise StepError(f"the toy environment produces {len(FEATURE_NAMES)} features; "
                            f"the base model uses {n_features}")
        log.warning("training the policy in the synthetic toy environment (a smoke test, not the simulator)")
        return ToyQueueEnv(window=window), ToyQueueEnv(window=window), {"kind": "toy"}
    from .models.simenv import envs_for

    train_env, val_env = envs_for(args.trace, base_cfg)
    info = {"train": train_env.describe(), "validation": val_env.describe(), "trace": storage.normalize(args.trace)}
    log.info("policy episodes: training starts %s .. %s, validation starts %s .. %s", info["train"]["start_min"],
             info["train"]["start_max"], info["validation"]["start_min"], info["validation"]["start_max"])
    return train_env, val_env, info
