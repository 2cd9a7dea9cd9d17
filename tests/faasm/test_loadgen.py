"""Load driver: percentiles against a server with known injected delays, error kinds,
coordinated-omission-free open loop, the seed's latency.txt, wrk script/parser."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hdrh.histogram import HdrHistogram

from faasm_tasks.loadgen import LoadSpec, latency_txt, parse_wrk, run_load, run_wrk, wrk_available, wrk_script
from faasm_testutil import ScriptedServer


def delay_server(slow_every: int = 0, fast_ms: float = 0.0, slow_ms: float = 0.0, status: int = 200):
    n = {"i": 0}
    lock = threading.Lock()

    def h(method, path, headers, body):
        with lock:
            n["i"] += 1
            i = n["i"]
        time.sleep((slow_ms if slow_every and i % slow_every == 0 else fast_ms) / 1000.0)
        return status, b"ok"
    return h


def test_closed_loop_percentiles_follow_injected_delay():
    # every 5th request takes 100 ms, the others 10 ms -> p50 ~10 ms, p90+ ~100 ms
    with ScriptedServer(delay_server(slow_every=5, fast_ms=10, slow_ms=100)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", mode="closed", connections=1, duration_s=1.5, timeout_s=2,
                              body=b"{}", headers={"Content-Type": "application/json"}))
    assert s["errors_total"] == 0 and s["requests_ok"] >= 15
    assert 9_000 <= s["p50_us"] <= 40_000
    assert 95_000 <= s["p90_us"] <= 200_000 and s["max_us"] >= 99_000
    assert len(s["latencies_us"]) == 100 and s["latencies_us"][0] == 0
    h = HdrHistogram.decode(s["histogram"])
    assert h.get_total_count() == s["requests_ok"]
    assert s["throughput_ok"] == pytest.approx(s["requests_ok"] / 1.5)


def test_errors_by_kind():
    with ScriptedServer(delay_server(status=503)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", connections=2, duration_s=0.5, timeout_s=1))
    assert s["requests_ok"] == 0 and s["errors"]["non2xx"] == s["requests_all"] > 0
    with ScriptedServer(delay_server(fast_ms=800)) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", connections=1, duration_s=0.5, timeout_s=0.2))
    assert s["errors"]["timeout"] >= 1 and s["requests_ok"] == 0
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    s = run_load(LoadSpec(url=f"http://127.0.0.1:{port}/", connections=1, duration_s=0.3, timeout_s=0.2))
    assert s["errors"]["connect"] >= 1


def test_open_loop_measures_from_schedule_not_from_send():
    # The server stalls for 400 ms once; with one connection at 100 req/s a closed-loop
    # client would record one slow request. The open loop charges the stall to every
    # request scheduled during it.
    stalled = {"done": False}

    def h(method, path, headers, body):
        if not stalled["done"] and len(srv.requests) == 20:
            stalled["done"] = True
            time.sleep(0.4)
        return 200, b"ok"

    with ScriptedServer(h) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", mode="open", rate=100, connections=1, duration_s=1.5, timeout_s=2))
    assert s["scheduled"] == 150 and s["errors_total"] == 0
    slow = sum(1 for v in s["latencies_us"][1:] if v >= 100_000)
    assert slow >= 10  # about 30 of 150 requests were scheduled inside the stall and waited >= 100 ms
    assert s["max_us"] >= 350_000


def test_open_loop_keeps_schedule_at_low_rate():
    with ScriptedServer(delay_server()) as srv:
        s = run_load(LoadSpec(url=srv.url + "/", mode="open", rate=200, connections=4, processes=2, duration_s=1,
                              warmup_s=0.2, timeout_s=2))
    assert s["scheduled"] == 200 and s["missed"] <= 2 and s["schedule_lag_fraction"] <= 0.05  # shared CI cores
    assert s["requests_ok"] >= 190


def test_latency_txt_has_seed_lines_and_errors():
    s = {"min_us": 1, "max_us": 9, "stddev_us": 1.5, "duration_s": 2, "requests_all": 10, "p50_us": 5,
         "p90_us": 8, "p10_us": 2, "latencies_us": [0] + list(range(1, 100)), "errors": {"timeout": 3}}
    txt = latency_txt(s)
    assert "DURATION=2000000" in txt and txt.count("LATENCIES=0,1,2") == 1 and "ERRORS_TIMEOUT=3" in txt


def test_wrk_script_and_parser():
    spec = LoadSpec(url="http://127.0.0.1:1/", connections=1, max_delay_ms=5,
                    body=json.dumps({"user": "tf", "function": "image", "cold_start_interval": "5"}).encode(),
                    headers={"Host": "faasm-image.faasm.example.com"})
    lua = wrk_script(spec)
    assert 'wrk.headers["Host"] = "faasm-image.faasm.example.com"' in lua and "math.random(0, max_delay)" in lua
    assert '\\"cold_start_interval\\": \\"5\\"' in lua
    out = ("Running 10s test\n  Non-2xx or 3xx responses: 7\n"
           "FAASM_WRK REQUESTS=100 DURATION=10000000\n"
           "FAASM_WRK ERRORS connect=1 read=2 write=0 status=7 timeout=3\n"
           "FAASM_WRK MIN=10 MAX=900 MEAN=50.00 STDDEV=5.00\n"
           "FAASM_WRK LATENCIES=0," + ",".join(str(i * 10) for i in range(1, 100)) + "\nFAASM_WRK P999=899\n")
    s = parse_wrk(out, 10)
    assert s["errors"] == {"connect": 1, "timeout": 3, "read": 2, "non2xx": 7}
    assert s["requests_ok"] == 93 and s["p50_us"] == 500 and s["p999_us"] == 899


@pytest.mark.skipif(not wrk_available(), reason="wrk not installed (apt-get install -y wrk)")
def test_wrk_runs_against_local_server():
    with ScriptedServer(delay_server(fast_ms=2)) as srv:
        s, stdout, _ = run_wrk(LoadSpec(url=srv.url + "/", connections=1, duration_s=1, timeout_s=2,
                                        body=b"{}"), threads=1)
    assert s["requests_all"] > 10 and s["p50_us"] >= 1500 and "FAASM_WRK" in stdout
