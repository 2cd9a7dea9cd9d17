"""What the kept chains add up to, with intervals: per policy over every link of every chain
(of one keep-service run, or of several runs: one per window), and each policy against
``reactive``, ``avg-cal`` and ``avg`` (where run) on the same links.

A link is one decision: the successor of a predecessor, signed interruption = successor start
minus predecessor end (trace hours). Links of one chain are not independent (a link's
predecessor is the previous link's successor) and chains of one run share a background, so
the intervals are a cluster bootstrap over chains: a resample draws whole chains (a run and a
chain index), with every link they hold. Pairing: policy ``p``'s link ``k`` of chain ``c`` in
run ``r`` is set against the reference's link with the same ``(r, c, k)``: submitted at the
same instant into the same background (the chains of one index start together).

"Interrupted" is a successor starting more than :func:`interrupted_h` after its predecessor's
end: a minute, or two real seconds of the compressed cluster where that is longer (Slurm's
clock has whole seconds and its dispatch takes about one; at x180 two real seconds are six
trace minutes, so a successor started "at once" is not counted as an interruption).
Objective: interruption h + ``w`` x wasted node-hours (protocol v2's, ``w`` = 0.1).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..evaluation.rules import INTERRUPTED_H, interrupted_share, per_sample_objective, verdict

#: Real seconds of a compressed cluster within which a successor's start counts as on time.
DISPATCH_REAL_S = 2.0
W = 0.1
REFERENCES = ("reactive", "avg-cal", "avg")


def interrupted_h(factor: float) -> float:
    return max(INTERRUPTED_H, DISPATCH_REAL_S * float(factor) / 3600.0)


def _boot(values: np.ndarray, units: np.ndarray, n_boot: int, rng: np.random.Generator) -> tuple[float, float]:
    """Mean of ``values`` and its 95 % cluster-bootstrap interval over ``units``."""
    keys, inv = np.unique(units, return_inverse=True)
    if len(keys) < 2 or n_boot < 1:
        return math.nan, math.nan
    sums = np.bincount(inv, weights=values, minlength=len(keys))
    counts = np.bincount(inv, minlength=len(keys)).astype(float)
    idx = rng.integers(0, len(keys), size=(n_boot, len(keys)))
    means = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def summary(
    frame: pd.DataFrame, factor: float, node: int, w: float = W, n_boot: int = 2000, seed: int = 0
) -> list[dict]:
    """One row per policy (``frame``: the links of :meth:`Session.links`, optionally with a
    ``run`` column naming the window each came from)."""
    if frame.empty:
        return []
    f = frame.copy()
    f["chain"] = f["chain"].astype(int) if "chain" in f else 0
    f["run"] = f["run"].astype(str) if "run" in f else ""
    f["unit"] = f["run"] + "#" + f["chain"].astype(str)  # a bootstrap unit: one chain of one run
    f["objective"] = per_sample_objective(f["signed_interruption_h"].to_numpy(float), node, w)
    tol = interrupted_h(factor)
    rng = np.random.default_rng(seed)
    rows = []
    key = ["run", "chain", "link"]
    for p, g in f.groupby("policy", sort=False):
        s = g["signed_interruption_h"].to_numpy(float)
        units = g["unit"].to_numpy()
        row = {
            "policy": p,
            "links": int(len(g)),
            "chains": int(g["unit"].nunique()),
            "runs": int(g["run"].nunique()),
            "early": int((~g["forced"].astype(bool)).sum()),
            "interrupted_h_threshold": tol,
        }
        for col, vals in (
            ("interruption_h", np.maximum(s, 0.0)),
            ("wasted_node_h", g["wasted_node_h"].to_numpy(float)),
            ("objective", g["objective"].to_numpy(float)),
        ):
            lo, hi = _boot(vals, units, n_boot, rng)
            row.update({col: float(vals.mean()), f"{col}_lo": lo, f"{col}_hi": hi})
        share = interrupted_share(s, tol)
        row.update(
            interrupted=share["interrupted_share"],
            interrupted_lo=share["interrupted_lo"],
            interrupted_hi=share["interrupted_hi"],
        )
        for ref in REFERENCES:
            if ref == p or ref not in set(f["policy"]):
                continue
            m = g[key + ["objective", "unit"]].merge(
                f[f["policy"] == ref][key + ["objective"]], on=key, suffixes=("", "_ref")
            )
            d = (m["objective"] - m["objective_ref"]).to_numpy(float)
            lo, hi = _boot(d, m["unit"].to_numpy(), n_boot, rng)
            row.update(
                {
                    f"vs_{ref}": float(d.mean()) if len(d) else math.nan,
                    f"vs_{ref}_lo": lo,
                    f"vs_{ref}_hi": hi,
                    f"vs_{ref}_n": int(len(d)),
                    f"vs_{ref}_verdict": verdict(lo, hi) if lo == lo else "one chain: no interval",
                }
            )
        if "sim_signed_interruption_h" in g:
            sim = g["sim_signed_interruption_h"].to_numpy(float)
            ok = np.isfinite(sim)
            row["sim_links"] = int(ok.sum())
            row["sim_interruption_h"] = float(np.maximum(sim[ok], 0).mean()) if ok.any() else math.nan
            row["sim_objective"] = float(per_sample_objective(sim[ok], node, w).mean()) if ok.any() else math.nan
            row["real_objective_same_links"] = (
                float(g["objective"].to_numpy(float)[ok].mean()) if ok.any() else math.nan
            )
        rows.append(row)
    return rows


def _ci(v: float, lo: float, hi: float, fmt: str = "{:.2f}") -> str:
    if v != v:
        return "-"
    return fmt.format(v) + ("" if lo != lo else f" [{fmt.format(lo)}, {fmt.format(hi)}]")


def markdown(rows: list[dict]) -> list[str]:
    """The summary table (lines of markdown): a "vs" column per reference that was run."""
    if not rows:
        return []
    tol = rows[0]["interrupted_h_threshold"]
    refs = [ref for ref in REFERENCES if any(r["policy"] == ref for r in rows)]
    out = [
        f"Per policy over every link (95 % intervals: a bootstrap over chains; interrupted: a successor "
        f"starting over {tol * 60:.0f} trace min after its predecessor's end, Clopper-Pearson; objective: "
        f"interruption h + {W} x wasted node-h; vs: the objective's paired difference on the same links, "
        "negative = better):",
        "",
        "| policy | runs | chains | links | submitted early | mean interruption (h) | interrupted | wasted node-h "
        "| objective | " + " | ".join(f"vs {ref}" for ref in refs) + " | simulator: objective (same links, real) |",
        "|---|---|---|---|---|---|---|---|---|" + "---|" * len(refs) + "---|",
    ]
    for r in rows:
        vs = []
        for ref in refs:
            if f"vs_{ref}" not in r:
                vs.append("-")
                continue
            vs.append(
                f"{_ci(r[f'vs_{ref}'], r[f'vs_{ref}_lo'], r[f'vs_{ref}_hi'], '{:+.2f}')} ({r[f'vs_{ref}_verdict']})"
            )
        sim = "-"
        if r.get("sim_links"):
            sim = f"{r['sim_objective']:.2f} ({r['real_objective_same_links']:.2f}), {r['sim_links']} links"
        out.append(
            f"| {r['policy']} | {r['runs']} | {r['chains']} | {r['links']} | {r['early']} | "
            f"{_ci(r['interruption_h'], r['interruption_h_lo'], r['interruption_h_hi'])} | "
            f"{_ci(r['interrupted'], r['interrupted_lo'], r['interrupted_hi'], '{:.0%}')} | "
            f"{_ci(r['wasted_node_h'], r['wasted_node_h_lo'], r['wasted_node_h_hi'])} | "
            f"{_ci(r['objective'], r['objective_lo'], r['objective_hi'])} | " + " | ".join(vs) + f" | {sim} |"
        )
    return out


def jsonable(rows: list[dict]) -> list[dict]:
    """``rows`` with every NaN as None (JSON has no NaN)."""
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in rows]
