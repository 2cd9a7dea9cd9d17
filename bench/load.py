"""Benchmark of the faasm_tasks open-loop load driver against a local no-op endpoint.

Starts nginx (Debian's, if installed) on a free 127.0.0.1 port answering ``200 ok`` to
every request, or, without nginx, a small asyncio no-op server in another process.
Steps the offered rate up and reports the highest rate the driver *sustains*: fewer
than 1 % of the scheduled requests sent more than 5 ms after their slot or not sent at
all (its schedule lag) and no errors. Prints p50/p99 (measured from the scheduled send time)
for every rate, then wrk's closed-loop figures on the same endpoint when wrk exists.

    python bench/load.py [--rates 2000,4000,8000] [--duration 4] [--processes 2] [--connections 32]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


from faasm_tasks.loadgen import LoadSpec, run_load, run_wrk, wrk_available  # noqa: E402

NGINX_CONF = """worker_processes {workers};
error_log {dir}/error.log warn;
pid {dir}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  fastcgi_temp_path {dir}/fastcgi;
  uwsgi_temp_path {dir}/uwsgi;
  scgi_temp_path {dir}/scgi;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{port};
    location / {{ return 200 "ok"; }}
  }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"endpoint on port {port} did not come up")


def start_nginx(tmp: str, port: int, workers: int) -> subprocess.Popen | None:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not exe:
        return None
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        f.write(NGINX_CONF.format(dir=tmp, port=port, workers=workers))
    return subprocess.Popen([exe, "-p", tmp, "-c", conf, "-g", "daemon off;"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


NOOP_SERVER = r"""
import asyncio, sys
RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"
async def handle(r, w):
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
            if n:
                await r.readexactly(n)
            w.write(RESP)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        w.close()
async def main():
    srv = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"""


def start_python_noop(port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", NOOP_SERVER, str(port)], start_new_session=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="2000,4000,8000,12000,16000,20000,24000,32000")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--server", choices=["auto", "nginx", "python"], default="auto")
    ap.add_argument("--nginx-workers", type=int, default=1)
    ap.add_argument("--json-out", help="also write the results here")
    a = ap.parse_args()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="faasm-bench-")
    proc = None
    kind = a.server
    if kind in ("auto", "nginx"):
        proc = start_nginx(tmp, port, a.nginx_workers)
        kind = "nginx" if proc else "python"
        if proc is None and a.server == "nginx":
            print("nginx not installed", file=sys.stderr)
            return 2
    if proc is None:
        proc = start_python_noop(port)
    results: dict = {"endpoint": kind, "cpus": os.cpu_count(), "processes": a.processes,
                     "connections": a.connections, "duration_s": a.duration, "rates": []}
    try:
        wait_port(port)
        url = f"http://127.0.0.1:{port}/"
        print(f"endpoint: {kind} on {url}; driver: {a.processes} process(es), {a.connections} connections, "
              f"{a.duration}s per rate")
        print(f"{'offered':>8} {'sent':>8} {'unsent%':>7} {'late%':>6} {'ok/s':>9} {'p50 us':>8} {'p99 us':>8} "
              f"{'send-lag p99':>12} errors")
        best, fails, best_sent = None, 0, None
        for rate in [float(r) for r in a.rates.split(",")]:
            s = run_load(LoadSpec(url=url, mode="open", rate=rate, connections=a.connections,
                                  processes=a.processes, duration_s=a.duration, warmup_s=a.warmup, timeout_s=2,
                                  method="GET"))
            s.pop("histogram", None)
            s.pop("latencies_us", None)
            ok = s["schedule_lag_fraction"] < 0.01 and s["errors_total"] == 0
            results["rates"].append({"rate": rate, "sustained": ok, **{k: s[k] for k in (
                "sent", "scheduled", "missed", "late", "schedule_lag_fraction", "throughput_ok", "p50_us", "p99_us", "p999_us",
                "max_us", "send_lag_p99_us", "errors")}})
            unsent = s["missed"] / s["scheduled"] if s["scheduled"] else 0.0
            if unsent < 0.01 and s["errors_total"] == 0:
                best_sent = rate
            print(f"{rate:8.0f} {s['sent']:8d} {100 * unsent:7.2f} {100 * s['late'] / max(1, s['scheduled']):6.2f} "
                  f"{s['throughput_ok']:9.0f} "
                  f"{s['p50_us'] or 0:8d} {s['p99_us'] or 0:8d} {s['send_lag_p99_us'] or 0:12d} {s['errors_total']}"
                  + ("" if ok else "  <- not sustained"))
            if ok:
                best = rate
            # stop once the driver clearly cannot keep up (unsent >= 1 % twice in a row);
            # "late" alone is often scheduler noise on a shared machine
            fails = 0 if unsent < 0.01 else fails + 1
            if fails >= 2:
                break
        results["max_sustained_rate"] = best
        results["max_rate_all_sent"] = best_sent
        print(f"highest sustained open-loop rate (< 1 % late by > 5 ms or unsent): {best} req/s")
        print(f"highest rate with < 1 % of requests unsent (lenient): {best_sent} req/s")
        try:
            print(f"load average during the benchmark: {os.getloadavg()}")
        except OSError:
            pass
        if wrk_available():
            s, _, _ = run_wrk(LoadSpec(url=url, connections=a.connections, duration_s=a.duration, timeout_s=2,
                                       method="GET"), threads=1)
            results["wrk"] = {k: s[k] for k in ("throughput_all", "p50_us", "p99_us", "max_us", "errors")}
            print(f"wrk -t1 -c{a.connections} (closed loop, max throughput): {s['throughput_all']:.0f} req/s, "
                  f"p50 {s['p50_us']} us, p99 {s['p99_us']} us, errors {s['errors']}")
            s, _, _ = run_wrk(LoadSpec(url=url, connections=1, duration_s=a.duration, timeout_s=2, method="GET"),
                              threads=1)
            results["wrk_1conn"] = {k: s[k] for k in ("throughput_all", "p50_us", "p99_us", "max_us")}
            print(f"wrk -t1 -c1: {s['throughput_all']:.0f} req/s, p50 {s['p50_us']} us, p99 {s['p99_us']} us")
        else:
            print("wrk not installed: no comparison (apt-get install -y wrk)")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
