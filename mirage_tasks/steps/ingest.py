"""``python -m mirage_tasks ingest``: a job trace in any supported format -> normalised Parquet.

Outputs under ``--out``: ``trace.parquet`` (schema in :mod:`mirage_tasks.data.schema`),
``ingest_report.json`` (rows read, kept, rejected with line numbers and reasons, window,
time span, machine size, ``limit_fill`` and ``never_ran``), then ``_SUCCESS.json``.

A job without a requested time gets one known at its submission
(:func:`mirage_tasks.data.limits.fill_limits`: its partition's declared maximum
``--partition-max-limit``, else its user's finished jobs, else the log's default
``--default-limit-s``), before the time window is applied, so that the history before it counts.
Jobs that never ran (no start, a time they left) are kept with that time as their end.

``--trace`` may name a folder of daily exports (a site's ``sacct`` export per day, named with
that day: :mod:`mirage_tasks.data.exports`): its export files are read in day order as one
trace (each file's rejected rows name it), a job in several exports keeping its newest row;
the files are the step's inputs, so a new day's file is a new trace.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
import pandas as pd

from stepkit import Step, StepError

from .. import __version__
from ..data.exports import is_folder, list_exports
from ..data.ingest import BadRows, formats, formats_help, parse
from ..data.limits import DEFAULT_LIMIT_S, KINDS, fill_limits, parse_partition_max
from ..data.prefixes import PREFIXES_FILE
from ..data.schema import TRACE_FILE, describe, parse_time, submit_prefixes, write_trace

log = logging.getLogger(__name__)
REPORT_FILE = "ingest_report.json"


#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {"max_bad_rows": (0, None), "cluster_nodes": (1, 10_000_000), "default_limit_s": (1, 100 * 366 * 86400)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trace",
        required=True,
        help="trace URI or path (.gz ok): sacct export or SWF; or a folder of daily exports named with "
        "their day (ls6-2023-01-31.log.gz), read in day order as one trace",
    )
    p.add_argument("--out", required=True, help="output prefix URI (file://, path or s3://)")
    p.add_argument("--format", default="auto", choices=formats(), help=formats_help())
    p.add_argument(
        "--timezone",
        default=None,
        help="IANA zone of sacct's local times, e.g. America/Chicago for Lonestar6 (SWF: from its header)",
    )
    p.add_argument(
        "--from", dest="t_from", default=None, help="keep jobs submitted at or after this ISO time (UTC if no offset)"
    )
    p.add_argument(
        "--to", dest="t_to", default=None, help="keep jobs submitted before this ISO time (UTC if no offset)"
    )
    p.add_argument(
        "--max-bad-rows",
        type=int,
        default=100,
        help="refuse the file when more rows than this are unusable (default 100; 0 = strict)",
    )
    p.add_argument(
        "--cluster-nodes",
        type=int,
        default=None,
        help="machine size in nodes, recorded in the trace metadata when the file does not say",
    )
    p.add_argument(
        "--partition-max-limit",
        action="append",
        default=None,
        metavar="NAME=SECONDS",
        help="a partition's (queue's) maximum time limit, the limit of its jobs that request none "
        "(repeatable; NAME * for every partition)",
    )
    p.add_argument(
        "--default-limit-s",
        type=int,
        default=None,
        help="the log's default time limit, for a job that requests none, has no declared partition "
        f"maximum and whose user has no finished job yet (default {DEFAULT_LIMIT_S} s)",
    )


def run(args: argparse.Namespace) -> int:
    t_from = parse_time(args.t_from, "--from")
    t_to = parse_time(args.t_to, "--to")
    if t_from is not None and t_to is not None and t_to <= t_from:
        raise StepError(f"--to {args.t_to} must be later than --from {args.t_from}")
    if args.max_bad_rows < 0:
        raise StepError("--max-bad-rows must be >= 0")
    if args.default_limit_s is not None and args.default_limit_s < 1:
        raise StepError(f"--default-limit-s must be >= 1, got {args.default_limit_s}")
    part_max = parse_partition_max(args.partition_max_limit)
    params = {
        "format": args.format,
        "timezone": args.timezone,
        "from": t_from.isoformat() if t_from is not None else None,
        "to": t_to.isoformat() if t_to is not None else None,
        "max_bad_rows": args.max_bad_rows,
        "cluster_nodes": args.cluster_nodes,
    }
    if part_max or args.default_limit_s:  # only when given: the runs that do not give them keep their keys
        params["limits"] = {"partition_max": part_max, "default_s": args.default_limit_s}
    # a folder of daily exports: its export files are the inputs (mirage_tasks.data.exports), in day order
    inputs = [uri for _day, uri in list_exports(args.trace).files] if is_folder(args.trace) else [args.trace]
    step = Step("ingest", args.out, __version__, params, inputs=inputs)
    if step.skip():
        return 0

    t0 = time.perf_counter()
    result = parse(args.trace, args.format, args.timezone)
    elapsed = time.perf_counter() - t0
    bad = result.rejected
    for r in bad[:20]:
        log.warning("%s: %s rejected: %s", args.trace, r.where(), r.reason)
    if len(bad) > 20:
        log.warning("%s: ... and %d more rejected rows (all listed in %s)", args.trace, len(bad) - 20, REPORT_FILE)
    if len(bad) > args.max_bad_rows:
        first = "; ".join(f"{r.where()}: {r.reason}" for r in bad[:5])
        raise BadRows(
            f"{args.trace}: {len(bad)} unusable rows exceed --max-bad-rows {args.max_bad_rows} "
            f"(first: {first}); nothing was written"
        )

    df = result.frame.copy()
    parsed_rows = len(df)
    # a time limit known at submission for the jobs that request none (the whole log: history counts)
    from ..data.schema import epoch_seconds

    limits, kind, limit_fill = fill_limits(
        epoch_seconds(df["submit"]),
        epoch_seconds(df["start"]),
        epoch_seconds(df["end"]),
        df["time_limit_s"].to_numpy(dtype="float64", na_value=np.nan),
        df["user"].astype("string").fillna("").to_numpy(dtype=object),
        df["partition"].astype("string").to_numpy(dtype=object, na_value=None),
        part_max,
        args.default_limit_s,
    )
    df["time_limit_s"] = pd.array(limits, dtype="Float64").round().astype("Int64")
    fill_kind = pd.Series(kind, index=df.index)
    if limit_fill["jobs_without_limit"]:
        msg = (
            f"{args.trace}: {limit_fill['jobs_without_limit']} jobs request no time limit; filled with a limit "
            f"known at submission: {limit_fill['partition_max']} partition maximum, "
            f"{limit_fill['user_history']} user history, {limit_fill['log_default']} the log's default "
            f"({limit_fill['log_default_s']} s, {'declared' if limit_fill['log_default_declared'] else 'undeclared'})"
        )
        log.warning("%s", msg)
        print(f"ingest: {msg}", flush=True)
    if t_from is not None:
        df = df[df["submit"] >= t_from]
    if t_to is not None:
        df = df[df["submit"] < t_to]
    if df.empty:
        raise StepError(f"{args.trace}: no jobs left after the time window [{args.t_from}, {args.t_to})")
    meta = result.meta
    if args.cluster_nodes is not None:
        meta.machine_nodes = args.cluster_nodes
    if len(df) != parsed_rows:  # the counts of the jobs kept (the fill read the whole log's history)
        kept = fill_kind.loc[df.index]
        limit_fill = {**limit_fill, "jobs_without_limit": int((kept != "").sum())}
        limit_fill.update({k: int((kept == k).sum()) for k in KINDS})
    # jobs that never ran: no start, but a time they left the queue (kept; the simulator queues them)
    gone = df["start"].isna() & df["end"].notna()
    never_ran = {
        "jobs": int(gone.sum()),
        "cancelled": int((gone & (df["status"] == "CANCELLED")).sum()),
        "no_leave_time": int((df["start"].isna() & df["end"].isna()).sum()),
    }
    meta.hygiene = {"limit_fill": limit_fill, "never_ran": never_ran}
    over_limit = int(((df["end"] - df["start"]).dt.total_seconds() > df["time_limit_s"].astype("float64")).sum())
    no_nodes = int((df["nodes"].isna() & df["procs"].notna()).sum())
    if no_nodes:  # SWF logs record processors; nodes only where the machine has one processor per node
        ppn = (
            f" (the header says {meta.machine_procs} processors on {meta.machine_nodes} nodes, "
            f"about {meta.machine_procs / meta.machine_nodes:.1f} per node)"
            if meta.machine_procs and meta.machine_nodes
            else ""
        )
        msg = (
            f"{args.trace}: {no_nodes} of {len(df)} jobs record processors but no node count{ppn}; "
            f"the simulating steps (sample, fidelity, calibrate, validate) need --procs-per-node P to "
            f"convert them (nodes = ceil(processors / P))"
        )
        log.warning("%s", msg)
        print(f"ingest: WARNING: {msg}", flush=True)

    expected = result.notes.get("expected_records")
    count_mismatch = None
    if expected is not None and expected != result.rows_read:  # a truncated or spliced log: said, and recorded
        count_mismatch = {"header_expects": int(expected), "rows_read": int(result.rows_read)}
        msg = (
            f"{args.trace}: the header's job count (MaxJobs/MaxRecords) says {expected} records, the file has "
            f"{result.rows_read} ({'fewer: truncated?' if result.rows_read < expected else 'more'}); "
            f"ingest_report.json records it as header_count_mismatch"
        )
        log.warning("%s", msg)
        print(f"ingest: WARNING: {msg}", flush=True)

    write_trace(step.record(TRACE_FILE), df, meta)
    step.write_json(PREFIXES_FILE, submit_prefixes(df))
    report = {
        "trace": args.trace,
        "format": meta.format,
        "timezone": meta.timezone,
        "rows_read": result.rows_read,
        "rows_parsed": parsed_rows,
        "rows_rejected": len(bad),
        "rejected": [r.as_dict() for r in bad],
        "rows_outside_window": parsed_rows - len(df),
        "rows_kept": int(len(df)),
        "window": {"from": params["from"], "to": params["to"]},
        "machine_nodes": meta.machine_nodes,
        "machine_procs": meta.machine_procs,
        "runs_over_time_limit": over_limit,
        "jobs_without_node_count": no_nodes,
        "limit_fill": limit_fill,
        "never_ran": never_ran,
        "parse_seconds": round(elapsed, 3),
        "rows_per_second": round(result.rows_read / elapsed) if elapsed > 0 else None,
        "notes": result.notes,
        "header_count_mismatch": count_mismatch,
        **{f"span_{k}": v for k, v in describe(df).items() if k in ("first_submit", "last_submit")},
        "stats": describe(df),
    }
    step.write_json(REPORT_FILE, report)
    step.commit(
        summary={k: report[k] for k in ("rows_read", "rows_kept", "rows_rejected", "format", "limit_fill", "never_ran")}
    )
    print(
        f"ingest: {report['rows_read']} rows read, {report['rows_kept']} kept, {len(bad)} rejected, "
        f"{report['rows_outside_window']} outside the window; submits "
        f"{report.get('span_first_submit')} .. {report.get('span_last_submit')}; "
        f"{limit_fill['jobs_without_limit']} limits filled (partition maximum {limit_fill['partition_max']}, "
        f"user history {limit_fill['user_history']}, log default {limit_fill['log_default']}); "
        f"{never_ran['jobs']} jobs never ran (kept until they left)",
        flush=True,
    )
    return 0
