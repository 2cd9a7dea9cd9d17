"""``python -m lab fidelity-slurm``: score the simulator again on a recorded Slurm replay.

Reads a ``replay-slurm`` output (``jobs.parquet``: Slurm's real submit/start times of every
job; ``replay.json``: factor, configuration, the horizon the replay watched to) and
recomputes the comparison (:func:`lab.slurm.compare.compare`) with the replay's
configuration or the one the usual flags give (e.g. ``--bf-resolution``, ``--backfill none``,
``--nodes``, ``--weight-fairshare 0``), without running Slurm again: which simulator setting
moves the agreement. A replay made with ``--accounting`` is rescored with the jobs' users (the
simulator's fair share and limits per trace user, as Slurm had them).

Outputs: ``fidelity_slurm.json``, ``fidelity_slurm.md``, ``jobs.parquet``.
"""

from __future__ import annotations

import argparse
import io
import os

from mirage_tasks import __version__
from mirage_tasks.sim.config import _FLAGS, SimConfig, add_config_arguments
from stepkit import Step, StepError, storage


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--replay", required=True, help="replay-slurm output prefix")
    p.add_argument(
        "--slurm-state",
        default=None,
        metavar="DIR",
        help="the replay's cluster state folder (<slurm-root>/state): the phase of Slurm's usage "
        "re-reads, for a replay whose replay.json does not record it (made before it did)",
    )
    p.add_argument(
        "--slurm-log",
        default=None,
        metavar="FILE",
        help="the replay's slurmctld.log (<slurm-root>/log/slurmctld.log): slurmctld's submission "
        "instants to the millisecond, for a replay whose jobs.parquet does not hold them",
    )
    p.add_argument(
        "--sim-backfill",
        default=None,
        metavar="POLICY",
        help="the simulator's backfill policy in the comparison instead of the one Slurm enforces "
        "(named for conservative), e.g. conservative to score the free-node count",
    )
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from lab.slurm import compare as cmp
    from mirage_tasks.data.schema import parse_time

    from .replay_slurm import markdown, recalc_trace_t

    meta_uri, jobs_uri = storage.join(args.replay, "replay.json"), storage.join(args.replay, "jobs.parquet")
    for u in (meta_uri, jobs_uri):
        if not storage.exists(u):
            raise StepError(f"--replay {args.replay}: {u} not found (not a replay-slurm output)")
    doc = storage.read_json(meta_uri)
    base = dict(doc["config"])
    if args.cluster_config:
        from mirage_tasks.sim.config import load_config

        base.update(load_config(args.cluster_config))
    for name, _flag, _t, _h in _FLAGS:
        v = getattr(args, f"cfg_{name}", None)
        if v is not None:
            base[name] = v
    cfg = SimConfig.from_dict(base)
    from mirage_tasks.sim import policies

    if args.sim_backfill and args.sim_backfill not in policies.BACKFILL:
        raise StepError(f"--sim-backfill must be one of {policies.backfill_names()}, got {args.sim_backfill!r}")
    if args.slurm_log and not os.path.isfile(args.slurm_log):
        raise StepError(f"--slurm-log {args.slurm_log}: no such file")
    extra = {
        k: v
        for k, v in (
            ("slurm_state", args.slurm_state),
            ("slurm_log", args.slurm_log),
            ("sim_backfill", args.sim_backfill),
        )
        if v
    }
    step = Step(
        "fidelity-slurm",
        args.out,
        __version__,
        {"config": cfg.to_dict(), **extra},
        inputs=[meta_uri, jobs_uri, *([args.slurm_log] if args.slurm_log else [])],
    )
    if step.skip():
        return 0
    with storage.open_read(jobs_uri) as fh:
        jobs = pd.read_parquet(fh)
    factor = float(doc["factor"])
    run = dict(doc["run"])
    if run.get("priority_recalc_epoch") is None and args.slurm_state:
        run["priority_recalc_epoch"] = cmp.last_recalc_epoch(args.slurm_state)
        if run["priority_recalc_epoch"] is None:
            raise StepError(
                f"--slurm-state {args.slurm_state}: no priority_last_decay_ran there (not a slurmctld "
                "StateSaveLocation with priority/multifactor)"
            )
    recalc_t = None
    if run.get("priority_recalc_epoch") is not None or args.slurm_log:
        t0 = int(parse_time(doc["from"], f"{meta_uri}: from").timestamp())
    if run.get("priority_recalc_epoch") is not None:
        recalc_t = recalc_trace_t(run, t0, factor)
    if args.slurm_log:
        from mirage_tasks.slurm.queue import read_submit_log

        jobs = cmp.precise_submits(jobs, read_submit_log(args.slurm_log), float(run["origin_epoch"]), t0, factor)
        if not jobs["slurm_submit_ms"].notna().any():
            raise StepError(f"--slurm-log {args.slurm_log}: no submission of this replay's jobs found there")
    res, frame = cmp.compare(
        jobs,
        cfg,
        factor,
        horizon_t=run.get("horizon_t"),
        accounting=bool(doc.get("accounting")),
        recalc_t=recalc_t,
        sim_backfill=args.sim_backfill,
    )
    out = {**doc, "run": run, "config": cfg.to_dict(), "comparison": res, "rescored_from": args.replay}
    step.write_json("fidelity_slurm.json", out)
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    step.write_bytes("jobs.parquet", buf.getvalue())
    step.write_bytes("fidelity_slurm.md", markdown(out).encode())
    m = res["sim_vs_slurm"]
    print(
        f"fidelity-slurm: {res['compared']} of {res['scored']} compared; start error mean "
        f"{res['start_error_h']['mean']:.2f} h, within 1 h {m.get('within_1h', float('nan')):.1%}, Spearman "
        f"{m.get('spearman', float('nan')):.2f}; rules {res['why']}",
        flush=True,
    )
    step.commit(summary={"within_1h": m.get("within_1h"), "why": res["why"]})
    return 0
