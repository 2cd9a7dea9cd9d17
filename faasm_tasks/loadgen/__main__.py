"""``python -m faasm_tasks.loadgen``: drive load from the command line.

* ``run``: the controller (or one client): ``--clients N --client-isolation {netns,process}``
  or ``--client-hosts h1,h2``; prints the summary as JSON (histograms left out unless
  ``--histograms``). SIGTERM stops the clients and removes their namespaces (exit 143).
* ``client``: one load client of a controller, speaking JSON lines on stdin/stdout (what the
  controller starts, locally, inside a namespace, or over ``ssh`` on another host).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from stepkit.procs import run_trapped

from . import CLIENT_ISOLATION, LoadSpec, client_main, run_load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m faasm_tasks.loadgen")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("client", help="one load client of a controller (JSON lines on stdin/stdout)")
    r = sub.add_parser("run", help="drive load against a URL and print the summary")
    r.add_argument("--url", required=True)
    r.add_argument("--mode", choices=["closed", "open"], default="open")
    r.add_argument("--rate", type=float, default=0.0, help="open loop: total requests/s")
    r.add_argument("--duration", type=float, default=5.0)
    r.add_argument("--warmup", type=float, default=0.0)
    r.add_argument("--connections", type=int, default=4)
    r.add_argument("--processes", type=int, default=1, help="driver processes in all (dealt to the clients)")
    r.add_argument("--timeout", type=float, default=5.0)
    r.add_argument("--method", default="GET")
    r.add_argument("--clients", type=int, default=1)
    r.add_argument("--client-isolation", choices=list(CLIENT_ISOLATION), default="netns")
    r.add_argument("--client-hosts", default="", help="comma-separated hosts, one client each")
    r.add_argument("--client-command", default=LoadSpec.client_command, help="how a client is started on {host}")
    r.add_argument("--histograms", action="store_true", help="keep the encoded histograms in the output")
    a = p.parse_args(argv)
    if a.cmd == "client":
        proto = os.fdopen(os.dup(sys.stdout.fileno()), "w")
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray prints never corrupt the protocol
        return client_main(sys.stdin, proto)
    try:
        spec = LoadSpec(
            url=a.url,
            mode=a.mode,
            rate=a.rate,
            duration_s=a.duration,
            warmup_s=a.warmup,
            connections=a.connections,
            processes=a.processes,
            timeout_s=a.timeout,
            method=a.method,
            clients=a.clients,
            client_isolation=a.client_isolation,
            client_hosts=tuple(h for h in a.client_hosts.split(",") if h),
            client_command=a.client_command,
        )
    except ValueError as exc:
        p.error(str(exc))
    try:
        out = run_load(spec)
    except RuntimeError as exc:  # a client failed, namespaces refused: the reason, not a traceback
        print(f"python -m faasm_tasks.loadgen run: {exc}", file=sys.stderr)
        return 1
    if not a.histograms:
        for k in ("histogram", "send_lag_histogram", "client_histograms"):
            out.pop(k, None)
    print(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(run_trapped(main, "faasm_tasks.loadgen"))
