"""The epoch loop every neural Mirage model trains with (transformer, MoE experts and mixture).

Training is a list of :class:`Phase` s, each optimising one module on some rows with
AdamW; after every epoch the whole model is evaluated on the validation rows. Training
checkpoints (weights, optimiser, epoch, RNG states, curves) so that a killed run resumes
exactly; a checkpoint that cannot be read is set aside (renamed) and training restarts.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from stepkit import StepError

from . import StopRequested, torchutil

log = logging.getLogger(__name__)


@dataclass
class Phase:
    """One stage of training: ``module`` is optimised on ``rows`` and evaluated on the validation rows."""

    name: str
    module: nn.Module
    rows: np.ndarray
    epochs: int
    lr: float
    batch_size: int
    weight_decay: float = 0.0
    schedule: str = "constant"  # or "cosine": lr decays to 10 % over the phase's epochs

    def lr_at(self, epoch: int) -> float:
        if self.schedule == "constant":
            return self.lr
        if self.schedule == "cosine":
            frac = (epoch - 1) / max(self.epochs - 1, 1)
            return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        raise StepError(f"unknown lr schedule {self.schedule!r}; use constant or cosine")


AMP_MODES = ("off", "bf16", "auto")


def amp_dtype(mode: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``mode``: ``off`` none; ``bf16`` bfloat16 on any device; ``auto``
    bfloat16 on a CUDA device, none on the CPU (bfloat16 matmuls are rarely faster there).
    bfloat16 keeps float32's exponent range, so no loss scaling is needed; weights, optimiser
    state and the loss stay float32."""
    if mode not in AMP_MODES:
        raise StepError(f"unknown amp mode {mode!r}; use {', '.join(AMP_MODES)}")
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def _loss_fn(name: str) -> nn.Module:
    return {"l1": nn.L1Loss(), "mse": nn.MSELoss(), "huber": nn.HuberLoss(delta=1.0)}[name]


@torch.no_grad()
def predict_scaled(
    module: nn.Module, X: torch.Tensor, device: torch.device, batch: int = 512, amp: torch.dtype | None = None
) -> torch.Tensor:
    module.eval()
    out = []
    for i in range(0, X.shape[0], batch):
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            out.append(module(X[i : i + batch].to(device)).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def fit_phases(
    model: nn.Module,
    phases: list[Phase],
    X: torch.Tensor,
    y: torch.Tensor,
    val_rows: np.ndarray,
    *,
    loss: str,
    y_scale: float,
    device: torch.device,
    seed: int,
    grad_clip: float,
    checkpoint_every: int,
    ckpt_uri: str | None,
    fingerprint: str,
    stop_after: int | None = None,
    amp: str = "off",
) -> list[dict[str, Any]]:
    """Train ``phases`` in order; checkpoint after every ``checkpoint_every`` epochs and at phase ends.

    ``X``/``y`` are the scaled inputs/targets of every row (CPU tensors); phases index into
    them. A checkpoint in ``ckpt_uri`` written under the same ``fingerprint`` is resumed
    exactly (weights, optimiser, epoch, RNG states, curves). Returns the per-epoch curves.
    """
    loss_fn = _loss_fn(loss)
    cast = amp_dtype(amp, device)
    if cast is not None:
        log.info("mixed precision: autocast to %s on %s", cast, device)
    curves: list[dict[str, Any]] = []
    start_phase, start_epoch, ck = 0, 0, None
    if ckpt_uri is not None:
        ck = torchutil.load_checkpoint(ckpt_uri, fingerprint)
        if ck is not None:
            torchutil.load_state(model, ck["model"], ckpt_uri)
            start_phase, start_epoch = int(ck["phase"]), int(ck["epoch"])
            curves = list(ck["curves"])
            log.info(
                "resuming from %s: phase %d (%s) after epoch %d",
                ckpt_uri,
                start_phase,
                phases[start_phase].name,
                start_epoch,
            )
    model.to(device)
    val_idx = torch.as_tensor(val_rows)
    Xv, yv = X[val_idx.to(X.device)], y[val_idx.to(y.device)].float().cpu()  # predictions come back on the CPU
    run = 0
    for pi, ph in enumerate(phases):
        if pi < start_phase:
            continue
        params = [p for p in ph.module.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=ph.lr, weight_decay=ph.weight_decay)
        gen = torch.Generator().manual_seed(seed * 1009 + pi)
        first = 1
        if ck is not None and pi == start_phase:
            opt.load_state_dict(ck["optimizer"])
            gen.set_state(ck["generator"])
            torchutil.set_rng_state(ck["rng"])
            first = start_epoch + 1
        rows = torch.as_tensor(ph.rows).to(X.device)
        prog = torchutil.Progress(ph.name, ph.epochs, first - 1)
        for epoch in range(first, ph.epochs + 1):
            for group in opt.param_groups:
                group["lr"] = ph.lr_at(epoch)
            ph.module.train()
            perm = rows[torch.randperm(len(rows), generator=gen).to(rows.device)]
            total, count = 0.0, 0
            for i in range(0, len(perm), ph.batch_size):
                idx = perm[i : i + ph.batch_size]
                xb, yb = X[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
                opt.zero_grad(set_to_none=True)
                with torch.autocast(device.type, dtype=cast, enabled=cast is not None):
                    out = ph.module(xb)
                lo = loss_fn(out.float(), yb)
                lo.backward()
                if grad_clip:
                    nn.utils.clip_grad_norm_(params, grad_clip)
                opt.step()
                total += float(lo.detach()) * len(idx)
                count += len(idx)
            pv = predict_scaled(ph.module, Xv, device, amp=cast)
            rec = {
                "phase": ph.name,
                "epoch": epoch,
                "train_loss": total / max(count, 1),
                "val_loss": float(loss_fn(pv, yv)),
                "val_mae_h": float((pv - yv).abs().mean()) * y_scale,
            }
            if not math.isfinite(rec["train_loss"]):
                raise StepError(
                    f"{ph.name}: training diverged at epoch {epoch} (loss {rec['train_loss']}); lower the learning rate"
                )
            curves.append(rec)
            prog.line(epoch, train_loss=rec["train_loss"], val_loss=rec["val_loss"], val_mae_h=rec["val_mae_h"])
            run += 1
            last = epoch == ph.epochs
            if ckpt_uri is not None and (last or epoch % max(checkpoint_every, 1) == 0 or run == stop_after):
                torchutil.save_checkpoint(
                    ckpt_uri,
                    {
                        "fingerprint": fingerprint,
                        "phase": pi,
                        "epoch": epoch,
                        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
                        "optimizer": opt.state_dict(),
                        "generator": gen.get_state(),
                        "rng": torchutil.rng_state(),
                        "curves": curves,
                    },
                )
            if stop_after is not None and run >= stop_after and not (last and pi == len(phases) - 1):
                raise StopRequested(f"stopped after {run} epoch(s) as requested; rerun to resume")
    return curves
