"""Benchmark of the ``train`` step: wall time and validation MAE of each model, as a table.

    python bench/train.py [--dataset URI] [--models transformer,moe,xgboost,random_forest]
                          [--preset quick] [--threads 2] [--workdir DIR] [--trace TRACE]
                          [--paper-moe-epochs 2 --paper-rows 256 --devices cpu,cuda --amp off,bf16]

Without ``--dataset`` a synthetic dataset of the ls6 size (684 samples x 7 probes =
4,788 histories of 144 x 42, :mod:`mirage_tasks.models.toy`) is generated, and the
table says so: its MAE figures describe the synthetic signal, not ls6. Each model is
trained by the real CLI (``python -m mirage_tasks train``) in a subprocess; the wall time
includes loading the dataset and computing the metrics.

``--trace`` (the ingest output the dataset was sampled from) also trains both policies
on the simulator on top of this run's transformer and MoE, and reports their validation
return against the untrained (always-wait, i.e. reactive) policy.

``--paper-moe-epochs N`` also times the ``paper`` preset's mixture (10 experts, embedding
512) for N epochs of joint training, and the paper transformer, on ``--paper-rows`` training
rows on each of ``--devices`` and precision (``--amp``: float32, bfloat16 autocast; the
paper preset's ``amp=auto`` uses bfloat16 on CUDA only) and reports seconds per epoch,
measured and extrapolated to the full training split, and the validation MAE after those
epochs. A device that is not available is reported as such.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(argv: list[str], out: str, threads: int) -> dict:
    """Run ``python -m mirage_tasks train <argv>`` and return its metrics (or the error)."""
    cmd = [sys.executable, "-m", "mirage_tasks", "train", *argv, "--out", out, "--threads", str(threads)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        return {"model": argv[1], "error": f"exit {proc.returncode}", "wall_s": wall}
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    m["process_wall_s"] = wall
    return m


def train_one(model: str, dataset: str, out: str, preset: str, threads: int, extra: list[str]) -> dict:
    return _train(["--model", model, "--dataset", dataset, "--preset", preset, *extra], out, threads)


def train_policy(model: str, base: str, trace: str, out: str, preset: str, threads: int) -> dict:
    return _train(["--model", model, "--base", base, "--trace", trace, "--preset", preset], out, threads)


def time_paper(kind: str, dataset: str, device: str, epochs: int, rows: int, threads: int, amp: str) -> dict:
    """Seconds per epoch of the ``paper`` preset's ``kind`` (the MoE's joint mixture phase, or the
    transformer) on ``rows`` training rows, with ``amp`` ("off" float32, "bf16" autocast); and the
    validation MAE (scaled units) after those epochs, to compare precisions on equal terms."""
    import numpy as np
    import torch

    from mirage_tasks.models import datasets as D, moe, presets, torchutil, transformer
    from mirage_tasks.models.training import Phase, fit_phases

    try:
        dev = torchutil.pick_device(device)
    except Exception as exc:  # noqa: BLE001 - report why and go on
        return {"device": device, "error": str(exc).split(";")[0]}
    torch.set_num_threads(threads)
    ds = D.load_dataset(dataset)
    sp = D.chronological_split(ds)
    sc = D.FeatureScaler.fit(ds.X[sp.train])
    sub = sp.train[:rows]
    X = torch.from_numpy(sc.transform(ds.X))
    y = torch.from_numpy(((ds.y - np.median(ds.y[sp.train])) / ds.y[sp.train].std()).astype(np.float32))
    hp = presets.resolve("paper", kind, {"epochs": epochs})
    if kind == "moe":
        model = moe.build(moe.arch_from(hp, ds.n_features, ds.window), 0)
    else:
        torchutil.seed_everything(0, dev)
        model = transformer.build(transformer.arch_from(hp, ds.n_features, ds.window))
    if dev.type == "cuda":
        X, y = X.to(dev), y.to(dev)
    # warm-up (one-time allocations, kernel selection), untimed, on a copy of the model
    import copy

    warm = copy.deepcopy(model)
    fit_phases(
        warm,
        [Phase("warm-up", warm, sub[: hp["batch_size"]], 1, hp["lr"], hp["batch_size"])],
        X,
        y,
        sp.val[:8],
        loss=hp["loss"],
        y_scale=1.0,
        device=dev,
        seed=0,
        grad_clip=1.0,
        checkpoint_every=10**9,
        ckpt_uri=None,
        fingerprint="bench",
        amp=amp,
    )
    del warm
    phase = Phase(f"paper {kind}", model, sub, epochs, hp["lr"], hp["batch_size"])
    torchutil.seed_everything(0, dev)
    t0 = time.monotonic()
    curves = fit_phases(
        model,
        [phase],
        X,
        y,
        sp.val[:rows],
        loss=hp["loss"],
        y_scale=1.0,
        device=dev,
        seed=0,
        grad_clip=1.0,
        checkpoint_every=10**9,
        ckpt_uri=None,
        fingerprint="bench",
        amp=amp,
    )
    if dev.type == "cuda":
        torch.cuda.synchronize()
    per = (time.monotonic() - t0) / epochs
    full = per * (len(sp.train) + len(sp.val)) / (len(sub) + min(rows, len(sp.val)))
    return {
        "kind": kind,
        "device": device,
        "amp": amp,
        "rows": len(sub),
        "s_per_epoch": per,
        "s_per_full_epoch_est": full,
        "val_mae_scaled": curves[-1]["val_mae_h"],
        "n_parameters": sum(p.numel() for p in model.parameters()),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", help="merge output; default: a synthetic ls6-sized dataset")
    p.add_argument("--models", default="transformer,moe,xgboost,random_forest")
    p.add_argument("--preset", default="quick")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workdir", default=None)
    p.add_argument("--param", action="append", default=[], help="passed to every train run")
    p.add_argument(
        "--trace",
        help="ingest output of the dataset's trace: also train the policies on the "
        "simulator (needs the transformer and moe rows)",
    )
    p.add_argument(
        "--paper-moe-epochs", type=int, default=0, help="also time the paper preset for this many epochs (0: no)"
    )
    p.add_argument("--paper-kinds", default="moe,transformer", help="paper-preset models to time")
    p.add_argument("--paper-rows", type=int, default=256)
    p.add_argument("--devices", default="cpu,cuda")
    p.add_argument("--amp", default="off,bf16", help="precisions to time: off (float32), bf16 (autocast)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a synthetic dataset of 40 samples and the tree models only (the test suite's)",
    )
    args = p.parse_args()
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(
        p,
        args,
        {"threads": (1, 256), "paper_moe_epochs": (0, 10_000), "paper_rows": (1, 10_000_000)},
        folders=("workdir",),
        files=(),
    )
    n_samples = 684
    if args.smoke:
        n_samples = 40
        if args.models == p.get_default("models"):
            args.models = "xgboost,random_forest"
    work = args.workdir or tempfile.mkdtemp(prefix="bench-train-")
    dataset, source = args.dataset, args.dataset
    if not dataset:
        from mirage_tasks.models.toy import write_synthetic_dataset

        dataset = os.path.join(work, "synthetic-ls6-size" if n_samples == 684 else f"synthetic-{n_samples}")
        if not os.path.exists(os.path.join(dataset, "manifest.json")):
            write_synthetic_dataset(dataset, n_samples=n_samples, probes=7, window=144, seed=0)
        source = f"synthetic ({n_samples} samples x 7 probes x 144 x 42; MAE of the synthetic signal, not ls6)"
    extra = [a for kv in args.param for a in ("--param", kv)]
    rows = []
    for model in [m for m in args.models.split(",") if m]:
        out = os.path.join(work, f"{model}-{args.preset}")
        print(f"training {model} ({args.preset}) ...", file=sys.stderr, flush=True)
        rows.append(train_one(model, dataset, out, args.preset, args.threads, extra))
    print(f"\ndataset: {source}\npreset: {args.preset}, threads: {args.threads}, cpus: {os.cpu_count()}\n")
    print("| model | wall s | val MAE h | constant MAE h | train MAE h | train rows | val rows |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['wall_s']:.0f} | failed: {r['error']} | | | | |")
            continue
        print(
            f"| {r['model']} | {r['process_wall_s']:.0f} | {r['val_mae_h']:.3f} | {r['val_constant_mae_h']:.3f} | "
            f"{r['train_mae_h']:.3f} | {r['n_train']} | {r['n_val']} |"
        )
    if args.trace:
        print(
            "\npolicies on the simulator (return = -|interruption| in minutes, mean over the fixed "
            "validation episodes, actions sampled with a fixed seed; reactive = always wait):\n"
        )
        print("| policy | wall s | episodes | reactive | untrained | best | best epoch |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        from mirage_tasks.models.registry import POLICIES

        for model in POLICIES:
            base = os.path.join(work, f"{POLICIES[model]}-{args.preset}")
            if not os.path.exists(os.path.join(base, "_SUCCESS.json")):
                print(f"| {model} | | | base model not trained in this run | | | |")
                continue
            print(f"training {model} ({args.preset}) ...", file=sys.stderr, flush=True)
            r = train_policy(
                model, base, args.trace, os.path.join(work, f"{model}-{args.preset}"), args.preset, args.threads
            )
            if "error" in r:
                print(f"| {model} | {r['wall_s']:.0f} | failed: {r['error']} | | | | |")
            else:
                print(
                    f"| {model} | {r['process_wall_s']:.0f} | {r['episodes']} | {r['reactive_val_return']:.0f} | "
                    f"{r['initial_val_return']:.0f} | {r['best_val_return']:.0f} | {r['best_epoch']} |"
                )
    if args.paper_moe_epochs:
        print(
            f"\npaper preset (MoE: the joint mixture phase), {args.paper_moe_epochs} epoch(s) on "
            f"{args.paper_rows} rows:\n"
        )
        print(
            "| model | device | precision | s/epoch measured | s/epoch full split (est.) | val MAE (scaled) after "
            "these epochs | parameters |"
        )
        print("|---|---|---|---:|---:|---:|---:|")
        for kind in args.paper_kinds.split(","):
            for dev in args.devices.split(","):
                for amp in args.amp.split(","):
                    r = time_paper(kind, dataset, dev, args.paper_moe_epochs, args.paper_rows, args.threads, amp)
                    if "error" in r:
                        print(f"| {kind} | {dev} | {amp} | not available: {r['error']} | | | |")
                    else:
                        print(
                            f"| {kind} | {dev} | {amp} | {r['s_per_epoch']:.1f} | {r['s_per_full_epoch_est']:.0f} | "
                            f"{r['val_mae_scaled']:.3f} | {r['n_parameters']:,} |",
                            flush=True,
                        )
    failed = [r["model"] for r in rows if "error" in r]
    if failed:  # the table says so; the exit status too, so a broken model cannot pass unseen
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
