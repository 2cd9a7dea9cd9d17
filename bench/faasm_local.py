"""Faasm's headline comparisons on one machine: the C functions as WebAssembly (wasmtime
instances in one runtime process) against the same source built native and run in runc
containers, side by side in one run, each figure beside the ATC'20 paper's.

    python bench/faasm_local.py [--smoke] [--out docs/results/faasm-local.md] [--json PATH]

Measures (both systems, same functions, same private redis-server as the global state tier):

* start time: a cold start (fresh instance / new container) and a warm call (idle instance /
  running container) of the no-op function, median and p90 over repeats;
* memory per instance: K instances / containers each holding the CNN model after one
  inference; wasm = the runtime process's PSS growth / K, native = the containers' PSS summed / K
  (the runc process supervising each container reported beside it);
* SGD (Hogwild SVM) time to a fixed number of epochs and peak memory at 1..N workers;
* inference throughput and p50/p99 latency at the catalogue's cold-start intervals (2
  closed-loop callers, no think time);
* divide-and-conquer matmul time (73 chained calls) per size.

Chained calls run in-process (runtimes.InProcess) in both systems, so neither pays an HTTP
round trip per call; the local target's workers add that for both. Native needs runc as root.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil
import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from faasm_tasks import data, runtimes  # noqa: E402

# The paper's figures (Shillaker & Pietzuch, "Faasm: Lightweight Isolation for Efficient
# Stateful Serverless Computing", USENIX ATC'20; abstract, and the notes' section 5 for the
# rest: those marked "unconfirmed" were not checked against the PDF).
PAPER = {
    "cold": "Faaslet ~5 ms vs Docker ~2.8 s (Table 3, unconfirmed)",
    "warm": "proto-Faaslet restore ~0.5 ms (Table 3, unconfirmed)",
    "memory": "Faaslet ~100-200 KB vs container ~MB (Table 3, unconfirmed)",
    "sgd_time": "2x speed-up (abstract)",
    "sgd_memory": "10x less memory (abstract)",
    "tpt": "2x throughput (abstract)",
    "p99": "tail latency -90 % (abstract)",
    "matmul": "section 6.4: duration vs size (no headline ratio)",
}


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def pss(p: psutil.Process) -> int:
    try:
        return p.memory_full_info().pss
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def container_pss(rt) -> tuple[int, int, int]:
    """(PSS of the containers' processes, PSS of their runc supervisors, containers)."""
    fn = sup = n = 0
    with rt.lock:
        conts = list(rt.all.values())
    for c in conts:
        try:
            runc = psutil.Process(c.proc.pid)
            sup += pss(runc)
            fn += sum(pss(k) for k in runc.children(recursive=True))
            n += 1
        except psutil.NoSuchProcess:
            continue
    return fn, sup, n


class Sampler:
    """Peak memory of a system while a block runs, sampled every 50 ms."""

    def __init__(self, fn):
        self.fn, self.peak, self._stop = fn, 0, threading.Event()

    def __enter__(self):
        self.peak = self.fn()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.fn())

    def __exit__(self, *exc):
        self._stop.set()
        self.t.join()
        self.peak = max(self.peak, self.fn())


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def loadavg() -> str:
    with open("/proc/loadavg", encoding="utf-8") as f:
        return " ".join(f.read().split()[:3])


# ------------------------------------------------------------------ measurements
def start_times(ip, n_cold: int, n_warm: int) -> dict:
    ip.call("demo", "noop")  # the module compiled / staged
    cold, warm = [], []
    for _ in range(n_cold):
        t = time.perf_counter()
        ok, out = ip.call("demo", "noop", cold=True)
        cold.append((time.perf_counter() - t) * 1e3)
        assert ok, out
    for _ in range(n_warm):
        t = time.perf_counter()
        ok, out = ip.call("demo", "noop")
        warm.append((time.perf_counter() - t) * 1e3)
        assert ok, out
    return {"cold_ms_p50": pct(cold, 50), "cold_ms_p90": pct(cold, 90), "warm_ms_p50": pct(warm, 50),
            "warm_ms_p90": pct(warm, 90), "n_cold": n_cold, "n_warm": n_warm}


def memory_per_instance(ip, system: str, k: int) -> dict:
    rt = ip.rt
    ok, out = ip.call("tf", "image")
    assert ok, out
    rt.flush()
    if system == "wasm":
        me = psutil.Process()
        before = pss(me)
        held = []
        for _ in range(k):
            inst = rt.acquire("inference", cold=True)
            call = runtimes.Call("tf", "inference", 0, b"", {"user": "tf", "function": "image"})
            ok, out, _ = rt.run(inst, call)
            assert ok, out
            held.append(inst)
        after = pss(me)
        linear = statistics.mean(i["memory"].data_len(i["store"]) for i in held)
        del held
        return {"instances": k, "pss_total_mb": (after - before) / 2**20,
                "per_instance_kb": (after - before) / k / 1024, "linear_memory_kb": linear / 1024}
    conts = []
    for _ in range(k):
        c = rt.start("inference")
        ok, out = c.call(runtimes.Call("tf", "inference", 0, b"", {"user": "tf", "function": "image"}), 60)
        assert ok, out
        conts.append(c)
    fn, sup, n = container_pss(rt)
    for c in conts:
        c.kill()
        rt.all.pop(c.id, None)
    return {"instances": n, "pss_total_mb": fn / 2**20, "per_instance_kb": fn / max(n, 1) / 1024,
            "runc_supervisor_kb": sup / max(n, 1) / 1024}


def sgd(ip, system: str, r, workers: list[int], epochs: int, interval: int, repeats: int) -> list[dict]:
    """Per worker count, the median of ``repeats`` runs (time, CPU, peak memory)."""
    rt, me = ip.rt, psutil.Process()
    out = []
    for w in workers:
        runs = []
        for _ in range(repeats):
            rt.flush()
            if isinstance(ip.host.tier, runtimes.LocalTier):
                ip.host.tier.clear()
            base = pss(me)
            if system == "wasm":
                def mem():
                    return max(0, pss(me) - base)
            else:
                def mem():
                    fn, sup, _ = container_pss(rt)
                    return fn + sup
            c0, t0 = cpu_s(), time.perf_counter()
            with Sampler(mem) as s:
                ok, res = ip.call("sgd", "reuters_svm", f"{w} {interval} {epochs}")
            wall = time.perf_counter() - t0
            assert ok, res
            runs.append({"time_s": wall, "cpu_s": cpu_s() - c0, "peak_mb": s.peak / 2**20,
                         "final_loss": float(res.splitlines()[-1].split()[1])})
        out.append({"workers": w, "repeats": repeats, "time_s_all": [x["time_s"] for x in runs],
                    **{k: statistics.median(x[k] for x in runs) for k in ("time_s", "cpu_s", "peak_mb", "final_loss")},
                    "load": loadavg()})
    return out


def inference(ip, intervals: list[int], duration_s: float, callers: int = 2) -> list[dict]:
    out = []
    for interval in intervals:
        ip.rt.flush()
        lat, fails, n = [], [0], [0]
        lock = threading.Lock()
        stop = time.perf_counter() + duration_s

        def loop():
            while time.perf_counter() < stop:
                with lock:
                    cold = n[0] % interval == 0
                    n[0] += 1
                t = time.perf_counter()
                ok, _ = ip.call("tf", "image", cold=cold)
                dt = (time.perf_counter() - t) * 1e3
                with lock:
                    (lat.append(dt) if ok else fails.__setitem__(0, fails[0] + 1))

        t0, c0 = time.perf_counter(), cpu_s()
        ths = [threading.Thread(target=loop) for _ in range(callers)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        wall = time.perf_counter() - t0
        out.append({"cold_start_interval": interval, "requests": len(lat), "failed": fails[0],
                    "throughput_rps": len(lat) / wall, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                    "cpu_s": cpu_s() - c0, "load": loadavg()})
    return out


def matmul(ip, r, sizes: list[int], repeats: int) -> list[dict]:
    """Per size, the median of ``repeats`` runs, each from no idle instance / container."""
    out = []
    for size in sizes:
        for k in list(r.scan_iter("python_*")):
            r.delete(k)
        for k, v in data.matrix_state_objects(size, 2, seed=42).items():
            r.set(f"python_{k}", v)
        want = data.expected_product(size, 2, seed=42)
        runs = []
        for _ in range(repeats):
            ip.rt.flush()
            if isinstance(ip.host.tier, runtimes.LocalTier):
                ip.host.tier.clear()
            c0, t0 = cpu_s(), time.perf_counter()
            ok, res = ip.call("python", "mat_mul", python=True)
            wall = time.perf_counter() - t0
            assert ok, res
            got = np.frombuffer(r.get("python_result_matrix"), dtype=np.float32).reshape(size, size)
            err = float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-6)))
            runs.append({"time_s": wall, "cpu_s": cpu_s() - c0, "max_rel_err": err})
        out.append({"size": size, "repeats": repeats, "time_s_all": [x["time_s"] for x in runs],
                    "time_s": statistics.median(x["time_s"] for x in runs),
                    "cpu_s": statistics.median(x["cpu_s"] for x in runs),
                    "max_rel_err": max(x["max_rel_err"] for x in runs), "load": loadavg()})
    return out


# ------------------------------------------------------------------ report
def ratio(a, b):
    return a / b if b else float("nan")


def fmt(x, nd=2):
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    return f"{x:.{nd}f}"


def report(res: dict) -> str:
    w, n = res["systems"].get("wasm", {}), res["systems"].get("native", {})
    lines = ["# Faasm on one machine: wasm (wasmtime) vs native (runc containers)", "",
             f"Command: `{res['command']}` ({res['date']}, {res['host']}; load before {res['load_before']}, "
             f"after {res['load_after']}; {res['cpus']} CPUs, shared with other work). Generated by "
             "bench/faasm_local.py; do not edit by hand.", "",
             "Same C source (faasm_tasks/functions) in both systems: wasm32-wasi on wasmtime "
             f"{res['wasmtime']} (one runtime process, instances per call) and native static in runc "
             f"{res['runc']} containers (read-only root holding the binary, own namespaces, memory cgroup). "
             "State: one private redis-server; wasm reads through the runtime's shared local tier, native "
             "copies in and out of Redis. Ratio = wasm / native (below 1: wasm smaller / faster).", ""]
    if res.get("native_skipped"):
        lines += [f"**native not measured:** {res['native_skipped']}", ""]
    lines += ["## Start time and memory per instance (no-op / CNN function)", "",
              "| figure | wasm | native | wasm/native | paper |", "|---|---|---|---|---|"]
    sw, sn = w.get("start", {}), n.get("start", {})
    for key, label, paper in (("cold_ms_p50", "cold start p50 (ms)", PAPER["cold"]),
                              ("cold_ms_p90", "cold start p90 (ms)", ""),
                              ("warm_ms_p50", "warm call p50 (ms)", PAPER["warm"]),
                              ("warm_ms_p90", "warm call p90 (ms)", "")):
        a, b = sw.get(key, float("nan")), sn.get(key, float("nan"))
        lines.append(f"| {label} | {fmt(a, 3)} | {fmt(b, 3)} | {fmt(ratio(a, b), 3)} | {paper} |")
    mw, mn = w.get("memory", {}), n.get("memory", {})
    a, b = mw.get("per_instance_kb", float("nan")), mn.get("per_instance_kb", float("nan"))
    lines.append(f"| memory per instance, PSS (KB; {mw.get('instances', '?')} held) | {fmt(a, 0)} | {fmt(b, 0)} | "
                 f"{fmt(ratio(a, b), 3)} | {PAPER['memory']} |")
    if mn.get("runc_supervisor_kb") is not None:
        lines.append(f"| + runc supervisor per container, PSS (KB) | - | {fmt(mn['runc_supervisor_kb'], 0)} | "
                     f"{fmt(ratio(a, b + mn['runc_supervisor_kb']), 3)} (with it) | |")
    if mw.get("linear_memory_kb") is not None:
        lines.append(f"| wasm linear memory per instance (KB, reserved by the module) | "
                     f"{fmt(mw['linear_memory_kb'], 0)} | | | |")
    lines += ["", f"## SGD (Hogwild SVM, {res['sgd']['examples']} examples x {res['sgd']['features']} features, "
              f"{res['sgd']['epochs']} epochs, sync interval {res['sgd']['interval']}; median of {res['repeats']} runs)", "",
              "Peak memory: wasm = the runtime process's PSS growth during the run; native = PSS of the "
              "containers plus their runc supervisors.", "",
              "CPU s: this process plus the containers runc reaped (user + system).", "",
              "| workers | wasm time (s) | native time (s) | time wasm/native | CPU s wasm / native | wasm peak (MB) | "
              "native peak (MB) | memory wasm/native | final loss wasm / native | load |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for a, b in zip(w.get("sgd", []), n.get("sgd", []) or [{}] * len(w.get("sgd", []))):
        lines.append(f"| {a['workers']} | {fmt(a['time_s'], 3)} | {fmt(b.get('time_s', float('nan')), 3)} | "
                     f"{fmt(ratio(a['time_s'], b.get('time_s', float('nan'))), 3)} | "
                     f"{fmt(a['cpu_s'], 2)} / {fmt(b.get('cpu_s', float('nan')), 2)} | {fmt(a['peak_mb'], 1)} | "
                     f"{fmt(b.get('peak_mb', float('nan')), 1)} | "
                     f"{fmt(ratio(a['peak_mb'], b.get('peak_mb', float('nan'))), 3)} | "
                     f"{fmt(a['final_loss'], 4)} / {fmt(b.get('final_loss', float('nan')), 4)} | {a['load']} |")
    lines.append(f"\nPaper: {PAPER['sgd_time']}, {PAPER['sgd_memory']}. Faasm maps the shared state into every "
                 "Faaslet's linear memory (one copy per host); wasmtime's Python API cannot map host memory into "
                 "an instance, so here each instance copies the data set into its memory as each container does, "
                 "and the runtime's local tier holds one more copy: the paper's memory saving has no mechanism "
                 "here, and the time includes those copies.")
    lines += ["", f"## Inference (CNN, {res['inference']['duration_s']} s per point, "
              f"{res['inference']['callers']} closed-loop callers; cold start = fresh instance / new container "
              "every N-th call)", "",
              "| cold-start interval | wasm req/s | native req/s | throughput wasm/native | wasm p50 / p99 (ms) | "
              "native p50 / p99 (ms) | p99 wasm/native | load |", "|---|---|---|---|---|---|---|---|"]
    for a, b in zip(w.get("inference", []), n.get("inference", []) or [{}] * len(w.get("inference", []))):
        nan = float("nan")
        lines.append(f"| {a['cold_start_interval']} | {fmt(a['throughput_rps'], 1)} | "
                     f"{fmt(b.get('throughput_rps', nan), 1)} | {fmt(ratio(a['throughput_rps'], b.get('throughput_rps', nan)), 3)} | "
                     f"{fmt(a['p50_ms'], 3)} / {fmt(a['p99_ms'], 3)} | {fmt(b.get('p50_ms', nan), 3)} / "
                     f"{fmt(b.get('p99_ms', nan), 3)} | {fmt(ratio(a['p99_ms'], b.get('p99_ms', nan)), 3)} | {a['load']} |")
    lines.append(f"\nPaper: {PAPER['tpt']}, {PAPER['p99']}.")
    lines += ["", f"## Matrix multiplication (divide and conquer, 2 splits = 73 chained calls; median of "
              f"{res['repeats']} runs)", "",
              "Each size starts from no idle instance / container (the catalogue's soft restart between points), "
              "so the 73 calls include their cold starts.", "",
              "| size | wasm (s) | native (s) | wasm/native | CPU s wasm / native | max rel. error wasm / native | load |",
              "|---|---|---|---|---|---|---|"]
    for a, b in zip(w.get("matmul", []), n.get("matmul", []) or [{}] * len(w.get("matmul", []))):
        nan = float("nan")
        lines.append(f"| {a['size']} | {fmt(a['time_s'], 3)} | {fmt(b.get('time_s', nan), 3)} | "
                     f"{fmt(ratio(a['time_s'], b.get('time_s', nan)), 3)} | {fmt(a['cpu_s'], 2)} / "
                     f"{fmt(b.get('cpu_s', nan), 2)} | {a['max_rel_err']:.1e} / "
                     f"{b.get('max_rel_err', nan):.1e} | {a['load']} |")
    lines.append(f"\nPaper: {PAPER['matmul']}.")
    lines += ["", "## The paper's claims here", ""] + [f"* {c}" for c in claims(res)]
    lines += ["", "What one machine cannot show: the paper's cluster effects (network transfer of state between "
              "hosts, Knative's scheduling and autoscaling, containers running short of memory at 20-host "
              "parallelism, Docker's image and network set-up in its cold start). These need the knative target.",
              ""]
    return "\n".join(lines)


def claims(res: dict) -> list[str]:
    w, n = res["systems"].get("wasm", {}), res["systems"].get("native", {})
    if not n:
        return ["native not measured: no comparison"]
    out = []
    cw, cn = w["start"]["cold_ms_p50"], n["start"]["cold_ms_p50"]
    out.append(f"Cold start much faster in wasm: {'holds' if cw < cn else 'refuted'} "
               f"(p50 {fmt(cw, 3)} ms vs {fmt(cn, 3)} ms, ratio {fmt(ratio(cw, cn), 3)}; the paper's containers "
               "include Docker's set-up, runc here does not)")
    mw, mn = w["memory"]["per_instance_kb"], n["memory"]["per_instance_kb"] + n["memory"].get("runc_supervisor_kb", 0)
    out.append(f"Smaller footprint per instance in wasm: {'holds' if mw < mn else 'refuted'} "
               f"({fmt(mw, 0)} KB vs {fmt(mn, 0)} KB with the runc supervisor, ratio {fmt(ratio(mw, mn), 3)})")
    sw, sn = w["sgd"][-1], n["sgd"][-1]
    out.append(f"SGD 2x faster in wasm: {'direction holds' if sw['time_s'] < sn['time_s'] else 'refuted'} at "
               f"{sw['workers']} workers (ratio {fmt(ratio(sw['time_s'], sn['time_s']), 3)})")
    out.append(f"SGD 10x less memory in wasm: {'direction holds' if sw['peak_mb'] < sn['peak_mb'] else 'refuted'} "
               f"at {sw['workers']} workers (ratio {fmt(ratio(sw['peak_mb'], sn['peak_mb']), 3)})")
    for iw, inn in {0: (w["inference"][0], n["inference"][0]), 1: (w["inference"][-1], n["inference"][-1])}.values():
        tr, pr = ratio(iw["throughput_rps"], inn["throughput_rps"]), ratio(iw["p99_ms"], inn["p99_ms"])
        out.append(f"Inference throughput 2x in wasm at cold-start interval {iw['cold_start_interval']}: "
                   f"{('holds' if tr >= 2 else 'direction holds') if tr > 1 else 'refuted'} (ratio {fmt(tr, 3)})")
        out.append(f"Inference tail latency -90 % in wasm at interval {iw['cold_start_interval']}: "
                   f"{('holds' if pr <= 0.1 else 'direction holds') if pr < 1 else 'refuted'} "
                   f"(p99 ratio {fmt(pr, 3)}; -90 % is 0.1)")
    return out


def start_redis(tmp: str) -> tuple[subprocess.Popen, redis.Redis]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("redis-server")
    if not exe:
        raise SystemExit("redis-server not found (apt-get install -y redis-server)")
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", tmp], stdout=subprocess.DEVNULL)
    r = redis.Redis(port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            r.ping()
            return p, r
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): for the test")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "faasm-local.md"))
    ap.add_argument("--json", default="", help="also write the raw figures here")
    ap.add_argument("--systems", default="wasm,native")
    args = ap.parse_args(argv)
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(ap, args, {}, folders=(), files=('out', 'json'))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for sysname in ("wasm", "native"):
        for mod in ("sgd", "matmul", "inference", "demo"):
            try:
                runtimes.artefact(sysname, mod)
            except runtimes.CallFailed as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
    smoke = args.smoke
    cfg = {"repeats": 1 if smoke else 3, "n_cold": 5 if smoke else 40, "n_warm": 20 if smoke else 400, "k": 4 if smoke else 24,
           "sgd": {"examples": 1500 if smoke else 40000, "features": 300 if smoke else 5000,
                   "nnz_per_example": 12 if smoke else 30, "epochs": 2 if smoke else 10, "interval": 60000,
                   "workers": [1, 2] if smoke else [1, 2, 4]},
           "inference": {"intervals": [5, 500] if smoke else [5, 10, 20, 40, 50, 80, 500],
                         "duration_s": 0.5 if smoke else 4.0, "callers": 2},
           "matmul": [100] if smoke else [100, 200, 1000]}
    systems = [s for s in args.systems.split(",") if s]
    res = {"command": "python bench/faasm_local.py" + (" --smoke" if smoke else ""),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
           "cpus": os.cpu_count(), "load_before": loadavg(), "systems": {},
           "wasmtime": runtimes.wasmtime_version(), "sgd": {**cfg["sgd"]}, "inference": cfg["inference"],
           "repeats": cfg["repeats"]}
    runc = runtimes.runc_binary()
    res["runc"] = (subprocess.run([runc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
                   .replace("runc version ", "") if runc else "absent")
    if "native" in systems and (not runc or os.geteuid() != 0):
        res["native_skipped"] = "runc missing" if not runc else "not root (runc containers need root here)"
        systems.remove("native")
    tmp = tempfile.mkdtemp(prefix="faasm-bench-")
    rproc, r = start_redis(tmp)
    try:
        sgd_objs = data.synthetic_sgd(examples=cfg["sgd"]["examples"], features=cfg["sgd"]["features"],
                                      nnz_per_example=cfg["sgd"]["nnz_per_example"], seed=7)
        model, files = data.synthetic_tf()
        for system in systems:
            print(f"== {system}", flush=True)
            r.flushall()
            for k, v in sgd_objs.items():
                r.set(f"sgd_{k}", v)
            r.set("tf_mobilenet_v1", model)
            ip = runtimes.InProcess(system, r, os.path.join(tmp, system), label=f"bench-{os.getpid()}:{system}")
            os.makedirs(os.path.join(tmp, system, "shared", "tfdata"), exist_ok=True)
            for name, body in files.items():
                with open(os.path.join(tmp, system, "shared", "tfdata", name), "wb") as f:
                    f.write(body)
            try:
                ip.rt.warm_up(["sgd", "matmul", "inference", "demo"])  # codegen / staging outside the timings
                out = res["systems"][system] = {}
                out["start"] = start_times(ip, cfg["n_cold"], cfg["n_warm"])
                print(" start", out["start"], flush=True)
                out["memory"] = memory_per_instance(ip, system, cfg["k"])
                print(" memory", out["memory"], flush=True)
                out["sgd"] = sgd(ip, system, r, cfg["sgd"]["workers"], cfg["sgd"]["epochs"], cfg["sgd"]["interval"],
                                 cfg["repeats"])
                print(" sgd", out["sgd"], flush=True)
                out["inference"] = inference(ip, cfg["inference"]["intervals"], cfg["inference"]["duration_s"],
                                             cfg["inference"]["callers"])
                print(" inference", out["inference"], flush=True)
                out["matmul"] = matmul(ip, r, cfg["matmul"], cfg["repeats"])
                print(" matmul", out["matmul"], flush=True)
            finally:
                ip.close()
                if system == "native":
                    left = runtimes.runc_list(ip.rt.root)
                    assert not left, f"containers left: {left}"
    finally:
        rproc.terminate()
        rproc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    res["load_after"] = loadavg()
    text = report(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=2)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
