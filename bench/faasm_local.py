"""Faasm's headline comparisons on one machine: the C functions as WebAssembly (wasmtime
instances in one runtime process) against the same source built native and run in runc
containers, side by side in one run, each figure beside the ATC'20 paper's.

    python bench/faasm_local.py [--smoke] [--out docs/results/faasm-local.md] [--json PATH]
                                [--repeats N] [--budget-s S] [--label NAME]
    python bench/faasm_local.py --runs quiet.json busy.json [--out PAGE]   # the page from stored runs

docs/results/faasm-local.md is two runs: one on a quiet machine and one beside ``stress-ng
--cpu 2``, each measured with ``--json docs/results/faasm-local-{quiet,busy}.json``, then the
page written from both with ``--runs``.

Every point is repeated (12 by default; at least 6, fewer than 12 once the point's time budget
is spent) with the two systems interleaved, in each round in an order shuffled with ``--seed``
(the daily pipeline's faasm_tasks.order), and reported as SeBS does (faasm_tasks.stats): n,
the median with its order-statistic 95 % interval, the mean with its Student-t interval, and
the wasm/native ratio with a paired rank interval (faasm_tasks.stats.ratio_ci). Each run is checked (SGD's
final loss against the single-worker runs, the matrix product against NumPy, the inference
output against NumPy); a run whose check fails is left out of the figures and counted.

Measures (both systems, same functions, same private redis-server as the global state tier):

* start time: a cold start (fresh instance / new container) and a warm call (idle instance /
  running container) of the no-op function, each call one value;
* memory per instance: K instances / containers each holding the CNN model after one
  inference; wasm = the runtime process's PSS growth / K, native = the containers' PSS summed / K
  (the runc process supervising each container reported beside it);
* SGD (Hogwild SVM) time to a fixed number of epochs and peak memory at 1..N workers;
* inference throughput and p50/p99 latency per window at cold-start intervals 5, 50 and 500 (2
  closed-loop callers, no think time), with the callers' run-queue wait per call;
* divide-and-conquer matmul time (73 chained calls) at sizes 100, 1000 and 2000 (the
  catalogue's larger sizes projected from the measured growth, not run).

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

from faasm_tasks import data, order, runtimes, stats
from faasm_tasks.kinds import (
    matmul as matmul_kind,
    sgd as sgd_kind,
)
from faasm_tasks.kinds.inference import PROB_TOLERANCE as INFER_TOLERANCE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def catalogue_sizes() -> list[int]:
    """The matrix sizes the catalogue's matrix_multiplication sweep runs (its wasm sweep)."""
    import yaml

    with open(os.path.join(ROOT, "faasm_tasks", "experiments", "matrix_multiplication.yaml"), encoding="utf-8") as f:
        exp = yaml.safe_load(f)
    return sorted({v for row in exp["sweep"]["wasm"] if row["param"] == "matrix_size" for v in row["values"]})


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
# Every function below measures one repeat of one point on one system; main() runs the
# repeats of a point with the systems interleaved (wasm, native, wasm, native, ...), so a
# change of the machine's load falls on both systems of a pair and the ratio is paired.
def runq_s() -> float:
    """This thread's time waiting on a run queue so far (``/proc/thread-self/schedstat``)."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def start_block(ip, n_cold: int, n_warm: int) -> dict:
    """``n_cold`` cold starts and ``n_warm`` warm calls of the no-op function (ms each)."""
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
    return {"cold_ms": cold, "warm_ms": warm}


def memory_once(ip, system: str, k: int) -> dict:
    """PSS per instance with ``k`` instances / containers each holding the CNN model."""
    rt = ip.rt
    ok, out = ip.call("tf", "image")
    assert ok, out
    rt.flush()
    call = runtimes.Call("tf", "inference", 0, b"", {"user": "tf", "function": "image"})
    if system == "wasm":
        me = psutil.Process()
        before = pss(me)
        held = []
        for _ in range(k):
            inst = rt.acquire("inference", cold=True)
            ok, out, _ = rt.run(inst, call)
            assert ok, out
            held.append(inst)
        after = pss(me)
        linear = statistics.mean(i["memory"].data_len(i["store"]) for i in held)
        del held
        kb = (after - before) / k / 1024
        return {"mem_kb": kb, "mem_with_runc_kb": kb, "linear_memory_kb": linear / 1024}
    conts = []
    for _ in range(k):
        c = rt.start("inference")
        ok, out = c.call(call, 60)
        assert ok, out
        conts.append(c)
    fn, sup, n = container_pss(rt)
    for c in conts:
        c.kill()
        rt.all.pop(c.id, None)
    return {
        "mem_kb": fn / max(n, 1) / 1024,
        "mem_with_runc_kb": (fn + sup) / max(n, 1) / 1024,
        "runc_supervisor_kb": sup / max(n, 1) / 1024,
    }


def sgd_once(ip, system: str, workers: int, epochs: int, interval: int) -> dict:
    """One Hogwild SVM run: wall time, CPU, peak memory and the final loss."""
    rt, me = ip.rt, psutil.Process()
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
        ok, res = ip.call("sgd", "reuters_svm", f"{workers} {interval} {epochs}")
    wall = time.perf_counter() - t0
    assert ok, res
    return {
        "time_s": wall,
        "cpu_s": cpu_s() - c0,
        "peak_mb": s.peak / 2**20,
        "final_loss": float(res.splitlines()[-1].split()[1]),
    }


def inference_window(ip, interval: int, duration_s: float, callers: int, reference: tuple[str, float]) -> dict:
    """``callers`` closed-loop callers for ``duration_s``, a cold start every ``interval``-th
    call; then one call's output checked against NumPy's label and probability."""
    ip.rt.flush()
    lat, fails, n, runq = [], [0], [0], []
    lock = threading.Lock()
    stop = time.perf_counter() + duration_s

    def loop():
        q0 = runq_s()
        while time.perf_counter() < stop:
            with lock:
                cold = n[0] % interval == 0
                n[0] += 1
            t = time.perf_counter()
            ok, _ = ip.call("tf", "image", cold=cold)
            dt = (time.perf_counter() - t) * 1e3
            with lock:
                (lat.append(dt) if ok else fails.__setitem__(0, fails[0] + 1))
        with lock:
            runq.append(runq_s() - q0)

    t0, c0 = time.perf_counter(), cpu_s()
    ths = [threading.Thread(target=loop) for _ in range(callers)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.perf_counter() - t0
    ok, out = ip.call("tf", "image")
    text = (out or "").split(":", 1)[-1].strip().split()
    label, prob = reference
    try:
        good = ok and text[0] == label and abs(float(text[1]) - prob) <= INFER_TOLERANCE
    except (IndexError, ValueError):
        good = False
    return {
        "rps": len(lat) / wall,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "requests": len(lat),
        "failed": fails[0],
        "runq_ms": 1e3 * sum(runq) / max(len(lat), 1),
        "cpu_s": cpu_s() - c0,
        "check": "ok"
        if good and not fails[0]
        else f"{fails[0]} failed calls; output {' '.join(text)!r} vs NumPy {label} {prob:.4f}",
    }


def matmul_once(ip, r, size: int, want: np.ndarray) -> dict:
    """One divide-and-conquer product from no idle instance / container, checked."""
    ip.rt.flush()
    if isinstance(ip.host.tier, runtimes.LocalTier):
        ip.host.tier.clear()
    c0, t0 = cpu_s(), time.perf_counter()
    ok, res = ip.call("python", "mat_mul", python=True)
    wall = time.perf_counter() - t0
    assert ok, res
    got = np.frombuffer(r.get("python_result_matrix"), dtype=np.float32).reshape(size, size)
    err = float(np.max(np.abs(got - want) / (np.abs(want) + 1.0)))
    return {"time_s": wall, "cpu_s": cpu_s() - c0, "max_rel_err": err}


# ------------------------------------------------------------------ statistics
class Points:
    """The figures of a run: per figure key, the per-repeat values of each system (None where a
    run's check failed: it is not averaged in), whether repeats pair up, and their loads."""

    def __init__(self):
        self.figs: dict[str, dict] = {}

    def add(self, key: str, system: str, value, paired: bool = True, failed: str = "") -> None:
        f = self.figs.setdefault(key, {"paired": paired, "values": {}, "failed": {}})
        if isinstance(value, list):
            f["values"].setdefault(system, []).extend(value)
            return
        f["values"].setdefault(system, []).append(None if failed else value)
        if failed:
            f["failed"].setdefault(system, []).append(failed)

    def as_json(self) -> dict:
        return self.figs


def summary(fig: dict) -> dict:
    """Per system the n / median / mean with intervals; the wasm / native ratio of medians with
    its rank interval (paired over the repeats both systems passed)."""
    vals = fig["values"]
    out = {s: stats.describe([v for v in xs if v is not None]) for s, xs in vals.items()}
    if "wasm" in vals and "native" in vals:
        a, b = vals["wasm"], vals["native"]
        if fig["paired"]:
            pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
            a, b = [x for x, _ in pairs], [y for _, y in pairs]
        else:
            a, b = [x for x in a if x is not None], [y for y in b if y is not None]
        out["ratio"] = stats.ratio_ci(a, b, paired=fig["paired"])
    return out


def figure(res: dict, key: str) -> dict:
    """:func:`summary` of a run's figure ``key``, or {} when the run has none."""
    fig = res["points"].get(key)
    return summary(fig) if fig else {}


# ------------------------------------------------------------------ report
def fmt(x, nd=2):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.{nd}f}"


def fmt_med(d: dict, nd: int) -> str:
    if not d.get("n"):
        return "-"
    ci = f" [{fmt(d['median_lo'], nd)}, {fmt(d['median_hi'], nd)}]" if "median_lo" in d else " (n < 6: no interval)"
    return fmt(d["median"], nd) + ci


def fmt_mean(d: dict, nd: int) -> str:
    if not d.get("n"):
        return "-"
    return fmt(d["mean"], nd) + (f" [{fmt(d['mean_lo'], nd)}, {fmt(d['mean_hi'], nd)}]" if "mean_lo" in d else "")


def fmt_ratio(r: dict | None) -> str:
    if not r or "ratio" not in r:
        return "n/a"
    if "ratio_lo" not in r:
        return f"{fmt(r['ratio'], 3)} ({r.get('ci_note', 'no interval')})"
    return f"{fmt(r['ratio'], 3)} [{fmt(r['ratio_lo'], 3)}, {fmt(r['ratio_hi'], 3)}]"


def figure_rows(res: dict, keys: list[tuple[str, str, int]]) -> list[str]:
    """One table: per figure, each system's n, median [95 % CI], mean [95 % CI], the ratio."""
    rows = [
        "| figure | n wasm / native | wasm median [95 % CI] | native median [95 % CI] | wasm mean [95 % CI] | "
        "native mean [95 % CI] | wasm/native, median ratio [95 % CI] | checks failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, label, nd in keys:
        fig = res["points"].get(key)
        if not fig:
            continue
        s = summary(fig)
        w, n = s.get("wasm", {}), s.get("native", {})
        failed = "; ".join(f"{sysname}: {len(v)} ({v[0]})" for sysname, v in fig["failed"].items()) or "none"
        rows.append(
            f"| {label} | {w.get('n', 0)} / {n.get('n', 0)} | {fmt_med(w, nd)} | {fmt_med(n, nd)} | "
            f"{fmt_mean(w, nd)} | {fmt_mean(n, nd)} | {fmt_ratio(s.get('ratio'))} | {failed} |"
        )
    return rows


# The paper's headline claims: (claim, figure key, the side of 1 the claim puts wasm/native on,
# the paper's factor). A claim is confirmed when the ratio's 95 % interval lies on its side of
# 1, refuted when it lies on the other side, not shown when it includes 1.
def claim_list(res: dict) -> list[tuple[str, str, str, float | None, str]]:
    cfg = res["config"]
    w, i0, i1 = max(cfg["sgd"]["workers"]), cfg["inference"]["intervals"][0], cfg["inference"]["intervals"][-1]
    return [
        ("cold start faster in wasm", "cold_ms", "below", 5 / 2800, PAPER["cold"]),
        (
            "smaller footprint per instance in wasm (native with its runc supervisor)",
            "mem_with_runc_kb",
            "below",
            None,
            PAPER["memory"],
        ),
        (f"SGD faster in wasm ({w} workers)", f"sgd{w}_time_s", "below", 0.5, PAPER["sgd_time"]),
        (f"SGD less memory in wasm ({w} workers)", f"sgd{w}_peak_mb", "below", 0.1, PAPER["sgd_memory"]),
        (f"inference throughput higher in wasm (cold start every {i0})", f"inf{i0}_rps", "above", 2.0, PAPER["tpt"]),
        (f"inference throughput higher in wasm (cold start every {i1})", f"inf{i1}_rps", "above", 2.0, PAPER["tpt"]),
        (f"inference p99 lower in wasm (cold start every {i0})", f"inf{i0}_p99_ms", "below", 0.1, PAPER["p99"]),
        (f"inference p99 lower in wasm (cold start every {i1})", f"inf{i1}_p99_ms", "below", 0.1, PAPER["p99"]),
    ]


def claim_verdict(r: dict | None, side: str, factor: float | None) -> str:
    if not r or "ratio_lo" not in r:
        return "not shown (no interval)"
    v = stats.verdict(r["ratio_lo"], r["ratio_hi"])
    if v == "includes 1":
        return "not shown (interval includes 1)"
    if v != f"{side} 1":
        return "**refuted**"
    if factor is None:
        return "confirmed"
    lo, hi = r["ratio_lo"], r["ratio_hi"]
    reached = hi <= factor if side == "below" else lo >= factor
    short = lo > factor if side == "below" else hi < factor
    return "confirmed" + (
        ", at the paper's factor"
        if reached
        else ", short of the paper's factor"
        if short
        else ", the paper's factor inside the interval"
    )


def claims_table(runs: list[dict]) -> list[str]:
    head = (
        "| claim | paper | "
        + " | ".join(f"{r['label']} (load before {r['load_before']}): wasm/native [95 % CI], verdict" for r in runs)
        + " |"
    )
    rows = [head, "|---|---|" + "---|" * len(runs)]
    for idx, (claim, _key, side, factor, paper) in enumerate(claim_list(runs[0])):
        cells = []
        for r in runs:
            s = figure(r, claim_list(r)[idx][1])
            cells.append(f"{fmt_ratio(s.get('ratio'))}, {claim_verdict(s.get('ratio'), side, factor)}")
        rows.append(f"| {claim} | {paper} | " + " | ".join(cells) + " |")
    return rows


def claim_verdicts(res: dict) -> list[tuple[str, str, dict | None, str]]:
    """Per paper claim of one run: the claim, its figure key, its wasm/native ratio and the
    verdict the claims table states."""
    out = []
    for claim, key, side, factor, _paper in claim_list(res):
        r = figure(res, key).get("ratio")
        out.append((claim, key, r, claim_verdict(r, side, factor)))
    return out


def answer(runs: list[dict]) -> list[str]:
    """The page's leading answer, from the claims table's verdicts: per run, how many of the
    paper's claims its intervals confirm, refute or cannot show, and the cold start's and SGD's
    ratios as the table states them."""
    parts, heads = [], []
    for r in runs:
        vs = claim_verdicts(r)
        conf = sum(v.startswith("confirmed") for *_, v in vs)
        at = sum(v == "confirmed, at the paper's factor" for *_, v in vs)
        ref = sum(v == "**refuted**" for *_, v in vs)
        parts.append(
            f"{r['label']}: {conf} of {len(vs)} confirmed ({at} at the paper's factor), {ref} refuted, "
            f"{len(vs) - conf - ref} not shown"
        )
        by = {k: rat for _, k, rat, _ in vs}
        sgd = f"sgd{max(r['config']['sgd']['workers'])}_time_s"
        heads.append(f"{r['label']}: cold start {fmt_ratio(by['cold_ms'])}, SGD time {fmt_ratio(by[sgd])}")
    return [
        "**Answer.** Against the paper's headline claims (wasm/native ratio's 95 % interval on the claimed side "
        "of 1): " + "; ".join(parts) + ". Wasm/native [95 % CI] " + "; ".join(heads) + " (table below).",
        "",
    ]


def run_section(res: dict) -> list[str]:
    cfg = res["config"]
    sg, inf = cfg["sgd"], cfg["inference"]
    lines = [
        f"## Run: {res['label']}",
        "",
        f"`{res['command']}` ({res['date']}, {res['host']}, {res['cpus']} CPUs; load before {res['load_before']}, "
        f"after {res['load_after']}, which counts the bench's own last points: matmul's 73 chained calls run at once; "
        f"{fmt(res['wall_s'], 0)} s wall). Repeats per point: up to "
        f"{cfg['repeats']}, at least {cfg['min_repeats']}, fewer when the point's {cfg['budget_s']:g} s budget ran "
        "out (n says how many)"
        + (
            f"; each round's order of the systems shuffled with seed {cfg['seed']} (faasm_tasks.order)."
            if "seed" in cfg
            else "; the systems in a fixed order in each round."
        ),
        "",
        f"### Start time and memory per instance (no-op / CNN function; {cfg['k']} instances held)",
        "",
        "Start times are per call (unpaired: the ratio's interval compares calls); memory is one figure "
        "per repeat, paired.",
        "",
    ]
    lines += figure_rows(
        res,
        [
            ("cold_ms", "cold start (ms)", 3),
            ("warm_ms", "warm call (ms)", 3),
            ("mem_kb", "memory per instance, PSS (KB)", 0),
            ("mem_with_runc_kb", "memory per instance with runc's supervisor (KB)", 0),
        ],
    )
    lines += [
        "",
        f"### SGD (Hogwild SVM, {sg['examples']} examples x {sg['features']} features, {sg['epochs']} "
        f"epochs, sync interval {sg['interval']})",
        "",
        "Each run's final loss is checked against the single-worker runs' median loss of the same system "
        f"(within {sgd_kind.LOSS_TOLERANCE:g} x reference + {sgd_kind.ABS_TOLERANCE:g}, the pipeline's SGD "
        "check); a run that fails is left out of every figure and counted in the last column. Peak "
        "memory: wasm = the runtime process's PSS growth; native = the containers' and their runc "
        "supervisors' PSS.",
        "",
    ]
    lines += figure_rows(
        res,
        [
            (f"sgd{w}_{key}", f"{w} worker{'s' * (w > 1)}: {label}", nd)
            for w in sg["workers"]
            for key, label, nd in (
                ("time_s", "time (s)", 3),
                ("cpu_s", "CPU (s)", 2),
                ("peak_mb", "peak memory (MB)", 1),
                ("loss", "final loss", 4),
            )
        ],
    )
    lines += [
        "",
        f"### Inference (CNN, {inf['duration_s']:g} s windows, {inf['callers']} closed-loop callers; a cold "
        "start every N-th call)",
        "",
        "Per window: throughput, p50 and p99 latency, and the callers' run-queue wait per call (time "
        "runnable but not running, from /proc/thread-self/schedstat: the machine's other load, not the "
        "system under test). After each window one call's output is checked against NumPy.",
        "",
    ]
    lines += figure_rows(
        res,
        [
            (f"inf{i}_{key}", f"every {i}: {label}", nd)
            for i in inf["intervals"]
            for key, label, nd in (
                ("rps", "req/s", 1),
                ("p50_ms", "p50 (ms)", 3),
                ("p99_ms", "p99 (ms)", 3),
                ("runq_ms", "run-queue wait per call (ms)", 3),
            )
        ],
    )
    lines += [
        "",
        "### Matrix multiplication (divide and conquer, 2 splits = 73 chained calls)",
        "",
        "Each run starts from no idle instance / container, so its 73 calls include their cold starts; each "
        f"product is checked against float64 NumPy (max rel err <= {matmul_kind.MAX_REL_ERR:g}).",
        "",
    ]
    lines += figure_rows(res, [(f"mm{s}_time_s", f"size {s}: time (s)", 3) for s in cfg["matmul"]])
    lines += matmul_projection(res)
    return lines


def matmul_projection(res: dict) -> list[str]:
    """The catalogue's sizes above the largest measured one: the time the measured growth predicts."""
    sizes = sorted(res["config"]["matmul"])
    big = [s for s in catalogue_sizes() if s > sizes[-1]]
    if len(sizes) < 2 or not big:
        return []
    out = [
        "",
        f"Sizes {', '.join(map(str, big))} of the catalogue were not run: at the growth measured between "
        f"sizes {sizes[-2]} and {sizes[-1]} they would take",
    ]
    parts = []
    lower, upper = figure(res, f"mm{sizes[-2]}_time_s"), figure(res, f"mm{sizes[-1]}_time_s")
    for system in ("wasm", "native"):
        a, b = lower.get(system, {}), upper.get(system, {})
        if not a.get("median") or not b.get("median"):
            continue
        k = math.log(b["median"] / a["median"]) / math.log(sizes[-1] / sizes[-2])
        proj = [b["median"] * (s / sizes[-1]) ** k for s in big]
        parts.append(f"{system} (time ~ size^{k:.2f}): " + ", ".join(f"{fmt(p, 0)} s" for p in proj) + " per repeat")
    out[-1] += (
        " "
        + "; ".join(parts)
        + (
            ". The bench keeps each point under its time budget on a 2-core machine; "
            "the catalogue's sweep runs them on the knative target."
        )
    )
    return out


def report(runs: list[dict]) -> str:
    r0 = runs[0]
    lines = [
        "# Faasm on one machine: wasm (wasmtime) vs native (runc containers)",
        "",
        *answer(runs),
        "Generated by bench/faasm_local.py from "
        + ", ".join(f"`{r['json']}`" for r in runs if r.get("json"))
        + "; do not edit by hand. Each run measured the two systems side by side, their repeats interleaved "
        "(wasm, native, wasm, ...), so a change of the machine's load falls on both of a pair.",
        "",
        "Same C source (faasm_tasks/functions) in both systems: wasm32-wasi on wasmtime "
        f"{r0['wasmtime']} (one runtime process, instances per call) and native static in runc "
        f"{r0['runc']} containers (read-only root holding the binary, own namespaces, memory cgroup). "
        "State: one private redis-server; wasm reads through the runtime's shared local tier, native "
        "copies in and out of Redis. Chained calls run in-process in both systems (no HTTP per call). "
        "Ratio = wasm / native (below 1: wasm smaller / faster).",
        "",
        "Intervals (faasm_tasks/stats.py, SeBS' practice): each figure's median with the distribution-free "
        "95 % interval from order statistics (none under 6 values) and its mean with the Student-t interval; "
        "each ratio with a 95 % interval from ranks on the logarithms (Mann-Whitney; Wilcoxon signed-rank "
        "where the systems ran in pairs). A claim is **confirmed** when the ratio's interval lies on the claimed side of 1, "
        "**refuted** when it lies on the other side, **not shown** when it includes 1.",
        "",
    ]
    if any(r.get("native_skipped") for r in runs):
        lines += [f"**native not measured in some run:** {[r.get('native_skipped') for r in runs]}", ""]
    lines += ["## The paper's claims", ""] + claims_table(runs)
    lines += [
        "",
        "Paper figures: Shillaker & Pietzuch, ATC'20 (abstract; those marked unconfirmed are from the "
        "notes, not checked against the PDF). The paper's containers include Docker's image and network "
        "set-up in their cold start; runc here does not. Faasm maps the shared state into every Faaslet's "
        "linear memory; wasmtime's Python API cannot map host memory into an instance, so each instance "
        "copies the data set as each container does: the paper's SGD memory saving has no mechanism here.",
        "",
    ]
    lines += load_note(runs)
    for r in runs:
        lines += [""] + run_section(r)
    lines += [
        "",
        "What one machine cannot show: the paper's cluster effects (network transfer of state between "
        "hosts, Knative's scheduling and autoscaling, containers running short of memory at 20-host "
        "parallelism, Docker's image and network set-up in its cold start). These need the knative target.",
        "",
    ]
    return "\n".join(lines)


def load_note(runs: list[dict]) -> list[str]:
    """Across runs: what the load did to wasm's tail latency (p99 beside the callers' run-queue
    wait), and the matrix product's direction at its largest size."""
    i = runs[0]["config"]["inference"]["intervals"][-1]
    rows = []
    for r in runs:
        s99, sq = figure(r, f"inf{i}_p99_ms"), figure(r, f"inf{i}_runq_ms")
        w99, wq = s99.get("wasm", {}), sq.get("wasm", {})
        if w99.get("n"):
            rows.append(
                f"{r['label']}: wasm p99 {fmt(w99['median'], 2)} ms (median of the windows), its callers "
                f"waited {fmt(wq.get('median'), 3)} ms per call on average on the run queue "
                f"(load before {r['load_before']})"
            )
    out = []
    if len(rows) >= 2:
        out += [
            "## What the load does to the tail",
            "",
            f"At a cold start every {i} calls: " + "; ".join(rows) + ". A wasm call runs in its caller's "
            "thread for about a millisecond and needs no other process; when the machine has more runnable "
            "tasks than cores, a preempted caller waits for the others' time slices (milliseconds each) "
            "before it runs again, and the calls that wait make the p99. The run-queue wait rising with "
            "the tail, while the median call stays near its quiet figure, says the tail is the machine's "
            "load, not wasm (the page before this one measured p99 of about 24 ms at load 13-19, with more "
            "runnable tasks per core than the hog gives here).",
            "",
        ]
    size = max(runs[0]["config"]["matmul"])
    cells = []
    for r in runs:
        ratio = figure(r, f"mm{size}_time_s").get("ratio")
        if ratio:
            cells.append(
                f"{r['label']}: {fmt_ratio(ratio)}, {stats.verdict(ratio.get('ratio_lo'), ratio.get('ratio_hi'))}"
            )
    if cells:
        out += [
            "## Matrix multiplication (no paper claim)",
            "",
            f"wasm/native time at size {size}: " + "; ".join(cells) + ". Each native run starts its 73 "
            "chained calls' containers (processes of their own, competing with any other load for the two "
            "cores); the wasm calls are threads of one process. Where the two runs' intervals lie on "
            "opposite sides of 1, the direction of this comparison depends on the machine's load and "
            "one run alone cannot say which system is faster.",
            "",
        ]
    return out


def start_redis(tmp: str) -> tuple[subprocess.Popen, redis.Redis]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = shutil.which("redis-server")
    if not exe:
        raise SystemExit("redis-server not found (apt-get install -y redis-server)")
    p = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL,
    )
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


def round_order(systems: list[str], seed: int, k: int) -> list[str]:
    """The systems' order in round ``k`` of the run: one point and one repeat of the pipeline's
    shuffled order (faasm_tasks.order.trials) with the systems as its arms, seeded ``seed + k``."""
    return [t.arm for t in order.trials(1, 1, seed=seed + k, arms=systems)]


def measure(cfg: dict, systems: list[str], res: dict) -> None:
    """Every point, its repeats interleaved over the systems, into ``res["points"]``."""
    pts = Points()
    tmp = tempfile.mkdtemp(prefix="faasm-bench-")
    rproc, r = start_redis(tmp)
    ips = {}
    try:
        for k, v in data.synthetic_sgd(
            examples=cfg["sgd"]["examples"],
            features=cfg["sgd"]["features"],
            nnz_per_example=cfg["sgd"]["nnz_per_example"],
            seed=7,
        ).items():
            r.set(f"sgd_{k}", v)
        model, files = data.synthetic_tf()
        r.set("tf_mobilenet_v1", model)
        reference = data.cnn_reference(model, files["grace_hopper.bmp"], files["labels.txt"].decode().split("\n"))
        for system in systems:
            ips[system] = runtimes.InProcess(
                system, r, os.path.join(tmp, system), label=f"bench-{os.getpid()}:{system}"
            )
            os.makedirs(os.path.join(tmp, system, "shared", "tfdata"), exist_ok=True)
            for name, body in files.items():
                with open(os.path.join(tmp, system, "shared", "tfdata", name), "wb") as f:
                    f.write(body)
            ips[system].rt.warm_up(["sgd", "matmul", "inference", "demo"])  # codegen / staging outside the timings
            ips[system].call("demo", "noop")

        rounds = iter(range(10**9))

        def repeat(name: str, once) -> None:
            """Up to ``repeats`` rounds within the point's budget, at least ``min_repeats``; each
            round measures every system once, in an order shuffled with the run's seed (the
            pipeline's faasm_tasks.order, one point and one repeat per round, so the systems
            stay paired by round while neither always goes first)."""
            t0 = time.monotonic()
            for i in range(cfg["repeats"]):
                if i >= cfg["min_repeats"] and time.monotonic() - t0 > cfg["budget_s"]:
                    break
                for system in round_order(systems, cfg["seed"], next(rounds)):
                    once(system, ips[system])
            print(f" {name}: {i + 1} repeats, {time.monotonic() - t0:.1f} s, load {loadavg()}", flush=True)

        per = max(1, cfg["n_cold"] // cfg["repeats"]), max(1, cfg["n_warm"] // cfg["repeats"])

        def start(system, ip):
            got = start_block(ip, *per)
            pts.add("cold_ms", system, got["cold_ms"], paired=False)
            pts.add("warm_ms", system, got["warm_ms"], paired=False)

        repeat("start", start)

        def memory(system, ip):
            got = memory_once(ip, system, cfg["k"])
            for key in ("mem_kb", "mem_with_runc_kb"):
                pts.add(key, system, got[key])

        repeat("memory", memory)

        ref_loss: dict[str, float] = {}
        for w in cfg["sgd"]["workers"]:

            def sgd_run(system, ip, w=w):
                got = sgd_once(ip, system, w, cfg["sgd"]["epochs"], cfg["sgd"]["interval"])
                failed = ""
                ref = ref_loss.get(system)
                if ref is not None:
                    bound = sgd_kind.LOSS_TOLERANCE * abs(ref) + sgd_kind.ABS_TOLERANCE
                    if not abs(got["final_loss"] - ref) <= bound:
                        failed = f"final loss {got['final_loss']:.4g} vs single-worker {ref:.4g}, bound {bound:.3g}"
                pts.add(f"sgd{w}_loss", system, got["final_loss"])  # the loss itself is always shown
                for key in ("time_s", "cpu_s", "peak_mb"):
                    pts.add(f"sgd{w}_{key}", system, got[key], failed=failed)

            repeat(f"sgd {w} workers", sgd_run)
            if not ref_loss:  # the first worker count (1) is the reference
                for system in systems:
                    ref_loss[system] = float(np.median(pts.figs[f"sgd{w}_loss"]["values"][system]))
        for interval in cfg["inference"]["intervals"]:

            def infer(system, ip, interval=interval):
                got = inference_window(
                    ip, interval, cfg["inference"]["duration_s"], cfg["inference"]["callers"], reference
                )
                failed = "" if got["check"] == "ok" else got["check"]
                for key in ("rps", "p50_ms", "p99_ms", "runq_ms"):
                    pts.add(f"inf{interval}_{key}", system, got[key], failed=failed)

            repeat(f"inference every {interval}", infer)
        for size in cfg["matmul"]:
            for k in list(r.scan_iter("python_*")):
                r.delete(k)
            for k, v in data.matrix_state_objects(size, 2, seed=42).items():
                r.set(f"python_{k}", v)
            want = data.expected_product(size, 2, seed=42)

            def mm(system, ip, size=size, want=want):
                got = matmul_once(ip, r, size, want)
                failed = (
                    "" if got["max_rel_err"] <= matmul_kind.MAX_REL_ERR else f"max rel err {got['max_rel_err']:.3g}"
                )
                pts.add(f"mm{size}_time_s", system, got["time_s"], failed=failed)

            repeat(f"matmul {size}", mm)
    finally:
        for system, ip in ips.items():
            ip.close()
            if system == "native":
                left = runtimes.runc_list(ip.rt.root)
                assert not left, f"containers left: {left}"
        rproc.terminate()
        rproc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    res["points"] = pts.as_json()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (seconds): for the test")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "results", "faasm-local.md"))
    ap.add_argument("--json", default="", help="also write the raw figures here")
    ap.add_argument("--systems", default="wasm,native")
    ap.add_argument("--label", default="", help="this run's name on the page (default: quiet / busy by the load)")
    ap.add_argument("--repeats", type=int, default=0, help="repeats per point (default 12, smoke 3)")
    ap.add_argument(
        "--budget-s",
        type=float,
        default=0.0,
        help="per point: stop repeating after this many seconds once 6 repeats are done (default 40)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the systems' shuffled order per round (default 0)")
    ap.add_argument(
        "--runs",
        nargs="+",
        default=[],
        help="write the page from these runs' --json files (no measuring), e.g. the quiet and busy run",
    )
    args = ap.parse_args(argv)
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(ap, args, {"repeats": (0, 1000), "budget_s": (0.0, 3600.0)}, folders=(), files=("out", "json"))
    if args.runs:
        runs = []
        for path in args.runs:
            try:
                with open(path, encoding="utf-8") as f:
                    run = json.load(f)
                run["points"], run["config"]  # the keys the page needs
            except (OSError, ValueError, KeyError, TypeError) as exc:
                print(f"error: --runs {path}: not a bench/faasm_local.py --json file ({exc})", file=sys.stderr)
                return 2
            run["json"] = os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT) else path
            runs.append(run)
        return write_page(args.out, runs)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for sysname in ("wasm", "native"):
        for mod in ("sgd", "matmul", "inference", "demo"):
            try:
                runtimes.artefact(sysname, mod)
            except runtimes.CallFailed as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
    smoke = args.smoke
    repeats = args.repeats or (3 if smoke else 12)
    cfg = {
        "seed": args.seed,  # of the systems' order in each round (faasm_tasks.order), round k: seed + k
        "repeats": repeats,
        "min_repeats": min(repeats, 3 if smoke else 6),
        "budget_s": args.budget_s or (5.0 if smoke else 40.0),
        "n_cold": 6 if smoke else 120,
        "n_warm": 30 if smoke else 1200,
        "k": 4 if smoke else 16,
        "sgd": {
            "examples": 1500 if smoke else 40000,
            "features": 300 if smoke else 5000,
            "nnz_per_example": 12 if smoke else 30,
            "epochs": 2 if smoke else 10,
            "interval": 60000,
            "workers": [1, 2] if smoke else [1, 2, 4],
        },
        "inference": {
            "intervals": [5, 500] if smoke else [5, 50, 500],
            "duration_s": 0.3 if smoke else 2.0,
            "callers": 2,
        },
        "matmul": [100] if smoke else [100, 1000, 2000],
    }
    systems = [s for s in args.systems.split(",") if s]
    load0 = loadavg()
    res = {
        "command": "python bench/faasm_local.py"
        + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "label": args.label or ("quiet" if float(load0.split()[0]) < 1.5 else "busy"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_before": load0,
        "config": cfg,
        "wasmtime": runtimes.wasmtime_version(),
    }
    runc = runtimes.runc_binary()
    res["runc"] = (
        subprocess.run([runc, "--version"], capture_output=True, text=True)
        .stdout.split("\n")[0]
        .replace("runc version ", "")
        if runc
        else "absent"
    )
    if "native" in systems and (not runc or os.geteuid() != 0):
        res["native_skipped"] = "runc missing" if not runc else "not root (runc containers need root here)"
        systems.remove("native")
    t0 = time.monotonic()
    measure(cfg, systems, res)
    res["wall_s"], res["load_after"] = time.monotonic() - t0, loadavg()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
        res["json"] = os.path.relpath(args.json, ROOT) if os.path.abspath(args.json).startswith(ROOT) else args.json
    return write_page(args.out, [res])


def write_page(out: str, runs: list[dict]) -> int:
    text = report(runs)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    from stepkit.procs import run_trapped  # SIGTERM: the finally blocks stop the containers and redis-server

    sys.exit(run_trapped(main, "bench/faasm_local.py"))
