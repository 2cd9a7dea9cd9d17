"""Divide-and-conquer float32 matrix multiplication (ATC'20 6.4): the point's matrices are
uploaded right before its call (every size uses the same keys), the call chains 73
multiplications (2 splits), the product lands in state ``result_matrix``.

Verification: the product read back against float64 NumPy on the same inputs, every entry
for sizes up to ``FULL_CHECK_MAX`` and ``SAMPLED`` random entries above (the maximum error
relative to ``|want| + 1`` must stay below ``MAX_REL_ERR``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..points import Check, Request

BUDGET_S = 60.0  # per (matrix_size / 1000) ** 3 of a chained multiplication
STARTUP_BUDGET_S = 60.0
MAX_REL_ERR = 1e-3
FULL_CHECK_MAX = 1000
SAMPLED = 256


def prepare(plan, client, source: str, s3: dict[str, Any], synthetic: dict[str, Any], force: bool) -> list[dict]:
    """Every size uses the same keys (matrix_state, mat_a_2_0_0, ...), as in the seed, so the
    run step uploads each size right before its point; here only the first one."""
    from ..data import ensure_matrix_archives, matrix_objects_from_s3, upload_matrices, upload_state_once

    spec = plan.experiment["data"]
    user = spec.get("state_user", "python")
    first = int(plan.points[0]["matrix_size"])
    if source == "s3":  # the manual's matrix-upload-s3 / -download-s3, one archive per size
        bucket = s3.get("bucket") or "faasm-data"
        reports = ensure_matrix_archives(plan, bucket, s3.get("endpoint_url"))
        objs = matrix_objects_from_s3(plan, first, bucket, s3.get("endpoint_url"))
        return reports + [upload_state_once(client, user, k, v, force) for k, v in objs.items()]
    return upload_matrices(client, user, first, int(plan.params.get("splits", 2)), int(spec.get("seed", 42)), force)


def request(ctx, point: dict[str, Any]) -> Request:
    from ..data import matrix_objects_from_s3, matrix_state_objects, upload_state_once

    exp, args = ctx.plan.experiment, ctx.args
    size, splits = int(point["matrix_size"]), int(point.get("splits", 2))
    source = args.matrix_source if args.matrix_source != "auto" else ("generate" if args.target == "local" else "s3")
    user = exp["data"].get("state_user", "python")
    if source == "s3":
        bucket = args.bucket or (exp["data"].get("s3") or {}).get("bucket") or "faasm-data"
        objs = matrix_objects_from_s3(ctx.plan, size, bucket, args.s3_endpoint_url)
    else:
        objs = matrix_state_objects(size, splits, int(exp["data"].get("seed", 42)))
    uploads = [upload_state_once(ctx.upload, user, k, v)["action"] for k, v in objs.items()]
    ctx.target.delete_state_keys(list(exp.get("run_state_keys", [])))
    ctx.cache["matmul-inputs"] = (size, splits, objs)
    return Request(
        "python",
        exp["function"],
        "",
        python=True,
        py_user="python",
        py_func=exp["function"],
        metrics={"uploads": uploads},
    )


def budget(point: dict[str, Any], driver) -> float:
    return min(float(driver.call_timeout_s), STARTUP_BUDGET_S + BUDGET_S * (int(point["matrix_size"]) / 1000.0) ** 3)


def _full(objs: dict[str, bytes], which: str, size: int, splits: int) -> np.ndarray:
    blocks, bs = 2**splits, size // 2**splits
    m = np.empty((size, size), dtype=np.float32)
    for r in range(blocks):
        for c in range(blocks):
            m[r * bs : (r + 1) * bs, c * bs : (c + 1) * bs] = np.frombuffer(
                objs[f"mat_{which}_{splits}_{r}_{c}"], dtype=np.float32
            ).reshape(bs, bs)
    return m


def verify(ctx, point: dict[str, Any], res, metrics: dict[str, Any]) -> Check | None:
    if ctx.args.verify == "no":
        return None
    size, splits, objs = ctx.cache.pop("matmul-inputs")
    raw = ctx.upload.get_state("python", "result_matrix")
    got = np.frombuffer(raw or b"", dtype=np.float32)
    full = size <= FULL_CHECK_MAX or ctx.args.verify == "yes"
    what = (
        f"product vs float64 NumPy ({'every entry' if full else f'{SAMPLED} random entries'}), "
        f"max rel err <= {MAX_REL_ERR:g}"
    )
    if got.size != size * size:
        return Check(False, what, detail=f"result_matrix has {got.size} values, want {size * size}")
    got = got.reshape(size, size)
    a, b = _full(objs, "a", size, splits), _full(objs, "b", size, splits)  # float32, as uploaded
    if full:
        want, have = a.astype(np.float64) @ b.astype(np.float64), got
    else:  # only the sampled rows and columns in float64 (size 8000: 2 x 256 MB float32 in memory)
        rng = np.random.default_rng([size, splits])
        i, j = rng.integers(0, size, SAMPLED), rng.integers(0, size, SAMPLED)
        want = np.einsum("kn,nk->k", a[i, :].astype(np.float64), b[:, j].astype(np.float64))
        have = got[i, j]
    err = float(np.max(np.abs(have - want) / (np.abs(want) + 1.0)))
    metrics["verify_max_rel_err"] = err
    return Check(
        err <= MAX_REL_ERR,
        what,
        value=err,
        bound=MAX_REL_ERR,
        detail=f"max rel err {err:.3g}" + ("" if err <= MAX_REL_ERR else " (wrong product)"),
    )
