"""Image inference under load (ATC'20 6.3): the load driver posts ``{"user": "tf", "function":
"image", "cold_start_interval": "<N>"}`` for the point's duration (the 2020 protocol's names).

Verification: after the load, one call of the function; its output must be ``"<label>
<probability>"`` and, when the model in state is the package's synthetic CNN (the local
target's), the label and probability NumPy computes from the same model and image. On a real
MobileNet (no reference here) the check says so and passes on a non-empty output."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from stepkit import StepError

from ..points import Check, Request, extra_window_s

SETUP_S = 15.0  # per point, beside the driver's own deadlines
START_S = 60.0  # the driver's start deadline
PROB_TOLERANCE = 1e-3


def prepare(plan, client, source: str, s3: dict[str, Any], synthetic: dict[str, Any], force: bool) -> list[dict]:
    from ..data import fetch_archive, synthetic_tf, upload_file_once, upload_state_once

    spec = plan.experiment["data"]
    user = spec.get("state_user", "tf")
    if source == "s3":
        files = fetch_archive(s3["bucket"], s3["key"], s3.get("endpoint_url"))
        models = [n for n in files if n.endswith(".tflite")]
        if len(models) != 1:
            raise StepError(f"expected one .tflite model in the archive, found {models}")
        model = files[models[0]]
        shared = {n: files[n] for n in spec.get("files", []) if n in files}
        missing = [n for n in spec.get("files", []) if n not in files]
        if missing:
            raise StepError(f"s3://{s3['bucket']}/{s3['key']} lacks {missing}")
    else:
        model, shared = synthetic_tf()
    reports = [upload_state_once(client, user, spec.get("model_key", "mobilenet_v1"), model, force)]
    return reports + [upload_file_once(client, f"tfdata/{n}", b, force) for n, b in shared.items()]


def request(ctx, point: dict[str, Any]) -> Request:
    exp = ctx.plan.experiment
    body = {
        "user": exp["user"],
        "function": exp["function"],
        "cold_start_interval": str(point.get("cold_start_interval", 0)),
    }
    return Request(exp["user"], exp["function"], body=json.dumps(body).encode())


def budget(point: dict[str, Any], driver) -> float:
    """Readiness deadline + warm-up + duration + its possible extension + request timeout +
    10 % + 15 s + the driver's start deadline."""
    dur = float(point["duration_s"])
    return (
        driver.ready_timeout_s
        + driver.warmup_s
        + dur
        + extra_window_s(dur)
        + driver.timeout_s
        + 0.1 * dur
        + SETUP_S
        + START_S
    )


def verify(ctx, point: dict[str, Any], res, metrics: dict[str, Any]) -> Check:
    from ..data import cnn_reference, synthetic_tf

    exp = ctx.plan.experiment
    what = "one inference's output (label and probability; against NumPy on the synthetic CNN)"
    out = ctx.call(Request(exp["user"], exp["function"], ""), 60.0 + ctx.plan.driver.timeout_s)
    if not out.ok:
        return Check(False, what, detail=f"the check call failed: {out.error}")
    text = out.output.split(":", 1)[1].strip() if out.output.startswith("SUCCESS") else out.output.strip()
    parts = text.split()
    if not parts:
        return Check(False, what, detail="empty output")
    model, shared = synthetic_tf()
    held = ctx.upload.get_state(exp["data"].get("state_user", "tf"), exp["data"].get("model_key", "mobilenet_v1"))
    if held is None or hashlib.sha256(held).digest() != hashlib.sha256(model).digest():
        return Check(True, what, value=text, detail="output present; no reference for this model")
    label, prob = cnn_reference(model, shared["grace_hopper.bmp"], shared["labels.txt"].decode().split("\n"))
    try:
        got = float(parts[1])
    except (IndexError, ValueError):
        return Check(False, what, value=text, detail=f"output {text!r} is not '<label> <probability>'")
    ok = parts[0] == label and abs(got - prob) <= PROB_TOLERANCE
    return Check(
        ok,
        what,
        value=text,
        reference=f"{label} {prob:.4f}",
        bound=PROB_TOLERANCE,
        detail=f"got {text!r}, NumPy {label} {prob:.4f}",
    )
