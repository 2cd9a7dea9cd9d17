"""``python -m mirage_tasks fidelity``: how well does the simulator reproduce real waits?

Replays every job of a trace submitted in ``[--from, --to)`` in one continuous run (with
the configuration's warm start: the trace's running and pending jobs at the replay start),
or with ``--episode-days D`` in independent D-day windows each starting warm or empty like
a Mirage episode, until all of them have started, then compares each job's simulated wait
(start - submit) with its real one. ``--lead-in-days L`` starts each replay L days earlier
and scores only the jobs submitted in the window (the jobs of the lead-in load the cluster).

Measures (per month of submission in the trace's own time zone, per node class, pooled):

* ``mae_h`` / ``medae_h``: mean / median absolute error of the per-job wait (hours);
* ``within_1h`` / ``within_10m``: share of jobs whose simulated wait is within 1 hour /
  10 minutes of the real one;
* ``daily_corr``: Pearson correlation, over days of submission, of the real and the
  simulated daily mean wait (NaN with fewer than 3 days or a constant series);
* ``spearman``: rank correlation of simulated and real per-job waits;
* ``ks``: two-sample Kolmogorov-Smirnov statistic between the two wait distributions;
  ``ks_1min`` the same with waits in whole minutes;
* the zero-wait predictor (every job starts at once) on the same jobs, the bar any
  useful simulator must clear: ``zero_mae_h`` (= the real mean), ``zero_medae_h``,
  ``zero_within_1h``, ``zero_within_10m`` (the share of real waits under 1 h / 10 min);
* ``real_mean_h`` / ``sim_mean_h``, ``n``.

A configuration's ``dispatch_latency_s`` (the delay between the scheduler's decision and
the job's recorded start, which Slurm shows as a few seconds) is added to every simulated
wait.

The configuration under test comes from the usual flags (``--cluster-config``,
``--nodes``, ...). ``--compare`` adds whole configurations (presets or JSON files; the
default adds ``reference``, the SC'23 simulator's semantics) and ``--sweep-nodes`` adds
copies of the tested configuration at other sizes. A compared configuration smaller than
a job of the window is skipped and the report says so (which job sizes, how many jobs);
when the tested configuration is, the step fails with exit 2. No job is dropped silently.

Outputs: ``fidelity.json``, ``fidelity.md`` (per configuration: a month table, a node
class table, pooled) and ``waits.parquet`` (one row per job and configuration: ``config``,
``job_id``, ``submit`` (UTC), ``nodes``, ``real_wait_s``, ``sim_wait_s``).
"""

from __future__ import annotations

import argparse
import io
import logging
import os

import pandas as pd

from stepkit import Step, StepError

from .. import __version__
from ..calibration.fidelity import markdown, report, too_big
from ..data.schema import parse_time, read_trace
from ..data.times import window_outside_trace
from ..sim.config import PRESETS, SimConfig, add_config_arguments, config_from_args, load_config
from ..sim.workload import Workload

log = logging.getLogger(__name__)


#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {"lead_in_days": (0, 366), "episode_days": (0, 3660)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument("--from", dest="t_from", required=True, help="first submit time (ISO, UTC if no offset)")
    p.add_argument("--to", dest="t_to", required=True, help="end of the window, exclusive (ISO)")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument(
        "--compare",
        nargs="*",
        default=["reference"],
        help="extra configurations to report (presets or JSON files; default: reference)",
    )
    p.add_argument("--sweep-nodes", default="", help="comma list of cluster sizes to add for the tested config")
    p.add_argument(
        "--lead-in-days",
        type=float,
        default=0.0,
        help="start each replay this many days before its window; only the window's jobs are scored",
    )
    p.add_argument(
        "--episode-days",
        type=float,
        default=0.0,
        help="replay independent windows of this many days (Mirage episodes: 5) instead of one "
        "continuous run; each window starts warm or empty as its configuration says",
    )
    add_config_arguments(p)


def sweep_nodes(text: str) -> list[int]:
    """``--sweep-nodes 8,16,32`` as cluster sizes (whole numbers >= 1, at most 64 of them)."""
    out = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        if not x.isdigit() or not 1 <= int(x) <= 10_000_000:
            raise StepError(f"--sweep-nodes {text!r}: {x!r} is not a cluster size (a whole number of nodes >= 1)")
        out.append(int(x))
    if len(out) > 64:
        raise StepError(f"--sweep-nodes: {len(out)} sizes; at most 64 (each is a whole replay)")
    return out


def run(args: argparse.Namespace) -> int:
    t_from, t_to = parse_time(args.t_from, "--from"), parse_time(args.t_to, "--to")
    if t_to <= t_from:
        raise StepError("--to must be after --from")
    if args.lead_in_days < 0:
        raise StepError("--lead-in-days must be >= 0")
    df, meta = read_trace(args.trace)
    cfg = config_from_args(args, meta.machine_nodes)
    configs: dict[str, SimConfig] = {"tested": cfg}
    for spec in args.compare or []:
        doc = load_config(spec)
        name = spec if spec in PRESETS else os.path.splitext(os.path.basename(spec))[0]
        configs[name] = SimConfig.from_dict(doc)
    for n in sweep_nodes(args.sweep_nodes):
        configs[f"tested@{n}"] = cfg.replace(nodes=n)
    lead_in = int(round(args.lead_in_days * 86400))
    params = {
        "from": t_from.isoformat(),
        "to": t_to.isoformat(),
        "episode_days": args.episode_days,
        "lead_in_s": lead_in,
        "configs": {k: c.to_dict() for k, c in configs.items()},
    }
    wl = Workload.from_frame(df, cfg.procs_per_node or None)
    a, b = int(t_from.timestamp()), int(t_to.timestamp())
    if len(wl.submit) == 0:
        raise StepError(f"{args.trace}: the trace holds no jobs")
    why = window_outside_trace(int(wl.submit.min()), int(wl.submit.max()), a, b, "--from/--to", args.trace)
    if why:
        raise StepError(why)
    big = too_big(wl, cfg, a, b, lead_in)
    if big:
        raise StepError(
            f"{big['jobs']} job(s) of the window ask for up to {big['largest_nodes']} nodes, more than "
            f"the tested configuration's {cfg.nodes}: raise --nodes (or the config's 'nodes')"
        )
    step = Step("fidelity", args.out, __version__, params, inputs=[args.trace])
    if step.skip():
        return 0
    tz = meta.timezone or "UTC"
    reports: dict[str, dict] = {}
    frames = []
    for name, c in configs.items():
        big = too_big(wl, c, a, b, lead_in)
        if big:
            msg = (
                f"{big['jobs']} job(s) of the window need up to {big['largest_nodes']} nodes; this configuration "
                f"has {big['config_nodes']}"
            )
            log.warning("fidelity: %s skipped: %s", name, msg)
            print(f"fidelity {name}: SKIPPED ({msg})", flush=True)
            reports[name] = {
                "config": c.to_dict(),
                "skipped": msg,
                **big,
                "pooled": {"n": 0},
                "months": {},
                "node_classes": {},
            }
            continue
        log.info("fidelity: replaying %s", name)
        reports[name], frame = report(wl, c, a, b, args.episode_days, lead_in, tz)
        frames.append(frame.assign(config=name))
        p = reports[name]["pooled"]
        print(
            f"fidelity {name}: n={p.get('n')} MAE {p.get('mae_h', float('nan')):.2f} h "
            f"(zero-wait {p.get('zero_mae_h', float('nan')):.2f} h), within 1 h "
            f"{p.get('within_1h', float('nan')):.1%} (zero-wait {p.get('zero_within_1h', float('nan')):.1%}), "
            f"Spearman {p.get('spearman', float('nan')):.2f}, daily corr {p.get('daily_corr', float('nan')):.2f}",
            flush=True,
        )
    doc = {
        "trace_fingerprint": wl.fingerprint,
        **params,
        "timezone": tz,
        "reports": reports,
        "targets": {"mae_h_max": 2.5, "within_1h_min": 0.75, "spearman_min": 0.65, "daily_corr_min": 0.8},
    }
    step.write_json("fidelity.json", doc)
    waits = pd.concat(frames, ignore_index=True)
    waits = waits[["config", "job_id", "submit", "nodes", "real_wait_s", "sim_wait_s"]]
    waits["submit"] = pd.to_datetime(waits["submit"], unit="s", utc=True).astype("datetime64[s, UTC]")
    buf = io.BytesIO()
    waits.to_parquet(buf, index=False)
    step.write_bytes("waits.parquet", buf.getvalue())
    mode = f"independent {args.episode_days:g}-day windows" if args.episode_days > 0 else "one continuous replay"
    if lead_in:
        mode += f", each with a {args.lead_in_days:g}-day lead-in"
    md = [
        f"# Simulator fidelity: jobs submitted {t_from:%Y-%m-%d} to {t_to:%Y-%m-%d} (exclusive), {mode}",
        "",
        "Per-job wait (start - submit) simulated vs real, hours. mae/medae: mean/median absolute error; "
        "within_1h/within_10m: share of jobs simulated within 1 h / 10 min of their real wait; daily_corr: "
        "correlation of the daily mean waits; spearman: rank correlation per job; ks: Kolmogorov-Smirnov "
        "distance of the two wait distributions (ks_1min on whole minutes). zero_*: the same figures for "
        "predicting no wait at all, the bar a useful simulator must clear. Targets: MAE <= 2.5 h, within 1 h "
        ">= 75 % and above the zero-wait predictor, Spearman >= 0.65, daily correlation >= 0.8. A "
        "configuration with trace_age_backout uses each job's real wait to correct its recorded priority, "
        "i.e. the outcome it is scored on.",
        "",
    ]
    md += [markdown(name, rep) for name, rep in reports.items()]
    step.write_bytes("fidelity.md", "\n".join(md).encode())
    step.commit(summary={k: r.get("pooled", {"skipped": r.get("skipped")}) for k, r in reports.items()})
    return 0
