"""Load driver start-up under load: a point must not come back with zero requests
and zero errors. The target's first reply is awaited (readiness, not a fixed warm-up), forked
driver processes report that they started before the start time is fixed, a closed-loop
window runs on until ``min_requests`` were concluded, and every point without a success
says what happened with its counters. Functional: each case is decided by what the server
does, never by how long a window is."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from faasm_testutil import ScriptedServer

from faasm_tasks import loadgen
from faasm_tasks.loadgen import LoadSpec, explain_no_success, run_load


def first_call_slow(first_s: float, then_ms: float = 1.0, status: int = 200):
    """The first request takes ``first_s`` (a worker importing its libraries), the rest ``then_ms``."""
    n = {"i": 0}
    lock = threading.Lock()

    def h(method, path, headers, body):
        with lock:
            n["i"] += 1
            i = n["i"]
        time.sleep(first_s if i == 1 else then_ms / 1000.0)
        return status, b"ok"

    return h


def free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def test_a_slow_first_reply_without_readiness_leaves_zero_requests_and_says_why():
    # the record: the only request in flight started in the warm-up and outlived the window
    with ScriptedServer(first_call_slow(2.0)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", connections=1, warmup_s=0.2, duration_s=0.5, timeout_s=5))
    assert s["requests_all"] == 0 and s["errors_total"] == 0 and s["attempted"] == 0
    msg = explain_no_success(s)
    assert msg.startswith("zero requests sent in the 0.5 s measurement window: "), msg
    assert (
        "were still in flight when the window closed" in msg or "the driver started after the window had closed" in msg
    ), msg
    assert "attempted 0, sent 0" in msg and "elapsed" in msg


def test_readiness_waits_for_the_first_reply_then_measures():
    with ScriptedServer(first_call_slow(2.0)) as srv:
        s = run_load(
            LoadSpec(
                url=srv.url + "/",
                connections=1,
                warmup_s=0.2,
                duration_s=0.5,
                timeout_s=5,
                ready_timeout_s=120,
                min_requests=10,
                max_extra_s=120,
            )
        )
    assert s["ready"] is True and s["readiness"]["attempts"] == 1 and s["readiness"]["waited_s"] >= 2.0
    assert s["requests_ok"] >= 10 and s["errors_total"] == 0


def test_closed_window_runs_on_until_min_requests():
    # 20 ms a request: a 0.1 s window holds at most 5, so reaching 30 needs the extension
    with ScriptedServer(first_call_slow(0.02, then_ms=20)) as srv:
        s = run_load(
            LoadSpec(url=srv.url + "/", connections=1, duration_s=0.1, timeout_s=5, min_requests=30, max_extra_s=120)
        )
    assert s["requests_ok"] >= 30 and s["window_extended_s"] > 0
    assert s["measured_duration_s"] > s["duration_s"]
    assert s["throughput_ok"] == pytest.approx(s["requests_ok"] / s["measured_duration_s"])


def test_min_requests_in_forked_processes():
    with ScriptedServer(first_call_slow(0.02, then_ms=20)) as srv:
        s = run_load(
            LoadSpec(
                url=srv.url + "/",
                connections=4,
                processes=2,
                duration_s=0.1,
                timeout_s=5,
                min_requests=40,
                max_extra_s=120,
            )
        )
    assert s["requests_ok"] >= 40 and s["attempted"] >= 40


def test_a_target_that_never_answers_2xx_is_not_measured_and_says_so():
    with ScriptedServer(first_call_slow(0.0, status=503)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", connections=1, duration_s=0.5, timeout_s=1, ready_timeout_s=0.5))
    assert s["ready"] is False and s["requests_all"] == 0 and s["readiness"]["errors"]["non2xx"] >= 1
    msg = explain_no_success(s)
    assert msg.startswith("the target never answered 2xx before the window: ") and "non2xx" in msg, msg
    assert "HTTP 503" in msg and "no load was sent" in msg
    s = run_load(
        LoadSpec(
            url=f"http://127.0.0.1:{free_port()}/", connections=1, duration_s=0.5, timeout_s=1, ready_timeout_s=0.5
        )
    )
    assert s["ready"] is False and s["readiness"]["errors"]["connect"] >= 1
    assert "connect" in explain_no_success(s) and "Refused" in explain_no_success(s)


def test_each_kind_of_failure_has_its_own_message():
    # min_requests=1 with a long extension: at least one attempt concludes however late the driver starts
    kw = dict(connections=1, duration_s=0.3, min_requests=1, max_extra_s=120)
    s = run_load(LoadSpec(url=f"http://127.0.0.1:{free_port()}/", timeout_s=1, **kw))
    msg = explain_no_success(s)
    assert msg.startswith("no connection: all ") and "connect attempt(s) failed" in msg, msg
    assert f"connect errors {s['errors']['connect']}" in msg
    with ScriptedServer(first_call_slow(0.0, status=503)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", timeout_s=1, **kw))
    msg = explain_no_success(s)
    assert msg.startswith(f"all {s['errors']['non2xx']} repl(ies) were non-2xx (HTTP 503 x"), msg
    with ScriptedServer(first_call_slow(3.0, then_ms=3000)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", timeout_s=0.2, **kw))
    msg = explain_no_success(s)
    assert msg.startswith(f"all {s['errors']['timeout']} request(s) timed out (no reply within 0.2 s)"), msg


def test_a_driver_process_that_never_starts_fails_the_point_with_that_message(monkeypatch):
    # the forked processes hang before they report "started" (a machine too busy to run them)
    monkeypatch.setattr(loadgen.driver, "child_setup", lambda spec: time.sleep(3600))  # a fault, inside
    with ScriptedServer(first_call_slow(0.0)) as srv:
        with pytest.raises(
            RuntimeError,
            match=r"the load driver never started: process\(es\) \[\d+, \d+\] did not "
            r"report within 1 s \(0/2 started",
        ):
            run_load(
                LoadSpec(url=srv.url + "/", connections=2, processes=2, duration_s=0.3, timeout_s=1, start_timeout_s=1)
            )


def test_wrk_waits_for_readiness_too():
    if not loadgen.wrk_available():
        pytest.skip("wrk is not installed (apt-get install -y wrk)")
    with ScriptedServer(first_call_slow(0.0, status=503)) as srv:
        s, stdout, _ = loadgen.run_wrk(
            LoadSpec(url=srv.url + "/", connections=1, duration_s=1, timeout_s=1, ready_timeout_s=0.5), threads=1
        )
    assert s["ready"] is False and stdout == "" and "histogram" not in s
    assert explain_no_success(s).startswith("the target never answered 2xx before the window")
    with ScriptedServer(first_call_slow(1.0)) as srv:
        s, stdout, _ = loadgen.run_wrk(
            LoadSpec(url=srv.url + "/", connections=1, duration_s=1, timeout_s=2, ready_timeout_s=120), threads=1
        )
    assert s["requests_all"] > 0 and "FAASM_WRK" in stdout
