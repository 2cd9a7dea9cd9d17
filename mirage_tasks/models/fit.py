"""Fitting Mirage models: what the ``train`` step runs (:mod:`mirage_tasks.steps.train`).

:func:`train_regressor` fits a regressor on a ``merge`` dataset and :func:`train_policy` a
wait/submit policy on a frozen base model; both write the model's files through the
step's :class:`~stepkit.Step` (``config.json``, weights, ``curves.json``,
``metrics.json``) and leave the commit to the caller. Neural training checkpoints to
:data:`CHECKPOINT` under the output; a killed run started again resumes from it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from stepkit import Step, StepError, read_marker, storage

from .. import __version__
from .registry import family
from .thresholds import WASTE_WEIGHT, calibrate_load_aware

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoints/train.pt"


def remove_checkpoints(step: Step) -> None:
    """Remove a committed training's checkpoints (and their folder when nothing else is in it)."""
    from .torchutil import remove_checkpoints as remove

    remove(step.path(CHECKPOINT))
    fs, path = storage.filesystem(step.path("checkpoints"))
    try:
        if fs.isdir(path) and not fs.ls(path):
            fs.rmdir(path)
    except OSError:  # not empty or not removable: harmless
        pass


def train_regressor(
    kind: str,
    dataset: str,
    step: Step,
    hp: dict[str, Any],
    *,
    seed: int = 0,
    device: str = "cpu",
    val_fraction: float = 0.2,
    purge_days: float | None = None,
    threads: int | None = None,
    stop_after: int | None = None,
    preset: str | None = None,
    waste_weight: float = WASTE_WEIGHT,
    samples_until: int | None = None,
    sample_fraction: float = 1.0,
    hpo_trials: int = 0,
    hpo_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Fit ``kind`` on ``dataset`` and write its files through ``step`` (not committed). Returns metrics."""
    from . import datasets as D
    from .loader import CONFIG_FILE, DEFAULT_DECISION, FORMAT, FORMAT_VERSION, load_model

    t0 = time.monotonic()
    ds = D.load_dataset(dataset)
    subset_info = None
    if samples_until is not None or sample_fraction < 1.0:
        ds, subset_info = D.subset(ds, until=samples_until, fraction=sample_fraction)
        log.info("training on a subset: %s", subset_info)
    if purge_days is None:  # an episode's labels depend on the trace up to workload_days after its start
        purge_days = float((ds.manifest.get("params") or {}).get("workload_days", 5.0))
    split = D.chronological_split(ds, val_fraction, purge_days)
    log.info(
        "dataset %s: %d examples [%d x %d]; train %d rows (%d samples), validation %d rows (%d samples), "
        "%d samples purged",
        ds.uri,
        ds.n,
        ds.window,
        ds.n_features,
        split.info["n_train"],
        split.info["n_train_samples"],
        split.info["n_val"],
        split.info["n_val_samples"],
        split.info["n_purged_samples"],
    )
    scaler = D.FeatureScaler.fit(ds.X[split.train])
    Xs = scaler.transform(ds.X)
    fam = family(kind)
    hpo_summary = None
    if hpo_trials:
        from .hpo import HPO_FILE, search

        def trial_fit(thp: dict[str, Any], tmp: str) -> tuple[np.ndarray, np.ndarray]:
            tstep = Step("hpo-trial", tmp, __version__, {"hp": thp})
            tcfg: dict[str, Any] = {
                "format": FORMAT,
                "format_version": FORMAT_VERSION,
                "kind": kind,
                "version": __version__,
                "weights": fam.weights,
                "scaler": scaler.to_dict(),
                "decision": dict(DEFAULT_DECISION),
                "data": D.data_window(ds, split),
            }
            # F821: search() runs every trial before the `del Xs` below frees the scaled features
            fam.fit_fn()(
                kind,
                ds,
                split,
                Xs,  # noqa: F821
                thp,
                tcfg,
                tstep,
                seed=seed,
                device=device,
                threads=threads,
                stop_after=None,
            )
            tstep.write_json(CONFIG_FILE, tcfg)
            tm = load_model(tmp, device=device if fam.torch else "cpu")
            return batched_predict(tm, ds.X, split.val), ds.y[split.val]

        hp, history, hpo_summary = search(kind, hp, trial_fit, n_trials=hpo_trials, timeout_s=hpo_timeout_s, seed=seed)
        step.write_json(HPO_FILE, {"summary": hpo_summary, "trials": history})
        log.info(
            "%s: hyper-parameter search kept trial %d of %d (%s %.4f; preset %s)",
            kind,
            hpo_summary["best_number"],
            hpo_summary["n_trials"],
            hpo_summary["objective"],
            hpo_summary["best_value"],
            hpo_summary["preset_value"],
        )
    cfg: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "version": __version__,
        "preset": preset,
        "preset_hp": hp,
        "seed": seed,
        "weights": family(kind).weights,
        "scaler": scaler.to_dict(),
        "decision": dict(DEFAULT_DECISION),
        "data": D.data_window(ds, split),
    }
    if subset_info is not None:
        cfg["data"]["subset"] = subset_info
    if hpo_summary is not None:
        cfg["hpo"] = hpo_summary
    curves = fam.fit_fn()(
        kind, ds, split, Xs, hp, cfg, step, seed=seed, device=device, threads=threads, stop_after=stop_after
    )
    del Xs
    step.write_json(CONFIG_FILE, cfg)
    step.write_json("curves.json", curves)
    # Metrics from the saved files, so they describe exactly what a reader will load.
    model = load_model(step.out, device=device if fam.torch else "cpu")
    pred_tr = batched_predict(model, ds.X, split.train)
    pred_va = batched_predict(model, ds.X, split.val)
    yt, yv = ds.y[split.train], ds.y[split.val]
    const = D.constant_baseline(yt, yv)
    # the submit threshold, chosen on this validation split (never on the validation month)
    # (fixed, or moving with the load at the decision: calibrate_load_aware)
    cal = calibrate_load_aware(
        pred_va,
        yv,
        ds.sample[split.val],
        ds.X[split.val, -1:, :],
        list(ds.manifest["feature_names"]),
        int(ds.manifest["node"]),
        waste_weight=waste_weight,
        default=DEFAULT_DECISION["low_h"],
    )
    cfg["decision"] = {
        "rule": "threshold",
        "low_h": cal["threshold"],
        "high_h": DEFAULT_DECISION["high_h"],
        "load": cal["load"],
        "calibration": cal,
    }
    step.write_json(CONFIG_FILE, cfg)
    model.decision_rule = dict(cfg["decision"])
    metrics = {
        "model": kind,
        "train_mae_h": D.mae(pred_tr, yt),
        "val_mae_h": D.mae(pred_va, yv),
        "val_rmse_h": float(np.sqrt(np.mean((pred_va.astype(np.float64) - yv) ** 2))),
        "val_constant_mae_h": const["val_mae_h"],
        "constant_h": const["value_h"],
        "val_submit_share": float(model.decide(ds.X[split.val]).submit.mean()),
        "threshold_h": cal["threshold"],
        "never_submits_early": cal["never_submits_early"],
        "calibration": {k: cal[k] for k in ("waste_weight", "chosen", "default", "reactive", "fixed", "load")},
        "n_train_samples": split.info["n_train_samples"],
        "n_train": split.info["n_train"],
        "n_val": split.info["n_val"],
        "wall_s": round(time.monotonic() - t0, 2),
    }
    if hpo_summary is not None:
        metrics["hpo"] = {
            k: hpo_summary[k]
            for k in ("n_trials", "n_complete", "objective", "best_value", "preset_value", "best_params", "seconds")
        }
    step.write_json("metrics.json", metrics)
    log.info(
        "%s: validation MAE %.3f h (constant predictor %.3f h), train MAE %.3f h, %.1f s",
        kind,
        metrics["val_mae_h"],
        metrics["val_constant_mae_h"],
        metrics["train_mae_h"],
        metrics["wall_s"],
    )
    thr = "never early" if cal["threshold"] is None else f"{cal['threshold']:.3f}"
    print(
        f"train {kind}: val_mae_h={metrics['val_mae_h']:.4f} constant={metrics['val_constant_mae_h']:.4f} "
        f"threshold_h={thr} (objective {cal['chosen']['objective']:.3f}, at -0.5 h "
        f"{cal['default']['objective']:.3f}) wall_s={metrics['wall_s']}",
        flush=True,
    )
    return metrics


def batched_predict(model: Any, X: np.ndarray, rows: np.ndarray, batch: int = 1024) -> np.ndarray:
    return np.concatenate([model.predict(X[rows[i : i + batch]]) for i in range(0, len(rows), batch)])


def fit_neural(
    kind: str,
    ds: Any,
    split: Any,
    Xs: np.ndarray,
    hp: dict[str, Any],
    cfg: dict[str, Any],
    step: Step,
    *,
    seed: int,
    device: str,
    threads: int | None,
    stop_after: int | None,
) -> list:
    """Fit a torch regressor: its family's net module (registry ``net``) gives the
    architecture, the model and the training phases; the epoch loop is
    :func:`mirage_tasks.models.training.fit_phases`."""
    import torch

    from . import torchutil
    from .training import fit_phases

    net = family(kind).net_module()
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
    arch = net.arch_from(hp, ds.n_features, ds.window)
    model = net.build(arch, seed)
    phases = net.phases(model, ds, split, hp, cfg)
    cfg["arch"] = arch
    n_params = sum(p.numel() for p in model.parameters())
    cfg["n_parameters"] = int(n_params)
    log.info("%s: %d parameters on %s", kind, n_params, dev)
    curves = fit_phases(
        model,
        phases,
        X,
        y,
        split.val,
        loss=hp["loss"],
        y_scale=scale,
        device=dev,
        seed=seed,
        grad_clip=float(hp.get("grad_clip", 0.0)),
        checkpoint_every=int(hp["checkpoint_every"]),
        ckpt_uri=step.path(CHECKPOINT),
        fingerprint=step.fingerprint,
        stop_after=stop_after,
        amp=str(hp.get("amp", "off")),
    )
    torchutil.save_tensors(step.record(cfg["weights"]), {k: v.detach().cpu() for k, v in model.state_dict().items()})
    return curves


# ------------------------------------------------------------------------------ policies


def train_policy(
    kind: str,
    base_uri: str,
    base_cfg: dict[str, Any],
    step: Step,
    hp: dict[str, Any],
    *,
    env_kind: str = "sim",
    trace: str | None = None,
    seed: int = 0,
    device: str = "cpu",
    threads: int | None = None,
    stop_after: int | None = None,
    preset: str | None = None,
    waste_weight: float = WASTE_WEIGHT,
) -> dict[str, Any]:
    """Train the wait/submit policy ``kind`` on the frozen base model in ``base_uri`` and write its
    files through ``step`` (not committed). Returns its metrics."""
    import torch

    from . import policy as P, torchutil
    from .loader import BASE_DIR, CONFIG_FILE, FORMAT, FORMAT_VERSION, load_model

    t0 = time.monotonic()
    if threads:
        torch.set_num_threads(threads)
    torchutil.seed_everything(seed, torchutil.pick_device(device))
    base = load_model(base_uri, device=device)
    env, val_env, env_info = make_envs(env_kind, trace, base_cfg)
    k = max(1, int(hp["parallel_envs"]))
    envs, val_envs = [env] + [env.copy() for _ in range(k - 1)], [val_env] + [val_env.copy() for _ in range(k - 1)]
    probe = env.reset(np.random.default_rng([seed, 99]))
    n_inputs = int(base.features(probe[None]).shape[1])
    head, curves, summary = P.train_reinforce(
        base.features,
        n_inputs,
        envs,
        val_envs,
        hp,
        seed=seed,
        ckpt_uri=step.path(CHECKPOINT),
        fingerprint=step.fingerprint,
        stop_after=stop_after,
    )
    torchutil.save_tensors(
        step.record(family(kind).weights), {k: v.detach().cpu() for k, v in head.state_dict().items()}
    )
    for rel in (CONFIG_FILE, base_cfg["weights"]):  # the frozen base travels with the policy
        step.write_bytes(f"{BASE_DIR}/{rel}", storage.read_bytes(storage.join(base_uri, rel)))
    base_marker = read_marker(base_uri)
    cfg = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "version": __version__,
        "preset": preset,
        "preset_hp": hp,
        "seed": seed,
        "weights": family(kind).weights,
        "arch": {"n_inputs": n_inputs, "hidden": int(hp["hidden"])},
        "decision": {
            "rule": "policy",
            "eval_mode": hp["eval_mode"],
            "sample": "submit with probability P(submit) (decide(X, rng))",
            "greedy": "submit if P(submit) > 0.5 (decide(X))",
        },
        "base": {
            "uri": storage.normalize(base_uri),
            "kind": base_cfg["kind"],
            "dir": BASE_DIR,
            "fingerprint": base_marker["fingerprint"] if base_marker else None,
        },
        "data": base_cfg["data"],
        "env": env_info,
        "training": summary,
    }
    step.write_json(CONFIG_FILE, cfg)
    step.write_json("curves.json", curves)
    # greedy P(submit) threshold, chosen on the base model's own validation split (its probes)
    cal = calibrate_policy(load_model(step.out, device=device), base_cfg, waste_weight)
    cfg["decision"].update(
        {
            "threshold": cal["threshold"],
            "load": cal["load"],
            "calibration": cal,
            "greedy": "submit if P(submit) >= threshold (decide(X))",
        }
    )
    step.write_json(CONFIG_FILE, cfg)
    metrics = {
        "model": kind,
        **summary,
        "wall_s": round(time.monotonic() - t0, 2),
        "episodes": int(hp["epochs"]) * int(hp["episodes_per_epoch"]),
        "threshold": cal["threshold"],
        "argmax_submit_share": cal["argmax_submit_share"],
        "argmax_never_submits": cal["argmax_never_submits"],
        "calibration": {k: cal[k] for k in ("waste_weight", "chosen", "default", "reactive", "fixed", "load")},
    }
    step.write_json("metrics.json", metrics)
    print(
        f"train {kind}: val_return {summary['initial_val_return']:.1f} -> "
        f"best {summary['best_val_return']:.1f} "
        f"(epoch {summary['best_epoch']}) wall_s={metrics['wall_s']}",
        flush=True,
    )
    return metrics


def calibrate_policy(model: Any, base_cfg: dict[str, Any], waste_weight: float) -> dict[str, Any]:
    """The greedy P(submit) threshold of a policy, chosen on its base regressor's validation split
    (the same rows, subset and purge as the base's training); with how often argmax (P > 0.5)
    submits there: a policy whose argmax never submits is the reactive baseline when run greedily."""
    from . import datasets as D

    data = base_cfg["data"]
    ds = D.load_dataset(data["dataset"])
    sub = data.get("subset")
    if sub:
        until = sub.get("until")
        ds, _ = D.subset(
            ds, until=None if until is None else int(D.parse_iso(until)), fraction=float(sub.get("fraction", 1.0))
        )
    split = D.chronological_split(ds, float(data["split"]["val_fraction"]), float(data["split"]["purge_days"]))
    p = np.concatenate([model.decide(ds.X[split.val[i : i + 512]]).raw for i in range(0, len(split.val), 512)])
    cal = calibrate_load_aware(
        p,
        ds.y[split.val],
        ds.sample[split.val],
        ds.X[split.val, -1:, :],
        list(ds.manifest["feature_names"]),
        int(ds.manifest["node"]),
        waste_weight=waste_weight,
        default=0.5,
    )
    cal["argmax_submit_share"] = float((p > 0.5).mean())
    cal["argmax_never_submits"] = bool(not (p > 0.5).any())
    cal["p_submit_max"] = float(p.max())
    return cal


def make_envs(kind: str, trace: str | None, base_cfg: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """(training env, validation env, description) of a policy: the simulator replaying ``trace``, or the toy."""
    data = base_cfg["data"]
    window, n_features = int(data["window"]), len(data["feature_names"])
    if kind == "toy":
        from .toy import FEATURE_NAMES, ToyQueueEnv

        if n_features != len(FEATURE_NAMES):
            raise StepError(
                f"the toy environment produces {len(FEATURE_NAMES)} features; the base model uses {n_features}"
            )
        log.warning("training the policy in the synthetic toy environment (a smoke test, not the simulator)")
        return ToyQueueEnv(window=window), ToyQueueEnv(window=window), {"kind": "toy"}
    from .simenv import envs_for

    train_env, val_env = envs_for(trace, base_cfg)
    info = {"train": train_env.describe(), "validation": val_env.describe(), "trace": storage.normalize(trace)}
    log.info(
        "policy episodes: training starts %s .. %s, validation starts %s .. %s",
        info["train"]["start_min"],
        info["train"]["start_max"],
        info["validation"]["start_min"],
        info["validation"]["start_max"],
    )
    return train_env, val_env, info
