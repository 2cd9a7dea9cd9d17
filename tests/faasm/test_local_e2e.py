"""Every step from the CLI against the local target (real redis-server and workers)."""

from __future__ import annotations

import json
import os
import signal

import psutil
import pytest
from faasm_testutil import cli, needs_local_target

from stepkit import storage

pytestmark = needs_local_target


def test_local_end_to_end(tmp_path):
    state, results = str(tmp_path / "state"), f"file://{tmp_path}/results"
    common = ["--target", "local", "--run-id", "e2e", "--results", results, "--date", "2026-11-29"]
    try:
        out = cli("deploy", *common, "--experiment", "tf_inference_throughput", state_dir=state).stdout
        assert "deployed" in out
        assert (
            "already deployed"
            in cli("deploy", *common, "--experiment", "tf_inference_throughput", state_dir=state).stdout
        )
        cli("wait-ready", *common, "--timeout", "60", state_dir=state)
        for exp in ("sgd_reuters_svm", "matrix_multiplication", "tf_inference_latency"):
            cli("upload-data", *common, "--experiment", exp, state_dir=state)
        again = cli("upload-data", *common, "--experiment", "sgd_reuters_svm", state_dir=state).stdout
        assert "0 uploaded, 7 unchanged" in again
        cli("run", *common, "--experiment", "sgd_reuters_svm", state_dir=state)
        cli("run", *common, "--experiment", "sgd_reuters_svm", "--protocol", "planner", "--rerun", state_dir=state)
        assert "skip" in cli("run", *common, "--experiment", "sgd_reuters_svm", state_dir=state).stdout
        cli("run", *common, "--experiment", "matrix_multiplication", "--only", "matrix_size=100", state_dir=state)
        # a smoke-sized load point: 10 requests are enough here (the default, 100, guards p99)
        cli(
            "run",
            *common,
            "--experiment",
            "tf_inference_latency",
            "--only",
            "cold_start_interval=5",
            "--set",
            "duration_s=2",
            "--min-requests",
            "10",
            state_dir=state,
        )
        bad = cli(
            "run", *common, "--experiment", "sgd_reuters_svm", "--set", "n_workers=0", state_dir=state, check=False
        )
        assert bad.returncode == 1 and "failed" in bad.stdout
        cli("collect", *common, state_dir=state)
    finally:
        cli("teardown", *common, state_dir=state, check=False)
    st = json.load(open(os.path.join(state, "e2e", "local", "state.json")))
    assert st["status"] == "torn_down"
    assert not any(
        psutil.pid_exists(p["pid"]) and psutil.Process(p["pid"]).status() != psutil.STATUS_ZOMBIE for p in st["procs"]
    )
    assert "clean" in cli("verify-clean", *common, state_dir=state).stdout
    cli("teardown", *common, state_dir=state)  # idempotent
    # the day had a failed point (n_workers=0): summarize writes everything, says FAILED and exits 1;
    # the tf_inference_throughput deployment served the other experiments' runs: not a failed group
    s = cli("summarize", *common, state_dir=state, check=False)
    assert s.returncode == 1 and "FAILED: 1 failed point(s), 0 failed experiment group(s)" in s.stdout, s.stdout

    from faasm_tasks.results import iter_records

    recs = {
        (r["experiment"], json.dumps(r["params"], sort_keys=True), r["attempt"]): (u, r)
        for u, r in iter_records(results, "2026-11-29", "e2e")
    }
    sgd = [(u, r) for (e, _, _), (u, r) in recs.items() if e == "sgd_reuters_svm"]
    ok = [r for _, r in sgd if r["status"] == "succeeded"]
    assert len(ok) == 2 and {r["protocol"] for r in ok} == {"knative", "planner"}
    assert all(r["metrics"]["epochs"] == 3 for r in ok)
    failed = [(u, r) for u, r in sgd if r["status"] == "failed"]
    assert len(failed) == 1 and "n_workers" in (failed[0][1]["outcome"]["error"] or "")
    assert "FAILED" in storage.read_bytes(storage.join(failed[0][0], "output.txt")).decode()
    out = storage.read_bytes(
        storage.join(next(u for u, r in sgd if r["protocol"] == "knative" and r["status"] == "succeeded"), "output.txt")
    ).decode()
    assert out.startswith("SUCCESS: ") and len(out.splitlines()) == 3
    mm = [r for (e, _, _), (u, r) in recs.items() if e == "matrix_multiplication"]
    assert mm[0]["status"] == "succeeded" and mm[0]["metrics"]["verify_max_rel_err"] < 1e-4
    tf = [(u, r) for (e, _, _), (u, r) in recs.items() if e == "tf_inference_latency"]
    assert tf[0][1]["status"] == "succeeded" and tf[0][1]["metrics"]["requests_ok"] >= 10
    assert tf[0][1]["params"]["mode"] == "closed" and tf[0][1]["params"]["driver"] == "builtin"
    assert {"histogram.hdr", "latency.txt", "latency.json"} <= set(tf[0][1]["files"])
    assert any("billing" in r for _, r in sgd + [(None, mm[0])])
    summary = storage.read_json(f"{results}/2026-11-29/e2e/summary/summary.json")
    assert summary["failed"] == 1 and len(summary["points"]) == 4


def test_run_without_deploy_is_a_user_error(tmp_path):
    state = str(tmp_path / "state")
    common = ["--target", "local", "--run-id", "nodeploy", "--results", str(tmp_path / "r")]
    p = cli("run", *common, "--experiment", "sgd_reuters_svm", state_dir=state, check=False)
    assert p.returncode == 2 and "not deployed" in p.stderr
    assert "nothing to tear down" not in cli("teardown", *common, state_dir=state).stderr
    assert cli("verify-clean", *common, state_dir=state).returncode == 0


def test_dead_worker_is_detected_and_teardown_still_cleans(tmp_path):
    from faasm_tasks.catalogue import get_experiment, resolve
    from faasm_tasks.targets.local import LocalTarget
    from stepkit import StepError

    t = LocalTarget(str(tmp_path), "dead")
    plan = resolve(get_experiment("sgd_reuters_svm"), "native", "local")
    try:
        t.deploy(plan)
        t.wait_ready(30)
        worker = next(p for p in t.load()["procs"] if p["role"] == "worker")
        os.kill(worker["pid"], signal.SIGKILL)
        psutil.Process(worker["pid"]).wait(timeout=10)
        with pytest.raises(StepError, match="died"):
            t.wait_ready(5)
    finally:
        rep = t.teardown([], 10)
    stopped = {p["pid"]: p["result"] for p in rep["processes"]}
    assert worker["pid"] not in stopped and len(stopped) == 3, rep  # redis, upload, the other worker
    assert set(stopped.values()) <= {"terminated", "killed"}
    assert t.verify_clean([])["clean"]


def test_local_worker_protocol_details(tmp_path):
    import requests

    from faasm_tasks.catalogue import get_experiment, resolve
    from faasm_tasks.clients import KnativeInvoker
    from faasm_tasks.targets.local import LocalTarget

    t = LocalTarget(str(tmp_path), "proto")
    plan = resolve(get_experiment("sgd_reuters_svm"), "native", "local")
    plan.deployment["worker_replicas"] = 1
    try:
        t.deploy(plan)
        t.wait_ready(30)
        ep = t.endpoints()
        post = lambda body: requests.post(ep.invoke_url, data=body, timeout=10)  # noqa: E731
        assert post(b"not json").status_code == 400
        assert post(json.dumps({"user": "demo"}).encode()).status_code == 400
        r = post(json.dumps({"user": "demo", "function": "nope"}).encode())
        assert r.status_code == 500 and "no such function" in r.text
        assert post(json.dumps({"user": "demo", "function": "echo", "input_data": "x"}).encode()).text == "x\n"
        assert post(json.dumps({"flush": True}).encode()).text == "Flush success"
        hosts = post(json.dumps({"http_type": "GET_AVAILABLE_HOSTS", "payload": "{}"}).encode()).json()
        assert len(hosts["hosts"]) == 1
        r = post(json.dumps({"http_type": 11, "payload": json.dumps({"appId": 999})}).encode())
        assert r.status_code == 500 and "App not registered" in r.text
        assert post(json.dumps({"status": True, "id": 123456}).encode()).text.startswith("FAILED")
        res = KnativeInvoker(ep).call("demo", "sleep", "300", timeout_s=5, poll_interval_s=0.01)
        assert res.ok and res.output == "SUCCESS: slept" and res.raw[1]["body"] == "RUNNING"
        assert t.flush_queue() >= 1 and t.wait_ready(10)["ready"]  # registrations survive a flush
    finally:
        t.teardown([], 10)
    assert t.verify_clean([])["clean"]


def test_steps_in_fresh_processes_recover_the_record_from_storage(tmp_path):
    """A step with another (empty) state folder, as in a fresh pod or on another worker slot,
    finds the deployment through ``<results>/_state/<run>/local-target.json``: it waits for the
    deployed processes and tears them down; the deploying step's folder then says clean."""
    first, fresh = str(tmp_path / "state-a"), str(tmp_path / "state-b")
    results = f"file://{tmp_path}/results"
    common = ["--target", "local", "--run-id", "fresh", "--results", results, "--date", "2026-11-29"]
    try:
        cli("deploy", *common, "--experiment", "sgd_reuters_svm", state_dir=first)
        record = storage.read_json(f"{results}/_state/fresh/local-target.json")
        assert record["status"] == "deployed" and record["label"].startswith("fresh:")
        assert "ready" in cli("wait-ready", *common, "--timeout", "60", state_dir=fresh).stdout
        cli("teardown", *common, state_dir=fresh)
    finally:
        cli("teardown", *common, state_dir=first, check=False)
    st = json.load(open(os.path.join(first, "fresh", "local", "state.json")))
    assert not any(
        psutil.pid_exists(p["pid"]) and psutil.Process(p["pid"]).status() != psutil.STATUS_ZOMBIE for p in st["procs"]
    )
    assert "clean" in cli("verify-clean", *common, state_dir=first).stdout
