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
import time

import numpy as np
import pandas as pd

from stepkit import Step, StepError

from . import __version__
from .schema import parse_time, read_trace
from .sim.config import PRESETS, SimConfig, add_config_arguments, config_from_args, load_config
from .sim.engine import Simulator
from .sim.workload import Workload

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument("--from", dest="t_from", required=True, help="first submit time (ISO, UTC if no offset)")
    p.add_argument("--to", dest="t_to", required=True, help="end of the window, exclusive (ISO)")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument("--compare", nargs="*", default=["reference"],
                   help="extra configurations to report (presets or JSON files; default: reference)")
    p.add_argument("--sweep-nodes", default="", help="comma list of cluster sizes to add for the tested config")
    p.add_argument("--lead-in-days", type=float, default=0.0,
                   help="start each replay this many days before its window; only the window's jobs are scored")
    p.add_argument("--episode-days", type=float, default=0.0,
                   help="replay independent windows of this many days (Mirage episodes: 5) instead of one "
                        "continuous run; each window starts warm or empty as its configuration says")
    add_config_arguments(p)


def too_big(wl: Workload, cfg: SimConfig, t_from: int, t_to: int, lead_in_s: int = 0) -> dict:
    """Jobs a replay of ``[t_from, t_to)`` would meet (submitted in the window or its
    lead-in, or still active at its start) that ask for more nodes than ``cfg`` has."""
    a = t_from - lead_in_s
    sel = (wl.submit < t_to) & ((wl.submit >= a) | (wl.real_start + wl.duration > a))
    big = sel & (wl.nodes > cfg.nodes)
    if not big.any():
        return {}
    sizes = np.unique(wl.nodes[big])
    return {"jobs": int(big.sum()), "largest_nodes": int(sizes.max()), "config_nodes": int(cfg.nodes)}


def replay(wl: Workload, cfg: SimConfig, t_from: int, t_to: int, lead_in_s: int = 0) -> pd.DataFrame:
    """Per-job real and simulated waits (s) of the jobs submitted in ``[t_from, t_to)``,
    replayed from ``t_from - lead_in_s``."""
    a = t_from - int(lead_in_s)
    sim = Simulator.from_workload(wl, cfg, a, t_to - 1)
    sim.drain()
    tags = np.asarray(sim.j_tag)
    starts = np.asarray(sim.j_start)
    keep = tags >= 0
    idx = tags[keep]
    submit = wl.submit[idx]
    inwin = (submit >= t_from) & (submit < t_to)
    idx, st = idx[inwin], starts[keep][inwin]
    order = np.argsort(idx, kind="stable")
    idx, st = idx[order], st[order]
    return pd.DataFrame({
        "job_id": wl.job_id[idx],
        "submit": wl.submit[idx],
        "real_wait_s": wl.real_start[idx] - wl.submit[idx],
        "sim_wait_s": np.maximum(st - wl.submit[idx], 0) + int(getattr(cfg, "dispatch_latency_s", 0)),
        "nodes": wl.nodes[idx],
    })


def replay_windows(wl: Workload, cfg: SimConfig, t_from: int, t_to: int, episode_days: float = 0.0,
                   lead_in_s: int = 0) -> pd.DataFrame:
    """:func:`replay` of the whole window, or of independent ``episode_days`` windows."""
    if episode_days > 0:
        step = int(round(episode_days * 86400))
        parts = [replay(wl, cfg, a, min(a + step, t_to), lead_in_s) for a in range(t_from, t_to, step)]
        return pd.concat(parts, ignore_index=True)
    return replay(wl, cfg, t_from, t_to, lead_in_s)


def _day_index(submit: np.ndarray, tz: str) -> np.ndarray:
    return pd.to_datetime(submit, unit="s", utc=True).tz_convert(tz).strftime("%Y-%m-%d").to_numpy()


def daily_corr(df: pd.DataFrame, tz: str = "UTC") -> float:
    """Pearson correlation of the real and simulated mean wait per day of submission."""
    if len(df) < 3:
        return float("nan")
    day = _day_index(df["submit"].to_numpy(), tz)
    g = df.groupby(day)[["real_wait_s", "sim_wait_s"]].mean()
    if len(g) < 3 or g["real_wait_s"].std() == 0 or g["sim_wait_s"].std() == 0:
        return float("nan")
    return float(np.corrcoef(g["real_wait_s"], g["sim_wait_s"])[0, 1])


def metrics(df: pd.DataFrame, tz: str = "UTC") -> dict:
    from scipy import stats

    if df.empty:
        return {"n": 0}
    r = df["real_wait_s"].to_numpy(dtype=float) / 3600
    s = df["sim_wait_s"].to_numpy(dtype=float) / 3600
    err = np.abs(s - r)
    rho = stats.spearmanr(r, s).statistic if len(r) > 2 and np.ptp(s) > 0 and np.ptp(r) > 0 else float("nan")
    return {
        "n": int(len(r)),
        "real_mean_h": float(r.mean()),
        "sim_mean_h": float(s.mean()),
        "mae_h": float(err.mean()),
        "medae_h": float(np.median(err)),
        "within_1h": float((err <= 1.0).mean()),
        "within_10m": float((err <= 1 / 6).mean()),
        "daily_corr": daily_corr(df, tz) if "submit" in df else float("nan"),
        "spearman": float(rho),
        "ks": float(stats.ks_2samp(r, s).statistic),
        # the same on whole minutes (sub-minute dispatch latency is at most a constant here)
        "ks_1min": float(stats.ks_2samp(np.floor(r * 60), np.floor(s * 60)).statistic),
        "zero_mae_h": float(r.mean()),
        "zero_medae_h": float(np.median(r)),
        "zero_within_1h": float((r <= 1.0).mean()),
        "zero_within_10m": float((r <= 1 / 6).mean()),
    }


def node_class(nodes: np.ndarray) -> np.ndarray:
    """Power-of-two node classes: "1", "2-3", "4-7", "8-15", ..."""
    nodes = np.asarray(nodes, dtype=np.int64)
    lo = 2 ** np.floor(np.log2(np.maximum(nodes, 1))).astype(np.int64)
    return np.array([("1" if a == 1 else f"{a}-{2 * a - 1}") for a in lo], dtype=object)


def _class_key(label: str) -> int:
    return int(label.split("-")[0])


def summarize(df: pd.DataFrame, tz: str = "UTC") -> dict:
    """Pooled, per-month (trace time zone) and per-node-class metrics of a replay frame."""
    month = pd.to_datetime(df["submit"], unit="s", utc=True).dt.tz_convert(tz).dt.strftime("%Y-%m")
    months = {m: metrics(g, tz) for m, g in df.groupby(month, sort=True)}
    cls = node_class(df["nodes"].to_numpy()) if len(df) else np.array([], dtype=object)
    classes = {c: metrics(g, tz) for c, g in sorted(df.groupby(cls), key=lambda kv: _class_key(kv[0]))}
    return {"pooled": metrics(df, tz), "months": months, "node_classes": classes}


def report(wl: Workload, cfg: SimConfig, t_from: int, t_to: int, episode_days: float = 0.0,
           lead_in_s: int = 0, tz: str = "UTC") -> tuple[dict, pd.DataFrame]:
    """Metrics per month, per node class and pooled, and the per-job frame."""
    t = time.perf_counter()
    df = replay_windows(wl, cfg, t_from, t_to, episode_days, lead_in_s)
    wall = time.perf_counter() - t
    rep = {"config": cfg.to_dict(), **summarize(df, tz), "replay_wall_s": round(wall, 2),
           "episode_days": episode_days, "lead_in_s": int(lead_in_s), "timezone": tz}
    return rep, df


COLS = [("n", "{:d}"), ("real_mean_h", "{:.2f}"), ("sim_mean_h", "{:.2f}"), ("mae_h", "{:.2f}"),
        ("zero_mae_h", "{:.2f}"), ("medae_h", "{:.2f}"), ("zero_medae_h", "{:.2f}"),
        ("within_1h", "{:.1%}"), ("zero_within_1h", "{:.1%}"), ("within_10m", "{:.1%}"),
        ("zero_within_10m", "{:.1%}"), ("daily_corr", "{:.2f}"), ("spearman", "{:.2f}"), ("ks", "{:.3f}"),
        ("ks_1min", "{:.3f}")]


def table(rows: list[tuple[str, dict]], first: str) -> list[str]:
    lines = [f"| {first} | " + " | ".join(c for c, _ in COLS) + " |", "|---|" + "---|" * len(COLS)]
    for m, r in rows:
        cells = []
        for c, fmt in COLS:
            v = r.get(c)
            cells.append("-" if v is None or (isinstance(v, float) and np.isnan(v)) else fmt.format(v))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def config_line(cfg: dict) -> str:
    return (f"nodes {cfg['nodes']}, backfill {cfg['backfill']} (interval {cfg['bf_interval_s']} s), "
            f"priority {cfg['priority']} (age weight {cfg['weight_age']:g}, size weight {cfg['weight_size']:g}), "
            f"age cap {cfg['age_cap']}, max jobs/user {cfg['max_jobs_per_user'] or '-'}, "
            f"max nodes/user {cfg['max_nodes_per_user'] or '-'}, tick {cfg['tick_s'] or 'event'}, "
            f"warm start {cfg['warm_start']}, dispatch latency {cfg.get('dispatch_latency_s', 0)} s, "
            f"age back-out {cfg.get('trace_age_backout', False)}")


def markdown(name: str, rep: dict) -> str:
    if "skipped" in rep:
        return f"### {name}\n\nSkipped: {rep['skipped']}\n"
    lines = [f"### {name}", "", config_line(rep["config"]) + f"; replay {rep['replay_wall_s']} s", "",
             f"Per month (submission, {rep.get('timezone', 'UTC')}):", ""]
    lines += table(list(rep["months"].items()) + [("pooled", rep["pooled"])], "month")
    lines += ["", "Per node class:", ""]
    lines += table(list(rep.get("node_classes", {}).items()), "nodes")
    return "\n".join(lines) + "\n"


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
    for n in [int(x) for x in args.sweep_nodes.split(",") if x.strip()]:
        configs[f"tested@{n}"] = cfg.replace(nodes=n)
    lead_in = int(round(args.lead_in_days * 86400))
    params = {"from": t_from.isoformat(), "to": t_to.isoformat(), "episode_days": args.episode_days,
              "lead_in_s": lead_in, "configs": {k: c.to_dict() for k, c in configs.items()}}
    wl = Workload.from_frame(df, cfg.procs_per_node or None)
    a, b = int(t_from.timestamp()), int(t_to.timestamp())
    big = too_big(wl, cfg, a, b, lead_in)
    if big:
        raise StepError(f"{big['jobs']} job(s) of the window ask for up to {big['largest_nodes']} nodes, more than "
                        f"the tested configuration's {cfg.nodes}: raise --nodes (or the config's 'nodes')")
    step = Step("fidelity", args.out, __version__, params, inputs=[args.trace])
    if step.skip():
        return 0
    tz = meta.timezone or "UTC"
    reports: dict[str, dict] = {}
    frames = []
    for name, c in configs.items():
        big = too_big(wl, c, a, b, lead_in)
        if big:
            msg = (f"{big['jobs']} job(s) of the window need up to {big['largest_nodes']} nodes; this configuration "
                   f"has {big['config_nodes']}")
            log.warning("fidelity: %s skipped: %s", name, msg)
            print(f"fidelity {name}: SKIPPED ({msg})", flush=True)
            reports[name] = {"config": c.to_dict(), "skipped": msg, **big, "pooled": {"n": 0}, "months": {},
                             "node_classes": {}}
            continue
        log.info("fidelity: replaying %s", name)
        reports[name], frame = report(wl, c, a, b, args.episode_days, lead_in, tz)
        frames.append(frame.assign(config=name))
        p = reports[name]["pooled"]
        print(f"fidelity {name}: n={p.get('n')} MAE {p.get('mae_h', float('nan')):.2f} h "
              f"(zero-wait {p.get('zero_mae_h', float('nan')):.2f} h), within 1 h "
              f"{p.get('within_1h', float('nan')):.1%} (zero-wait {p.get('zero_within_1h', float('nan')):.1%}), "
              f"Spearman {p.get('spearman', float('nan')):.2f}, daily corr {p.get('daily_corr', float('nan')):.2f}",
              flush=True)
    doc = {"trace_fingerprint": wl.fingerprint, **params, "timezone": tz, "reports": reports,
           "targets": {"mae_h_max": 2.5, "within_1h_min": 0.75, "spearman_min": 0.65, "daily_corr_min": 0.8}}
    step.write_json("fidelity.json", doc)
    waits = pd.concat(frames, ignore_index=True)
    waits = waits[["config", "job_id", "submit", "nodes", "real_wait_s", "sim_wait_s"]]
    waits["submit"] = pd.to_datetime(waits["submit"], unit="s", utc=True).astype("datetime64[s, UTC]")
    buf = io.BytesIO()
    waits.to_parquet(buf, index=False)
    step.write_bytes("waits.parquet", buf.getvalue())
    mode = (f"independent {args.episode_days:g}-day windows" if args.episode_days > 0 else "one continuous replay")
    if lead_in:
        mode += f", each with a {args.lead_in_days:g}-day lead-in"
    md = [f"# Simulator fidelity: jobs submitted {t_from:%Y-%m-%d} to {t_to:%Y-%m-%d} (exclusive), {mode}", "",
          "Per-job wait (start - submit) simulated vs real, hours. mae/medae: mean/median absolute error; "
          "within_1h/within_10m: share of jobs simulated within 1 h / 10 min of their real wait; daily_corr: "
          "correlation of the daily mean waits; spearman: rank correlation per job; ks: Kolmogorov-Smirnov "
          "distance of the two wait distributions (ks_1min on whole minutes). zero_*: the same figures for "
          "predicting no wait at all, the bar a useful simulator must clear. Targets: MAE <= 2.5 h, within 1 h "
          ">= 75 % and above the zero-wait predictor, Spearman >= 0.65, daily correlation >= 0.8. A "
          "configuration with trace_age_backout uses each job's real wait to correct its recorded priority, "
          "i.e. the outcome it is scored on.", ""]
    md += [markdown(name, rep) for name, rep in reports.items()]
    step.write_bytes("fidelity.md", "\n".join(md).encode())
    step.commit(summary={k: r.get("pooled", {"skipped": r.get("skipped")}) for k, r in reports.items()})
    return 0
