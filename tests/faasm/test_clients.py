"""Clients against a local HTTP server that speaks each protocol: success, failure,
timeout, slow responses. Every failure keeps the raw payload."""

from __future__ import annotations

import base64
import json
import time

import pytest
from faasm_testutil import ScriptedServer

from faasm_tasks.clients import KnativeInvoker, PlannerInvoker, UploadClient, UploadError
from faasm_tasks.data import upload_state_once
from faasm_tasks.targets.base import Endpoints


def knative_server(outcome: str, slow_s: float = 0.0):
    polls = {"n": 0}

    def h(method, path, headers, body):
        msg = json.loads(body or b"{}")
        if msg.get("status"):
            assert headers["Host"].startswith("faasm-worker.")
            polls["n"] += 1
            if outcome == "running" or polls["n"] < 3:
                return 200, b"RUNNING"
            if outcome == "success":
                return 200, b"SUCCESS: 0.1 0.5\n0.2 0.4"
            return 200, b"FAILED: out of memory"
        if slow_s:
            time.sleep(slow_s)
        if outcome == "http500":
            return 500, b"worker exploded"
        return 200, b"1583746290"

    return h, polls


def ep(url):
    return Endpoints(url + "/", url)


@pytest.mark.parametrize("outcome", ["success", "failed", "running", "http500"])
def test_knative_protocol(outcome):
    h, polls = knative_server(outcome)
    with ScriptedServer(h) as srv:
        inv = KnativeInvoker(ep(srv.url))
        res = inv.call("sgd", "reuters_svm", "10 60000", system="native", timeout_s=1.0, poll_interval_s=0.05)
        first = json.loads(srv.requests[0][3])
        assert first == {"user": "sgd", "function": "reuters_svm", "input_data": "10 60000", "async": True}
        assert srv.requests[0][2]["Host"] == "faasm-reuters-svm.faasm.example.com"
    if outcome == "success":
        assert res.ok and res.output == "SUCCESS: 0.1 0.5\n0.2 0.4" and res.call_id == 1583746290
    elif outcome == "failed":
        assert not res.ok and res.status == "failed" and polls["n"] == 3  # stops at once, no endless polling
        assert res.raw[-1]["body"] == "FAILED: out of memory"
    elif outcome == "running":
        # the server answers RUNNING forever: the client stops at its deadline (a generous bound: busy machines)
        assert res.status == "timeout" and 0.9 <= res.elapsed_s < 20
        assert res.raw[-1]["body"] == "RUNNING"
    else:
        assert res.status == "error" and res.raw[0]["http_status"] == 500 and res.raw[0]["body"] == "worker exploded"


def test_knative_slow_invoke_hits_deadline():
    h, _ = knative_server("success", slow_s=30)
    with ScriptedServer(h) as srv:
        res = KnativeInvoker(ep(srv.url)).call("tf", "image", system="wasm", timeout_s=0.5, poll_interval_s=0.05)
    # a client that waited for the answer would take 30 s; the margin is for busy machines
    assert not res.ok and res.status == "timeout" and res.elapsed_s < 10


def test_python_message_shape():
    h, _ = knative_server("success")
    with ScriptedServer(h) as srv:
        KnativeInvoker(ep(srv.url)).call(
            "python", "mat_mul", python=True, system="native", timeout_s=2, poll_interval_s=0.01
        )
        msg = json.loads(srv.requests[0][3])
        assert msg == {
            "user": "python",
            "function": "py_func",
            "python": True,
            "py_user": "python",
            "py_func": "mat_mul",
            "async": True,
        }
        assert srv.requests[0][2]["Host"] == "faasm-python.faasm.example.com"


def planner_server(fail=False, no_hosts=1, not_ready=2):
    st = {"no_hosts": no_hosts, "not_ready": not_ready}

    def h(method, path, headers, body):
        msg = json.loads(body)
        payload = json.loads(msg["payload"])
        if msg["http_type"] == "EXECUTE_BATCH":
            if st["no_hosts"] > 0:
                st["no_hosts"] -= 1
                return 500, b"No available hosts"
            assert base64.b64decode(payload["messages"][0]["input_data"]) == b"4 100"
            return 200, json.dumps({"appId": 77, "finished": False}).encode()
        assert msg["http_type"] == "EXECUTE_BATCH_STATUS" and payload["appId"] == 77
        if st["not_ready"] > 0:
            st["not_ready"] -= 1
            return 500, b"App not registered in results"
        out = base64.b64encode(b"done!").decode()
        return 200, json.dumps(
            {"appId": 77, "finished": True, "messageResults": [{"output_data": out, "returnValue": 1 if fail else 0}]}
        ).encode()

    return h


def test_planner_protocol_success_and_retries(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)  # skip the 1.5 s "No available hosts" back-off
    with ScriptedServer(planner_server()) as srv:
        res = PlannerInvoker(ep(srv.url)).call("sgd", "reuters_svm", "4 100", timeout_s=10, poll_interval_s=0.01)
    assert res.ok and res.output == "done!" and res.call_id == 77
    assert [r["http_status"] for r in res.raw] == [500, 200, 500, 500, 200]


def test_planner_failure_kept_raw():
    with ScriptedServer(planner_server(fail=True, no_hosts=0, not_ready=0)) as srv:
        res = PlannerInvoker(ep(srv.url)).call("sgd", "reuters_svm", "4 100", timeout_s=5, poll_interval_s=0.01)
    assert not res.ok and res.status == "failed" and "returnValue" in res.raw[-1]["body"]


def test_planner_never_finishes_times_out():
    with ScriptedServer(planner_server(no_hosts=0, not_ready=10**6)) as srv:
        res = PlannerInvoker(ep(srv.url)).call("sgd", "reuters_svm", "4 100", timeout_s=0.5, poll_interval_s=0.05)
    assert res.status == "timeout" and res.elapsed_s < 20  # never finishes: stops at the deadline, not never


def test_upload_client_and_checksum_skip():
    store = {}

    def h(method, path, headers, body):
        if path.startswith("/s/"):
            if method == "PUT":
                store[path] = body
                return 200, b"ok"
            return (200, store[path]) if path in store else (404, b"")
        if path == "/file":
            store["file:" + headers["FilePath"]] = body
            return 200, b"ok"
        if path == "/p/python/mat_mul":
            return 500, b"disk full"
        return 404, b""

    with ScriptedServer(h) as srv:
        c = UploadClient(srv.url, timeout_s=5)
        assert upload_state_once(c, "sgd", "outputs", b"abc")["action"] == "uploaded"
        assert upload_state_once(c, "sgd", "outputs", b"abc")["action"] == "skipped"
        assert upload_state_once(c, "sgd", "outputs", b"abd")["action"] == "uploaded"
        assert store["/s/sgd/outputs"] == b"abd"
        c.put_file("tfdata/labels.txt", b"x")
        assert store["file:tfdata/labels.txt"] == b"x"
        with pytest.raises(UploadError, match="disk full"):
            c.put_python("python", "mat_mul", b"print()")
