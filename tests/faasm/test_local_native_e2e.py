"""The local target's runtimes behind real workers: containers a killed worker leaves are
found by verify-clean and removed by teardown; a trap or an over-limit call fails its own
call through the worker protocol and the worker serves the next one."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psutil
import pytest
import requests
from faasm_testutil import ROOT, needs_local_target
from proctree import wait_for

from faasm_tasks import procs, runtimes
from faasm_tasks.catalogue import get_experiment, resolve
from faasm_tasks.targets.local import LocalTarget

pytestmark = needs_local_target
HAVE_RUNC = runtimes.runc_binary() is not None and os.geteuid() == 0


@pytest.fixture(scope="module", autouse=True)
def built():
    proc = subprocess.run(
        ["make", "-C", os.path.join(ROOT, "faasm_tasks", "functions")], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        pytest.skip(
            f"the functions do not build here (make system-deps installs clang, wasi-libc): {proc.stderr[-300:]}"
        )


@pytest.mark.skipif(not HAVE_RUNC, reason="runc missing or not root (apt-get install -y runc)")
def test_containers_of_a_killed_worker_are_found_and_removed(tmp_path):
    t = LocalTarget(str(tmp_path), "leftover")
    plan = resolve(get_experiment("sgd_reuters_svm"), "native", "local")
    plan.deployment["worker_replicas"] = 1
    try:
        t.deploy(plan)
        t.wait_ready(60)
        ep = t.endpoints()
        r = requests.post(ep.invoke_url, json={"user": "demo", "function": "loop", "async": True}, timeout=10)
        assert r.ok
        wait_for(lambda: runtimes.runc_list(t.runc_root), "the call's container", deadline_s=30)
        worker = next(p for p in t.load()["procs"] if p["role"] == "worker")
        os.kill(worker["pid"], signal.SIGKILL)  # its containers outlive it
        psutil.Process(worker["pid"]).wait(timeout=10)
        left = t.verify_clean([])
        assert not left["clean"] and any("native container" in p for p in left["problems"]), left
        assert any(procs.role_of(p) == "container" for p in t.run_processes())  # labelled too
    finally:
        rep = t.teardown([], 10)
    assert rep["containers"] and set(rep["containers"].values()) == {"deleted"}, rep
    assert runtimes.runc_list(t.runc_root) == []
    assert t.verify_clean([])["clean"]
    assert not [p for p in t.run_processes()]


@pytest.mark.parametrize(
    "system",
    ["wasm", pytest.param("native", marks=pytest.mark.skipif(not HAVE_RUNC, reason="runc missing or not root"))],
)
def test_failed_calls_through_the_worker(tmp_path, system):
    t = LocalTarget(str(tmp_path), f"fail-{system}")
    plan = resolve(get_experiment("sgd_reuters_svm"), system, "local")
    plan.deployment["worker_replicas"] = 1
    plan.params.update(memory_limit_mb=64, call_timeout_s=2)  # the worker's per-instance bounds
    try:
        t.deploy(plan)
        t.wait_ready(60)
        url = t.endpoints().invoke_url
        post = lambda **m: requests.post(url, json=m, timeout=60)  # noqa: E731
        r = post(user="demo", function="trap")
        assert r.status_code == 500 and ("unreachable" in r.text or "SIGILL" in r.text), r.text
        r = post(user="demo", function="alloc", input_data="256")
        assert r.status_code == 500 and ("refused" in r.text or "64 MiB memory limit" in r.text), r.text
        r = post(user="demo", function="loop")
        assert r.status_code == 500 and "2 s limit" in r.text, r.text
        assert post(user="demo", function="echo", input_data="alive").text == "alive\n"
        assert t.health() is None  # one worker, still the same process
    finally:
        t.teardown([], 10)
    assert t.verify_clean([])["clean"]
    assert runtimes.runc_list(t.runc_root) == []
    st = json.load(open(t.state_path))
    assert st["status"] == "torn_down"
