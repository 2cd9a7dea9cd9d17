"""The per-node billing sampler of the knative target (the container of the billing DaemonSet).

The experiments manual samples every host of its billing inventory with psutil every 2 s
(``ansible/roles/billing``); here ``deploy`` starts one sampler pod per node of the
experiment (a DaemonSet labelled with the run) and each writes its samples under the
run's results prefix, so ``collect`` (in any pod) summarizes them per host:
``<results>/<date>/<run>/billing/<host>/<seq>.jsonl``, one object per ``--flush-s``
seconds (object stores have no append), the first line of each a header naming the host.
SIGTERM (the DaemonSet's deletion by ``collect`` or ``teardown``) writes a last sample and
the last segment, then exits 0. ``--max-s`` bounds its life if nothing deletes it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import psutil

from stepkit import StepError, storage

from .. import billing
from ..common import add_common, run_date
from ..results import run_prefix


def add_arguments(p):
    add_common(p)
    p.add_argument("--interval", type=float, default=2.0, help="seconds between samples (default 2, the manual's)")
    p.add_argument("--flush-s", type=float, default=10.0, help="seconds between segments written to storage")
    p.add_argument("--max-s", type=float, default=8 * 3600, help="stop by itself after this long")
    p.add_argument(
        "--host",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="host name of the samples (default: env NODE_NAME, the pod's node, else the hostname)",
    )


def host_folder(results: str, date: str, run_id: str, host: str) -> str:
    return storage.join(run_prefix(results, date, run_id), "billing", host)


def run(args) -> int:
    if args.interval <= 0 or args.flush_s <= 0:
        raise StepError("--interval and --flush-s must be positive")
    if not args.host or "/" in args.host:
        raise StepError(f"--host {args.host!r} must be a non-empty name without '/'")
    date = run_date(args)
    folder = host_folder(args.results, date, args.run_id, args.host)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(now=True))
    psutil.cpu_percent(interval=None)
    freq = psutil.cpu_freq()
    header = {
        "t": round(time.time(), 3),
        "host": args.host,
        "cpu_count": psutil.cpu_count(),
        "cpu_freq_max": freq.max if freq else None,
        "interval_s": args.interval,
        "run_id": args.run_id,
    }
    seq = len([n for n in storage.list_files(folder) if n.endswith(".jsonl")])  # a restarted pod appends
    rows: list[str] = []
    t_end = time.monotonic() + args.max_s
    next_flush = time.monotonic() + args.flush_s

    def flush() -> None:
        nonlocal seq, rows
        if not rows:
            return
        text = json.dumps({"header": header}) + "\n" + "".join(r + "\n" for r in rows)
        storage.write_bytes(storage.join(folder, f"{seq:06d}.jsonl"), text.encode())
        seq, rows = seq + 1, []

    print(f"billing-agent: sampling {args.host} every {args.interval}s -> {folder}", flush=True)
    while not stop["now"] and time.monotonic() < t_end:
        rows.append(json.dumps(billing.sample()))
        if time.monotonic() >= next_flush:
            flush()
            next_flush = time.monotonic() + args.flush_s
        nxt = time.monotonic() + args.interval
        while not stop["now"] and time.monotonic() < nxt:
            time.sleep(min(0.1, max(0.0, nxt - time.monotonic())))
    rows.append(json.dumps(billing.sample()))  # a last sample at stop
    flush()
    print(f"billing-agent: stopped after {seq} segment(s)", flush=True)
    return 0
