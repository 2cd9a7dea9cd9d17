"""Data preparation: deterministic matrices, SGD and TF data from S3 (or synthetic on the
local target), uploaded as Faasm state once.

Upload-once: next to every uploaded object the package stores its SHA-256 as a small
state object ``<key>.sha256`` (through the same upload API, so it works on any target).
An upload is skipped when the cluster already holds the same checksum.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import tempfile
from typing import Any

import numpy as np

from stepkit import StepError

from .clients import UploadClient

log = logging.getLogger(__name__)
FILES_USER = "faasm_tasks_files"  # state user holding checksums of shared files


# ---------------------------------------------------------------- matrices
def _matrix_rng(size: int, splits: int, seed: int, which: str) -> np.random.Generator:
    return np.random.default_rng([seed, size, splits, 0 if which == "a" else 1])


def full_matrix(size: int, splits: int, seed: int, which: str) -> np.ndarray:
    return _matrix_rng(size, splits, seed, which).random((size, size), dtype=np.float32)


def matrix_state_objects(size: int, splits: int, seed: int = 42) -> dict[str, bytes]:
    """``matrix_state`` (int32 [size, splits]) and the float32 sub-matrices
    ``mat_a_<splits>_<r>_<c>`` / ``mat_b_...`` of a 2^splits x 2^splits block grid."""
    blocks = 2**splits
    if size % blocks:
        raise StepError(f"matrix size {size} is not divisible by {blocks} (2^{splits})")
    bs = size // blocks
    out = {"matrix_state": np.array([size, splits], dtype=np.int32).tobytes()}
    for which in ("a", "b"):
        m = full_matrix(size, splits, seed, which)
        for r in range(blocks):
            for c in range(blocks):
                out[f"mat_{which}_{splits}_{r}_{c}"] = np.ascontiguousarray(
                    m[r * bs : (r + 1) * bs, c * bs : (c + 1) * bs]
                ).tobytes()
    return out


def expected_product(size: int, splits: int, seed: int = 42) -> np.ndarray:
    a, b = full_matrix(size, splits, seed, "a"), full_matrix(size, splits, seed, "b")
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


# ---------------------------------------------------------------- SGD
def synthetic_sgd(
    examples: int = 1500, features: int = 400, nnz_per_example: int = 12, seed: int = 7
) -> dict[str, bytes]:
    """A small sparse binary-classification set in the Reuters state layout:
    features x examples, column-compressed (``inputs_outr`` = column pointers)."""
    rng = np.random.default_rng(seed)
    true_w = rng.normal(size=features)
    innr, vals, outr, y = [], [], [0], []
    for _ in range(examples):
        k = int(min(features, max(1, rng.poisson(nnz_per_example))))
        f = np.sort(rng.choice(features, size=k, replace=False))
        v = rng.random(k) + 0.1
        innr.append(f.astype(np.int32))
        vals.append(v)
        outr.append(outr[-1] + k)
        y.append(1.0 if float(true_w[f] @ v) >= 0 else -1.0)
    innr_a, vals_a = np.concatenate(innr), np.concatenate(vals)
    counts = np.bincount(innr_a, minlength=features).astype(np.int32)
    nnz = np.diff(np.array(outr)).astype(np.int32)
    return {
        "inputs_vals": vals_a.astype(np.float64).tobytes(),
        "inputs_innr": innr_a.tobytes(),
        "inputs_outr": np.array(outr, dtype=np.int32).tobytes(),
        "inputs_size": np.array([features, examples, int(innr_a.size)], dtype=np.int32).tobytes(),
        "inputs_nonz": nnz.tobytes(),
        "outputs": np.array(y, dtype=np.float64).tobytes(),
        "feature_counts": counts.tobytes(),
    }


# ---------------------------------------------------------------- TF (local: the small CNN of functions/inference.c)
IMAGE_SHAPE = (3, 64, 64)
N_CLASSES = 10
# conv1 [8,3,3,3] + b, conv2 [16,8,3,3] + b, fc [10,16] + b: the order inference.c reads them in
CNN_SHAPES = ((8, 3, 3, 3), (8,), (16, 8, 3, 3), (16,), (N_CLASSES, 16), (N_CLASSES,))


def cnn_weights(seed: int = 0) -> bytes:
    """Deterministic float32 weights of the CNN (uniform, fan-in scaled), raw bytes."""
    rng = np.random.default_rng(seed)
    parts = []
    for shape in CNN_SHAPES:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 16
        bound = 1.0 / np.sqrt(fan_in)
        parts.append(rng.uniform(-bound, bound, size=shape).astype(np.float32).ravel())
    return np.concatenate(parts).tobytes()


def cnn_reference(model: bytes, image: bytes, labels: list[str]) -> tuple[str, float]:
    """What inference.c computes, in NumPy: (top label, its softmax probability)."""
    vec = np.frombuffer(model, dtype=np.float32)
    ws, off = [], 0
    for shape in CNN_SHAPES:
        n = int(np.prod(shape))
        ws.append(vec[off : off + n].reshape(shape).astype(np.float64))
        off += n
    need = int(np.prod(IMAGE_SHAPE))
    x = np.frombuffer(image[-need:], dtype=np.uint8).reshape(IMAGE_SHAPE) / 255.0

    def conv(a, w, b):  # 3x3, stride 2, pad 1, ReLU
        c, h, _ = a.shape
        p = np.pad(a, ((0, 0), (1, 1), (1, 1)))
        ho = (h + 1) // 2
        out = np.zeros((w.shape[0], ho, ho))
        for ky in range(3):
            for kx in range(3):
                patch = p[:, ky : ky + 2 * ho : 2, kx : kx + 2 * ho : 2]
                out += np.einsum("oc,chw->ohw", w[:, :, ky, kx], patch)
        return np.maximum(out + b[:, None, None], 0)

    a = conv(conv(x, ws[0], ws[1]), ws[2], ws[3])
    logits = ws[4] @ a.mean(axis=(1, 2)) + ws[5]
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    top = int(probs.argmax())
    return (labels[top] if top < len(labels) else "?"), float(probs[top])


def synthetic_tf(seed: int = 0) -> tuple[bytes, dict[str, bytes]]:
    """(model state, shared files) for the local CNN. The image is raw RGB bytes."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8).tobytes()
    labels = "\n".join(f"class_{i}" for i in range(N_CLASSES)).encode()
    return cnn_weights(seed), {"grace_hopper.bmp": image, "labels.txt": labels}


# ---------------------------------------------------------------- S3
def fetch_archive(bucket: str, key: str, endpoint_url: str | None = None) -> dict[str, bytes]:
    """Download ``s3://bucket/key`` (a tar, any compression) and return its files by base name."""
    import fsspec

    opts = {"client_kwargs": {"endpoint_url": endpoint_url}} if endpoint_url else {}
    uri = f"s3://{bucket}/{key}"
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, "archive")
        try:
            with fsspec.open(uri, "rb", **opts) as src, open(local, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
        except (FileNotFoundError, PermissionError, OSError) as exc:
            raise StepError(f"cannot fetch {uri}: {exc}") from exc
        try:
            with tarfile.open(local, "r:*") as tar:
                for m in tar.getmembers():
                    if m.isfile():
                        f = tar.extractfile(m)
                        if f is not None:
                            out[os.path.basename(m.name)] = f.read()
        except tarfile.TarError as exc:
            raise StepError(f"{uri} is not a tar archive: {exc}") from exc
    return out


# ---------------------------------------------------------------- upload once
def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def upload_state_once(client: UploadClient, user: str, key: str, data: bytes, force: bool = False) -> dict[str, Any]:
    digest = sha256(data)
    if not force:
        held = client.get_state(user, f"{key}.sha256")
        if held is not None and held.decode(errors="replace").strip() == digest:
            return {
                "kind": "state",
                "user": user,
                "key": key,
                "bytes": len(data),
                "sha256": digest,
                "action": "skipped",
            }
    client.put_state(user, key, data)
    client.put_state(user, f"{key}.sha256", digest.encode())  # written last: only after the data landed
    return {"kind": "state", "user": user, "key": key, "bytes": len(data), "sha256": digest, "action": "uploaded"}


def upload_file_once(client: UploadClient, path: str, data: bytes, force: bool = False) -> dict[str, Any]:
    digest = sha256(data)
    ck = path.replace("/", "__") + ".sha256"
    if not force:
        held = client.get_state(FILES_USER, ck)
        if held is not None and held.decode(errors="replace").strip() == digest:
            return {"kind": "file", "path": path, "bytes": len(data), "sha256": digest, "action": "skipped"}
    client.put_file(path, data)
    client.put_state(FILES_USER, ck, digest.encode())
    return {"kind": "file", "path": path, "bytes": len(data), "sha256": digest, "action": "uploaded"}


def fetch_object(bucket: str, key: str, endpoint_url: str | None = None) -> bytes:
    """``s3://bucket/key`` as bytes; a missing object or unreachable store -> StepError (exit 2)."""
    import fsspec

    opts = {"client_kwargs": {"endpoint_url": endpoint_url}} if endpoint_url else {}
    uri = f"s3://{bucket}/{key}"
    try:
        with fsspec.open(uri, "rb", **opts) as f:
            return f.read()
    except (FileNotFoundError, PermissionError, OSError) as exc:
        raise StepError(f"cannot fetch {uri}: {exc}") from exc


def needs_function(plan) -> bool:
    """The manual uploads the function before a run: wasm functions (``inv upload <user> <func>``)
    and Python ones for both systems (``inv upload python mat_mul --py``); native C++ functions
    are built into their images."""
    return bool(plan.experiment["data"].get("function_key")) and (
        plan.system == "wasm" or bool(plan.experiment.get("python"))
    )


def matrix_archive_key(prefix: str, size: int, splits: int) -> str:
    """One archive per size, named after the manual's folders (``<N>x<N>_<splits>``)."""
    return f"{prefix.strip('/')}/{size}x{size}_{splits}.tar"


def ensure_matrix_archives(plan, bucket: str, endpoint_url: str | None = None) -> list[dict[str, Any]]:
    """``data.matrix-upload-s3``: each size's 33 state objects as a tar in S3, generated
    (deterministically, from the catalogue's seed) only when the archive is not there yet."""
    import fsspec

    spec = plan.experiment["data"]
    prefix, seed = spec.get("matrix_prefix", "matrix"), int(spec.get("seed", 42))
    splits = int(plan.params.get("splits", 2))
    opts = {"client_kwargs": {"endpoint_url": endpoint_url}} if endpoint_url else {}
    fs = fsspec.filesystem("s3", **opts)
    out = []
    for size in sorted({int(p["matrix_size"]) for p in plan.points}):
        key = matrix_archive_key(prefix, size, splits)
        try:
            there = fs.exists(f"{bucket}/{key}")
        except (PermissionError, OSError) as exc:
            raise StepError(f"cannot reach s3://{bucket}/{key}: {exc}") from exc
        if there:
            out.append({"kind": "matrix-archive", "key": key, "action": "skipped"})
            continue
        body = tar_bytes(
            {f"{size}x{size}_{splits}/{k}": v for k, v in matrix_state_objects(size, splits, seed).items()}
        )
        with fs.open(f"{bucket}/{key}", "wb") as f:
            f.write(body)
        out.append({"kind": "matrix-archive", "key": key, "bytes": len(body), "action": "uploaded"})
    return out


def matrix_objects_from_s3(plan, size: int, bucket: str, endpoint_url: str | None = None) -> dict[str, bytes]:
    """``data.matrix-download-s3`` for one size: its state objects from the archive."""
    spec = plan.experiment["data"]
    splits = int(plan.params.get("splits", 2))
    key = matrix_archive_key(spec.get("matrix_prefix", "matrix"), size, splits)
    files = fetch_archive(bucket, key, endpoint_url)
    if "matrix_state" not in files:
        raise StepError(f"s3://{bucket}/{key} lacks matrix_state")
    return files


def check_wasm(body: bytes, name: str) -> None:
    """A WebAssembly function starts with the magic number and version 1 (before any upload)."""
    if body[:4] != b"\0asm" or body[4:8] != b"\x01\0\0\0":
        raise StepError(
            f"{name} is not a WebAssembly module ({len(body)} bytes starting {body[:8]!r}); "
            "rebuild it (make functions) or name the right file"
        )


def prepare(
    plan,
    client: UploadClient,
    source: str,
    *,
    force: bool = False,
    bucket: str | None = None,
    key: str | None = None,
    endpoint_url: str | None = None,
    function_file: str | None = None,
    function_source: str | None = None,
) -> list[dict[str, Any]]:
    """Upload everything the experiment needs. ``source`` is ``synthetic`` or ``s3``;
    ``function_source="s3"`` uploads the function from ``s3://<bucket>/<data.function_key>``
    first (when the system needs one, :func:`needs_function`)."""
    exp, spec = plan.experiment, plan.experiment["data"]
    reports: list[dict[str, Any]] = []
    data_bucket = bucket or (spec.get("s3") or {}).get("bucket") or "faasm-data"
    if not function_file and function_source == "s3" and needs_function(plan):
        body = fetch_object(data_bucket, spec["function_key"], endpoint_url)
        if not exp.get("python"):
            check_wasm(body, f"s3://{data_bucket}/{spec['function_key']}")
        digest = sha256(body)
        ck = f"function__{exp['user']}__{exp['function']}.sha256"
        held = None if force else client.get_state(FILES_USER, ck)
        if held is not None and held.decode(errors="replace").strip() == digest:
            reports.append(
                {
                    "kind": "function",
                    "user": exp["user"],
                    "function": exp["function"],
                    "bytes": len(body),
                    "sha256": digest,
                    "action": "skipped",
                }
            )
        else:
            if exp.get("python"):
                client.put_python(exp["user"], exp["function"], body)
            else:
                client.put_function(exp["user"], exp["function"], body)
            client.put_state(FILES_USER, ck, digest.encode())
            reports.append(
                {
                    "kind": "function",
                    "user": exp["user"],
                    "function": exp["function"],
                    "bytes": len(body),
                    "sha256": digest,
                    "action": "uploaded",
                    "source": f"s3://{data_bucket}/{spec['function_key']}",
                }
            )
    if function_file:
        with open(function_file, "rb") as f:
            body = f.read()
        if not exp.get("python"):
            check_wasm(body, function_file)
        if exp.get("python"):
            client.put_python(exp["user"], exp["function"], body)
        else:
            client.put_function(exp["user"], exp["function"], body)
        reports.append(
            {
                "kind": "function",
                "user": exp["user"],
                "function": exp["function"],
                "bytes": len(body),
                "sha256": sha256(body),
                "action": "uploaded",
            }
        )
    s3 = dict(spec.get("s3", {}))
    if bucket:
        s3["bucket"] = bucket
    if key:
        s3["key"] = key
    if endpoint_url:
        s3["endpoint_url"] = endpoint_url
    synthetic = (exp.get("local", {}).get("data", {}) or {}).get("synthetic", {})
    reports += plan.workload.hook("prepare")(plan, client, source, s3, synthetic, force)
    return reports


def upload_matrices(
    client: UploadClient, user: str, size: int, splits: int, seed: int, force: bool = False
) -> list[dict[str, Any]]:
    return [upload_state_once(client, user, k, v, force) for k, v in matrix_state_objects(size, splits, seed).items()]


def tar_bytes(files: dict[str, bytes]) -> bytes:
    """A tar archive of ``files`` (used to stage test data in S3)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
