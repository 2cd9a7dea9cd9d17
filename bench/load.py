"""Benchmark of the faasm_tasks open-loop load driver against a local nginx, beside wrk.

Starts nginx (Debian's; ``apt-get install -y nginx wrk``) on a free 127.0.0.1 port with a
throw-away config answering ``200 ok`` to every request (without nginx, a small asyncio
no-op server in another process). In ONE run against that endpoint it

* steps the driver's open-loop rate up (default 4k, 8k, 12k, 16k, 20k, 24k, 32k, 40k req/s,
  5 s each, stopping after two rates in a row are not sustained);
  a rate is *sustained* when fewer than 1 % of the scheduled requests were sent more than
  5 ms after their slot or not sent at all, with no errors; latency is measured from the
  scheduled send time (coordinated-omission free);
* does so once under the normal time-sharing policy and, where this process may (root or
  CAP_SYS_NICE), once with the driver processes under SCHED_FIFO and nginx under SCHED_FIFO
  one step below: on a machine shared with other busy processes the normal policy lets a
  time slice of someone else's delay a send (or nginx) by 5-20 ms; under the normal policy
  the driver and nginx ask for a 100 us time slice (``--slice-us``; Linux >= 6.12 EEVDF,
  unprivileged), which lets them preempt a busy neighbour sooner when they wake;
* after each ramp runs wrk closed loop (its ceiling) on the same endpoint under the same
  policy;
* prints the load average beside every step and a summary line per policy;
* with ``--clients N`` (N > 1), ramps the same rates a second time with N load clients
  started together by one controller, each driving 1/N of the rate over its share of the
  connections and processes, each in a network namespace of its own (``--client-isolation
  netns``, the default; root) or as a plain process; the endpoint then also listens on the
  host's veth address. A rate counts as sustained for this comparison by the project's
  validity judgement (``faasm_tasks.results.judge_load``: < 1 % late or unsent, sent rate
  within 1 % of the offered, >= 100 successes) and no errors.

Columns: ``late%`` sent > 5 ms after the slot; ``noconn%`` the part of those that waited
because every connection had a request in flight (the endpoint fell behind), the rest is
the driver's own lag; ``lag`` send time minus scheduled time; ``cpu us/req`` the driver's
CPU time (all its processes, user + system) per request.

    python bench/load.py [--rates 4000,8000,...,40000] [--duration 5] [--scheduling normal|fifo|both]
                          [--processes 2] [--connections 256] [--json-out results.json]
                          [--clients 2 [--client-isolation netns|process]]
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

from faasm_tasks.loadgen import (
    CLIENT_ISOLATION,
    ClientNamespaces,
    LoadSpec,
    netns_unavailable,
    run_clients,
    run_load,
    run_wrk,
    set_sched_slice,
    wrk_available,
)
from faasm_tasks.results import judge_load

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
    {listen}
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


def start_nginx(tmp: str, port: int, workers: int, hosts: list[str]) -> subprocess.Popen | None:
    exe = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not exe:
        return None
    conf = os.path.join(tmp, "nginx.conf")
    with open(conf, "w") as f:
        listen = " ".join(f"listen {h}:{port};" for h in hosts)
        f.write(NGINX_CONF.format(dir=tmp, port=port, workers=workers, listen=listen))
    return subprocess.Popen(
        [exe, "-p", tmp, "-c", conf, "-g", "daemon off;"],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


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
    srv = await asyncio.start_server(handle, sys.argv[2:], int(sys.argv[1]), backlog=1024)
    async with srv:
        await srv.serve_forever()
asyncio.run(main())
"""


def start_python_noop(port: int, hosts: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", NOOP_SERVER, str(port), *hosts], start_new_session=True)


def loadavg() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def ramp(url: str, a: argparse.Namespace, rt_priority: int, endpoint: str, clients: int = 1, namespaces=None) -> dict:
    label = (
        f"SCHED_FIFO {rt_priority}" if rt_priority else (f"normal, {a.slice_us} us slice" if a.slice_us else "normal")
    )
    who = f"{clients} clients ({a.client_isolation}), " if clients > 1 else "1 client, "
    print(
        f"\n-- driver open loop, {who}scheduling {label} (endpoint {endpoint}): {a.processes} process(es), "
        f"{a.connections} connections, {a.duration:g} s per rate (+{a.warmup:g} s warm-up)"
    )
    print(
        f"{'offered':>8} {'sent':>8} {'unsent%':>7} {'late%':>6} {'noconn%':>7} {'ok/s':>8} {'p50 us':>7} {'p99 us':>7} "
        f"{'lag p50':>7} {'lag p99':>7} {'errors':>6} {'cpu us/req':>10}  load avg"
    )
    rows, best, fails, applied = [], None, 0, set()
    for rate in [float(r) for r in a.rates.split(",")]:
        spec = LoadSpec(
            url=url,
            mode="open",
            rate=rate,
            connections=a.connections,
            processes=a.processes,
            duration_s=a.duration,
            warmup_s=a.warmup,
            timeout_s=2,
            method="GET",
            rt_priority=rt_priority,
            slice_us=a.slice_us,
            clients=clients,
            client_isolation=a.client_isolation,
        )
        s = run_clients(spec, namespaces=namespaces) if clients > 1 else run_load(spec)
        applied.update(s["scheduling"])
        sched = max(1, s["scheduled"])
        invalid = judge_load(s, "open", rate)
        ok = not invalid and s["errors_total"] == 0
        la = loadavg()
        rows.append(
            {
                "rate": rate,
                "clients": clients,
                "sustained": ok,
                "invalid": invalid,
                "per_client": s.get("clients_detail"),
                "load_avg": la,
                **{
                    k: s[k]
                    for k in (
                        "scheduled",
                        "sent",
                        "missed",
                        "late",
                        "late_waiting_for_connection",
                        "schedule_lag_fraction",
                        "throughput_ok",
                        "measured_duration_s",
                        "p50_us",
                        "p99_us",
                        "p999_us",
                        "max_us",
                        "send_lag_p50_us",
                        "send_lag_p99_us",
                        "send_lag_max_us",
                        "errors",
                        "scheduling",
                        "driver_cpu_s",
                        "driver_cpu_us_per_request",
                    )
                },
            }
        )
        print(
            f"{rate:8.0f} {s['sent']:8d} {100 * s['missed'] / sched:7.2f} {100 * s['late'] / sched:6.2f} "
            f"{100 * s['late_waiting_for_connection'] / sched:7.2f} "
            f"{s['throughput_ok']:8.0f} {s['p50_us'] or 0:7d} {s['p99_us'] or 0:7d} "
            f"{s['send_lag_p50_us'] or 0:7d} {s['send_lag_p99_us'] or 0:7d} {s['errors_total']:6d} {s['driver_cpu_us_per_request'] or 0:10.1f}  {la}"
            + ("" if ok else "  <- not sustained")
        )
        for d in s.get("clients_detail") or []:
            print(
                f"{'':>8} client {d['index']} {d.get('address', d['host'])}: sent {d['sent']}, late {d['late']}, "
                f"lag p99 {d['send_lag_p99_us'] or 0} us, cpu {d['driver_cpu_s']:.2f} s"
            )
        if ok:
            best = rate if best is None else max(best, rate)
        fails = 0 if ok else fails + 1
        if fails >= 2:  # two failures in a row: higher rates will not do better
            break
    print(
        f"highest sustained open-loop rate ({who}{label}; judge_load valid, no errors): {best:.0f} req/s"
        if best
        else f"no rate sustained ({who}{label})"
    )
    if any(x.startswith("normal (") for x in applied):
        print(f"note: {sorted(applied)}")
    return {
        "clients": clients,
        "scheduling": label,
        "applied": sorted(applied),
        "endpoint_scheduling": endpoint,
        "max_sustained_rate": best,
        "rates": rows,
    }


def set_sched_tree(pid: int, prio: int, slice_us: int) -> str:
    """The endpoint's policy: SCHED_FIFO ``prio``, or for 0 normal with the driver's time slice,
    for a process and its children."""
    import psutil

    policy, param = (os.SCHED_FIFO, os.sched_param(prio)) if prio else (os.SCHED_OTHER, os.sched_param(0))
    try:
        root = psutil.Process(pid)
        sliced = True
        for p in [root, *root.children(recursive=True)]:
            if prio or os.sched_getscheduler(p.pid) != os.SCHED_OTHER:
                os.sched_setscheduler(p.pid, policy, param)
            if not prio and slice_us:
                sliced = set_sched_slice(p.pid, slice_us) and sliced
        if prio:
            return f"SCHED_FIFO {prio}"
        return f"normal, {slice_us} us slice" if slice_us and sliced else "normal"
    except (OSError, psutil.Error) as exc:
        return f"unchanged ({exc})"


def can_fifo() -> bool:
    if not hasattr(os, "sched_setscheduler"):
        return False
    try:
        old = (os.sched_getscheduler(0), os.sched_getparam(0))
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        os.sched_setscheduler(0, old[0], old[1])
        return True
    except OSError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--rates",
        default="4000,8000,12000,16000,20000,24000,32000,40000",
        help="offered rates, ascending; a ramp stops after two rates in a row are not sustained",
    )
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=0.5)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--connections", type=int, default=256, help="driver connections, all processes together")
    ap.add_argument(
        "--scheduling",
        choices=["normal", "fifo", "both"],
        default="both",
        help="driver scheduling policy; fifo/both need root or CAP_SYS_NICE (else normal only)",
    )
    ap.add_argument("--rt-priority", type=int, default=10)
    ap.add_argument(
        "--slice-us",
        type=int,
        default=100,
        help="normal policy: time slice asked for the driver and nginx (Linux >= 6.12; 0: default)",
    )
    ap.add_argument("--wrk-connections", type=int, default=64)
    ap.add_argument("--server", choices=["auto", "nginx", "python"], default="auto")
    ap.add_argument("--nginx-workers", type=int, default=1)
    ap.add_argument("--json-out", help="also write the results here")
    ap.add_argument(
        "--clients",
        type=int,
        default=1,
        help="> 1: ramp also with this many load clients together, beside one client (wrk is then skipped)",
    )
    ap.add_argument("--client-isolation", choices=list(CLIENT_ISOLATION), default="netns")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="one 1000 req/s point for 1 s, normal scheduling, 1 process, 16 connections (the test suite's)",
    )
    a = ap.parse_args()
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(
        ap,
        a,
        {
            "duration": (0.1, 3600),
            "warmup": (0, 600),
            "processes": (1, 256),
            "connections": (1, 100_000),
            "rt_priority": (1, 99),
            "slice_us": (1, 1_000_000),
            "wrk_connections": (1, 100_000),
            "nginx_workers": (1, 256),
            "clients": (1, 63),
        },
        folders=(),
        files=("json_out",),
    )
    try:
        rates = [float(r) for r in a.rates.split(",")]
    except ValueError:
        ap.error(f"--rates {a.rates!r}: a comma list of request rates (numbers)")
    if not rates or not all(1 <= r <= 10_000_000 for r in rates):
        ap.error(f"--rates {a.rates!r}: each rate must be between 1 and 10000000 requests/s")
    if a.smoke:
        a.rates, a.duration, a.warmup, a.processes, a.connections = "1000", 1.0, 0.2, 1, 16
        a.scheduling, a.wrk_connections = "normal", 16
    if not 1 <= a.rt_priority <= 99:
        ap.error("--rt-priority must be 1..99")
    if a.clients > a.connections:
        ap.error(f"--clients {a.clients}: each client needs a connection (--connections {a.connections})")
    from stepkit.procs import trap_sigterm

    restore = trap_sigterm()  # SIGTERM: the finally below stops the endpoint and removes the namespaces
    namespaces = None
    hosts = ["127.0.0.1"]
    if a.clients > 1 and CLIENT_ISOLATION[a.client_isolation].netns:
        why = netns_unavailable()
        if why:
            print(f"--clients {a.clients} --client-isolation {a.client_isolation}: {why}", file=sys.stderr)
            return 2
        namespaces = ClientNamespaces(a.clients).open()  # closed in the finally below
        hosts.append(namespaces.endpoint_address)
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="faasm-bench-")
    proc = None
    kind = a.server
    if kind in ("auto", "nginx"):
        proc = start_nginx(tmp, port, a.nginx_workers, hosts)
        kind = "nginx" if proc else "python"
        if proc is None and a.server == "nginx":
            print("nginx not installed (apt-get install -y nginx)", file=sys.stderr)
            return 2
    if proc is None:
        proc = start_python_noop(port, hosts)
    policies = {"normal": [0], "fifo": [a.rt_priority], "both": [0, a.rt_priority]}[a.scheduling]
    if any(policies) and not can_fifo():
        print("SCHED_FIFO not permitted here (needs root or CAP_SYS_NICE): normal scheduling only")
        policies = [0]
    results: dict = {
        "endpoint": kind,
        "cpus": os.cpu_count(),
        "processes": a.processes,
        "connections": a.connections,
        "duration_s": a.duration,
        "load_avg_start": loadavg(),
        "ramps": [],
    }
    try:
        wait_port(port)
        url = f"http://127.0.0.1:{port}/"
        print(f"endpoint: {kind} ({a.nginx_workers} worker) on {url}; {os.cpu_count()} CPUs; load average {loadavg()}")
        for prio in policies:
            # the endpoint follows the driver's policy, one step below it (normal, or SCHED_FIFO)
            endpoint = set_sched_tree(proc.pid, max(1, prio - 5) if prio else 0, a.slice_us)
            ramp_result = ramp(url, a, prio, endpoint)
            if a.clients > 1:  # the comparison of clients, beside one: no wrk ceiling
                results["ramps"].append(ramp_result)
                ramp_result = ramp(url, a, prio, endpoint, clients=a.clients, namespaces=namespaces)
            elif wrk_available():
                s, _, _ = run_wrk(
                    LoadSpec(
                        url=url,
                        connections=a.wrk_connections,
                        duration_s=a.duration,
                        timeout_s=2,
                        method="GET",
                        rt_priority=prio,
                    ),
                    threads=a.processes,
                )
                ramp_result["wrk"] = {
                    "threads": a.processes,
                    "connections": a.wrk_connections,
                    "load_avg": loadavg(),
                    **{k: s[k] for k in ("throughput_all", "p50_us", "p99_us", "max_us", "errors")},
                }
                print(
                    f"wrk -t{a.processes} -c{a.wrk_connections} -d{a.duration:g}s, same scheduling (closed loop, "
                    f"its ceiling): {s['throughput_all']:.0f} req/s, p50 {s['p50_us']} us, p99 {s['p99_us']} us, "
                    f"errors {s['errors_total']}  load avg {loadavg()}"
                )
            else:
                print("wrk not installed: no closed-loop ceiling (apt-get install -y wrk)")
            results["ramps"].append(ramp_result)
        print("\nsummary:")
        for r in results["ramps"]:
            best = f"{r['max_sustained_rate']:.0f} req/s" if r["max_sustained_rate"] else "none"
            wrk = f"{r['wrk']['throughput_all']:.0f} req/s" if "wrk" in r else "n/a"
            who = f"{r['clients']} client(s)"
            print(
                f"  {who:<12} driver {r['scheduling']:<22} endpoint {r['endpoint_scheduling']:<22} open loop sustained {best:>12}"
                f"   wrk closed-loop ceiling {wrk:>12}   load avg at end {r['rates'][-1]['load_avg']}"
            )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)
        if namespaces is not None:
            namespaces.close()
        restore()
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
