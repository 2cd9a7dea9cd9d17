"""The C functions in both builds (wasm32-wasi on wasmtime, native static in runc containers)
against a real redis-server: the same results in both and the references', failures that
name their reason, and nothing left behind.

Chaining runs in-process here (runtimes.InProcess: a thread pool stands in for the worker's
HTTP round trip);
tests/faasm/test_local_e2e.py runs the same runtimes behind the local target's workers.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time

import numpy as np
import pytest
import redis
from faasm_testutil import ROOT, needs_redis

from faasm_tasks import data, runtimes

pytestmark = needs_redis
FUNCS = os.path.join(ROOT, "faasm_tasks", "functions")
HAVE_BUILD_TOOLS = bool(shutil.which("clang") and shutil.which("gcc") and shutil.which("make"))
HAVE_RUNC = runtimes.runc_binary() is not None and os.geteuid() == 0


@pytest.fixture(scope="module")
def built():
    if not HAVE_BUILD_TOOLS:
        pytest.skip(
            "clang, gcc or make missing (make system-deps installs clang, lld, wasi-libc, libclang-rt-14-dev-wasm32)"
        )
    proc = subprocess.run(["make", "-C", FUNCS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return os.path.join(FUNCS, "build")


@pytest.fixture(scope="module")
def rds(tmp_path_factory):
    port = _free_port()
    d = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [
            shutil.which("redis-server"),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(d),
        ],
        stdout=subprocess.DEVNULL,
    )
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            r.ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield r
    proc.terminate()
    proc.wait(timeout=30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SYSTEMS = [
    "wasm",
    pytest.param(
        "native",
        marks=pytest.mark.skipif(
            not HAVE_RUNC, reason="runc missing or not root (apt-get install -y runc; the native system runs as root)"
        ),
    ),
]


@pytest.fixture(params=SYSTEMS)
def system(request):
    return request.param


@pytest.fixture
def rt(system, rds, tmp_path, built):
    os.makedirs(tmp_path / "shared", exist_ok=True)
    r = runtimes.InProcess(system, rds, str(tmp_path), built, memory_limit_mb=64, call_timeout_s=60)
    yield r
    r.close()
    if system == "native":
        assert runtimes.runc_list(r.rt.root) == [], "containers left after close()"


def sgd_reference(objs: dict[str, bytes], epochs: int = 1) -> list[float]:
    """sgd.c with one worker and no sync (NumPy): the RMS hinge error per epoch."""
    f, n, _ = np.frombuffer(objs["inputs_size"], dtype=np.int32)
    outr = np.frombuffer(objs["inputs_outr"], dtype=np.int32)
    innr = np.frombuffer(objs["inputs_innr"], dtype=np.int32)
    vals = np.frombuffer(objs["inputs_vals"], dtype=np.float64)
    y = np.frombuffer(objs["outputs"], dtype=np.float64)
    w, losses = np.zeros(f), []
    for _ in range(epochs):
        err = 0.0
        for i in range(n):
            fs, x = innr[outr[i] : outr[i + 1]], vals[outr[i] : outr[i + 1]]
            hinge = 1.0 - y[i] * float(w[fs] @ x)
            if hinge > 0:
                err += hinge * hinge
                w[fs] += 0.1 * y[i] * x
        losses.append(math.sqrt(err / n))
    return losses


def test_sgd_loss_after_one_epoch_matches_the_reference(rt, rds):
    objs = data.synthetic_sgd(examples=600, features=200, nnz_per_example=10, seed=3)
    for k, v in objs.items():
        rds.set(f"sgd_{k}", v)
    ok, out = rt.call("sgd", "reuters_svm", "1 -1 1")
    assert ok, out
    loss = float(out.split()[-1])
    assert loss == pytest.approx(sgd_reference(objs)[0], abs=1e-4)
    # Hogwild with 3 workers over 3 epochs: every epoch reported, and the loss falls
    ok, out = rt.call("sgd", "reuters_svm", "3 50 3")
    assert ok, out
    losses = [float(line.split()[1]) for line in out.splitlines()]
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_matmul_product_checked(rt, rds):
    for k, v in data.matrix_state_objects(200, 2, seed=5).items():
        rds.set(f"python_{k}", v)
    ok, out = rt.call("python", "mat_mul", python=True)
    assert ok and out == "Matrix multiplication finished", out
    got = np.frombuffer(rds.get("python_result_matrix"), dtype=np.float32).reshape(200, 200)
    want = data.expected_product(200, 2, seed=5)
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-6)) < 1e-4
    assert len(list(rds.scan_iter("python_intermediate_*"))) == 8 + 64


def test_inference_matches_the_numpy_network(rt, rds, tmp_path):
    model, files = data.synthetic_tf(seed=4)
    rds.set("tf_mobilenet_v1", model)
    os.makedirs(tmp_path / "shared" / "tfdata", exist_ok=True)
    for name, body in files.items():
        (tmp_path / "shared" / "tfdata" / name).write_bytes(body)
    label, prob = data.cnn_reference(model, files["grace_hopper.bmp"], files["labels.txt"].decode().splitlines())
    outs = {rt.call("tf", "image", cold_start_interval=5)[1] for _ in range(3)}
    assert len(outs) == 1
    got_label, got_prob = outs.pop().split()
    assert got_label == label and float(got_prob) == pytest.approx(prob, abs=1e-4)
    rds.set("tf_mobilenet_v1", b"\0" * 12)  # a warm instance keeps the model it read ...
    assert rt.call("tf", "image")[0]
    rt.rt.flush()
    if isinstance(rt.host.tier, runtimes.LocalTier):
        rt.host.tier.clear()
    ok, out = rt.rt.execute({"user": "tf", "function": "image"}, cold=True)  # ... a cold one reads it again
    assert not ok and "holds 12 bytes" in out


def test_both_builds_give_the_same_outputs(rds, tmp_path, built):
    if not HAVE_RUNC:
        pytest.skip("runc missing or not root")
    objs = data.synthetic_sgd(examples=300, features=100, nnz_per_example=8, seed=9)
    for k, v in objs.items():
        rds.set(f"sgd_{k}", v)
    outs = {}
    for system in ("wasm", "native"):
        os.makedirs(tmp_path / system / "shared", exist_ok=True)
        r = runtimes.InProcess(system, rds, str(tmp_path / system), built, memory_limit_mb=64)
        try:
            ok, out = r.call("sgd", "reuters_svm", "1 -1 2")
            assert ok, out
            outs[system] = [line.split()[1] for line in out.splitlines()]  # the losses, not the times
        finally:
            r.close()
    assert outs["wasm"] == outs["native"]


def test_failures_fail_their_call_with_a_reason(rt, system):
    ok, out = rt.call("demo", "trap")
    assert not ok and ("unreachable" in out if system == "wasm" else "crashed (SIGILL)" in out), out
    ok, out = rt.call("demo", "fail", "boom")
    assert not ok and out == "demo failure: boom"
    ok, out = rt.call("demo", "alloc", "256")  # over the 64 MiB per instance / container
    assert not ok, out
    assert ("refused" in out) if system == "wasm" else ("64 MiB memory limit" in out), out
    assert rt.call("demo", "alloc", "8") == (True, "allocated 8 MiB")
    assert rt.call("demo", "echo", "still here") == (True, "still here")  # the runtime lives on


def test_a_runaway_call_is_stopped(system, rds, tmp_path, built):
    if system == "native" and not HAVE_RUNC:
        pytest.skip("runc missing")
    os.makedirs(tmp_path / "shared", exist_ok=True)
    r = runtimes.InProcess(system, rds, str(tmp_path), built, memory_limit_mb=64, call_timeout_s=1.0)
    try:
        t0 = time.monotonic()
        ok, out = r.call("demo", "loop")
        assert not ok and "1 s limit" in out, out
        assert time.monotonic() - t0 < 30
        assert r.call("demo", "echo", "after") == (True, "after")
    finally:
        r.close()


def test_unknown_function_is_a_failed_call(rt):
    with pytest.raises(runtimes.CallFailed, match="no such function nobody/nothing"):
        rt.call("nobody", "nothing")


def test_wasm_compiles_once_and_caches_the_machine_code(rds, tmp_path, built):
    os.makedirs(tmp_path / "shared", exist_ok=True)
    a = runtimes.InProcess("wasm", rds, str(tmp_path), built)
    a.call("demo", "noop")
    a.call("demo", "noop")
    assert a.rt.stats["compiled"] == 1 and a.rt.stats["cold"] == 1 and a.rt.stats["warm"] == 1
    a.close()
    b = runtimes.InProcess("wasm", rds, str(tmp_path), built)  # a second runtime process loads the cached code
    assert b.call("demo", "echo", "x") == (True, "x")
    assert b.rt.stats["compiled"] == 0 and b.rt.stats["cache_loaded"] == 1
    b.close()
