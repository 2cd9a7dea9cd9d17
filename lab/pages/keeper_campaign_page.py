"""docs/results/keeper-campaign.md from the outputs of ``lab/campaigns/keeper_campaign.py`` (the
service keeper on a real Slurm over several busy windows, with intervals)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from mirage_tasks.sim import decision_rules as dr

#: the campaign's run sets: output name -> what it set side by side
SETS = {
    "keep": "the model, avg-cal, avg and reactive",
    "keepwp": "the wait predictor's rules and reactive",
    "keepc": "the model, the guarantee rule, avg-cal and reactive, on 78 + 4 nodes (the chains bring their capacity)",
    "keepc2": "as `keepc`, its chains 25 trace hours later in the same windows (`--offset-hours 25`): other links",
    "keepc3": "as `keepc`, its chains 12.5 trace hours after the window's start (`--offset-hours 12.5`), the 4 added "
    "nodes drained until the first chain's predecessors are queued (`--late-extra-nodes`), and the model "
    "asked at its training probes' times (`--decide-at auto`, the default now)",
    "keepg": "the model, guarantee-cal (guarantee's test with a conformal margin calibrated for 10 % on "
    "training samples, asked at their probe times), guarantee and reactive, as `keepc3` with its chains "
    "6.25 trace hours after the window's start",
}
#: sets whose links are pooled into one table (the same policies and design, other links)
POOLS = {
    "keepc + keepc2": ("keepc", "keepc2"),
    "keepc3 + keepg": ("keepc3", "keepg"),
    "all four": ("keepc", "keepc2", "keepc3", "keepg"),
}
#: pools whose sets asked the model differently (its rows pool two deciders: the page says so)
MIXED_ASKING = {"all four"}


def _f(v, fmt="{:.2f}"):
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def _runs(root: Path, name: str) -> list[Path]:
    return sorted(p for p in root.glob(f"{name}-w*") if (p / "_SUCCESS.json").exists())


def moved_predictions(stored: pd.DataFrame, new: pd.DataFrame) -> dict[str, tuple[int, int]]:
    """Per policy: (links whose predicted signed interruption differs between a run's stored links
    and the same links predicted again, links)."""
    m = stored.merge(new, on=["policy", "chain", "link"], suffixes=("_old", ""))
    moved = (m["sim_signed_interruption_h_old"] - m["sim_signed_interruption_h"]).abs() > 1e-9
    return {p: (int(moved[m["policy"] == p].sum()), int((m["policy"] == p).sum())) for p in m["policy"].unique()}


def _frame(runs: list[Path]) -> tuple[pd.DataFrame, dict]:
    """A set's links over its runs, with the simulator's prediction from ``repredicted.parquet``
    (``python -m lab.campaigns.keeper_campaign repredict``: computed again from the stored run) where present."""
    frames, docs = [], {}
    for p in runs:
        w = p.name.split("-")[-1]
        docs[w] = json.loads((p / "keeper.json").read_text())
        again = p / "repredicted.parquet"
        stored = pd.read_parquet(p / "links.parquet")
        if again.exists():  # how many predicted interruptions the fix moved, per policy
            new = pd.read_parquet(again)
            docs[w]["repredicted"] = moved_predictions(stored, new)
            stored = new
        frames.append(stored.assign(run=w))
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), docs


KEY = ["run", "chain", "link"]


def _pool(frames: dict, docs_by_set: dict, names: tuple[str, ...]) -> tuple[pd.DataFrame, dict]:
    """The links of several sets as one set: each run renamed ``<set>-<window>``, so a chain of one
    set is never paired with, or resampled as, a chain of another."""
    fs = [frames[n].assign(run=n + "-" + frames[n]["run"].astype(str)) for n in names if n in frames]
    docs = {f"{n}-{w}": d for n in names if n in docs_by_set for w, d in docs_by_set[n].items()}
    return (pd.concat(fs, ignore_index=True) if fs else pd.DataFrame()), docs


def _gaps(a: pd.DataFrame, b: pd.DataFrame) -> pd.Series:
    """|signed interruption of a - of b| on the same (window, chain, link)."""
    m = a[KEY + ["signed_interruption_h"]].merge(b[KEY + ["signed_interruption_h"]], on=KEY, suffixes=("_a", "_b"))
    return (m["signed_interruption_h_a"] - m["signed_interruption_h_b"]).abs()


def _gap_words(d: pd.Series) -> str:
    return (
        f"{d.mean():.2f} h on average (median {d.median():.2f} h, max {d.max():.2f} h; "
        f"{(d <= 0.1).mean():.0%} within 6 minutes)"
    )


def _interruption_vs_reactive(f: pd.DataFrame, policy: str) -> tuple[float, float, float]:
    """Mean paired difference of interruption (h) of ``policy`` minus reactive on the same (window,
    chain, link), with its 95 % bootstrap over chains (keeper_stats' resampling)."""
    from mirage_tasks.slurm.keeper_stats import _boot

    g = f.assign(intr=np.maximum(f["signed_interruption_h"].to_numpy(float), 0.0))
    m = g[g["policy"] == policy][KEY + ["intr"]].merge(
        g[g["policy"] == dr.REACTIVE][KEY + ["intr"]], on=KEY, suffixes=("", "_r")
    )
    if m.empty:
        return math.nan, math.nan, math.nan
    d = (m["intr"] - m["intr_r"]).to_numpy(float)
    lo, hi = _boot(d, (m["run"].astype(str) + "#" + m["chain"].astype(str)).to_numpy(), 2000, np.random.default_rng(0))
    return float(d.mean()), lo, hi


def _verdict_facts(rows: list[dict], f: pd.DataFrame | None = None) -> list[dict]:
    """Per rule other than reactive, avg and avg-cal: the figures the issue's criterion reads (a rule
    that submits early, interrupts less than reactive with the interval excluding zero, at a waste no
    higher than avg's): its summary row, the paired interruption difference against reactive with its
    interval (``di``), the objective's verdict and the waste against avg's."""
    by = {r["policy"]: r for r in rows}
    out = []
    avg_waste = by.get("avg", {}).get("wasted_node_h")
    for p, r in by.items():
        if p in (dr.REACTIVE, dr.AVG, dr.AVG_CAL):
            continue
        lo, hi = r.get("vs_reactive_lo"), r.get("vs_reactive_hi")
        di = _interruption_vs_reactive(f, p) if f is not None and dr.REACTIVE in by else (math.nan,) * 3
        out.append(
            {
                "policy": p,
                "row": r,
                "reactive": by.get(dr.REACTIVE),
                "di": di,
                "di_below": di[2] == di[2] and di[2] < 0,
                "objective": "**better than reactive**"
                if hi is not None and hi == hi and hi < 0
                else (
                    "**worse than reactive**"
                    if lo is not None and lo == lo and lo > 0
                    else "no difference from reactive shown"
                ),
                "avg_waste": avg_waste,
                "waste_ok": avg_waste is None or r["wasted_node_h"] <= avg_waste + 1e-12,
            }
        )
    return out


def _di_text(di: tuple[float, float, float]) -> str:
    return f"{_f(di[0], '{:+.3f}')} h [{_f(di[1], '{:+.3f}')}, {_f(di[2], '{:+.3f}')}]"


def _objective_text(r: dict) -> str:
    return (
        f"{_f(r.get('vs_reactive'), '{:+.2f}')} [{_f(r.get('vs_reactive_lo'), '{:+.2f}')}, "
        f"{_f(r.get('vs_reactive_hi'), '{:+.2f}')}]"
    )


def _verdict_lines(rows: list[dict], f: pd.DataFrame | None = None) -> list[str]:
    """The issue's criterion, plainly, one line per rule (:func:`_verdict_facts`)."""
    out = []
    for v in _verdict_facts(rows, f):
        r, avg_waste = v["row"], v["avg_waste"]
        out.append(
            f"* **{v['policy']}**: submitted early in {r['early']} of {r['links']} links; interruption against "
            f"reactive's on the same links {_di_text(v['di'])}"
            + (" (below reactive's, the interval excluding zero)" if v["di_below"] else " (not shown below reactive's)")
            + "; interrupted "
            f"{_f(r['interrupted'], '{:.0%}')} [{_f(r['interrupted_lo'], '{:.0%}')}, "
            f"{_f(r['interrupted_hi'], '{:.0%}')}] against reactive's "
            f"{_f(v['reactive']['interrupted'], '{:.0%}') if v['reactive'] else '-'}; objective against "
            f"reactive {_objective_text(r)}: {v['objective']}"
            + (
                f"; waste {r['wasted_node_h']:.2f} node-h per link"
                + (
                    f" (avg's {avg_waste:.2f}: {'no higher' if v['waste_ok'] else 'higher'})"
                    if avg_waste is not None
                    else ""
                )
            )
            + "."
        )
    return out


def _links_table(f: pd.DataFrame, docs: dict) -> list[str]:
    out = [
        "| window | policy | chain | pred wait (h) | decision lead (h) | signed interruption (h) | wasted node-h "
        "| forced | sim: lead (h) | sim: signed (h) | rule output at submit (h) |",
        "|" + "---|" * 11,
    ]
    for r in f.sort_values(["run", "chain", "policy"]).to_dict("records"):
        fac = docs[r["run"]]["factor"]
        pw = (r["pred_start"] - r["pred_submit"]) * fac / 3600
        out.append(
            f"| {r['run']} | {r['policy']} | {r.get('chain', 0)} | {pw:.2f} | {r['decision_lead_trace_h']:.2f} | "
            f"{r['signed_interruption_h']:+.2f} | {r['wasted_node_h']:.2f} | {r['forced']} | "
            f"{_f(r.get('sim_decision_lead_h'))} | {_f(r.get('sim_signed_interruption_h'), '{:+.2f}')} | "
            f"{_f(r.get('model_output'), '{:+.2f}')} |"
        )
    return out


def _sim_agreement(f: pd.DataFrame) -> list[str]:
    """Per policy: how often the simulator's prediction for the same chain (given the background
    Slurm ran) lands within 0.5 h / 1 h of Slurm's signed interruption, and whether it submits early."""
    out = [
        "| policy | links | sim within 0.5 h | sim within 1 h | mean real signed (h) | mean sim signed (h) "
        "| early: real / sim |",
        "|---|---|---|---|---|---|---|",
    ]
    for p, g in f.groupby("policy", sort=False):
        s = g["sim_signed_interruption_h"].to_numpy(float)
        r = g["signed_interruption_h"].to_numpy(float)
        ok = np.isfinite(s)
        d = np.abs(s[ok] - r[ok])
        early_sim = int((g["sim_decision_lead_h"].to_numpy(float)[ok] > 1e-9).sum())
        out.append(
            f"| {p} | {int(ok.sum())} | {_f(float((d <= 0.5).mean()) if ok.any() else None, '{:.0%}')} | "
            f"{_f(float((d <= 1).mean()) if ok.any() else None, '{:.0%}')} | {_f(float(r.mean()), '{:+.2f}')} | "
            f"{_f(float(s[ok].mean()) if ok.any() else None, '{:+.2f}')} | "
            f"{int((~g['forced'].astype(bool)).sum())} / {early_sim} |"
        )
    return out


def _waits(a: Path, b: Path) -> dict | None:
    """The same background jobs' Slurm waits in two runs of one window (trace h): those started in
    both, submitted before either run's last start; the mean difference with a bootstrap interval
    over jobs (2,000 resamples, seed 0)."""
    if not (a.exists() and b.exists()):
        return None
    x, y = pd.read_parquet(a), pd.read_parquet(b)
    m = x.merge(y, on="trace_job_id", suffixes=("_a", "_b"))
    m = m[m["start_t_a"].notna() & m["start_t_b"].notna() & (m["kind_a"] == "window")]
    m = m[m["submit_t_b"] <= min(float(x["start_t"].max()), float(y["start_t"].max()))]
    wa = ((m["start_t_a"] - m["submit_t_a"]) / 3600).to_numpy(float)
    wb = ((m["start_t_b"] - m["submit_t_b"]) / 3600).to_numpy(float)
    d = wa - wb
    boot = d[np.random.default_rng(0).integers(0, len(d), size=(2000, len(d)))].mean(1)
    return {
        "n": len(m),
        "d": d,
        "mean_a": wa.mean(),
        "mean_b": wb.mean(),
        "med_a": np.median(wa),
        "med_b": np.median(wb),
        "d_mean": d.mean(),
        "d_lo": float(np.quantile(boot, 0.025)),
        "d_hi": float(np.quantile(boot, 0.975)),
        "d_med": np.median(d),
        "in1h": (np.abs(d) <= 1).mean(),
        "in6m": (np.abs(d) <= 0.1).mean(),
    }


NO_CHAINS, AGAIN = "no chains", "no chains, again"


def _distortion(lo: float, hi: float, spread: float) -> str:
    """The verdict on a with-chains minus without-chains interval [lo, hi] of the background's mean
    wait (h), against Slurm's own spread (the no-chains pair's interval's reach from zero)."""
    if lo > spread:
        return (
            "**the chains lengthen the background's mean wait beyond Slurm's own spread**: the background "
            "the policies were judged on is busier than the log's window by about that much"
        )
    if hi < -spread:
        return "**the chains shorten the background's mean wait beyond Slurm's own spread**"
    if -spread <= lo and hi <= spread:
        return "**no distortion beyond Slurm's own spread**: the whole interval lies within it"
    return "the chains' effect is not separated from Slurm's own spread either way"


def _background_effect(root: Path) -> list[str]:
    """The first window's background: with the chains of set ``keep`` (4 policies), of set ``keepwp``
    (3) and without any (``replay-w1-nochains``, and ``replay-w1-nochains2`` where run twice): the
    same trace jobs' waits on Slurm, pair by pair. The two runs without chains are Slurm's own spread
    on the same load: the yardstick the runs with chains are read against."""
    bg = {
        "keep (4 chains at a time)": root / "keep-w1" / "background.parquet",
        "keepwp (3 chains at a time)": root / "keepwp-w1" / "background.parquet",
        "keepc (4 chains at a time, 78 + 4 nodes)": root / "keepc-w1" / "background.parquet",
        NO_CHAINS: root / "replay-w1-nochains" / "jobs.parquet",
        AGAIN: root / "replay-w1-nochains2" / "jobs.parquet",
    }
    names = list(bg)
    chained = [a for a in names if a not in (NO_CHAINS, AGAIN)]
    rows, res = [], {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            r = _waits(bg[a], bg[b])
            if r is not None:
                res[(a, b)] = r
                rows.append(
                    f"| {a} | {b} | {r['n']} | {r['mean_a']:.2f} / {r['mean_b']:.2f} | "
                    f"{r['med_a']:.2f} / {r['med_b']:.2f} | {r['d_mean']:+.2f} [{r['d_lo']:+.2f}, "
                    f"{r['d_hi']:+.2f}] | {r['d_med']:+.2f} | {r['in1h']:.0%} | {r['in6m']:.0%} |"
                )
    if not rows:
        return ["(not run: no replay of the first window without chains)"]
    out = [
        "Window w1's background jobs started in both runs of a pair (submitted before either run's last start); "
        "waits on Slurm in trace hours (the interval is a bootstrap over jobs, which treats them as independent: "
        "too narrow for jobs that queue together, so the two runs without chains, where run twice, are the "
        "yardstick):",
        "",
        "| run A | run B | jobs | mean wait A / B | median wait A / B | A - B: mean [95 %] | A - B: median | "
        "within 1 h | within 6 min |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    base = res.get((NO_CHAINS, AGAIN))
    withc = [(a, res[(a, NO_CHAINS)]) for a in chained if (a, NO_CHAINS) in res]
    if base is not None and withc:
        # Slurm's spread: the widest the no-chains pair's interval reaches from zero
        spread = max(abs(base["d_lo"]), abs(base["d_hi"]))
        out += [
            "",
            f"Slurm against itself without chains: the two runs' mean waits differ by {base['d_mean']:+.2f} h "
            f"[{base['d_lo']:+.2f}, {base['d_hi']:+.2f}] (median {base['d_med']:+.2f} h, {base['in1h']:.0%} of jobs "
            f"within 1 h): Slurm's own spread reaches {spread:.2f} h. With chains against the first run without:",
            "",
        ]
        for a, r in withc:
            v = _distortion(r["d_lo"], r["d_hi"], spread)
            med = (
                f" (median {r['d_med']:+.2f} h: the difference sits in the long waits)"
                if abs(r["d_med"]) <= 0.1 and abs(r["d_mean"]) > spread
                else ""
            )
            out.append(f"* {a}: {r['d_mean']:+.2f} h [{r['d_lo']:+.2f}, {r['d_hi']:+.2f}]: {v}{med}.")
    return out


def _background_by_window(root: Path, windows: list[str]) -> list[str]:
    """Every window replayed without chains (``replay-<w>-nochains``) against each set's run of it
    with chains: the background's mean wait with minus without, per window and pooled over the
    windows (the same jobs; intervals a bootstrap over jobs, too narrow as above), each read against
    Slurm's own spread measured on the first window."""
    base = _waits(root / "replay-w1-nochains" / "jobs.parquet", root / "replay-w1-nochains2" / "jobs.parquet")
    have = [w for w in windows if (root / f"replay-{w}-nochains" / "jobs.parquet").exists()]
    if base is None or len(have) < 2:
        return []
    spread = max(abs(base["d_lo"]), abs(base["d_hi"]))
    rows, verdicts = [], []
    for name in SETS:
        pooled = []
        for w in have:
            a = root / f"{name}-{w}" / "background.parquet"
            r = _waits(a, root / f"replay-{w}-nochains" / "jobs.parquet")
            if r is None:
                continue
            pooled.append(r)
            rows.append(
                f"| {name} | {w} | {r['n']} | {r['mean_a']:.2f} / {r['mean_b']:.2f} | {r['d_mean']:+.2f} "
                f"[{r['d_lo']:+.2f}, {r['d_hi']:+.2f}] | {r['in1h']:.0%} | "
                f"{_distortion(r['d_lo'], r['d_hi'], spread).split(':')[0].strip('*')} |"
            )
        if len(pooled) >= 2:
            d = np.concatenate([p["d"] for p in pooled])
            boot = d[np.random.default_rng(0).integers(0, len(d), size=(2000, len(d)))].mean(1)
            lo, hi = float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))
            within = sum(-spread <= p["d_lo"] and p["d_hi"] <= spread for p in pooled)
            verdicts.append(
                f"* `{name}`, {len(pooled)} windows pooled ({len(d)} jobs): {d.mean():+.2f} h "
                f"[{lo:+.2f}, {hi:+.2f}]: {_distortion(lo, hi, spread)}; per window, the interval lies "
                f"within the spread in {within} of {len(pooled)}."
            )
    if not rows:
        return []
    return [
        f"Every window replayed without chains ({', '.join(have)}), against each set's run of it with chains: the "
        "same background jobs' waits on Slurm (trace h), with minus without, read against Slurm's own spread of "
        f"{spread:.2f} h (the first window's two runs without chains):",
        "",
        *_fold(
            f"Per set and window: {len(rows)} rows",
            [
                "| set | window | jobs | mean wait with / without | with - without: mean [95 %] | within 1 h | verdict |",
                "|---|---|---|---|---|---|---|",
                *rows,
            ],
        ),
        *verdicts,
    ]


def _fold(summary: str, lines: list[str]) -> list[str]:
    """``lines`` (a table) in a collapsible block titled ``summary``, a blank line after it."""
    return ["<details>", f"<summary>{summary}</summary>", "", *lines, "", "</details>", ""]


def _costs(docs_by_set: dict) -> list[str]:
    out = [
        "| run | wall (s) | CPU: step (s) | CPU: cluster daemons (s) | load start -> end | errors |",
        "|---|---|---|---|---|---|",
    ]
    for name, docs in docs_by_set.items():
        for w, d in sorted(docs.items()):
            fa = d["facts"]
            out.append(
                f"| {name}-{w} | {_f(fa.get('wall_s'), '{:.0f}')} | {_f(fa.get('cpu_s'), '{:.1f}')} | "
                f"{_f(fa.get('daemons_cpu_s'), '{:.1f}')} | {' '.join(fa['loadavg_start'])} -> "
                f"{' '.join(fa['loadavg_end'])} | {fa['errors'] or 'none'} |"
            )
    return _fold(f"Every run: {len(out) - 2} rows", out)


def _reactive_spread(frames: dict) -> list[str]:
    """reactive ran in both run sets on the same windows and chains (two clusters replaying one
    background): Slurm's own spread for one policy, chain by chain."""
    if not {"keep", "keepwp"} <= set(frames):
        return []
    d = _gaps(
        frames["keep"][frames["keep"]["policy"] == dr.REACTIVE],
        frames["keepwp"][frames["keepwp"]["policy"] == dr.REACTIVE],
    )
    if d.empty:
        return []
    return [
        f"reactive ran in both run sets: {len(d)} chains paired on window and chain index (two clusters "
        f"replaying the same background). Its signed interruption differs between the two by {_gap_words(d)}. "
        "That is Slurm's own spread for one policy, and the floor under any difference between policies "
        "measured across the two sets."
    ]


def _same_decision_pair(f: pd.DataFrame, name: str = "keep") -> list[str]:
    """avg-cal where it never submits early decides exactly as reactive: both successors submitted at
    the same predecessor end into one cluster. How far apart they start is the chains' competition."""
    if not {dr.AVG_CAL, dr.REACTIVE} <= set(f["policy"]):
        return []
    a = f[f["policy"] == dr.AVG_CAL]
    if not a["forced"].astype(bool).all():
        return []
    d = _gaps(a, f[f["policy"] == dr.REACTIVE])
    return [
        f"In set `{name}`, avg-cal submitted at the predecessor's end in every link, as reactive did: {len(d)} pairs of "
        f"identical decisions in one cluster. Their successors' starts differ by {_gap_words(d)}: what the "
        "chains' competition for freed nodes, and which of two same-instant submissions Slurm serves first, do "
        "to identical decisions."
    ]


def _lateness(f: pd.DataFrame, factor: float) -> list[str]:
    """Per policy that submitted at the end: how late after the predecessor's end the keeper's
    submission went (trace h), and how many interrupted links that lateness alone explains."""
    from mirage_tasks.slurm.keeper_stats import interrupted_h

    tol = interrupted_h(factor)
    out = [
        "| policy | links submitted at the end | late by (trace h): mean / max | interrupted | of which no "
        "longer than the keeper's own lateness + tolerance |",
        "|---|---|---|---|---|",
    ]
    for p, g in f.groupby("policy", sort=False):
        g = g[g["forced"].astype(bool)]
        if g.empty:
            continue
        late = np.maximum(-g["decision_lead_trace_h"].to_numpy(float), 0.0)
        sig = g["signed_interruption_h"].to_numpy(float)
        intr = sig > tol
        out.append(
            f"| {p} | {len(g)} | {late.mean():.2f} / {late.max():.2f} | {int(intr.sum())} | "
            f"{int((intr & (sig <= late + tol)).sum())} |"
        )
    return out


def _first_run(root: Path, factor: float) -> list[str]:
    """The campaign's first run of set ``keep`` (``<root>/run1``), made with the keeper before it
    submitted at the end ahead of reading the queue."""
    from mirage_tasks.slurm.keeper_stats import markdown, summary

    f, docs = _frame(_runs(root / "run1", "keep"))
    if f.empty:
        return []
    loads = sorted({" ".join(d["facts"]["loadavg_end"]) for d in docs.values()})
    return [
        "### The first run, and why it was run again",
        "",
        f"Set `keep` ran first with the keeper as it was before commit 75ec249: it read `squeue` and `sinfo` before "
        "every decision, the one at the predecessor's end too. The machine was loaded then (a CI run and a CPU "
        f"hog beside it; load at the end {', '.join(loads)}), readings took seconds, and a successor submitted "
        "'at the end' went in up to 5 real seconds late: a tenth to a quarter of a trace hour at x180, counted as "
        "interruption. The keeper now submits at the end before it reads. The first run's figures, kept for the "
        "record (the same windows, chains and models; its own runs' outputs under `var/keepcamp/run1`):",
        "",
        *markdown(summary(f, factor, 1)),
        "",
        "The keeper's own lateness in that run:",
        "",
        *_lateness(f, factor),
        "",
    ]


def _pools(frames: dict, docs_by_set: dict, factor: float) -> dict:
    """Each :data:`POOLS` entry whose sets both ran: (its sets, the pooled links, their runs' docs,
    the summary rows)."""
    from mirage_tasks.slurm.keeper_stats import summary

    out = {}
    for pname, members in POOLS.items():
        members = tuple(m for m in members if m in frames)
        if len(members) >= 2 and not any(set(members) == set(o[0]) for o in out.values()):
            f, docs = _pool(frames, docs_by_set, members)
            out[pname] = (members, f, docs, summary(f, factor, 1))
    return out


def _with_avg(frames: dict, rows: list[dict], factor: float) -> list[dict]:
    """A pool's summary rows with avg's row of set ``keep`` added (avg ran there only: its waste is
    the yardstick the issue's criterion names)."""
    from mirage_tasks.slurm.keeper_stats import summary

    avg = [r for r in summary(frames["keep"], factor, 1) if r["policy"] == dr.AVG] if "keep" in frames else []
    return rows + [{**avg[0], "policy": "avg"}] if avg else rows


def answer(frames: dict, pools: dict, factor: float) -> list[str]:
    """The page's leading answer: the widest pool's (most runs) verdict per rule, the figures of its
    lines in "In short" and its pooled table."""
    if not pools:
        return []
    members, f, docs, rows = max(pools.values(), key=lambda v: len(v[2]))
    parts = []
    for v in _verdict_facts(_with_avg(frames, rows, factor), f):
        r = v["row"]
        parts.append(
            f"**{v['policy']}** submitted early in {r['early']} of {r['links']} links; its interruption minus "
            f"reactive's {_di_text(v['di'])} ({'below reactive' if v['di_below'] else 'not shown below reactive'}); "
            f"objective against reactive {_objective_text(r)}: {v['objective'].replace('**', '')}; waste "
            f"{r['wasted_node_h']:.2f} node-h per link"
            + (f" (avg's {v['avg_waste']:.2f})" if v["avg_waste"] is not None else "")
        )
    if not parts:
        return []
    return [
        f"**Answer.** Over the {len(docs)} runs of sets {', '.join(f'`{m}`' for m in members)} pooled, "
        "each rule paired with reactive on the same links [95 % intervals]: " + "; ".join(parts) + ".",
        "",
    ]


def _in_short(frames: dict, pools: dict, factor: float, by_window: list[str]) -> list[str]:
    """The answer first: each pooled set's verdict lines against the issue's criterion (the waste
    compared with avg's in set ``keep``, where avg ran) and the pooled distortion of the background
    (the pooled lines of :func:`_background_by_window`)."""
    out = []
    for pname, (members, f, docs, rows) in pools.items():
        rows = _with_avg(frames, rows, factor)
        out += [
            f"Sets {' and '.join(f'`{m}`' for m in members)} pooled ({len(docs)} runs), against the issue's "
            "criterion (a rule that submits early, interrupts less than reactive with the interval excluding "
            "zero, at a waste no higher than avg's; avg's waste from set `keep`):",
            "",
        ]
        if pname in MIXED_ASKING:
            out += [
                "(Its model rows pool two ways of asking the model: every reading in its last 24 h in "
                "`keepc` and `keepc2`, at its probe times (the default now) in `keepc3` and `keepg`.)",
                "",
            ]
        out += [ln for ln in _verdict_lines(rows, f) if not ln.startswith("* **avg**")] + [""]
        out += [ln + " The policies' paired differences are of that size." for ln in _same_decision_pair(f, pname)]
        out += [""]
    dist = [ln for ln in by_window if ln.startswith("* `")]
    if dist:
        out += ["The background's mean wait with the chains minus without, every window pooled:", "", *dist, ""]
        if "keepc2" in frames:
            out += [
                "In `keepc2` the 4 added nodes served the background alone for the 25 h before its chains "
                "started, the likely cause of its background waiting less than the log's: its policies were "
                "compared, paired, on a lighter background."
                + (
                    " `keepc3` and `keepg` kept them drained until their chains started (`--late-extra-nodes`), the "
                    "test of that cause: compare their lines with `keepc2`'s. What is left after it is likely the 4 "
                    "added nodes serving the background alone where no chain holds them (between a chain's "
                    "successor start and the next chain's start, and after the last chain; not tested by a run), "
                    "which draining before the first chain does not remove."
                    if "keepc3" in frames
                    else ""
                ),
                "",
            ]
    return ["## In short", "", *out] if out else []


def page(root: str) -> str:
    from mirage_tasks.slurm.keeper_stats import markdown, summary

    root = Path(root)
    wins = json.loads((root / "windows.json").read_text())
    frames, docs_by_set = {}, {}
    for name in SETS:
        f, docs = _frame(_runs(root, name))
        if len(f):
            frames[name], docs_by_set[name] = f, docs
    first = next(iter(next(iter(docs_by_set.values())).values())) if docs_by_set else {}
    factor = first.get("factor", 180)
    pools = _pools(frames, docs_by_set, factor)
    by_window = _background_by_window(root, [w["name"] for w in wins["windows"]])
    L = [
        "# The service keeper on a real Slurm over five busy windows",
        "",
        *answer(frames, pools, factor),
        "Written by `python -m lab.campaigns.keeper_campaign page --root var/keepcamp --write-doc docs/results/keeper-campaign.md` "
        "from the runs' outputs. Earlier single runs and the fixes that led here: "
        "[service-keeper.md](service-keeper.md); the protocol: [protocol-v2.md](protocol-v2.md) (the keeper section).",
        "",
        *_in_short(frames, pools, factor, by_window),
        "## What was run",
        "",
        f"A 1-node service of 48 h jobs kept by `keep-service` on Debian's Slurm 22.05 (78 nodes, the `ls6` preset as "
        f"this Slurm enforces it, compression x{factor:g}: 48 h = {48 * 3600 / factor / 60:.0f} real minutes, the queue "
        f"read every 10 trace minutes = {600 / factor:.1f} real s), each run on a fresh local cluster replaying a "
        "window of the Lonestar6 log as background (the jobs running and pending at its start first, then every "
        "submission at its scaled time; the background held until every chain is done).",
        "",
        "* **Windows**, chosen before any run from the log alone (`python -m lab.campaigns.keeper_campaign windows`): the hourly "
        "number of jobs waiting in the log; its median over the training period "
        f"({wins['train'][0]} to {wins['train'][1]}) is {wins['median_queue_train']:.0f} jobs; of the test period's "
        f"({wins['test'][0]} to {wins['test'][1]}) {wins['candidates']} daily-start windows of "
        f"{wins['span_hours']:g} h, {wins['busy_candidates']} have a mean queue above it; the busiest non-overlapping "
        f"{len(wins['windows'])}:",
        "",
        "| window | from (UTC) | mean jobs waiting in the log |",
        "|---|---|---|",
    ]
    L += [f"| {w['name']} | {w['from']} | {w['mean_queue']:.1f} |" for w in wins["windows"]]
    L += [
        "",
        "* **Chains**: per window and policy 4 chains, chain `c` submitting its predecessor `c x 50` trace hours after "
        "the window's start, so one chain of a policy has ended (48 h plus its wait) before the next starts; every "
        "policy's chain `c` starts at the same instant, so the policies are paired on (window, chain). A link is "
        "one decision: the successor of the chain's first job; the chain is cancelled once its successor has "
        "started. 5 windows x 4 chains = 20 chains per policy.",
        f"* **{len(frames)} run sets on separate clusters** (the same windows, the same background): "
        + "; ".join(f"`{k}`: {v}" for k, v in SETS.items() if k in frames)
        + ". Each set has its own `reactive`, the paired reference of its policies; two runs of `reactive` also "
        "measure Slurm's spread (below).",
        "* **Distortion of the background**: at most 4 (set `keep`) or 3 (`keepwp`) service jobs run at once on "
        "the log's 78 nodes, plus a successor's overlap. The first window was also replayed twice without any "
        "chain; the background's waits with and without are compared below."
        + (
            " Set `keepc` runs its 4 policies side by side on 78 + 4 nodes (`--extra-nodes 4`): the chains bring "
            "the capacity they take on average (one node per service job at a time), so the background keeps, on "
            "average, the capacity it had in the log, while the chains still queue with it for the same nodes "
            "(a successor's overlap takes a fifth node for its length, a gap leaves one free)."
            if "keepc" in frames
            else ""
        )
        + (
            " Set `keepc2` repeats `keepc` on fresh clusters with every chain 25 trace hours later "
            "(`--offset-hours 25`): its links are other decisions in the same windows, and every window was replayed "
            "without chains too (`--baseline-windows w2,w3,w4,w5`)."
            if "keepc2" in frames
            else ""
        )
        + (
            " Set `keepc3` repeats it 12.5 trace hours after the window's start with the 4 added nodes drained "
            "until its first chain's predecessors are queued (`keep-service --late-nodes 4`): before the chains "
            "exist its background has the log's 78 nodes, as the runs without chains do."
            if "keepc3" in frames
            else ""
        )
        + (
            " Set `keepg` is built as `keepc3`, its chains 6.25 trace hours after the window's start."
            if "keepg" in frames
            else ""
        ),
        "* **A deviation from protocol v2, said here**: the protocol asked for at least three windows with at least 7 "
        "chains one after another per window and policy, at most one service chain running at a time. Seven 50-hour "
        "chains in a row are 350 trace hours, about 2 real hours per window at x180; to get 20 chains per policy in "
        "the time a session has, this campaign runs 5 windows x 4 chains, the windows at once on separate "
        "clusters, and the policies of a set side by side in one cluster (one chain of each policy at a time). The "
        "chains of one set compete for the nodes their predecessors free; the simulator's prediction includes the "
        "other chains' jobs, and the set's two runs of reactive-like rules (avg-cal decides as reactive here, below) "
        "show what that competition does to identical decisions.",
        "* **Policies**: `model` is XGBoost (`train --preset quick`) on 1260 simulator samples with end-spaced "
        "probes (2022-10-12 to 2023-01-24, every 2 h, node 1, `sim_config(ls6, 180)` with warm start), its "
        "calibrated load-adjusted rule; `avg-cal` the calibrated average, its threshold calibrated on those samples "
        "by the probe replay's `calibrate_avg` (ties toward never early); `avg` the end minus the mean wait the "
        "keeper saw; `wait-pred` and `guarantee` the wait predictor (`waitpred` fitted on 2022-10-12 to 2023-01-28 "
        "with the same configuration) asked every step for a successor submitted now (`wait-pred`: predicted start "
        "at or after the end; `guarantee`: waiting 10 more minutes would leave less slack than its 90 % bound); "
        "`guarantee-cal` (set `keepg`) the same bound's test with a margin calibrated on training samples so that "
        "at most 10 % of them are interrupted, asked at their probe times (the probe replay's `guarantee-cal` on "
        "this log); `reactive` at the predecessor's end. Every policy submits at the end at the latest.",
        "* **What each figure may know**: every decision reads only the live queue (`squeue`/`sinfo`) at its instant "
        "and what the keeper saw before it (the waits of jobs it saw start); the model, avg-cal's threshold, the "
        "wait predictor and the windows' busy line come from the months before the test period. The simulator's "
        "prediction beside each link is given the background as Slurm ran it (submissions at slurmctld's instants), "
        "the other chains' jobs, and the predecessor at its real submission; it decides as the keeper does.",
        "",
    ]
    for name in frames:
        docs = docs_by_set[name]
        d0 = next(iter(docs.values()))
        if name in ("keep", "keepc", "keepc2", "keepc3") and d0["facts"].get("avg_cal"):
            ac = d0["facts"]["avg_cal"]
            L += [
                f"Set `{name}`: avg-cal's calibration on the training samples: threshold {ac['threshold']} "
                f"({'never submits early: on those samples no threshold beat reactive strictly' if ac['never_submits_early'] else 'h'}; "
                f"objective {ac['objective']:.3f} against reactive's {ac['reactive_objective']:.3f}, "
                f"{ac['n_samples']} samples). So avg-cal decides as reactive here.",
                "",
            ]
        if d0["facts"].get("waitpred"):
            wp = d0["facts"]["waitpred"]
            L += [f"Set `{name}`: the wait predictor's pick `{wp['pick']}`, bound level {wp['level']:g}.", ""]
        gc = d0["facts"].get("guarantee_cal")
        if gc:
            L += [
                f"Set `{name}`: guarantee-cal's margin {_f(gc['threshold'])} h (submit when the bound minus the time "
                f"left at the next probe reaches it), chosen by split conformal calibration at level "
                f"{gc['level']:.0%} on the {gc['n_samples']} samples of `var/{gc['samples'].split('/var/', 1)[-1]}` (the same training months "
                f"and predictor, drawn with `--waitpred`): {gc['validation_interrupted']:.1%} of them interrupted, "
                f"{gc['validation_mean_wasted_h']:.2f} h wasted per sample on average; asked at "
                f"{', '.join(f'{x / 3600:g} h' for x in gc['at_s'])} before the end. Those samples are the months "
                "the wait predictor was fitted on, so its bound is in-sample there; the windows are later.",
                "",
            ]
        span = (d0["facts"].get("model") or {}).get("trained_span_s")
        if span:
            at = (
                "at every queue reading there (`--decide-at grid`, the default when the set ran; the default is "
                "now `auto`, which asks an end-spaced model only at its training probes' times)"
                if d0.get("decide_at") is None
                else "at the first reading at or past each of its training probes' times there (`--decide-at probes`)"
            )
            L += [
                f"Set `{name}`: the model is asked only in the last {span / 3600:g} trace hours before the "
                "predecessor's end, the span its end-spaced training probes cover (`keep-service --decide-within "
                f"trained`, the default since commit d5290a1), {at}; earlier sets asked it at every reading once "
                "the predecessor ran.",
                "",
            ]
    if (root / "notes.md").exists():  # what happened to the runs that their outputs do not say
        L += ["**How the runs went**: " + (root / "notes.md").read_text().strip(), ""]
    again = {}
    for n, docs in docs_by_set.items():
        for d in docs.values():
            for p_, (mv, tot) in (d.get("repredicted") or {}).items():
                a = again.setdefault(n, {}).setdefault(p_, [0, 0])
                a[0], a[1] = a[0] + mv, a[1] + tot
    if again:
        L += [
            "**The simulator's predictions** of sets " + ", ".join(f"`{n}`" for n in again) + " were computed again "
            "from the stored runs (`python -m lab.campaigns.keeper_campaign repredict`) after a fix: the prediction had asked the "
            "model at every step from the predecessor's start, whatever the keeper did; it now asks it where the "
            "keeper asked (within its trained span, or at its probe times). Predicted interruptions that moved: "
            + "; ".join(
                f"`{n}` " + ", ".join(f"{p_} {mv} of {tot}" for p_, (mv, tot) in pol.items())
                for n, pol in again.items()
            )
            + ".",
            "",
        ]
    L += ["## Results", ""]
    for name, f in frames.items():
        docs = docs_by_set[name]
        L += [f"### Set `{name}`: {SETS[name]} ({len(docs)} windows: {', '.join(sorted(docs))})", ""]
        rows = summary(f, factor, 1)
        L += markdown(rows) + [""]
        L += (
            [
                "Against the issue's criterion (a rule that submits early, interrupts less than reactive with an "
                "interval that excludes zero, at a waste no higher than avg's):",
                "",
            ]
            + _verdict_lines(rows, f)
            + [""]
        )
        L += ["The simulator's prediction for the same links (given the background Slurm ran):", ""]
        L += _sim_agreement(f) + [""]
    for pname, (members, f, docs, rows) in pools.items():
        L += [
            f"### Sets {' and '.join(f'`{m}`' for m in members)} pooled ({len(docs)} runs; a chain of one set is "
            "paired only with the same set's chains)",
            "",
        ]
        L += markdown(rows) + [""]
        L += ["Against the issue's criterion:", ""] + _verdict_lines(rows, f) + [""]
        L += ["The simulator's prediction for the same links:", ""] + _sim_agreement(f) + [""]
        L += [
            ln
            + (
                " Read the policies' paired differences above against it: it is the size of what one cluster "
                "does to the same decision."
            )
            for ln in _same_decision_pair(f, pname)
        ] + [""]
    same = [
        ln for n in ("keep", "keepc", "keepc2", "keepc3") if n in frames for ln in _same_decision_pair(frames[n], n)
    ]
    if same:
        L += ["### Identical decisions in one cluster", ""] + same + [""]
    spread = _reactive_spread(frames)
    if spread:
        L += ["### Slurm's own spread", ""] + spread + [""]
    for name, f in frames.items():
        L += [f"The keeper's own lateness at the predecessor's end, set `{name}`:", ""] + _lateness(f, factor) + [""]
    L += _first_run(root, factor)
    L += ["### The background with and without the chains", ""] + _background_effect(root) + [""]
    if by_window:
        L += by_window + [""]
    L += [
        "### Wall time and CPU per run",
        "",
        "All runs of a set at once (and both sets together) on this 2-core "
        "machine, niced to -5; the step's CPU is the keeper, the background replay and the simulator's predictions.",
        "",
    ] + _costs(docs_by_set)
    L += ["## Every link", ""]
    for name, f in frames.items():  # folded: one row per link, hundreds in all
        L += _fold(f"Set <code>{name}</code>: {len(f)} rows (a rule's link each)", _links_table(f, docs_by_set[name]))
    L += [
        "## Commands",
        "",
        "```sh",
        "python -m mirage_tasks ingest --trace ../shared/traces/ls6-a100.log.gz --timezone America/Chicago --out var/keepcamp/ls6",
        "python - <<'PY'   # the ls6 preset as this Slurm enforces it at x180, warm start",
        "import json; from mirage_tasks.sim.config import PRESETS; from mirage_tasks.slurm.conf import sim_config",
        "json.dump(sim_config(PRESETS['ls6'], 180.0).replace(warm_start=True).to_dict(), open('var/keepcamp/ls6-slurm-x180.json', 'w'))",
        "PY",
        "python -m mirage_tasks sample --trace var/keepcamp/ls6/trace.parquet --start 2022-10-12T00:00 --count 1260 "
        "--interval-hours 2 --node 1 --workers 2 --probe-spacing end --out var/keepcamp/samples1260-end "
        "--cluster-config var/keepcamp/ls6-slurm-x180.json",
        "python -m mirage_tasks merge --in var/keepcamp/samples1260-end --out var/keepcamp/dataset-end",
        "python -m mirage_tasks train --model xgboost --preset quick --dataset var/keepcamp/dataset-end "
        "--out var/keepcamp/model-xgb-end --threads 2",
        "python -m mirage_tasks waitpred --trace var/keepcamp/ls6/trace.parquet --cluster-config "
        "var/keepcamp/ls6-slurm-x180.json --calibrate-from 2022-10-12 --calibrate-to 2023-01-28 "
        "--months 2023-02 2023-03 --out var/keepcamp/waitpred",
        "python -m lab.campaigns.keeper_campaign windows --trace var/keepcamp/ls6/trace.parquet --out var/keepcamp",
        "python -m lab.campaigns.keeper_campaign run --root var/keepcamp --trace var/keepcamp/ls6/trace.parquet "
        "--model var/keepcamp/model-xgb-end --avg-cal-samples var/keepcamp/samples1260-end",
        "python -m lab.campaigns.keeper_campaign run --root var/keepcamp --name keepwp --trace var/keepcamp/ls6/trace.parquet "
        "--waitpred var/keepcamp/waitpred --policies guarantee,wait-pred,reactive --no-baseline",
        "python -m lab.campaigns.keeper_campaign run --root var/keepcamp --name keepc --trace var/keepcamp/ls6/trace.parquet "
        "--model var/keepcamp/model-xgb-end --avg-cal-samples var/keepcamp/samples1260-end --waitpred "
        "var/keepcamp/waitpred --policies model,guarantee,avg-cal,reactive --extra-nodes 4 --no-baseline",
        "python -m lab.campaigns.keeper_campaign run --root var/keepcamp --name keepc2 --trace var/keepcamp/ls6/trace.parquet "
        "--model var/keepcamp/model-xgb-end --avg-cal-samples var/keepcamp/samples1260-end --waitpred "
        "var/keepcamp/waitpred --policies model,guarantee,avg-cal,reactive --extra-nodes 4 --offset-hours 25 "
        "--baseline-windows w2,w3,w4,w5",
        "python -m lab.campaigns.keeper_campaign run --root var/keepcamp --name keepc3 --trace var/keepcamp/ls6/trace.parquet "
        "--model var/keepcamp/model-xgb-end --avg-cal-samples var/keepcamp/samples1260-end --waitpred "
        "var/keepcamp/waitpred --policies model,guarantee,avg-cal,reactive --extra-nodes 4 --offset-hours 12.5 "
        "--late-extra-nodes --no-baseline",
        "python -m mirage_tasks sample --trace var/keepcamp/ls6/trace.parquet --start 2022-10-12T00:00 --count 1260 "
        "--interval-hours 2 --node 1 --workers 1 --probe-spacing end --out var/keepcamp/samples1260-end-wp "
        "--cluster-config var/keepcamp/ls6-slurm-x180.json --waitpred var/keepcamp/waitpred",
        "python -m lab.campaigns.keeper_campaign run --root var/keepcamp --name keepg --trace var/keepcamp/ls6/trace.parquet "
        "--model var/keepcamp/model-xgb-end --waitpred var/keepcamp/waitpred --guarantee-samples "
        "var/keepcamp/samples1260-end-wp --policies model,guarantee-cal,guarantee,reactive --extra-nodes 4 "
        "--offset-hours 6.25 --late-extra-nodes --no-baseline",
        "for s in keepc keepc2 keepc3 keepg; do python -m lab.campaigns.keeper_campaign repredict --root var/keepcamp --name $s; done",
        "python -m lab.campaigns.keeper_campaign page --root var/keepcamp --write-doc docs/results/keeper-campaign.md",
        "```",
        "",
    ]
    return "\n".join(L)
