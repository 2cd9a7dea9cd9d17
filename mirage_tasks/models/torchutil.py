"""Torch plumbing shared by the neural models: device choice, seeding, safe checkpoints.

Checkpoints and weights are ``torch.save`` of tensors, numbers, strings and nested
dicts/lists only, read back with ``torch.load(weights_only=True)``: loading never runs code.
"""

from __future__ import annotations

import io
import logging
import os
import time
from typing import Any

import torch

from stepkit import StepError, storage

log = logging.getLogger(__name__)


def pick_device(name: str) -> torch.device:
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise StepError(
                f"--device {name} requested but torch.cuda.is_available() is False "
                f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                f"use --device cpu or run on a GPU node with a CUDA build of torch"
            )
        return torch.device(name)
    raise StepError(f"unknown device {name!r}; use cpu or cuda")


def seed_everything(seed: int, device: torch.device) -> None:
    torch.manual_seed(seed)
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    else:  # cuBLAS is deterministic only with a fixed workspace, set before its first use
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.cuda.manual_seed_all(seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def save_tensors(uri: str, obj: dict[str, Any]) -> None:
    """``torch.save`` a dict of tensors/plain values to ``uri`` atomically."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    storage.write_bytes(uri, buf.getvalue())


def load_tensors(uri: str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a file written by :func:`save_tensors`; a clear error naming the file otherwise."""
    if not storage.exists(uri):
        raise StepError(f"model file not found: {uri}")
    try:
        obj = torch.load(io.BytesIO(storage.read_bytes(uri)), map_location=map_location, weights_only=True)
    except Exception as exc:  # zip, unpickler and weights-only errors vary
        raise StepError(f"{uri}: not a readable torch weights file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(obj, dict):
        raise StepError(f"{uri}: expected a dict of tensors, got {type(obj).__name__}")
    return obj


def load_state(module: torch.nn.Module, state: dict[str, Any], uri: str) -> None:
    """``load_state_dict`` with a clear error naming the file on any mismatch."""
    try:
        module.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()
        raise StepError(
            f"{uri}: weights do not match the architecture in the config "
            f"({first[0] if first else exc}{' ...' if len(first) > 1 else ''})"
        ) from exc


def rng_state() -> dict[str, Any]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Progress:
    """Epoch progress lines with an ETA, to the log."""

    def __init__(self, label: str, total: int, done: int = 0):
        self.label, self.total, self.start_done = label, total, done
        self.t0 = time.monotonic()

    def line(self, epoch: int, **metrics: float) -> str:
        elapsed = time.monotonic() - self.t0
        n = max(epoch - self.start_done, 1)
        per = elapsed / n
        eta = per * (self.total - epoch)
        parts = " ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        msg = f"{self.label} epoch {epoch}/{self.total} {parts} {per:.1f}s/epoch ETA {_hms(eta)}"
        log.info(msg)
        return msg


def _hms(s: float) -> str:
    s = int(round(max(s, 0)))
    return f"{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}"


# ----------------------------------------------------------------------------- training checkpoints
#
# A training checkpoint is rotated on every save: the previous one is kept as ``*.prev.pt``
# until the next save, so a checkpoint found truncated (a full disk, an interrupted copy)
# leaves the one before it. An unreadable checkpoint is never deleted: it is renamed
# ``*.corrupt-<UTC time>`` beside the others, with a warning, and training resumes from the
# last readable one, or from scratch.


def previous_checkpoint(uri: str) -> str:
    return uri[:-3] + ".prev.pt" if uri.endswith(".pt") else uri + ".prev"


def _move(src: str, dst: str) -> None:
    fs, src_path = storage.filesystem(src)
    _, dst_path = storage.filesystem(dst)
    fs.mv(src_path, dst_path)


def save_checkpoint(uri: str, obj: dict[str, Any]) -> None:
    """Write a training checkpoint, keeping the one it replaces as :func:`previous_checkpoint`."""
    if storage.exists(uri):
        _move(uri, previous_checkpoint(uri))
    save_tensors(uri, obj)


def load_checkpoint(uri: str, fingerprint: str) -> dict[str, Any] | None:
    """The newest readable checkpoint written under ``fingerprint`` (``uri``, else its previous
    one), or None (start from scratch). Unreadable ones are set aside with a warning."""
    for candidate in (uri, previous_checkpoint(uri)):
        if not storage.exists(candidate):
            continue
        try:
            ck = load_tensors(candidate)
        except StepError as exc:
            aside = f"{candidate}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
            _move(candidate, aside)
            log.warning("checkpoint %s is unreadable (%s); set aside as %s", candidate, exc, aside)
            continue
        if ck.get("fingerprint") != fingerprint:
            log.warning("checkpoint %s belongs to another configuration; not resumed", candidate)
            continue
        if candidate != uri:
            log.warning("resuming from the previous checkpoint %s", candidate)
        return ck
    return None


def remove_checkpoints(uri: str) -> None:
    """Remove a finished training's checkpoint and its previous one (set-aside files stay)."""
    storage.remove(uri)
    storage.remove(previous_checkpoint(uri))
