"""Python implementations of the native ATC'20 workloads, run by the local target's workers.

These exercise the pipeline (chaining, state, cold starts); they are not Faasm and their
timings say nothing about wasm. Functions are looked up by ``(user, function, index)``:

* ``sgd/reuters_svm`` index 0: Hogwild SVM driver, input ``"<n_workers> <sync_interval> [epochs]"``;
  index 1: one worker's pass over its batch, input ``"<w> <start> <end> <epoch>"``.
* ``python/mat_mul`` (Python call, ``py_func=mat_mul``) index 0: divide-and-conquer driver;
  index 1: one sub-multiplication (JSON input). With 2 splits: 1 + 8 + 64 = 73 calls.
* ``tf/image``: one inference of a tiny torch CNN on the shared image.
* ``demo/echo``, ``demo/sleep`` (input = milliseconds), ``demo/fail``: for tests.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


class FunctionError(Exception):
    """The function failed; the message becomes the ``FAILED:`` payload."""


@dataclass
class Context:
    """What a running function may use: state, chaining and per-process caches."""

    state: Any  # redis.Redis on the state database
    shared_dir: str
    chain: Callable[[dict[str, Any]], int]
    await_call: Callable[[int, float], tuple[bool, str]]
    cache: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    call_timeout_s: float = 600.0

    def get_state(self, user: str, key: str) -> bytes:
        val = self.state.get(f"{user}_{key}")
        if val is None:
            raise FunctionError(f"state key {user}_{key} missing")
        return val

    def set_state(self, user: str, key: str, data: bytes) -> None:
        self.state.set(f"{user}_{key}", data)


# ---------------------------------------------------------------- SGD (Hogwild SVM)
SGD_LR = 0.1


def _sgd_data(ctx: Context) -> dict[str, np.ndarray]:
    with ctx.lock:
        if "sgd" not in ctx.cache:
            get = lambda k: ctx.get_state("sgd", k)  # noqa: E731
            size = np.frombuffer(get("inputs_size"), dtype=np.int32)
            ctx.cache["sgd"] = {
                "features": int(size[0]), "examples": int(size[1]),
                "vals": np.frombuffer(get("inputs_vals"), dtype=np.float64),
                "innr": np.frombuffer(get("inputs_innr"), dtype=np.int32),
                "outr": np.frombuffer(get("inputs_outr"), dtype=np.int32),
                "outputs": np.frombuffer(get("outputs"), dtype=np.float64),
            }
        return ctx.cache["sgd"]


def _read_weights(ctx: Context, n_features: int) -> np.ndarray:
    w = np.zeros(n_features)
    raw = ctx.state.hgetall("sgd_weights")
    if raw:
        idx = np.fromiter((int(k) for k in raw), dtype=np.int64, count=len(raw))
        w[idx] = np.fromiter((float(v) for v in raw.values()), dtype=np.float64, count=len(raw))
    return w


def _push_delta(ctx: Context, delta: dict[int, float]) -> None:
    # Element-wise atomic adds, no lock over the vector: Hogwild's update model.
    pipe = ctx.state.pipeline(transaction=False)
    for k, v in delta.items():
        if v:
            pipe.hincrbyfloat("sgd_weights", str(k), float(v))
    pipe.execute()
    delta.clear()


def sgd_main(ctx: Context, input_data: str) -> str:
    parts = input_data.split()
    if len(parts) < 2:
        raise FunctionError("input must be '<n_workers> <sync_interval> [epochs]'")
    n_workers, interval = int(parts[0]), int(parts[1])
    epochs = int(parts[2]) if len(parts) > 2 else 20
    if n_workers < 1 or epochs < 1:
        raise FunctionError("n_workers and epochs must be >= 1")
    data = _sgd_data(ctx)
    n = data["examples"]
    ctx.state.set("sgd_params", json.dumps({"n_workers": n_workers, "sync_interval": interval,
                                            "epochs": epochs, "learning_rate": SGD_LR,
                                            "examples": n, "features": data["features"]}))
    ctx.state.delete("sgd_weights")
    batch = math.ceil(n / n_workers)
    lines, t_first = [], None
    rng = random.Random(1234)
    for epoch in range(epochs):
        ctx.state.delete("sgd_errors")
        order = list(range(n_workers))
        rng.shuffle(order)
        ids = [ctx.chain({"index": 1, "input_data": f"{w} {w * batch} {min(n, (w + 1) * batch)} {epoch}"})
               for w in order]
        for cid in ids:
            ok, out = ctx.await_call(cid, ctx.call_timeout_s)
            if not ok:
                raise FunctionError(f"step call {cid} failed: {out}")
        err = float(ctx.state.get("sgd_errors") or 0.0)
        loss = math.sqrt(err / n)
        now = time.monotonic()
        if t_first is None:
            t_first = now
        lines.append(f"{now - t_first:.4f} {loss:.4f}")
    return "\n".join(lines)


def sgd_step(ctx: Context, input_data: str) -> str:
    w_idx, start, end, _epoch = (int(x) for x in input_data.split())
    params = json.loads(ctx.state.get("sgd_params") or b"{}")
    interval = int(params.get("sync_interval", -1))
    data = _sgd_data(ctx)
    vals, innr, outr, y = data["vals"], data["innr"], data["outr"], data["outputs"]
    w = _read_weights(ctx, data["features"])
    delta: dict[int, float] = {}
    updates, sq_err = 0, 0.0
    for i in range(start, end):
        lo, hi = outr[i], outr[i + 1]
        feats, x = innr[lo:hi], vals[lo:hi]
        pred = float(w[feats] @ x)
        hinge = max(0.0, 1.0 - float(y[i]) * pred)
        sq_err += hinge * hinge  # the loss reported per epoch is the RMS hinge error
        if y[i] * pred < 1.0:
            step = SGD_LR * y[i] * x
            w[feats] += step
            for f, s in zip(feats.tolist(), step.tolist()):
                delta[f] = delta.get(f, 0.0) + s
        updates += 1
        if interval > 0 and updates % interval == 0:
            _push_delta(ctx, delta)
            w = _read_weights(ctx, data["features"])
    _push_delta(ctx, delta)
    ctx.state.incrbyfloat("sgd_errors", float(sq_err))
    return f"worker {w_idx} done {end - start} examples"


# ---------------------------------------------------------------- matrix multiplication
def _block_size(ctx: Context) -> tuple[int, int]:
    raw = ctx.get_state("python", "matrix_state")
    size, splits = (int(v) for v in np.frombuffer(raw, dtype=np.int32)[:2])
    return size, splits


def _read_mat(ctx: Context, key: str, n: int) -> np.ndarray:
    raw = ctx.get_state("python", key)
    if len(raw) != n * n * 4:
        raise FunctionError(f"python_{key}: {len(raw)} bytes, expected {n * n * 4}")
    return np.frombuffer(raw, dtype=np.float32).reshape(n, n)


def matmul_task(ctx: Context, spec: dict[str, int]) -> str:
    size, splits = _block_size(ctx)
    blocks = 2 ** splits
    if size % blocks:
        raise FunctionError(f"matrix size {size} not divisible by {blocks}")
    bs = size // blocks
    lvl, ar, ac, br, bc, span = (spec[k] for k in ("lvl", "ar", "ac", "br", "bc", "span"))
    out_key = "result_matrix" if lvl == 0 else f"intermediate_{lvl}_{ar}_{ac}_{br}_{bc}"
    if span == 1:
        a = _read_mat(ctx, f"mat_a_{splits}_{ar}_{ac}", bs)
        b = _read_mat(ctx, f"mat_b_{splits}_{br}_{bc}", bs)
        ctx.set_state("python", out_key, (a @ b).astype(np.float32).tobytes())
        return out_key
    half = span // 2
    children = {}
    for i in (0, 1):
        for j in (0, 1):
            for k in (0, 1):
                sub = {"lvl": lvl + 1, "ar": ar + i * half, "ac": ac + k * half,
                       "br": br + k * half, "bc": bc + j * half, "span": half}
                children[(i, j, k)] = (sub, ctx.chain({"index": 1, "input_data": json.dumps(sub)}))
    n_sub = bs * half
    quads = {}
    for key, (sub, cid) in children.items():
        ok, out = ctx.await_call(cid, ctx.call_timeout_s)
        if not ok:
            raise FunctionError(f"sub-multiplication {sub} (call {cid}) failed: {out}")
        quads[key] = _read_mat(ctx, out.strip(), n_sub)
    c = np.block([[quads[(0, 0, 0)] + quads[(0, 0, 1)], quads[(0, 1, 0)] + quads[(0, 1, 1)]],
                  [quads[(1, 0, 0)] + quads[(1, 0, 1)], quads[(1, 1, 0)] + quads[(1, 1, 1)]]])
    ctx.set_state("python", out_key, c.astype(np.float32).tobytes())
    return out_key


def matmul_main(ctx: Context, input_data: str) -> str:
    _size, splits = _block_size(ctx)
    matmul_task(ctx, {"lvl": 0, "ar": 0, "ac": 0, "br": 0, "bc": 0, "span": 2 ** splits})
    return "Matrix multiplication finished"


# ---------------------------------------------------------------- inference
IMAGE_SHAPE = (3, 64, 64)
N_CLASSES = 10


def build_cnn():
    """The tiny CNN standing in for MobileNet (about 6 k parameters)."""
    import torch
    from torch import nn

    torch.set_num_threads(1)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, N_CLASSES),
    ).eval()


def cnn_weights(seed: int = 0) -> bytes:
    """Deterministic float32 weights of :func:`build_cnn` (raw bytes, no pickle)."""
    import torch
    from torch.nn.utils import parameters_to_vector

    torch.manual_seed(seed)
    return parameters_to_vector(build_cnn().parameters()).detach().numpy().astype(np.float32).tobytes()


def _model(ctx: Context, model_key: str):
    import torch
    from torch.nn.utils import vector_to_parameters

    with ctx.lock:
        if "model" not in ctx.cache:
            model = build_cnn()
            vec = np.frombuffer(ctx.get_state("tf", model_key), dtype=np.float32).copy()
            n = sum(p.numel() for p in model.parameters())
            if vec.size != n:
                raise FunctionError(f"model state holds {vec.size} floats, the CNN needs {n}")
            vector_to_parameters(torch.from_numpy(vec), model.parameters())
            ctx.cache["model"] = model
        return ctx.cache["model"]


def inference(ctx: Context, input_data: str, model_key: str = "mobilenet_v1") -> str:
    import torch

    img_path = os.path.join(ctx.shared_dir, "tfdata", "grace_hopper.bmp")
    lbl_path = os.path.join(ctx.shared_dir, "tfdata", "labels.txt")
    with ctx.lock:
        if "image" not in ctx.cache:
            try:
                with open(img_path, "rb") as f:
                    raw = f.read()
                with open(lbl_path, encoding="utf-8") as f:
                    labels = f.read().splitlines()
            except FileNotFoundError as exc:
                raise FunctionError(f"shared file missing: {exc.filename}") from exc
            need = int(np.prod(IMAGE_SHAPE))
            if len(raw) < need:
                raise FunctionError(f"image has {len(raw)} bytes, need {need}")
            arr = np.frombuffer(raw[-need:], dtype=np.uint8).reshape(IMAGE_SHAPE).astype(np.float32) / 255.0
            ctx.cache["image"] = (torch.from_numpy(arr).unsqueeze(0), labels)
        x, labels = ctx.cache["image"]
    model = _model(ctx, model_key)
    with torch.no_grad():
        probs = torch.softmax(model(x), dim=1)[0]
    top = int(probs.argmax())
    name = labels[top] if top < len(labels) else str(top)
    return f"{name} {float(probs[top]):.4f}"


# ---------------------------------------------------------------- dispatch
def execute(ctx: Context, msg: dict[str, Any]) -> str:
    """Run one call; raises FunctionError on failure."""
    user, func = msg.get("user", ""), msg.get("function", "")
    if msg.get("python"):
        user, func = msg.get("py_user", user), msg.get("py_func", func)
    index = int(msg.get("index", 0) or 0)
    data = msg.get("input_data") or ""
    if (user, func) == ("sgd", "reuters_svm"):
        return sgd_step(ctx, data) if index == 1 else sgd_main(ctx, data)
    if (user, func) == ("python", "mat_mul"):
        return matmul_task(ctx, json.loads(data)) if index == 1 else matmul_main(ctx, data)
    if (user, func) == ("tf", "image"):
        return inference(ctx, data)
    if user == "demo":
        if func == "echo":
            return data
        if func == "sleep":
            time.sleep(min(float(data or 0), 60000) / 1000.0)
            return "slept"
        if func == "fail":
            raise FunctionError(f"demo failure: {data}")
        if func == "noop":
            return ""
    raise FunctionError(f"no such function {user}/{func}")
