"""Billing: a psutil sampler (every 2 s, the seed's metric set) and per-run summaries.

The sampler is a detached process (``python -m faasm_tasks.billing sample ...``) so it
outlives the CLI step that starts it: ``run`` starts it (if not already running for the
run id) and stops it when it ends; ``collect`` stops one left behind by a crashed
``run``, stores the samples and attaches a summary to every attempt, computed over the
attempt's own time window. Its pid and start time live in
``<state-dir>/<run-id>/billing/sampler.json``; like every process of the run it carries
the run label (:mod:`faasm_tasks.procs`), so teardown finds it without that file; samples are appended to
``<state-dir>/<run-id>/billing/<host>.jsonl``.

Summary (per host): deltas of the cumulative counters (network, disk, CPU seconds),
``PEAK_MEMORY`` as the seed computed it (max - min of used memory, MB), the absolute
peak, and ``memory_gb_s``: used memory integrated over the window (trapezoid rule), a
package-defined cost proxy (the seed defines no cost formula). When the local target's
state file is given, the RSS of the processes it started is sampled too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import psutil

from . import procs

MB = 1024 * 1024
MAX_GAP_S = 5.0  # summarize: samples this far outside a window still bound it
CUMULATIVE = (
    "disk_read_mb",
    "disk_write_mb",
    "net_sent_mb",
    "net_recv_mb",
    "cpu_time_user",
    "cpu_time_system",
    "cpu_time_idle",
    "cpu_time_iowait",
)


def sample(state_file: str | None = None) -> dict[str, Any]:
    vm, sw = psutil.virtual_memory(), psutil.swap_memory()
    ct = psutil.cpu_times()
    disk, net = psutil.disk_io_counters(), psutil.net_io_counters()
    s: dict[str, Any] = {
        "t": round(time.time(), 3),
        "cpu_pct": psutil.cpu_percent(interval=None),
        "cpu_pct_per_cpu": psutil.cpu_percent(interval=None, percpu=True),
        "cpu_time_user": ct.user,
        "cpu_time_system": ct.system,
        "cpu_time_idle": ct.idle,
        "cpu_time_iowait": getattr(ct, "iowait", 0.0),
        "memory_used_mb": vm.used / MB,
        "memory_active_mb": getattr(vm, "active", 0) / MB,
        "memory_used_pct": vm.percent,
        "memory_available_mb": vm.available / MB,
        "swap_used_mb": sw.used / MB,
        "disk_read_mb": (disk.read_bytes / MB) if disk else 0.0,
        "disk_write_mb": (disk.write_bytes / MB) if disk else 0.0,
        "net_sent_mb": net.bytes_sent / MB,
        "net_recv_mb": net.bytes_recv / MB,
    }
    if state_file:
        rss = 0.0
        try:
            with open(state_file, encoding="utf-8") as f:
                procs = json.load(f).get("procs", [])
            for r in procs:
                try:
                    p = psutil.Process(r["pid"])
                    if abs(p.create_time() - r["create_time"]) < 0.05:
                        rss += p.memory_info().rss / MB
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        except (OSError, ValueError):
            pass
        s["target_rss_mb"] = rss
    return s


def sampler_main(out: str, interval: float, state_file: str | None, max_s: float) -> int:
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    psutil.cpu_percent(interval=None)
    header = {
        "t": round(time.time(), 3),
        "host": socket.gethostname(),
        "cpu_count": psutil.cpu_count(),
        "cpu_freq_max": (psutil.cpu_freq().max if psutil.cpu_freq() else None),
        "interval_s": interval,
    }
    t_end = time.monotonic() + max_s
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps({"header": header}) + "\n")
        while not stop["now"] and time.monotonic() < t_end:
            f.write(json.dumps(sample(state_file)) + "\n")
            f.flush()
            nxt = time.monotonic() + interval
            while not stop["now"] and time.monotonic() < nxt:
                time.sleep(min(0.1, max(0.0, nxt - time.monotonic())))
        f.write(json.dumps(sample(state_file)) + "\n")  # a last sample at stop
    return 0


def _dir(state_root: str, run_id: str) -> str:
    return os.path.join(os.path.abspath(state_root), run_id, "billing")


def samples_path(state_root: str, run_id: str) -> str:
    return os.path.join(_dir(state_root, run_id), f"{socket.gethostname()}.jsonl")


def _ctl_path(state_root: str, run_id: str) -> str:
    return os.path.join(_dir(state_root, run_id), "sampler.json")


def _running(ctl: dict[str, Any], label: str) -> bool:
    """The recorded sampler is alive and still is this run's (start time, command, label)."""
    return procs.is_ours(ctl, label) is not None


def _read_ctl(path: str) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            ctl = json.load(f)
        return ctl if isinstance(ctl, dict) else None
    except (OSError, ValueError):
        return None


def _sample_lines_after(path: str, offset: int) -> int:
    """How many complete sample lines (not headers) ``path`` holds past byte ``offset``."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return 0
    lines = data.split(b"\n")[:-1]  # the last piece is an unfinished line (or empty)
    return sum(1 for ln in lines if ln.strip() and not ln.startswith(b'{"header"'))


def await_samples(
    path: str, offset: int, proc: psutil.Process | subprocess.Popen, n: int = 1, timeout_s: float = 120.0
) -> dict[str, Any]:
    """Wait until the sampler writing ``path`` has written ``n`` samples past ``offset`` (it
    has imported, installed its signal handlers and sampled), while it lives, for at most
    ``timeout_s``. Returns ``{"ready", "samples", "waited_s"}`` (and ``problem`` when not)."""
    t0 = time.monotonic()
    while True:
        got = _sample_lines_after(path, offset)
        if got >= n:
            return {"ready": True, "samples": got, "waited_s": round(time.monotonic() - t0, 3)}
        alive = proc.poll() is None if isinstance(proc, subprocess.Popen) else proc.is_running()
        if not alive:
            return {
                "ready": False,
                "samples": got,
                "waited_s": round(time.monotonic() - t0, 3),
                "problem": f"the sampler (pid {proc.pid}) exited before writing {n} sample(s)",
            }
        if time.monotonic() - t0 > timeout_s:
            return {
                "ready": False,
                "samples": got,
                "waited_s": round(time.monotonic() - t0, 3),
                "problem": f"the sampler (pid {proc.pid}) wrote {got} of {n} sample(s) in {timeout_s:g} s",
            }
        time.sleep(0.05)


def start_sampler(
    state_root: str,
    run_id: str,
    interval: float = 2.0,
    state_file: str | None = None,
    max_s: float = 6 * 3600,
    ready_timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Start the run's sampler (unless it runs) and wait until it has taken its first sample,
    so that a window measured from now on has a sample before it and a stop after this
    returns finds its SIGTERM handler installed (``ready`` says whether it got there)."""
    label = procs.run_label(state_root, run_id)
    procs.run_dir(state_root, run_id, "billing")
    ctl_path = _ctl_path(state_root, run_id)
    ctl = _read_ctl(ctl_path)
    if ctl and _running(ctl, label):
        return {**ctl, "action": "already running"}
    out = samples_path(state_root, run_id)
    try:
        offset = os.path.getsize(out)  # a restarted sampler appends to the same file
    except OSError:
        offset = 0
    cmd = [
        sys.executable,
        "-m",
        "faasm_tasks.billing",
        "sample",
        "--out",
        out,
        "--interval",
        str(interval),
        "--max-s",
        str(max_s),
    ] + (["--state-file", state_file] if state_file else [])
    env = procs.labelled_env(label, "billing-sampler")
    env.pop(procs.FAULT_ENV, None)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs.journal_append(
        _dir(state_root, run_id),
        {"event": "starting", "role": "billing-sampler", "cmd": cmd, "label": label, "t": time.time()},
    )
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    ctl = {
        "pid": proc.pid,
        "create_time": psutil.Process(proc.pid).create_time(),
        "out": out,
        "cmd": cmd,
        "interval_s": interval,
        "started": time.time(),
        "role": "billing-sampler",
    }
    procs.journal_append(_dir(state_root, run_id), {"event": "started", **ctl})
    tmp = ctl_path + ".tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8") as f:
        json.dump(ctl, f)
    os.replace(tmp, ctl_path)
    return {**ctl, "action": "started", **await_samples(out, offset, proc, 1, ready_timeout_s)}


def sampler_problem(ctl: dict[str, Any]) -> str | None:
    """None while the sampler ``ctl`` (what :func:`start_sampler` returned) runs, else why not:
    ``billing sampler pid N died: SIGKILL`` (the signal or exit status when it was this
    process's child, as it is in ``run``). A dead sampler means the host metrics of the
    points from then on are missing: ``run`` fails the point with this reason."""
    pid = ctl.get("pid")
    how = ""
    if isinstance(pid, int):
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                if os.WIFSIGNALED(status):
                    how = f": {signal.Signals(os.WTERMSIG(status)).name}"
                else:
                    how = f": exit status {os.WEXITSTATUS(status)}"
        except (ChildProcessError, OSError, ValueError):
            pass
    if not how and isinstance(pid, int):
        try:  # alive while the recorded process (same start time) runs; never a false alarm
            p = psutil.Process(pid)
            if abs(p.create_time() - float(ctl.get("create_time", 0))) < 0.05 and p.status() != psutil.STATUS_ZOMBIE:
                return None
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError, TypeError):
            pass
    return f"billing sampler pid {pid} died{how or ' (gone)'}; host metrics from then on are missing"


def stop_sampler(state_root: str, run_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Stop the run's sampler: the recorded one (when it still is ours) and any other process
    labelled as this run's sampler (a lost or truncated ``sampler.json`` hides nothing)."""
    label = procs.run_label(state_root, run_id)
    ctl_path = _ctl_path(state_root, run_id)
    ctl = _read_ctl(ctl_path) or {}
    found = {p.pid: p for p in procs.find_labelled(label) if procs.describe(p).get("role") == "billing-sampler"}
    mine = procs.is_ours(ctl, label) if ctl else None
    if mine is not None:
        found[mine.pid] = mine
    report: list[dict[str, Any]] = []
    if not found:
        action = "already stopped" if ctl else "none running"
    else:
        report = procs.stop(list(found.values()), label, timeout_s)
        action = "killed" if any(r["result"] != "terminated" for r in report) else "stopped"
    try:
        os.unlink(ctl_path)
    except OSError:
        pass
    return {**ctl, "action": action, "processes": report}


def read_samples(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    header: dict[str, Any] = {}
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue  # a torn last line from a killed sampler
        if "header" in d:
            header = header or d["header"]
        else:
            rows.append(d)
    rows.sort(key=lambda r: r["t"])
    return header, rows


def _integral_gb_s(rows: list[dict[str, Any]], key: str, t0: float, t1: float) -> float:
    """Trapezoid integral of ``key`` (MB) over ``[t0, t1]`` only, interpolating at the edges."""
    tot = 0.0
    for a, b in zip(rows, rows[1:]):
        lo, hi = max(a["t"], t0), min(b["t"], t1)
        if hi <= lo or b["t"] <= a["t"]:
            continue
        va, vb = a.get(key, 0.0), b.get(key, 0.0)
        v_lo = va + (vb - va) * (lo - a["t"]) / (b["t"] - a["t"])
        v_hi = va + (vb - va) * (hi - a["t"]) / (b["t"] - a["t"])
        tot += (hi - lo) * (v_lo + v_hi) / 2.0
    return tot / 1024.0


def summarize(
    rows: list[dict[str, Any]], t_start: float, t_end: float, host: str = "", max_gap_s: float = MAX_GAP_S
) -> dict[str, Any]:
    """Summary of one host over ``[t_start, t_end]`` (epoch seconds). Includes the sample
    just before the window and just after it (if within ``max_gap_s``: samples from another
    sampler session do not count), so a short run still gets a delta."""
    rows = [r for r in rows if t_start - max_gap_s <= r["t"] <= t_end + max_gap_s]
    before = [r for r in rows if r["t"] <= t_start]
    after = [r for r in rows if r["t"] >= t_end]
    inside = [r for r in rows if t_start < r["t"] < t_end]
    win = ([before[-1]] if before else []) + inside + ([after[0]] if after else [])
    out: dict[str, Any] = {
        "host": host,
        "window_start": t_start,
        "window_end": t_end,
        "samples": len(win),
        "cost_metric": "memory_gb_s = integral of used memory over the window "
        "(package-defined proxy; the seed defines no cost)",
    }
    if len(win) < 2:
        out["complete"] = False
        return out
    out["complete"] = bool(before and after)
    for k in CUMULATIVE:
        out[k] = round(win[-1].get(k, 0.0) - win[0].get(k, 0.0), 4)
    mem = [r["memory_used_mb"] for r in win]
    out["peak_memory_mb"] = round(max(mem), 2)
    out["PEAK_MEMORY"] = round(max(mem) - min(mem), 2)  # the seed's definition (a delta)
    out["mean_cpu_pct"] = round(sum(r["cpu_pct"] for r in win[1:]) / (len(win) - 1), 2)
    out["memory_gb_s"] = round(_integral_gb_s(win, "memory_used_mb", t_start, t_end), 4)
    if "target_rss_mb" in win[0]:
        out["target_peak_rss_mb"] = round(max(r.get("target_rss_mb", 0.0) for r in win), 2)
        out["target_memory_gb_s"] = round(_integral_gb_s(win, "target_rss_mb", t_start, t_end), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faasm_tasks.billing")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--out", required=True)
    s.add_argument("--interval", type=float, default=2.0)
    s.add_argument("--state-file")
    s.add_argument("--max-s", type=float, default=6 * 3600, help="stop by itself after this long")
    a = p.parse_args(argv)
    return sampler_main(a.out, a.interval, a.state_file, a.max_s)


if __name__ == "__main__":
    sys.exit(main())


def start_for_run(args: Any, plan: Any, target: Any) -> dict[str, Any] | None:
    """The run step's sampler on the local target (knative: the run's DaemonSet samples every
    node), its handle recorded in storage (host, pid, start time, samples file); None when
    the experiment or ``--no-billing`` wants none."""
    if not (plan.experiment.get("billing", False) and not args.no_billing and args.target == "local"):
        return None
    sampler = start_sampler(args.state_dir, args.run_id, state_file=getattr(target, "state_path", None))
    if sampler.get("ready") is False:  # the points run; collect says which windows have no samples
        print(f"run: billing sampler not sampling: {sampler.get('problem')}", flush=True)
    from stepkit import storage

    storage.write_json(
        storage.join(args.results, "_state", args.run_id, f"billing-sampler-{sampler.get('pid')}.json"),
        {**{k: v for k, v in sampler.items() if k != "cmd"}, "host": socket.gethostname()},
    )
    return sampler
