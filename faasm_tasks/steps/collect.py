"""Stop the billing samplers, store their samples and attach a billing summary (one entry
per host) to every attempt of the run that has none yet (an attempt that asked for billing and
has no samples around its window gets a summary that says so, ``no_samples`` and ``problem``,
and a later collect tries it again); copy local-target logs. Attempts left ``running`` by a
killed ``run`` are marked ``failed`` (``interrupted``) first.

Local target: the sampler is a process of this worker (its samples are stored under
``billing/<host>-<digest>.jsonl``). Knative target: the samplers are the run's billing
DaemonSet, one pod per node writing ``billing/<host>/<seq>.jsonl`` itself; collect deletes
the DaemonSet (each sampler writes its last samples on SIGTERM), waits for its pods to go,
and reads every host's samples from storage, so it needs nothing of an earlier pod."""

from __future__ import annotations

import hashlib
import os
import socket

from stepkit import storage

from .. import billing, procs
from ..common import add_common, run_date
from ..results import iter_records, mark_interrupted, run_prefix, validate_record, write_op_report
from ..targets import get_target


def add_arguments(p):
    add_common(p)
    p.add_argument(
        "--timeout", type=float, default=120.0, help="knative: seconds to wait for the billing DaemonSet's pods to go"
    )


def run(args) -> int:
    date = run_date(args)
    base = run_prefix(args.results, date, args.run_id)
    procs.fault("collect")  # test hook: collect killed before it stops the sampler
    stopped = billing.stop_sampler(args.state_dir, args.run_id)
    report: dict = {
        "sampler": stopped,
        "stored": [],
        "attached": [],
        "logs": [],
        "interrupted": mark_interrupted(args.results, date, args.run_id),
    }
    if args.target == "knative":
        report["billing_daemonset"] = get_target("knative", args).stop_billing(args.timeout)
    samples_file = billing.samples_path(args.state_dir, args.run_id)
    text = ""
    if os.path.exists(samples_file):
        with open(samples_file, encoding="utf-8") as f:
            text = f.read()
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        uri = storage.join(base, "billing", f"{socket.gethostname()}-{digest}.jsonl")
        if not storage.exists(uri):
            storage.write_bytes(uri, text.encode())
        report["stored"].append(uri)
    # samples already stored by an earlier collect (possibly from another host)
    texts = {socket.gethostname(): text} if text else {}
    segments: dict[str, list[str]] = {}
    for rel in storage.list_files(storage.join(base, "billing")):
        if not rel.endswith(".jsonl"):
            continue
        if "/" in rel:  # billing/<host>/<seq>.jsonl: a DaemonSet sampler's segments
            segments.setdefault(rel.split("/", 1)[0], []).append(rel)
            continue
        host = rel.rsplit("-", 1)[0]
        if host not in texts:
            texts[host] = storage.read_bytes(storage.join(base, "billing", rel)).decode()
    for host, rels in sorted(segments.items()):
        texts.setdefault(host, "")
        texts[host] += "".join(storage.read_bytes(storage.join(base, "billing", r)).decode() for r in sorted(rels))
    report["hosts"] = sorted(texts)
    parsed = {h: billing.read_samples(t)[1] for h, t in texts.items()}
    report["no_samples"] = []
    for uri, rec in iter_records(args.results, date, args.run_id):
        if rec.get("status") == "running" or (rec.get("billing") or {}).get("hosts"):
            continue
        win = (rec.get("metrics") or {}).get("window")
        if not win:
            continue
        every = [billing.summarize(rows, win["start"], win["end"], host) for host, rows in sorted(parsed.items())]
        summaries = [s for s in every if s["samples"] >= 2]
        if summaries:
            doc = {"hosts": summaries}
            rec["billing"] = {
                "hosts": len(summaries),
                "memory_gb_s": round(sum(s["memory_gb_s"] for s in summaries), 4),
                "peak_memory_mb": max(s["peak_memory_mb"] for s in summaries),
            }
        elif (rec.get("metrics") or {}).get("billing_wanted"):
            # billing was asked for and no host has samples around this window: say so, never leave it out
            problem = no_samples_problem(parsed, win)
            doc = {
                "hosts": [],
                "no_samples": True,
                "problem": problem,
                "hosts_without_samples": [{"host": s["host"], "samples": s["samples"]} for s in every],
            }
            rec["billing"] = {"hosts": 0, "problem": problem}
            report["no_samples"].append({"attempt": uri, "problem": problem})
        else:
            continue
        storage.write_json(storage.join(uri, "billing_summary.json"), doc)
        rec["files"] = sorted(set(rec.get("files", [])) | {"billing_summary.json"})
        validate_record(rec)
        storage.write_json(storage.join(uri, "run.json"), rec)
        report["attached"].append(uri)
    logs = os.path.join(os.path.abspath(args.state_dir), args.run_id, "local", "logs")
    if os.path.isdir(logs):
        for name in sorted(os.listdir(logs)):
            dst = storage.join(base, "logs", name)
            if not storage.exists(dst):
                with open(os.path.join(logs, name), "rb") as f:
                    storage.write_bytes(dst, f.read())
                report["logs"].append(name)
    write_op_report(args.results, date, args.run_id, "collect", report)
    print(
        f"collect: sampler {stopped.get('action')}, {len(report['attached'])} billing summaries attached, "
        f"{len(report['logs'])} logs stored",
        flush=True,
    )
    for item in report["no_samples"]:
        print(f"collect: no billing samples for {item['attempt']}: {item['problem']}", flush=True)
    return 0


def no_samples_problem(parsed: dict[str, list[dict]], win: dict[str, float]) -> str:
    """Why no host has samples around an attempt's window (what the samples cover instead)."""
    span = f"window {win['start']:.3f} .. {win['end']:.3f} (+- {billing.MAX_GAP_S:g} s)"
    if not parsed or not any(parsed.values()):
        return f"no billing samples were stored for this run; {span}"
    cover = "; ".join(
        f"{h}: {len(rows)} sample(s) from {rows[0]['t']:.3f} to {rows[-1]['t']:.3f}"
        for h, rows in sorted(parsed.items())
        if rows
    )
    return f"no host has 2 samples around the {span}; samples cover {cover}"
