"""``python -m lab replay-slurm``: a trace window on a real Slurm, against the simulator.

Submits the jobs of ``[--from, --to)`` of a normalised trace (plus the jobs running and
pending at ``--from``, which load the cluster but are not scored) to a Slurm cluster, time
compressed by ``--factor`` (see :mod:`lab.slurm.replay` for the scaling rules),
records every job's real submit/start/end from Slurm, then replays the same submissions in
the project's simulator with matching settings (:mod:`lab.slurm.compare`) and
reports per-job start agreement in trace time: mean/median absolute start error, share
within 1 h, Spearman, and per differing job the rule that explains it.

``--accounting``: the cluster keeps accounts (slurmdbd); each job names its trace user's account
and the comparison's simulator keeps the age factor, fair share and the limits, per user.

The cluster: ``--slurm-root DIR`` starts a local one there (``lab.slurm.cluster``,
sized and configured from the same cluster config, at the same factor) and stops it after;
without it the step uses the cluster ``SLURM_CONF`` names, which must be configured for the
factor (``make slurm FACTOR=...``) and should be idle; it cancels only the jobs it submitted.

Outputs: ``jobs.parquet`` (one row per submitted job: trace and Slurm times, simulated start,
the rule), ``replay.json`` (settings, scaled settings, what Slurm does not enforce, run
facts with CPU seconds and load, metrics) and ``replay.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import time

from mirage_tasks import __version__
from mirage_tasks.data.schema import parse_time, read_trace
from mirage_tasks.data.times import window_outside_trace
from mirage_tasks.sim.config import add_config_arguments, config_from_args
from stepkit import Step, StepError

log = logging.getLogger(__name__)

#: The longest real time a replay may spend submitting (a month of trace at x1 is not a step).
MAX_REAL_S = 7 * 86400


#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {"factor": (1e-3, 1e6), "drain": (0, 7 * 86400)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument("--from", dest="t_from", required=True, help="window start (ISO, UTC if no offset)")
    p.add_argument("--to", dest="t_to", required=True, help="window end, exclusive (ISO)")
    p.add_argument("--factor", type=float, required=True, help="time compression: trace seconds per real second")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument(
        "--slurm-root", default=None, help="start a local Slurm under this folder for the run (and stop it after)"
    )
    p.add_argument(
        "--drain",
        type=float,
        default=600.0,
        help="real seconds to wait after the last submission for every scored job to start (600)",
    )
    p.add_argument("--tag", default="mr", help="job name of the submitted jobs")
    p.add_argument(
        "--slurm-debug-flags",
        default="",
        help="with --slurm-root: slurmctld's DebugFlags (e.g. Backfill: its log under the root says why "
        "each job was or was not backfilled); not part of the output's key",
    )
    p.add_argument(
        "--accounting",
        action="store_true",
        help="the cluster keeps accounts: each job names its trace user's account (u<id>), and the "
        "simulator keeps the age factor, fair share and limits; with --slurm-root the local "
        "cluster starts slurmdbd on a local MariaDB with those accounts",
    )
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:

    from lab.slurm import compare as cmp, replay
    from lab.slurm.slurmconf import scaled, unsupported
    from mirage_tasks.sim.workload import Workload

    if not args.factor > 0:
        raise StepError(f"--factor must be > 0, got {args.factor}")
    if args.drain < 0:
        raise StepError("--drain must be >= 0")
    if args.slurm_root:
        from lab.slurm.cluster import check_root

        check_root(args.slurm_root)
    if not args.slurm_root:
        from mirage_tasks.slurm.queue import check_conf

        check_conf(None, "--slurm-root")
    t_from, t_to = parse_time(args.t_from, "--from"), parse_time(args.t_to, "--to")
    if t_to <= t_from:
        raise StepError("--to must be after --from")
    df, meta = read_trace(args.trace)
    cfg = config_from_args(args, meta.machine_nodes)
    if args.slurm_root:
        from lab.slurm.cluster import check_local_size

        check_local_size(cfg)
    t0, t1 = int(t_from.timestamp()), int(t_to.timestamp())
    if df.empty:
        raise StepError(f"{args.trace}: the trace holds no jobs")
    why = window_outside_trace(df["submit"].min(), df["submit"].max(), t0, t1, "--from/--to", args.trace)
    if why:
        raise StepError(why)
    if (t1 - t0) / args.factor > MAX_REAL_S:
        raise StepError(
            f"--from/--to/--factor: the window takes {(t1 - t0) / args.factor / 3600:.1f} h of real "
            f"submissions at x{args.factor:g}; at most {MAX_REAL_S / 3600:g} h (raise --factor)"
        )
    params = {
        "from": t_from.isoformat(),
        "to": t_to.isoformat(),
        "factor": args.factor,
        "config": cfg.to_dict(),
        "drain": args.drain,
        **({"accounting": True} if args.accounting else {}),
    }
    step = Step("replay-slurm", args.out, __version__, params, inputs=[args.trace])
    if step.skip():
        return 0
    wl = Workload.from_frame(df, cfg.procs_per_node or None)
    jobs = replay.plan(wl, cfg, t0, t1, args.factor)
    if jobs.empty or not (jobs["kind"] == "window").any():
        raise StepError(f"no jobs submitted in [{t_from}, {t_to}) in {args.trace}")
    cluster = None
    if args.slurm_root:
        from lab.slurm.cluster import start_local

        users, unknown = replay.users_of(jobs)
        cluster = start_local(
            args.slurm_root,
            cfg,
            args.factor,
            accounting=args.accounting,
            users=users,
            unknown=unknown,
            debug_flags=args.slurm_debug_flags,
        )
        env, jobcomp = cluster.env(), cluster.paths.jobcomp
    else:
        conf = os.environ.get("SLURM_CONF")
        if not conf:
            raise StepError("no cluster: pass --slurm-root DIR (a local Slurm for this run) or set SLURM_CONF")
        env = os.environ.copy()
        jobcomp = _jobcomp_of(conf)
    load0 = open("/proc/loadavg").read().split()[:3]
    t_cpu = time.process_time()
    try:
        print(
            f"replay-slurm: {int((jobs['kind'] == 'window').sum())} window jobs + "
            f"{int((jobs['kind'] != 'window').sum())} active at the start, factor x{args.factor:g}: "
            f"about {(t1 - t0) / args.factor:.0f} s of submissions",
            flush=True,
        )
        out, facts = replay.run(
            jobs, env, jobcomp, args.factor, t0, tag=args.tag, drain_s=args.drain, accounts=args.accounting
        )
        # the phase of Slurm's usage re-reads (a local cluster's state folder; unknown elsewhere)
        facts["priority_recalc_epoch"] = cmp.last_recalc_epoch(cluster.paths.state) if cluster is not None else None
        if cluster is not None:  # slurmctld's submission instants to the ms (jobcomp has whole seconds)
            from mirage_tasks.slurm.queue import read_submit_log

            out = cmp.precise_submits(
                out, read_submit_log(cluster.paths.ctld_log), facts["origin_epoch"], t0, args.factor
            )
    finally:
        if cluster is not None:
            cluster.stop()
    facts["loadavg_start"] = load0
    tz = meta.timezone or "UTC"
    doc_cmp, frame = cmp.compare(
        out,
        cfg,
        args.factor,
        tz,
        horizon_t=facts["horizon_t"],
        accounting=args.accounting,
        recalc_t=recalc_trace_t(facts, t0, args.factor),
    )
    facts["cpu_s_step"] = round(time.process_time() - t_cpu, 2)
    doc = {
        **params,
        "trace_fingerprint": wl.fingerprint,
        "slurm_settings": scaled(cfg, args.factor),
        "not_enforced_by_slurm": unsupported(cfg, args.accounting),
        "run": facts,
        "comparison": doc_cmp,
    }
    step.write_json("replay.json", doc)
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    step.write_bytes("jobs.parquet", buf.getvalue())
    step.write_bytes("replay.md", markdown(doc).encode())
    m = doc_cmp["sim_vs_slurm"]
    print(
        f"replay-slurm: {doc_cmp['compared']} of {doc_cmp['scored']} scored jobs started on both sides; "
        f"start error mean {doc_cmp['start_error_h']['mean']:.2f} h, within 1 h {m.get('within_1h', float('nan')):.1%}, "
        f"Spearman {m.get('spearman', float('nan')):.2f}; rules {doc_cmp['why']}",
        flush=True,
    )
    step.commit(
        summary={
            "compared": doc_cmp["compared"],
            "within_1h": m.get("within_1h"),
            "spearman": m.get("spearman"),
            "why": doc_cmp["why"],
        }
    )
    return 0


def recalc_trace_t(facts: dict, t0: int, factor: float) -> float | None:
    """Slurm's last usage re-read of a replay in trace time (None where it was not recorded)."""
    e = facts.get("priority_recalc_epoch")
    return None if e is None else t0 + (e - facts["origin_epoch"]) * factor


def _jobcomp_of(conf: str) -> str:
    loc = None
    with open(conf) as fh:
        for ln in fh:
            if ln.strip().startswith("JobCompLoc="):
                loc = ln.split("=", 1)[1].strip()
    if not loc:
        raise StepError(f"{conf}: no JobCompLoc (the replay reads starts from jobcomp/filetxt)")
    return loc


def _f(v, fmt: str) -> str:
    return "-" if v is None or v != v else fmt.format(v)


def markdown(doc: dict) -> str:
    c = doc["comparison"]
    m, st, sl, sm = c["sim_vs_slurm"], c["start_error_h"], c["slurm_vs_trace"], c["sim_vs_trace"]
    r = doc["run"]
    lines = [
        f"# Slurm replay {doc['from']} .. {doc['to']} at x{doc['factor']:g}",
        "",
        f"Slurm settings (real time): {json.dumps(doc.get('slurm_settings', {}))}",
        "",
        "Not enforced by this Slurm: " + "; ".join(doc.get("not_enforced_by_slurm", [])),
        "",
        f"Run: {r.get('submissions', '-')} submissions over {r.get('submit_span_real_s', '-')} s real, wall "
        f"{r.get('wall_s', '-')} s, submission lateness mean {r.get('submit_lateness_mean_s', '-')} s (max "
        f"{r.get('submit_lateness_max_s', '-')} s), {r.get('cancelled_at_end', '-')} jobs cancelled at the end, "
        f"load {r.get('loadavg_start', '-')} -> {r.get('loadavg_end', '-')}",
        "",
        "| measure (trace time) | value |",
        "|---|---|",
        f"| scored jobs / started on both sides | {c['scored']} / {c['compared']} |",
        f"| not started by the horizon: Slurm / simulator / both | {c['not_started_slurm']} / "
        f"{c['not_started_sim']} / {c['not_started_both']} |",
        f"| start error mean / median / p90 / max (h) | {_f(st['mean'], '{:.2f}')} / {_f(st['median'], '{:.2f}')}"
        f" / {_f(st['p90'], '{:.2f}')} / {_f(st['max'], '{:.2f}')} |",
        f"| within 1 h | {_f(m.get('within_1h'), '{:.1%}')} |",
        f"| Spearman (waits) | {_f(m.get('spearman'), '{:.2f}')} |",
        f"| mean wait Slurm / simulator (h) | {_f(m.get('real_mean_h'), '{:.2f}')} / "
        f"{_f(m.get('sim_mean_h'), '{:.2f}')} |",
        f"| backfill starts Slurm / simulator | {c['backfilled']['slurm']} / {c['backfilled']['sim']} |",
        f"| rule behind each start differing > 1 h | {c['why'] or 'none'} |",
        *(
            [
                f"| same nodes as Slurm (named-node backfill): all / of those within 1 h | "
                f"{sn['same']} of {sn['jobs']} / {sn['same_within_1h']} of {sn['within_1h']} |"
            ]
            if (sn := c.get("same_nodes"))
            else []
        ),
        f"| trace's real wait vs Slurm: MAE (h), within 1 h | {_f(sl.get('mae_h'), '{:.2f}')}, "
        f"{_f(sl.get('within_1h'), '{:.1%}')} |",
        f"| trace's real wait vs simulator: MAE (h), within 1 h | {_f(sm.get('mae_h'), '{:.2f}')}, "
        f"{_f(sm.get('within_1h'), '{:.1%}')} |",
        "",
    ]
    return "\n".join(lines) + "\n"
