"""``python -m mirage_tasks metrics``: interruption metrics per model, node size and load level.

``--in`` takes committed ``validate`` outputs (any models, baselines, node sizes and
shards). Samples are matched across models by ``(node, sample_start)``; runs of one node
size must share the trace, the cluster configuration, the warm-up and the workload span
(else their numbers are not comparable and the step stops). The **load
level** of a sample is set by the *reactive* baseline's interruption on the same sample:
``low`` <= 2 h, ``medium`` 2-12 h, ``heavy`` > 12 h; so every node size needs reactive
rows covering every sample of every model (a clear error names what is missing).

Per model x node x level (``all`` = every sample), with ``s`` the signed interruption
(successor start - predecessor end, hours):

| column | definition |
|---|---|
| ``n`` | samples |
| ``mean_signed_h`` | mean of ``s`` |
| ``mean_interruption_h``, ``median_interruption_h`` | mean / median of ``max(s, 0)`` |
| ``mean_overlap_h`` | mean of ``max(-s, 0)`` |
| ``mean_wasted_node_h`` | mean of ``node x max(-s, 0)`` |
| ``zero_share`` | share of samples with ``s <= 0`` (successor started no later than the predecessor ended) |
| ``reduction_vs_reactive`` | ``1 - mean_interruption_h / reactive mean_interruption_h`` on the same samples (None when the reactive mean is 0) |
| ``backfilled_share``, ``forced_share`` | share of successors started by backfill / submitted because the predecessor ended |
| ``diff_vs_avg_h`` | mean over samples of (model interruption - the ``avg`` baseline's interruption on the same sample); < 0: the model interrupts less than ``avg`` |
| ``wasted_diff_vs_avg`` | the same paired difference of wasted node-hours |
| ``*_ci_lo``, ``*_ci_hi`` | paired bootstrap 95% percentile intervals of mean interruption, zero share and reduction: samples are resampled with replacement, the same draw for the model and the reactive (or ``avg``) baseline (``--bootstrap`` draws, seeded by ``--seed``, the node, level and model name) |

Outputs under ``--out``: ``metrics.json`` (parameters, level counts, rows), ``metrics.parquet``
and ``metrics.csv`` (the rows), ``metrics.md`` (one table per node size) and
``samples.parquet`` (every validation row with its level and the reactive interruption, for
the report), then ``_SUCCESS.json``.
"""

from __future__ import annotations

import logging
import zlib
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError

from ..data.artifacts import load_rows
from ..sim import decision_rules as dr
from ..sim.probes import BASELINES

log = logging.getLogger(__name__)

LEVELS = ("all", "low", "medium", "heavy")
LOW_MAX_H = 2.0
MEDIUM_MAX_H = 12.0
# validate parameters that must agree between compared runs of one node size
SAME_SIM = ("warmup_days", "workload_days", "config")

COLUMNS = [
    "model",
    "node",
    "level",
    "n",
    "mean_signed_h",
    "mean_interruption_h",
    "mean_interruption_ci_lo",
    "mean_interruption_ci_hi",
    "median_interruption_h",
    "mean_overlap_h",
    "mean_wasted_node_h",
    "zero_share",
    "zero_share_ci_lo",
    "zero_share_ci_hi",
    "reduction_vs_reactive",
    "reduction_ci_lo",
    "reduction_ci_hi",
    "reactive_mean_interruption_h",
    "backfilled_share",
    "forced_share",
    "diff_vs_avg_h",
    "diff_vs_avg_ci_lo",
    "diff_vs_avg_ci_hi",
    "wasted_diff_vs_avg",
    "wasted_diff_vs_avg_ci_lo",
    "wasted_diff_vs_avg_ci_hi",
]


def level_of(reactive_interruption_h: np.ndarray) -> np.ndarray:
    """low <= 2 h < medium <= 12 h < heavy."""
    x = np.asarray(reactive_interruption_h, dtype=np.float64)
    return np.where(x <= LOW_MAX_H, "low", np.where(x <= MEDIUM_MAX_H, "medium", "heavy"))


def load_inputs(uris: list[str]) -> tuple[pd.DataFrame, list[dict]]:
    """All validation rows (with the run's parameters checked for consistency) and the run infos."""
    frames, runs = [], []
    for uri in uris:
        rows, info, marker = load_rows(uri)
        p = marker["params"]
        rows = rows.copy()
        rows["_run"] = len(runs)
        frames.append(rows)
        runs.append(
            {
                "uri": uri,
                "model": p["model"],
                "model_kind": p["model_kind"],
                "node": int(p["node"]),
                "shard": p["shard"],
                "fingerprint": marker["fingerprint"],
                "trace_fingerprint": info.get("trace_fingerprint"),
                "params": p,
                "n": int(len(rows)),
            }
        )
    if not frames:
        raise StepError("no validate outputs given")
    df = pd.concat(frames, ignore_index=True)
    # one simulator per node size: compared runs must replay the same trace the same way
    for node in sorted({r["node"] for r in runs}):
        rs = [r for r in runs if r["node"] == node]
        ref = rs[0]
        for r in rs[1:]:
            diff = [k for k in SAME_SIM if r["params"].get(k) != ref["params"].get(k)]
            if r["trace_fingerprint"] != ref["trace_fingerprint"]:
                diff.append("trace")
            if diff:
                raise StepError(
                    f"node {node}: {r['uri']} ({r['model']}) and {ref['uri']} ({ref['model']}) were "
                    f"validated differently ({', '.join(diff)}); their metrics are not comparable"
                )
    dup = df.duplicated(["model", "node", "sample_start"], keep=False)
    if dup.any():
        d = df[dup].iloc[0]
        raise StepError(
            f"{int(dup.sum())} duplicated (model, node, sample start) rows, e.g. {d['model']} node "
            f"{d['node']} at {pd.Timestamp(int(d['sample_start']), unit='s', tz='UTC')}: the same "
            f"shard or model given twice?"
        )
    return df, runs


def attach_levels(df: pd.DataFrame) -> pd.DataFrame:
    """Rows with ``reactive_interruption_h`` and ``level``; errors when reactive rows are missing."""
    out = []
    for node, g in df.groupby("node", sort=True):
        react = g[g["model"] == dr.REACTIVE]
        if react.empty:
            have = sorted(g["model"].unique())
            raise StepError(
                f"node {node}: no reactive baseline rows (have {have}); the load levels and the "
                f"reduction need `validate --model reactive --node {node}` on the same samples"
            )
        ref = react.set_index("sample_start")["interruption_h"]
        missing = sorted(set(g["sample_start"]) - set(ref.index))
        if missing:
            first = [pd.Timestamp(int(t), unit="s", tz="UTC").isoformat() for t in missing[:3]]
            who = sorted(g[g["sample_start"].isin(missing)]["model"].unique())
            raise StepError(
                f"node {node}: {len(missing)} sample(s) of {who} have no reactive row (e.g. {first}); "
                f"validate reactive on the same --start/--count/--interval-hours"
            )
        g = g.copy()
        g["reactive_interruption_h"] = ref.reindex(g["sample_start"]).to_numpy()
        avg = g[g["model"] == dr.AVG].set_index("sample_start")
        # the avg baseline on the same sample (NaN where it was not validated): paired differences
        g["avg_interruption_h"] = (
            avg["interruption_h"].reindex(g["sample_start"]).to_numpy(np.float64) if not avg.empty else np.nan
        )
        g["avg_wasted_node_h"] = (
            avg["wasted_node_h"].reindex(g["sample_start"]).to_numpy(np.float64) if not avg.empty else np.nan
        )
        g["level"] = level_of(g["reactive_interruption_h"].to_numpy())
        out.append(g)
    return pd.concat(out, ignore_index=True)


def model_order(models: list[str]) -> list[str]:
    base = [m for m in BASELINES if m in models]
    return base + sorted(m for m in models if m not in BASELINES)


def _ci(values: np.ndarray) -> tuple[float | None, float | None]:
    v = values[np.isfinite(values)]
    if len(v) == 0 or len(v) < 0.5 * len(values):
        return None, None
    lo, hi = np.percentile(v, [2.5, 97.5])
    return float(lo), float(hi)


def _f(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def group_metrics(g: pd.DataFrame, node: int, n_boot: int, rng: np.random.Generator | None) -> dict[str, Any]:
    s = g["signed_interruption_h"].to_numpy(np.float64)
    gap = np.maximum(s, 0.0)
    ovl = np.maximum(-s, 0.0)
    zero = (s <= 0).astype(np.float64)
    react = g["reactive_interruption_h"].to_numpy(np.float64)
    rmean = float(react.mean())
    red = 1.0 - gap.mean() / rmean if rmean > 0 else float("nan")
    row = {
        "n": int(len(s)),
        "mean_signed_h": float(s.mean()),
        "mean_interruption_h": float(gap.mean()),
        "median_interruption_h": float(np.median(gap)),
        "mean_overlap_h": float(ovl.mean()),
        "mean_wasted_node_h": float(node * ovl.mean()),
        "zero_share": float(zero.mean()),
        "reduction_vs_reactive": _f(red),
        "reactive_mean_interruption_h": rmean,
        "backfilled_share": float(g["backfilled"].astype(float).mean()),
        "forced_share": float(g["forced"].astype(float).mean()),
        "mean_interruption_ci_lo": None,
        "mean_interruption_ci_hi": None,
        "zero_share_ci_lo": None,
        "zero_share_ci_hi": None,
        "reduction_ci_lo": None,
        "reduction_ci_hi": None,
    }
    a_gap = g["avg_interruption_h"].to_numpy(np.float64) if "avg_interruption_h" in g else np.full(len(s), np.nan)
    a_waste = g["avg_wasted_node_h"].to_numpy(np.float64) if "avg_wasted_node_h" in g else np.full(len(s), np.nan)
    paired = bool(len(s)) and bool(np.isfinite(a_gap).all())
    d_gap = gap - a_gap if paired else None
    d_waste = node * ovl - a_waste if paired else None
    row.update(
        {
            "diff_vs_avg_h": float(d_gap.mean()) if paired else None,
            "diff_vs_avg_ci_lo": None,
            "diff_vs_avg_ci_hi": None,
            "wasted_diff_vs_avg": float(d_waste.mean()) if paired else None,
            "wasted_diff_vs_avg_ci_lo": None,
            "wasted_diff_vs_avg_ci_hi": None,
        }
    )
    if rng is not None and n_boot > 0 and len(s) > 1:
        idx = rng.integers(0, len(s), size=(n_boot, len(s)))
        if paired:  # the same resampled samples for the model and avg
            row["diff_vs_avg_ci_lo"], row["diff_vs_avg_ci_hi"] = _ci(d_gap[idx].mean(axis=1))
            row["wasted_diff_vs_avg_ci_lo"], row["wasted_diff_vs_avg_ci_hi"] = _ci(d_waste[idx].mean(axis=1))
        m_b = gap[idx].mean(axis=1)
        r_b = react[idx].mean(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            red_b = np.where(r_b > 0, 1.0 - m_b / np.where(r_b > 0, r_b, 1.0), np.nan)
        row["mean_interruption_ci_lo"], row["mean_interruption_ci_hi"] = _ci(m_b)
        row["zero_share_ci_lo"], row["zero_share_ci_hi"] = _ci(zero[idx].mean(axis=1))
        if rmean > 0:
            row["reduction_ci_lo"], row["reduction_ci_hi"] = _ci(red_b)
    return row


def never_submits(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Learned models that never submitted before the predecessor ended on any sample of a node size
    (every submission forced): online they are the reactive baseline, whatever they learned."""
    out = []
    for r in records(table[(table["level"] == "all") & ~table["model"].isin(BASELINES)]):
        if r["forced_share"] is not None and r["forced_share"] >= 1.0:
            out.append({"model": r["model"], "node": int(r["node"]), "n": int(r["n"])})
    return out


def compute(df: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(metrics rows, samples with levels, level counts per node) from validation rows."""
    samples = attach_levels(df)
    rows = []
    for node in sorted(samples["node"].unique()):
        g_node = samples[samples["node"] == node]
        for model in model_order(list(g_node["model"].unique())):
            g_model = g_node[g_node["model"] == model]
            for li, level in enumerate(LEVELS):
                g = g_model if level == "all" else g_model[g_model["level"] == level]
                if g.empty:
                    continue
                g = g.sort_values("sample_start")
                rng = np.random.default_rng([seed, int(node), li, zlib.crc32(model.encode())])
                rows.append(
                    {"model": model, "node": int(node), "level": level, **group_metrics(g, int(node), n_boot, rng)}
                )
    table = pd.DataFrame(rows, columns=COLUMNS)
    for c in COLUMNS[4:]:  # a stable schema: float64, NaN where undefined (None in JSON)
        table[c] = pd.to_numeric(table[c], errors="coerce").astype("float64")
    table["n"] = table["n"].astype("int64")
    table["node"] = table["node"].astype("int64")
    counts: dict[str, dict[str, int]] = {}
    for node, g in samples[samples["model"] == dr.REACTIVE].groupby("node", sort=True):
        vc = g["level"].value_counts()
        counts[str(int(node))] = {lv: int(vc.get(lv, 0)) for lv in LEVELS[1:]}
    samples = samples.drop(columns=[c for c in samples.columns if c.startswith("_")])
    return table, samples, counts


# ----------------------------------------------------------------------------- formatting


def _num(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "-"
    return fmt.format(x)


def _with_ci(v: Any, lo: Any, hi: Any, fmt: str) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    if lo is None or hi is None or (isinstance(lo, float) and not np.isfinite(lo)):
        return fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


TABLE_HEAD = [
    "model",
    "level",
    "n",
    "mean interruption h [95% CI]",
    "median interruption h",
    "mean signed h",
    "mean overlap h",
    "wasted node-h",
    "zero interruption [95% CI]",
    "reduction vs reactive [95% CI]",
    "backfilled",
    "forced",
    "interruption - avg h [95% CI]",
    "wasted node-h - avg [95% CI]",
]


def table_cells(r: dict[str, Any]) -> list[str]:
    pct = "{:.0%}"
    return [
        str(r["model"]),
        str(r["level"]),
        str(int(r["n"])),
        _with_ci(r["mean_interruption_h"], r["mean_interruption_ci_lo"], r["mean_interruption_ci_hi"], "{:.2f}"),
        _num(r["median_interruption_h"]),
        _num(r["mean_signed_h"]),
        _num(r["mean_overlap_h"]),
        _num(r["mean_wasted_node_h"]),
        _with_ci(r["zero_share"], r["zero_share_ci_lo"], r["zero_share_ci_hi"], pct),
        _with_ci(r["reduction_vs_reactive"], r["reduction_ci_lo"], r["reduction_ci_hi"], pct),
        _num(r["backfilled_share"], pct),
        _num(r["forced_share"], pct),
        _with_ci(r.get("diff_vs_avg_h"), r.get("diff_vs_avg_ci_lo"), r.get("diff_vs_avg_ci_hi"), "{:+.2f}"),
        _with_ci(
            r.get("wasted_diff_vs_avg"), r.get("wasted_diff_vs_avg_ci_lo"), r.get("wasted_diff_vs_avg_ci_hi"), "{:+.2f}"
        ),
    ]


def _clean(r: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in r.items()}


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [_clean(r) for r in table.astype(object).where(table.notna(), None).to_dict("records")]


def markdown(table: pd.DataFrame, counts: dict, title: str = "# Mirage online validation metrics") -> str:
    lines = [
        title,
        "",
        "Hours; signed interruption = successor start - predecessor end (> 0 gap, < 0 overlap). "
        "Interruption = its positive part, overlap = its negative part; wasted node-h = node x overlap. "
        "Zero interruption: share of samples with signed <= 0. Reduction = 1 - mean interruption / the "
        "reactive baseline's on the same samples. Load level from the reactive interruption: low <= 2 h, "
        "medium 2-12 h, heavy > 12 h. Brackets: paired bootstrap 95% intervals.",
        "",
    ]
    for node in sorted(table["node"].unique()):
        c = counts.get(str(int(node)), {})
        lines += [
            f"## {int(node)}-node jobs",
            "",
            "Samples per level (reactive): " + ", ".join(f"{lv} {int(c.get(lv, 0))}" for lv in LEVELS[1:]),
            "",
            "| " + " | ".join(TABLE_HEAD) + " |",
            "|" + "---|" * len(TABLE_HEAD),
        ]
        for r in records(table[table["node"] == node]):
            lines.append("| " + " | ".join(table_cells(r)) + " |")
        lines.append("")
        for d in never_submits(table[table["node"] == node]):
            lines += [
                f"**{d['model']} never submitted before the predecessor ended** on any of its {d['n']} "
                f"{int(node)}-node samples: online it is the reactive baseline.",
                "",
            ]
    return "\n".join(lines)
