"""Simulator fidelity: replay a trace window and compare simulated with real per-job waits.

The library behind ``python -m mirage_tasks fidelity`` (:mod:`mirage_tasks.steps.fidelity`,
which documents the measures) and ``calibrate`` (:mod:`mirage_tasks.calibration.calibrate`).
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from ..sim.config import SimConfig
from ..sim.engine import Simulator
from ..sim.workload import Workload

log = logging.getLogger(__name__)


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
    # int64 even when the replay met no job (a month before or after the trace): an empty list is
    # a float array, and indexing with it raised IndexError
    tags = np.asarray(sim.j_tag, dtype=np.int64)
    starts = np.asarray(sim.j_start, dtype=np.int64)
    keep = tags >= 0
    idx = tags[keep]
    submit = wl.submit[idx]
    inwin = (submit >= t_from) & (submit < t_to)
    idx, st = idx[inwin], starts[keep][inwin]
    order = np.argsort(idx, kind="stable")
    idx, st = idx[order], st[order]
    return pd.DataFrame(
        {
            "job_id": wl.job_id[idx],
            "submit": wl.submit[idx],
            "real_wait_s": wl.real_start[idx] - wl.submit[idx],
            "sim_wait_s": np.maximum(st - wl.submit[idx], 0) + int(getattr(cfg, "dispatch_latency_s", 0)),
            "nodes": wl.nodes[idx],
        }
    )


def replay_windows(
    wl: Workload, cfg: SimConfig, t_from: int, t_to: int, episode_days: float = 0.0, lead_in_s: int = 0
) -> pd.DataFrame:
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


def report(
    wl: Workload, cfg: SimConfig, t_from: int, t_to: int, episode_days: float = 0.0, lead_in_s: int = 0, tz: str = "UTC"
) -> tuple[dict, pd.DataFrame]:
    """Metrics per month, per node class and pooled, and the per-job frame."""
    t = time.perf_counter()
    df = replay_windows(wl, cfg, t_from, t_to, episode_days, lead_in_s)
    wall = time.perf_counter() - t
    rep = {
        "config": cfg.to_dict(),
        **summarize(df, tz),
        "replay_wall_s": round(wall, 2),
        "episode_days": episode_days,
        "lead_in_s": int(lead_in_s),
        "timezone": tz,
    }
    return rep, df


COLS = [
    ("n", "{:d}"),
    ("real_mean_h", "{:.2f}"),
    ("sim_mean_h", "{:.2f}"),
    ("mae_h", "{:.2f}"),
    ("zero_mae_h", "{:.2f}"),
    ("medae_h", "{:.2f}"),
    ("zero_medae_h", "{:.2f}"),
    ("within_1h", "{:.1%}"),
    ("zero_within_1h", "{:.1%}"),
    ("within_10m", "{:.1%}"),
    ("zero_within_10m", "{:.1%}"),
    ("daily_corr", "{:.2f}"),
    ("spearman", "{:.2f}"),
    ("ks", "{:.3f}"),
    ("ks_1min", "{:.3f}"),
]


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
    return (
        f"nodes {cfg['nodes']}, backfill {cfg['backfill']} (interval {cfg['bf_interval_s']} s), "
        f"priority {cfg['priority']} (age weight {cfg['weight_age']:g}, size weight {cfg['weight_size']:g}), "
        f"age cap {cfg['age_cap']}, max jobs/user {cfg['max_jobs_per_user'] or '-'}, "
        f"max nodes/user {cfg['max_nodes_per_user'] or '-'}, tick {cfg['tick_s'] or 'event'}, "
        f"warm start {cfg['warm_start']}, dispatch latency {cfg.get('dispatch_latency_s', 0)} s, "
        f"age back-out {cfg.get('trace_age_backout', False)}"
        + (
            f", nodes in service: the {cfg['capacity_quantile']:g} quantile of the trace's busy nodes over the "
            f"past {cfg['capacity_window_s']} s (re-read every {cfg.get('capacity_step_s', 3600)} s)"
            if cfg.get("capacity_window_s")
            else ""
        )
        + (
            f", short partition for limits <= {cfg['short_partition_limit_s']} s"
            if cfg.get("short_partition_limit_s")
            else ""
        )
        + (
            f", holds inferred from real starts within {cfg.get('holds_tolerance_s', 60)} s of a predecessor's "
            f"end (reads the outcome: a reconstruction)"
            if cfg.get("holds", "none") != "none"
            else ""
        )
    )


def markdown(name: str, rep: dict) -> str:
    if "skipped" in rep:
        return f"### {name}\n\nSkipped: {rep['skipped']}\n"
    lines = [
        f"### {name}",
        "",
        config_line(rep["config"]) + f"; replay {rep['replay_wall_s']} s",
        "",
        f"Per month (submission, {rep.get('timezone', 'UTC')}):",
        "",
    ]
    lines += table(list(rep["months"].items()) + [("pooled", rep["pooled"])], "month")
    lines += ["", "Per node class:", ""]
    lines += table(list(rep.get("node_classes", {}).items()), "nodes")
    return "\n".join(lines) + "\n"
