"""Writes docs/results/ls6-months.md from the outputs of lab/campaigns/ls6_months.py (no hand-typed numbers).

Called by ``python -m lab.campaigns.ls6_months --write-doc PATH``; reads ``metrics/<month>/metrics.json``, the
models' ``metrics.json``/``config.json``, the learning-curve runs and ``run.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from mirage_tasks.models.thresholds import LOAD_BETAS
from mirage_tasks.sim import decision_rules as dr
from mirage_tasks.sim.probes import BASELINES


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return fmt.format(x)


def _ci(v: Any, lo: Any, hi: Any, fmt: str = "{:.2f}") -> str:
    if v is None:
        return "-"
    if lo is None or hi is None:
        return _f(v, fmt)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _rows(doc: dict, node: int, level: str = "all") -> list[dict]:
    return [r for r in doc["rows"] if int(r["node"]) == node and r["level"] == level]


def _model_info(root: Path, month: str, node: int, model: str) -> tuple[dict | None, dict | None]:
    d = root / "models" / month / f"node{node}" / model
    return _load(d / "metrics.json"), _load(d / "config.json")


def rule_text(cfg: dict | None) -> str:
    """A regressor's calibrated rule in a few words: the threshold, and the load term when it moves."""
    if cfg is None:
        return "-"
    dec = cfg.get("decision") or {}
    low = dec.get("low_h", "n/a")
    if low is None:
        return "never early"
    if not isinstance(low, (int, float)):
        return "-"
    load = dec.get("load")
    if not load:
        return f"{low:.2f} h"
    return f"{low:.2f} h {'+' if load['slope'] >= 0 else '-'} {abs(load['slope']):.2f} z({load['feature']})"


def span_text(cfg: dict | None) -> str:
    """The effective threshold (on the prediction) at the lowest and the highest load of the split: the
    range a load-aware rule can move it over (z is clipped to that range online)."""
    dec = (cfg or {}).get("decision") or {}
    load, low = dec.get("load"), dec.get("low_h")
    if not load or low is None or load.get("z_min") is None:
        return "-"
    at = [low + load["slope"] * z for z in (load["z_min"], load["z_max"])]
    return f"{at[0]:.2f} / {at[1]:.2f} h"


def verdict(rows: list[dict]) -> dict | None:
    """The learned model with the lowest mean interruption, and whether it beats avg: the 95 %
    interval of the paired difference excludes zero (below it) and it wastes no more node-hours."""
    learned = [r for r in rows if r["model"] not in BASELINES]
    if not learned:
        return None

    def check(r: dict) -> tuple[bool, bool]:
        hi = r.get("diff_vs_avg_ci_hi")
        return (hi is not None and hi < 0), (
            r.get("wasted_diff_vs_avg") is not None and r["wasted_diff_vs_avg"] <= 1e-9
        )

    passing = [r for r in learned if all(check(r))]
    best = min(passing or learned, key=lambda r: r["mean_interruption_h"])
    below, waste_ok = check(best)
    return {"best": best, "beats_avg": below and waste_ok, "interval_excludes_zero": below, "waste_ok": waste_ok}


def verdict_cells(root: Path, args: Any, months: list[str], weight: float) -> list[dict]:
    """Per (month, node) with a learned model and avg: :func:`verdict`, avg's row, the best model's
    objective difference to avg and the learned model lowest on the objective with its difference."""
    out = []
    for m in months:
        doc = _load(root / "metrics" / m / "metrics.json")
        for n in args.nodes:
            rows = _rows(doc, n)
            v = verdict(rows)
            avg = next((r for r in rows if r["model"] == dr.AVG), None)
            if v is None or avg is None:
                continue
            ods = {
                r["model"]: objective_diff(root, m, n, r["model"], weight) for r in rows if r["model"] not in BASELINES
            }
            ods = {k: d for k, d in ods.items() if d is not None}
            k = min(ods, key=lambda x: ods[x][0]) if ods else None
            out.append(
                {
                    "month": m,
                    "node": n,
                    "verdict": v,
                    "avg": avg,
                    "objective": ods.get(v["best"]["model"]),
                    "objective_best": (k, ods[k]) if k else None,
                }
            )
    return out


def _why(v: dict) -> str:
    if v["beats_avg"]:
        return "yes"
    return "no: interval includes zero or is above it" if not v["interval_excludes_zero"] else "no: wastes more"


def verdict_row(c: dict) -> str:
    """One row of 'Does a learned model beat avg?'."""
    b, avg, od = c["verdict"]["best"], c["avg"], c["objective"]
    return (
        f"| {c['month']} | {c['node']} | {b['model']} | {b['mean_interruption_h']:.2f} ({avg['mean_interruption_h']:.2f}) "
        f"| {_ci(b['diff_vs_avg_h'], b['diff_vs_avg_ci_lo'], b['diff_vs_avg_ci_hi'], '{:+.2f}')} "
        f"| {_ci(b['wasted_diff_vs_avg'], b['wasted_diff_vs_avg_ci_lo'], b['wasted_diff_vs_avg_ci_hi'], '{:+.2f}')} "
        f"| {_why(c['verdict'])} | {'-' if od is None else _ci(*od, '{:+.2f}')} |"
    )


def answer(cells: list[dict], nodes: list[int], n_months: int) -> list[str]:
    """The page's leading answer: per node size, in how many months the best learned model beat avg,
    and per month its interruption and waste against avg as 'Does a learned model beat avg?' states them."""
    if not cells:
        return []
    per = []
    for c in cells:
        b = c["verdict"]["best"]
        per.append(
            f"{c['month']} node {c['node']} {b['model']} "
            f"{_ci(b['diff_vs_avg_h'], b['diff_vs_avg_ci_lo'], b['diff_vs_avg_ci_hi'], '{:+.2f}')} h, "
            f"{_ci(b['wasted_diff_vs_avg'], b['wasted_diff_vs_avg_ci_lo'], b['wasted_diff_vs_avg_ci_hi'], '{:+.2f}')} "
            f"node-h ({_why(c['verdict'])})"
        )
    wins = "; ".join(
        f"{sum(c['verdict']['beats_avg'] for c in cells if c['node'] == n)} of {n_months} months for {n}-node jobs"
        for n in nodes
    )
    return [
        f"**Answer.** The best learned model beat `avg` (interruption below avg's, the paired 95 % interval "
        f"excluding zero, at no more wasted node-hours) in {wins}. Interruption and waste against avg "
        "[95 % CI]: " + "; ".join(per) + ". The model is picked on the month itself, which favours the learned side.",
        "",
    ]


def objective_diff(
    root: Path, month: str, node: int, model: str, weight: float, n_boot: int = 2000
) -> tuple[float, float, float] | None:
    """Mean and paired bootstrap 95 % interval of (model - avg) in interruption + weight x wasted
    node-hours per sample: the objective the thresholds were calibrated for."""
    import numpy as np

    path = root / "metrics" / month / "samples.parquet"
    if not path.exists():
        return None
    df = pd.read_parquet(path, columns=["model", "node", "sample_start", "interruption_h", "wasted_node_h"])
    df = df[df["node"] == node]
    cost = (df["interruption_h"] + weight * df["wasted_node_h"]).to_numpy()
    df = df.assign(cost=cost).pivot_table(index="sample_start", columns="model", values="cost")
    if model not in df or dr.AVG not in df:
        return None
    d = (df[model] - df["avg"]).dropna().to_numpy()
    rng = np.random.default_rng([0, node, len(d)])
    boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)


def _spacing(root: Path, args: Any) -> tuple[str, int]:
    man = _load(root / "datasets" / f"node{args.nodes[0]}" / "manifest.json") or {}
    params = man.get("params") or {}
    return params.get("probe_spacing", "uniform"), int(params.get("probes", 7))


def probe_text(root: Path, args: Any) -> str:
    from mirage_tasks.sim.probes import END_OFFSETS_MIN

    spacing, probes = _spacing(root, args)
    if spacing == "end":
        ladder = ", ".join(_offset(m) for m in END_OFFSETS_MIN if m)
        return (
            f"{len(END_OFFSETS_MIN)} probes each near the predecessor's end (`sample --probe-spacing end`: at its "
            f"pre-simulated end minus {ladder}, and at its end; never before its submission + 60 s)"
        )
    return (
        f"{probes} probes each, equally spaced from the predecessor's submission to its end (`--probe-spacing uniform`)"
    )


def _offset(minutes: int) -> str:
    return f"{minutes // 60} h" if minutes >= 60 and minutes % 60 == 0 else f"{minutes} min"


def ladder_table(
    root: Path, node: int, until: pd.Timestamp, weight: float, workload_days: float = 5.0
) -> tuple[list[dict], dict] | None:
    """Per probe offset of the end spacing, on the training samples whose workload ends before
    ``until``: what submitting every sample's successor at that offset gives (the labels), and
    the per-sample best probe (an oracle no rule reaches)."""
    import numpy as np

    path = root / "datasets" / f"node{node}" / "probes.parquet"
    if not path.exists():
        return None
    pr = pd.read_parquet(
        path, columns=["sample", "sample_start", "probe_time", "pred_end_without_succ", "interruption_s"]
    )
    pr = pr[pr["sample_start"] + int(workload_days * 86400) <= int(until.timestamp())]
    if pr.empty:
        return None
    s = pr["interruption_s"].to_numpy(np.float64) / 3600.0
    pr = pr.assign(
        gap=np.maximum(s, 0),
        waste=node * np.maximum(-s, 0),
        offset=(pr["pred_end_without_succ"] - pr["probe_time"]) // 60,
    )
    pr = pr.assign(cost=pr["gap"] + weight * pr["waste"], zero=s <= 0)
    rows = []
    for off, g in pr.groupby("offset"):
        if len(g) < 0.9 * pr["sample"].nunique():  # a probe cut at the predecessor's submission + 60 s
            continue
        rows.append(
            {
                "offset_min": int(off),
                "n": len(g),
                "interruption_h": g["gap"].mean(),
                "wasted_node_h": g["waste"].mean(),
                "zero": g["zero"].mean(),
                "objective": g["cost"].mean(),
            }
        )
    best = pr.loc[pr.groupby("sample")["cost"].idxmin()]
    oracle = {
        "n": len(best),
        "interruption_h": best["gap"].mean(),
        "wasted_node_h": best["waste"].mean(),
        "zero": best["zero"].mean(),
        "objective": best["cost"].mean(),
        "offsets": best["offset"].value_counts(normalize=True).to_dict(),
    }
    return sorted(rows, key=lambda r: -r["offset_min"]), oracle


def previous_run(path: str | Path) -> dict:
    """An earlier run's record (the JSON :func:`write_doc` writes beside its page, committed with
    it): ``verdicts`` by "month node" and ``models`` by "month node model". Comparisons read
    this data, never an earlier page."""
    doc = _load(Path(path))
    if not isinstance(doc, dict) or "verdicts" not in doc or "models" not in doc:
        raise SystemExit(f"--compare-with {path}: not a run record written by --write-doc (verdicts, models)")
    return doc


def previous_verdicts(record: dict) -> dict[tuple[str, int], dict]:
    """(month, node) -> the verdict row's cells of an earlier run (:func:`previous_run`)."""
    out = {}
    for k, v in record["verdicts"].items():
        m, n = k.split()
        out[(m, int(n))] = v
    return out


def load_shift_section(root: Path, args: Any, months: list[str], weight: float) -> list[str]:
    """The calibrated thresholds against the month's load: per month, the reactive baseline's mean
    interruption on the calibration split (training period) and in the month, and which way the
    model that is best on the calibration objective missed avg (interruption or waste)."""
    rows, up, down = [], [], []
    quiet_edge: dict[tuple[str, int], tuple[str, float, float]] = {}
    for m in months:
        doc = _load(root / "metrics" / m / "metrics.json")
        for n in args.nodes:
            react = next((r for r in _rows(doc, n) if r["model"] == dr.REACTIVE), None)
            met, _ = _model_info(root, m, n, args.models[0])
            cal = (met or {}).get("calibration") or {}
            if react is None or not cal.get("reactive"):
                continue
            split = cal["reactive"]["mean_interruption_h"]
            ratio = react["mean_interruption_h"] / max(split, 1e-9)
            ods = {
                r["model"]: objective_diff(root, m, n, r["model"], weight)
                for r in _rows(doc, n)
                if r["model"] not in BASELINES
            }
            ods = {k: v for k, v in ods.items() if v is not None}
            if not ods:
                continue
            k = min(ods, key=lambda x: ods[x][0])
            r = next(x for x in _rows(doc, n) if x["model"] == k)
            _, ck = _model_info(root, m, n, k)
            rows.append(
                f"| {m} | {n} | {split:.2f} | {react['mean_interruption_h']:.2f} | x{ratio:.1f} | {k} | "
                f"{rule_text(ck)} | {r['diff_vs_avg_h']:+.2f} | "
                f"{r['wasted_diff_vs_avg']:+.2f} | {_ci(*ods[k], '{:+.2f}')} |"
            )
            entry = (m, n, ratio, r["diff_vs_avg_h"], r["wasted_diff_vs_avg"], ods[k])
            (up if ratio > 1.5 else down if ratio < 1 / 1.5 else []).append(entry)
            dec = (ck or {}).get("decision") or {}
            if ratio < 1 / 1.5 and dec.get("load") and dec.get("low_h") is not None:
                ld = dec["load"]  # both loads grow with the queue: z_min is the split's quietest decision
                quiet_edge[(m, n)] = (k, dec["low_h"] + ld["slope"] * ld["z_min"], dec["low_h"])
    if not rows:
        return []
    L = [
        "### The calibrated thresholds against the month's load",
        "",
        "Per month, the reactive baseline's mean interruption (a measure of the load) on the split the thresholds "
        "were calibrated on (the latest 20 % of the training period) and in the month, and the learned model best "
        "on the calibration objective there (lowest mean objective - avg) with its paired differences to avg.",
        "",
        "| month | node | load on the calibration split h | load in the month h | ratio | model | rule | "
        "interruption - avg h | wasted node-h - avg | objective - avg [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    late = [e for e in up if e[3] > 0]
    early = [e for e in down if e[4] > 0]
    if up:
        L += [
            "Where the month was busier than the calibration split (ratio > 1.5: "
            + ", ".join(f"{m} node {n}" for m, n, *_ in up)
            + f"), the model interrupted more than avg in "
            f"{len(late)} of {len(up)} (it submitted too late for the month's load)"
            + (
                "; its objective was below avg's in " + ", ".join(f"{m} node {n}" for m, n, *_, od in up if od[2] < 0)
                if any(od[2] < 0 for *_, od in up)
                else ""
            )
            + "."
        ]
    if down:
        L += [
            "Where it was quieter (ratio < 1/1.5: "
            + ", ".join(f"{m} node {n}" for m, n, *_ in down)
            + f"), the model wasted more node-hours than avg in {len(early)} of {len(down)} (it submitted too "
            "early for the month's load)."
        ]
        if quiet_edge:
            L += [
                "The load term moves the threshold only within the loads the split showed: at the split's quietest "
                "decision that model's threshold is "
                + "; ".join(
                    f"{t:.2f} h ({k}, {m} node {n}; {c:.2f} h at the split's mean load)"
                    for (m, n), (k, t, c) in quiet_edge.items()
                )
                + " (a negative threshold submits while the model still predicts that much overlap); the level "
                "itself was fitted on the split, whose load (column 3) was far above the month's."
            ]
    n_load = sum(
        1
        for m in months
        for n in args.nodes
        for model in args.models
        if ((_model_info(root, m, n, model)[1] or {}).get("decision") or {}).get("load")
    )
    n_all = sum(
        1 for m in months for n in args.nodes for model in args.models if _model_info(root, m, n, model)[1] is not None
    )
    if n_load:
        L += [
            "",
            f"The rules are chosen before the month, on the latest training samples; the load-aware form "
            f"(the threshold moved by the load in the decision's own history) was chosen there for {n_load} of "
            f"{n_all} month x node x model cells, the fixed threshold for the others. A month whose load lies "
            "outside the split's range still meets a rule fitted where the load was different.",
        ]
    else:
        L += [
            "",
            "The thresholds are fixed before the month, on the latest training samples, and a month whose load "
            "differs from theirs moves the best threshold: the regressors and the thresholds are fitted where the "
            "load was different.",
        ]
    curve = curve_points(root, args, months[-1])
    pairs = []
    for (n, model), pts in sorted(curve.items()):
        lo, hi = min(pts), max(pts)
        if lo != hi:
            pairs.append((n, model, lo, hi, pts[lo], pts[hi]))
    if pairs:
        small = all(abs(b[0] - a[0]) <= 0.1 * a[0] for *_, a, b in pairs)
        L += [
            f"The learning curve ({months[-1]}, below), from the smallest to the whole share of the samples: "
            + "; ".join(
                f"node {n} {model}: val MAE {a[0]:.2f} -> {b[0]:.2f} h, online interruption "
                f"{a[1]:.2f} -> {b[1]:.2f} h, wasted {a[2]:.2f} -> {b[2]:.2f} node-h"
                for n, model, _, _, a, b in pairs
            )
            + "."
            + (
                " Validation MAE moves by at most 10 %: more samples of the same past do not fix a month whose "
                "load differs from it."
                if small
                else ""
            )
        ]
    L.append("")
    return L


def curve_points(root: Path, args: Any, m: str) -> dict[tuple[int, str], dict[float, tuple[float, float, float]]]:
    """(node, model) -> {share: (val MAE h, online mean interruption h, mean wasted node-h)} of the learning curve."""
    out: dict[tuple[int, str], dict[float, tuple[float, float, float]]] = {}
    for n in args.nodes:
        for model in args.curve_models:
            for f in [*args.curve_fractions, 1.0]:
                if f < 1.0:
                    tag = f"{model}@{int(round(f * 100))}pct"
                    mdir, vdir = root / "curve" / m / f"node{n}" / tag, root / "curve-validate" / m / f"node{n}" / tag
                else:
                    mdir, vdir = root / "models" / m / f"node{n}" / model, root / "validate" / m / f"node{n}" / model
                met = _load(mdir / "metrics.json")
                if met is None or not (vdir / "validation.parquet").exists():
                    continue
                v = pd.read_parquet(vdir / "validation.parquet", columns=["interruption_h", "wasted_node_h"])
                out.setdefault((n, model), {})[f] = (
                    float(met["val_mae_h"]),
                    float(v["interruption_h"].mean()),
                    float(v["wasted_node_h"].mean()),
                )
    return out


def previous_models(record: dict) -> dict[tuple[str, int, str], dict]:
    """(month, node, model) -> online mean interruption, wasted node-h, forced share and threshold of
    an earlier run (:func:`previous_run`)."""
    out = {}
    for k, v in record["models"].items():
        m, n, model = k.split()
        out[(m, int(n), model)] = v
    return out


def change_section(root: Path, args: Any, months: list[str], record: dict, name: str) -> list[str]:
    """Per learned model and month: threshold and online result, the earlier run -> this run."""
    prev = previous_models(record)
    rows, less_waste, more_int, both_better = [], 0, 0, 0
    n_cells = 0
    for m in months:
        doc = _load(root / "metrics" / m / "metrics.json")
        for n in args.nodes:
            for r in _rows(doc, n):
                p_ = prev.get((m, n, r["model"]))
                if p_ is None:
                    continue
                met, cfg = _model_info(root, m, n, r["model"])
                thr = rule_text(cfg)
                n_cells += 1
                less_waste += r["mean_wasted_node_h"] < p_["wasted"]
                more_int += r["mean_interruption_h"] > p_["interruption"]
                both_better += (r["mean_wasted_node_h"] <= p_["wasted"]) and (
                    r["mean_interruption_h"] <= p_["interruption"]
                )
                rows.append(
                    f"| {m} | {n} | {r['model']} | {p_['threshold']} -> {thr} | {p_['interruption']:.2f} -> "
                    f"{r['mean_interruption_h']:.2f} | {p_['wasted']:.2f} -> {r['mean_wasted_node_h']:.2f} | "
                    f"{p_['forced']} -> {_f(r['forced_share'], '{:.0%}')} |"
                )
    if not rows:
        return []
    prev_l, now_l = _labels(args)
    return [
        f"### What changed, model by model ({prev_l} run, `{name}` -> this run, {now_l})",
        "",
        "| month | node | model | calibrated rule | online mean interruption h | wasted node-h | forced |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Of these {n_cells} month x node x model cells, this run ({now_l}) wasted fewer node-hours in {less_waste}, "
        f"interrupted more in {more_int}, and did no worse on both in {both_better}.",
        "",
    ]


def _labels(args: Any) -> tuple[str, str]:
    return getattr(args, "compare_label", None) or "uniform", getattr(args, "run_label", None) or "end"


def why_section(root: Path, args: Any, months: list[str], weight: float) -> list[str]:
    """The findings: what the probe spacing changed (against an earlier run's committed page when
    ``--compare-with`` names its record), the labels near the end, the stuck models and the load shift."""

    spacing, probes = _spacing(root, args)
    L = ["## Why learned models lose where they lose", ""]
    if spacing == "end":
        L += [
            ("An earlier run" if getattr(args, "compare_label", None) else "The run before this one")
            + " (`--probe-spacing uniform`) sampled 7 probes equally spaced from the "
            "predecessor's submission to its end, at least 8 h apart: no training example described a submission "
            "in the last 8 h before the predecessor ends, where `avg` gains, so trees could not answer there and "
            "the calibrated thresholds could only choose between submitting at least 8 h early or at the end. "
            f"This run's samples hold {probe_text(root, args)}, so the models and the threshold calibration see "
            "the decisions of the last hours.",
            "",
        ]
    else:
        L += [
            f"The training samples hold {probes} probes each, equally spaced from the predecessor's submission "
            f"to its end: at least 48 h / {probes - 1} = {48 / (probes - 1):.0f} h apart. No training example "
            "describes a submission in the last hours before the predecessor ends, where `avg` gains; "
            "`--probe-spacing end` samples there.",
            "",
        ]
    rev = getattr(args, "compare_with", None)
    if rev:
        record = previous_run(rev)
        prev = previous_verdicts(record)
        pl, nl = _labels(args)
        L += [
            f"### Against the {pl} run (its record `{rev}`)",
            "",
            "The same verdict for the two runs, month by month (best learned model; paired differences to avg "
            "[95% CI]):",
            "",
            f"| month | node | {pl}: model | {pl}: interruption - avg | {pl}: waste - avg | {pl}: beats | "
            f"{pl}: objective - avg | {nl}: model | {nl}: interruption - avg | {nl}: waste - avg | {nl}: beats | "
            f"{nl}: objective - avg |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        moved = []
        now_wins, prev_wins = {n: 0 for n in args.nodes}, {n: 0 for n in args.nodes}
        for m in months:
            doc = _load(root / "metrics" / m / "metrics.json")
            for n in args.nodes:
                v = verdict(_rows(doc, n))
                p_ = prev.get((m, n))
                if v is None or p_ is None:
                    continue
                b = v["best"]
                now_wins[n] += int(v["beats_avg"])
                prev_wins[n] += int(p_["beats"] == "yes")
                od = objective_diff(root, m, n, b["model"], weight)
                try:
                    before = float(p_["objective"].split()[0])
                except ValueError:
                    before = None
                if od is not None and before is not None:
                    moved.append((m, n, before, od[0]))
                L.append(
                    f"| {m} | {n} | {p_['model']} | {p_['diff']} | {p_['waste']} | {p_['beats'].split(':')[0]} "
                    f"| {p_['objective']} | {b['model']} "
                    f"| {_ci(b['diff_vs_avg_h'], b['diff_vs_avg_ci_lo'], b['diff_vs_avg_ci_hi'], '{:+.2f}')} "
                    f"| {_ci(b['wasted_diff_vs_avg'], b['wasted_diff_vs_avg_ci_lo'], b['wasted_diff_vs_avg_ci_hi'], '{:+.2f}')} "
                    f"| {'yes' if v['beats_avg'] else 'no'} | {'-' if od is None else _ci(*od, '{:+.2f}')} |"
                )
        L += [
            "",
            f"Months where the best learned model beats avg, {pl} -> {nl}: "
            + "; ".join(f"node {n}: {prev_wins[n]} -> {now_wins[n]} of {len(months)}" for n in args.nodes)
            + ".",
        ]
        if moved:
            better = [f"{m} node {n} ({a:+.2f} -> {b_:+.2f})" for m, n, a, b_ in moved if b_ < a]
            worse = [f"{m} node {n} ({a:+.2f} -> {b_:+.2f})" for m, n, a, b_ in moved if b_ >= a]
            L += [
                "",
                "On the calibration objective (the verdict's model, point estimates of the paired difference to "
                "avg; the two runs' samples are the same validation samples but the runs are not paired here): "
                f"lower with {nl} in {len(better)} of {len(moved)}"
                + (": " + "; ".join(better) if better else "")
                + (f"; higher in {'; '.join(worse)}" if worse else "")
                + ".",
            ]
        L.append("")
        L += change_section(root, args, months, record, rev)
    if spacing == "end" and months:
        until = month_start_ts(months[-1])
        for n in args.nodes:
            res = ladder_table(root, n, until, weight)
            if res is None:
                continue
            rows, oracle = res
            L += [
                f"### The labels near the end ({n}-node jobs, training samples before {months[-1]})",
                "",
                f"Every sample's successor submitted at the same offset before the predecessor's end (the probe "
                f"labels), and each sample at its best probe (an oracle: no rule knows it in advance); objective = "
                f"interruption + {weight:g} x wasted node-h.",
                "",
                "| submitted at | samples | mean interruption h | wasted node-h | zero interruption | objective |",
                "|---|---|---|---|---|---|",
            ]
            for r in rows:
                when = "the end (reactive)" if r["offset_min"] == 0 else f"end - {_offset(r['offset_min'])}"
                L.append(
                    f"| {when} | {r['n']} | {r['interruption_h']:.2f} | {r['wasted_node_h']:.2f} | "
                    f"{r['zero']:.0%} | {r['objective']:.3f} |"
                )
            top = sorted(oracle["offsets"].items(), key=lambda kv: -kv[1])[:3]
            L.append(
                f"| best probe per sample (oracle) | {oracle['n']} | {oracle['interruption_h']:.2f} | "
                f"{oracle['wasted_node_h']:.2f} | {oracle['zero']:.0%} | {oracle['objective']:.3f} |"
            )
            fixed = min(rows, key=lambda r: r["objective"])
            react = next((r for r in rows if r["offset_min"] == 0), None)
            L += [
                "",
                f"The best single offset on these samples is {_offset(fixed['offset_min']) if fixed['offset_min'] else 'the end'}"
                f" (objective {fixed['objective']:.3f}"
                + (f" against {react['objective']:.3f} at the end" if react else "")
                + f"); the oracle reaches {oracle['objective']:.3f}, most often at "
                + ", ".join(f"end - {_offset(int(k))} ({v:.0%})" if k else f"the end ({v:.0%})" for k, v in top)
                + ". The gap between the two is what a model could gain by telling samples apart.",
                "",
            ]
    stuck = []
    for m in months:
        doc = _load(root / "metrics" / m / "metrics.json")
        for n in args.nodes:
            for r in _rows(doc, n):
                met, cfg = _model_info(root, m, n, r["model"])
                dec_path = root / "validate" / m / f"node{n}" / r["model"] / "decisions.parquet"
                if cfg is None or not dec_path.exists() or r["forced_share"] < 1.0:
                    continue
                dec = pd.read_parquet(dec_path, columns=["output"])
                low = (cfg.get("decision") or {}).get("low_h")
                stuck.append(
                    f"{r['model']} ({m}, node {n}: highest prediction {dec['output'].max():.2f} h, "
                    f"threshold {'never early' if low is None else f'{low:.2f} h'})"
                )
    L += [
        "Learned models that never submitted before the predecessor ended: "
        + ("; ".join(stuck) if stuck else "none")
        + ".",
        "",
    ]
    if spacing == "end" and months:
        L += submission_section(root, args, months)
    L += load_shift_section(root, args, months, weight)
    return L


def submission_section(root: Path, args: Any, months: list[str]) -> list[str]:
    """Where the online submissions fell against the probes the models were trained on: before
    the earliest probe (the predecessor's end - 24 h), a state no training example describes,
    or inside the probed last 24 h."""
    from mirage_tasks.sim.probes import END_OFFSETS_MIN

    first = END_OFFSETS_MIN[0] * 60
    rows, beyond = [], {}
    for m in months:
        for n in args.nodes:
            for model in ["avg", *args.models]:
                path = root / "validate" / m / f"node{n}" / model / "validation.parquet"
                if not path.exists():
                    continue
                v = pd.read_parquet(path, columns=["pred_end", "decision_time", "wasted_node_h", "forced"])
                lead = (v["pred_end"] - v["decision_time"]) / 3600.0
                early = lead > first / 3600.0 + 1e-9
                rows.append(
                    f"| {m} | {n} | {model} | {early.mean():.0%} | {v['wasted_node_h'][early].sum() / len(v):.2f} "
                    f"| {v['wasted_node_h'].mean():.2f} | {((~early) & ~v['forced'].astype(bool)).mean():.0%} "
                    f"| {v['forced'].astype(bool).mean():.0%} | {lead.median():.1f} |"
                )
                if model != dr.AVG:
                    beyond[(m, n, model)] = (
                        early.mean(),
                        v["wasted_node_h"][early].sum() / max(1e-9, v["wasted_node_h"].sum()),
                    )
    if not rows:
        return []
    worst = sorted(beyond.items(), key=lambda kv: -kv[1][0])[:3]
    L = [
        f"### Where the online submissions fell (against the probes, {_offset(END_OFFSETS_MIN[0])} before the end at most)",
        "",
        "Online, a model decides every 10 minutes from the predecessor's submission, also while the predecessor "
        "still waits; the training probes start at its (pre-simulated) end - "
        f"{_offset(END_OFFSETS_MIN[0])}. A submission earlier than that comes from a state no training example "
        "describes (the trees answer with what they learned at the earliest probe), and the threshold calibration, "
        "which replays the probes only, never priced it.",
        "",
        "| month | node | model | submitted > 24 h before the end | its wasted node-h per sample | all wasted node-h "
        "per sample | submitted in the last 24 h | forced at the end | median hours before the end |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
    if worst and worst[0][1][0] > 0:
        L += [
            "Most submissions before the earliest probe: "
            + "; ".join(
                f"{model} ({m}, node {n}: {share:.0%} of samples, {w:.0%} of its wasted node-hours)"
                for (m, n, model), (share, w) in worst
                if share > 0
            )
            + ".",
            "",
        ]
    return L


def month_start_ts(m: str) -> pd.Timestamp:
    return pd.Timestamp(f"{m}-01T00:00:00+00:00")


def _load_aware(root: Path, args: Any) -> bool:
    """Whether this run's models were calibrated with the load-aware search (their metrics record ``fixed``)."""
    for m in args.months:
        for n in args.nodes:
            for model in args.models:
                met, _ = _model_info(root, m, n, model)
                if met is not None and "fixed" in (met.get("calibration") or {}):
                    return True
    return False


def write_doc(root: Path, out: Path, args: Any) -> None:
    run = _load(root / "run.json") or {}
    flags = (run.get("argv") or [])[1:]  # the run's own flags, as it was invoked
    run_flags = " ".join(flags) if flags else f"--root {args.root}"
    months = [m for m in args.months if (root / "metrics" / m / "metrics.json").exists()]
    L: list[str] = []
    L += [
        "# Mirage on ls6 over three validation months (January, February, March 2023)",
        "",
        "Written by `python -m lab.campaigns.ls6_months --write-doc` from the outputs of one command:",
        "",
        "```sh",
        f"nice -n 5 .venv/bin/python -m lab.campaigns.ls6_months {run_flags}  # everything below, under {args.root}/",
        f".venv/bin/python -m lab.campaigns.ls6_months {run_flags} --write-doc {out.as_posix()}"
        + (f" --compare-with {args.compare_with}" if getattr(args, "compare_with", None) else "")
        + "".join(
            f" {flag} '{getattr(args, attr)}'"
            for flag, attr in (("--compare-label", "compare_label"), ("--run-label", "run_label"))
            if getattr(args, attr, None)
        ),
        "```",
        "",
    ]
    if run.get("reuse_samples"):
        L += [
            "`--reuse-samples` ran no ingest, sample or merge: the `trace` and `datasets` (and `samples`) under "
            "the root are those of the end-spacing run (`python -m lab.campaigns.ls6_months --root var/ls6-months-end "
            "--probe-spacing end`), linked there; without the flag the same command computes them first.",
            "",
        ]
    if run:
        L += [
            f"CPU time of the steps (user + system of the child processes): **{run['cpu_s_children']:.0f} s**; "
            f"wall time {run['wall_s']:.0f} s on this project's shared 2-core machine (finished "
            f"{run['finished']}). Command: `{' '.join(run['argv'])}`.",
            "",
        ]
        walls, skipped = [], False
        started = pd.Timestamp(run["finished"]) - pd.Timedelta(seconds=float(run["wall_s"]))
        for n in args.nodes:
            info = _load(root / "samples" / f"node{n}" / "shard.json")
            marker = _load(root / "samples" / f"node{n}" / "_SUCCESS.json") or {}
            if info:
                walls.append(
                    f"node {n}: {info['n_samples']} samples, {info['n_examples']} examples in "
                    f"{info['wall_s']:.0f} s ({info.get('cpu_s', float('nan')):.0f} CPU s)"
                )
                skipped |= bool(marker.get("finished")) and pd.Timestamp(marker["finished"]) < started
        if walls:
            L += [
                (
                    "Steps whose outputs were already up to date (from an earlier invocation of the same command) "
                    "were skipped and are not in that CPU time, among them the training samples"
                    if skipped
                    else "It includes the training samples, computed by this invocation, one node size "
                    "after the other in one process"
                )
                + " (`sample`, as it recorded them: "
                + "; ".join(walls)
                + ")."
                + (
                    " The policy comparison below was run by `lab/campaigns/ls6_policy_fix.py` (its own CPU time is "
                    "printed by it)."
                    if (root / "policy").exists()
                    else ""
                ),
                "",
            ]
    else:
        L += [
            "The run had not finished when this page was written: the tables below hold what was committed "
            "by then (months or models missing from them did not finish).",
            "",
        ]
    L += [
        "## Setup",
        "",
        "* trace: `ls6-a100.log` (CC BY 4.0, the Mirage authors, SC'23), local times read as America/Chicago; "
        "simulator preset `ls6` (78 nodes, conservative backfill, recorded priority plus capped age, "
        "8 running jobs per user, warm start);",
        f"* training samples: one every {args.interval_hours:g} h from 2022-11-01 (the seed: 4 h), 2-day warm-up, "
        f"5-day workloads, {probe_text(root, args)}, node sizes "
        + ", ".join(map(str, args.nodes))
        + "; for each month the "
        "models use only the samples whose workload ends before the month starts (`train --samples-until`), "
        "split chronologically (latest 20 % of samples for validation, 5-day purge);",
        "* decision thresholds: chosen on that training-period validation split by replaying the probes "
        "(submit at the first probe whose prediction reaches the threshold, else at the predecessor's end), "
        "minimising mean interruption + waste weight x mean wasted node-hours (`train --waste-weight`, "
        "default 0.1 h per node-hour); never tuned on the validation month;"
        + (
            " the threshold may move with the load at the decision (`decision.load` in the model's config.json: "
            "prediction - slope x z(load) >= threshold, the load read from the last snapshot of the decision's "
            "own history, so the offline replay and the online decision see the same number; load queue_nodes or "
            "running_wait, slope = beta x the predictions' standard deviation on the split, beta in "
            + ", ".join(f"{b:g}" for b in LOAD_BETAS)
            + "; kept only when it lowers the split's objective below "
            "the best fixed threshold). One variant of this rule was run; nothing of it was chosen on the months;"
            if _load_aware(root, args)
            else ""
        ),
        f"* validation: {args.val_count} samples per month every 4 h from the 1st (26 days), a decision every "
        "10 simulated minutes; baselines `reactive` (submit at the predecessor's end) and `avg` (its end minus "
        "the recent mean wait);",
        f"* models: {', '.join(args.models)}, preset `{args.preset}` ("
        + ", ".join(args.param)
        + "), seed 0; "
        + (
            f"hyper-parameters of {', '.join(args.hpo_models)} searched with Optuna on each training period's "
            f"split ({args.hpo_trials} trials or {args.hpo_timeout_s:g} s, the preset as trial 0);"
            if args.hpo_trials and args.hpo_models
            else "no hyper-parameter search;"
        ),
        "* intervals: paired bootstrap 95 % (2,000 resamples of the samples, the same draw for the model and "
        "the baseline). `- avg` columns: mean over samples of (model - avg) on the same sample; negative = "
        "the model is better (less interruption, less waste). Load level of a sample from the reactive "
        "baseline's interruption: low <= 2 h, medium 2-12 h, heavy > 12 h.",
        "",
    ]

    # ---- verdict
    from mirage_tasks.models.thresholds import WASTE_WEIGHT  # train's default

    weight = args.waste_weight if args.waste_weight is not None else WASTE_WEIGHT
    L += [
        "## Does a learned model beat `avg`?",
        "",
        "Criterion: the best learned model's mean interruption is below avg's with the 95 % interval "
        "of the paired difference excluding zero, and its mean wasted node-hours are at most avg's. The row shows "
        "a learned model that meets it if any does, else the one with the least mean interruption. Picking the "
        "best of several models on the validation month itself favours the learned side (no correction for "
        "multiple comparisons).",
        "",
        f"The last column uses the objective the thresholds were calibrated for instead: interruption + "
        f"{weight:g} x wasted node-hours per sample, paired difference to avg.",
        "",
        "| month | node | best learned model | mean interruption h (avg) | interruption - avg h [95% CI] | "
        "wasted node-h - avg [95% CI] | beats avg | objective - avg [95% CI] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cells = verdict_cells(root, args, months, weight)
    L += [verdict_row(c) for c in cells]
    wins = {n: sum(c["verdict"]["beats_avg"] for c in cells if c["node"] == n) for n in args.nodes}
    obj_best = [
        f"{c['month']} node {c['node']}: {c['objective_best'][0]} {_ci(*c['objective_best'][1], '{:+.2f}')}"
        for c in cells
        if c["objective_best"]
    ]
    obj_wins = sum(c["objective_best"][1][2] < 0 for c in cells if c["objective_best"])
    L[2:2] = answer(cells, args.nodes, len(months))
    L += [
        "",
        "Months where the best learned model beats avg: "
        + "; ".join(f"node {n}: {wins[n]} of {len(months)}" for n in args.nodes)
        + ".",
        "",
    ]
    if _load_aware(root, args):
        L += [
            "How far these months are out of sample for the load-aware rule: its parameters (load, slope, "
            "threshold, the clip of z to the split's range) were chosen on each training period's own validation "
            "split only, and no variant was compared on the months (one was run; the clip was added after "
            "reading three models' split calibrations, before any validation-month result of a learned model). "
            "But the idea of moving the threshold with the load came from the previous run's diagnosis of these "
            "same three months, so the rule's form is not independent of them: a later month (April 2023 or "
            "after) is the clean test.",
            "",
        ]
    if obj_best:
        L += [
            "On the calibration objective (interruption + weight x wasted node-hours), the best learned model "
            "of each month and its paired difference to avg [95% CI]: "
            + "; ".join(obj_best)
            + f". Below avg with the interval excluding zero in {obj_wins} of {len(obj_best)} month x node cells "
            "(this measure ignores the criterion's separate waste condition; the model is chosen on the month, "
            "as above).",
            "",
        ]

    # ---- findings generated from the outputs
    L += why_section(root, args, months, weight)

    # ---- per month
    for m in months:
        doc = _load(root / "metrics" / m / "metrics.json")
        L += [f"## {m}", ""]
        for n in args.nodes:
            rows = _rows(doc, n)
            if not rows:
                continue
            c = doc["level_counts"].get(str(n), {})
            L += [
                f"### {m}, {n}-node service jobs (levels from reactive: {c.get('low', 0)} low, "
                f"{c.get('medium', 0)} medium, {c.get('heavy', 0)} heavy)",
                "",
                "| model | mean interruption h [95% CI] | zero interruption | wasted node-h | interruption - avg h "
                "[95% CI] | wasted node-h - avg [95% CI] | low / medium / heavy interruption h | forced | "
                "threshold (calibrated) | highest prediction h | val MAE h (constant) |",
                "|---|---|---|---|---|---|---|---|---|---|---|",
            ]
            for r in rows:
                lv = {x["level"]: x for x in doc["rows"] if x["model"] == r["model"] and int(x["node"]) == n}
                levels = " / ".join(
                    _f(lv[k]["mean_interruption_h"]) if k in lv else "-" for k in ("low", "medium", "heavy")
                )
                met, cfg = _model_info(root, m, n, r["model"])
                thr, mae = "-", "-"
                if cfg is not None:
                    thr = rule_text(cfg)
                if met is not None:
                    mae = f"{met['val_mae_h']:.2f} ({met['val_constant_mae_h']:.2f})"
                top = "-"
                dec_path = root / "validate" / m / f"node{n}" / r["model"] / "decisions.parquet"
                if cfg is not None and dec_path.exists():
                    dec = pd.read_parquet(dec_path, columns=["output"])
                    top = _f(float(dec["output"].max())) if len(dec) else "-"
                L.append(
                    f"| {r['model']} | {_ci(r['mean_interruption_h'], r['mean_interruption_ci_lo'], r['mean_interruption_ci_hi'])} "
                    f"| {_f(r['zero_share'], '{:.0%}')} | {_f(r['mean_wasted_node_h'])} "
                    f"| {_ci(r.get('diff_vs_avg_h'), r.get('diff_vs_avg_ci_lo'), r.get('diff_vs_avg_ci_hi'), '{:+.2f}')} "
                    f"| {_ci(r.get('wasted_diff_vs_avg'), r.get('wasted_diff_vs_avg_ci_lo'), r.get('wasted_diff_vs_avg_ci_hi'), '{:+.2f}')} "
                    f"| {levels} | {_f(r['forced_share'], '{:.0%}')} | {thr} | {top} | {mae} |"
                )
            L.append("")
            # per level: the paired difference to avg
            lv_rows = [
                x
                for x in doc["rows"]
                if int(x["node"]) == n and x["level"] in ("low", "medium", "heavy") and x["model"] not in BASELINES
            ]
            if lv_rows:
                L += [
                    "Per load level, interruption - avg h [95% CI]:",
                    "",
                    "| model | low | medium | heavy |",
                    "|---|---|---|---|",
                ]
                for model in dict.fromkeys(x["model"] for x in lv_rows):
                    cells = []
                    for k in ("low", "medium", "heavy"):
                        x = next((y for y in lv_rows if y["model"] == model and y["level"] == k), None)
                        cells.append(
                            "-"
                            if x is None
                            else f"{_ci(x.get('diff_vs_avg_h'), x.get('diff_vs_avg_ci_lo'), x.get('diff_vs_avg_ci_hi'), '{:+.2f}')} (n={x['n']})"
                        )
                    L.append(f"| {model} | " + " | ".join(cells) + " |")
                L.append("")
        ns = doc.get("never_submits") or []
        if ns:
            L += [
                "Never submitted before the predecessor ended (every submission forced: online they are the "
                "reactive baseline): " + ", ".join(f"{d['model']} (node {d['node']})" for d in ns) + ".",
                "",
            ]

    # ---- calibration
    cal_rows, n_load, gains = [], 0, []
    for m in months:
        for n in args.nodes:
            for model in args.models:
                met, cfg = _model_info(root, m, n, model)
                if met is None or "calibration" not in met:
                    continue
                c = met["calibration"]
                fx = c.get("fixed")
                if fx is not None:
                    n_load += bool(c.get("load"))
                    if c.get("load"):
                        gains.append((c["chosen"]["objective"] - fx["objective"]) / max(fx["objective"], 1e-9))
                fixed_obj = "-" if fx is None else f"{fx['objective']:.3f}"
                cal_rows.append(
                    f"| {m} | {n} | {model} | {met.get('n_train_samples', '-')} | {rule_text(cfg)} | "
                    f"{span_text(cfg)} | "
                    f"{c['chosen']['objective']:.3f} / {fixed_obj} / "
                    f"{c['default']['objective']:.3f} / {c['reactive']['objective']:.3f} |"
                )
    L += [
        "## Decision rules chosen on the training period",
        "",
        "Objective on each training period's own validation split (mean interruption h + weight x wasted "
        "node-h) with the calibrated rule, with the best fixed threshold alone, at the fixed -0.5 h of the seed, "
        "and never submitting early. A rule `t h - s z(load)` is the threshold the prediction must reach at the "
        "decision: t + slope x z with slope = -s, z = (load - its mean on the split) / its standard deviation "
        "there, clipped to the split's range (so `- s` lowers the threshold, i.e. submits earlier, when the load "
        "is above the split's mean); load `queue_nodes` = "
        "nodes requested by pending jobs / cluster nodes, `running_wait` = log1p(median wait of the running "
        "jobs in hours), both read from the last snapshot of the decision's own history.",
        "",
        "| month | node | model | training samples | rule | threshold at the split's lowest / highest load | "
        "objective: calibrated / best fixed / -0.5 h / reactive |",
        "|---|---|---|---|---|---|---|",
        *cal_rows,
        "",
    ]
    if _load_aware(root, args):
        L += [
            f"The load-aware form lowered the split's objective below the best fixed threshold in {n_load} of "
            f"{len(cal_rows)} cells"
            + (f" (by {-max(gains):.0%} to {-min(gains):.0%} of it)" if gains else "")
            + "; elsewhere no load term did strictly better on the split and the fixed threshold was kept.",
            "",
        ]

    # ---- hyper-parameter search
    hrows = []
    for m in months:
        for n in args.nodes:
            for model in args.models:
                met, _ = _model_info(root, m, n, model)
                h = (met or {}).get("hpo")
                if h:
                    hrows.append(
                        f"| {m} | {n} | {model} | {h['n_complete']}/{h['n_trials']} | {h['objective']} | "
                        f"{_f(h['preset_value'], '{:.3f}')} | {_f(h['best_value'], '{:.3f}')} | "
                        f"{json.dumps(h['best_params'], default=lambda v: round(v, 4))} |"
                    )
    if hrows:
        L += [
            "## Hyper-parameter search (Optuna, training period only)",
            "",
            "Loss on each training period's own validation split; the preset is trial 0, so the kept value is "
            "never worse there. The study histories are in `hpo_trials.json` beside each model and plotted by "
            "the pipeline's report.",
            "",
            "| month | node | model | trials complete | objective | preset | best | best parameters |",
            "|---|---|---|---|---|---|---|---|",
            *hrows,
            "",
        ]

    # ---- learning curve
    if months:
        m = months[-1]
        pts = []
        for n in args.nodes:
            for model in args.curve_models:
                for f in [*args.curve_fractions, 1.0]:
                    if f < 1.0:
                        tag = f"{model}@{int(round(f * 100))}pct"
                        mdir = root / "curve" / m / f"node{n}" / tag
                        vdir = root / "curve-validate" / m / f"node{n}" / tag
                    else:
                        mdir = root / "models" / m / f"node{n}" / model
                        vdir = root / "validate" / m / f"node{n}" / model
                    met = _load(mdir / "metrics.json")
                    if met is None or not (vdir / "validation.parquet").exists():
                        continue
                    v = pd.read_parquet(vdir / "validation.parquet")
                    cfg = _load(mdir / "config.json") or {}
                    sub = (cfg.get("data") or {}).get("subset") or {}
                    pts.append(
                        {
                            "node": n,
                            "model": model,
                            "fraction": f,
                            "samples": sub.get("n_samples"),
                            "train_samples": met.get("n_train_samples"),
                            "val_mae_h": met["val_mae_h"],
                            "online_h": float(v["interruption_h"].mean()),
                            "wasted": float(v["wasted_node_h"].mean()),
                        }
                    )
        if pts:
            L += [
                f"## Learning curve ({m})",
                "",
                "The curve models retrained on an evenly thinned share of the same history ("
                + ", ".join(
                    f"{f:.0%} = one sample every {args.interval_hours / f:g} h" for f in [*args.curve_fractions, 1.0]
                )
                + "); validation MAE on the training period's own split "
                "(its size shrinks with the share) and online mean interruption on the month.",
                "",
                "| node | model | share | samples (train split) | val MAE h | online mean interruption h | "
                "wasted node-h |",
                "|---|---|---|---|---|---|---|",
            ]
            for p in sorted(pts, key=lambda d: (d["node"], d["model"], d["fraction"])):
                L.append(
                    f"| {p['node']} | {p['model']} | {p['fraction']:.0%} | {p['samples']} ({p['train_samples']}) "
                    f"| {p['val_mae_h']:.2f} | {p['online_h']:.2f} | {p['wasted']:.2f} |"
                )
            L.append("")

    # ---- policies before/after the training fix (lab/campaigns/ls6_policy_fix.py)
    for pdir in sorted((root / "policy").glob("*/node*")) if (root / "policy").exists() else []:
        mdoc = _load(pdir / "metrics" / "metrics.json")
        if mdoc is None:
            continue
        month, node = pdir.parent.name, int(pdir.name[4:])
        L += [
            f"## Policies before and after the training fix ({month}, {node}-node jobs)",
            "",
            "`lab/campaigns/ls6_policy_fix.py`: `transformer_policy` on this month's frozen transformer, trained with the "
            "same seed, episodes and budget by the seed's method (one REINFORCE step per batch, constant entropy "
            "bonus: `ppo_epochs=1 entropy_final=0.1`) and by the fix (the preset: 8 clipped PPO steps per batch, "
            "entropy decaying to 0); validated on the month by argmax (P(submit) > 0.5) and by the P(submit) "
            "threshold calibrated on the training period.",
            "",
            "Returns are -|interruption| in minutes on the policy's own validation episodes (drawn from the "
            "training period): sampled = actions drawn from the policy (how the best epoch is selected), greedy = "
            "argmax, reactive = always wait.",
            "",
            "| training | best sampled return | greedy return | reactive return | greedy forced share | "
            "argmax submits on the probes | calibrated threshold |",
            "|---|---|---|---|---|---|---|",
        ]
        for name in ("reinforce", "ppo"):
            met = _load(pdir / f"transformer_policy-{name}" / "metrics.json")
            if met is None:
                continue
            thr = met.get("threshold")
            L.append(
                f"| {name} | {_f(met.get('best_val_return'), '{:.0f}')} | "
                f"{_f(met.get('greedy_val_return'), '{:.0f}')} | {_f(met.get('reactive_val_return'), '{:.0f}')} | "
                f"{_f(met.get('greedy_val_forced_share'), '{:.0%}')} | "
                f"{_f(met.get('argmax_submit_share'), '{:.1%}')} of decisions | "
                f"{'never' if thr is None else f'{thr:.3f}'} |"
            )
        L += [
            "",
            "| model | mean interruption h [95% CI] | wasted node-h | forced | interruption - avg h [95% CI] | "
            "wasted node-h - avg [95% CI] |",
            "|---|---|---|---|---|---|",
        ]
        for r in _rows(mdoc, node):
            L.append(
                f"| {r['model']} | {_ci(r['mean_interruption_h'], r['mean_interruption_ci_lo'], r['mean_interruption_ci_hi'])} "
                f"| {_f(r['mean_wasted_node_h'])} | {_f(r['forced_share'], '{:.0%}')} "
                f"| {_ci(r.get('diff_vs_avg_h'), r.get('diff_vs_avg_ci_lo'), r.get('diff_vs_avg_ci_hi'), '{:+.2f}')} "
                f"| {_ci(r.get('wasted_diff_vs_avg'), r.get('wasted_diff_vs_avg_ci_lo'), r.get('wasted_diff_vs_avg_ci_hi'), '{:+.2f}')} |"
            )
        ns = mdoc.get("never_submits") or []
        if ns:
            L += ["", "Never submitted before the predecessor ended: " + ", ".join(d["model"] for d in ns) + "."]
        ppo = _load(pdir / "transformer_policy-ppo" / "metrics.json") or {}
        if (
            ppo.get("greedy_never_submits")
            and ppo.get("best_val_return") is not None
            and abs(ppo["best_val_return"] - ppo.get("reactive_val_return", float("nan"))) < 1e-6
        ):
            L += [
                "",
                "With PPO the policy became deterministic and chose to wait: its best sampled return equals "
                "always waiting on its validation episodes, so on this training period the frozen transformer's "
                "output gave it no state in which submitting early paid (see the probe spacing above). On the toy "
                "environment, where the signal exists, the same change turns a policy whose argmax never submits "
                "into one that does (`tests/mirage/test_models.py::test_ppo_updates_make_the_greedy_policy_submit`).",
            ]
        L.append("")

    # ---- training
    L += [
        "## Training",
        "",
        "| month | node | model | training samples | val MAE h | constant h | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in months:
        for n in args.nodes:
            for model in args.models:
                met, _ = _model_info(root, m, n, model)
                if met is None:
                    continue
                L.append(
                    f"| {m} | {n} | {model} | {met.get('n_train_samples', '-')} | {met['val_mae_h']:.2f} | "
                    f"{met['val_constant_mae_h']:.2f} | {met['wall_s']:.0f} |"
                )
    L.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(L))
    rec = out.with_suffix(".json")
    rec.write_text(json.dumps(run_record(root, args, months, weight, out), indent=1, sort_keys=True) + "\n")
    print(f"wrote {out} and its run record {rec} ({len(months)} month(s))")


def run_record(root: Path, args: Any, months: list[str], weight: float, page: Path) -> dict:
    """This run's data that a later run compares with (``--compare-with``): the verdict row of each
    month x node (its cells as the page shows them) and each learned model's online result and
    calibrated rule. Written beside the page from the outputs, never read back from a page."""
    verdicts: dict[str, dict] = {}
    models: dict[str, dict] = {}
    for m in months:
        doc = _load(root / "metrics" / m / "metrics.json")
        for n in args.nodes:
            rows = _rows(doc, n)
            for r in rows:
                if r["model"] in BASELINES:
                    continue
                _, cfg = _model_info(root, m, n, r["model"])
                models[f"{m} {n} {r['model']}"] = {
                    "interruption": float(r["mean_interruption_h"]),
                    "wasted": float(r["mean_wasted_node_h"]),
                    "forced": _f(r["forced_share"], "{:.0%}"),
                    "threshold": rule_text(cfg) if cfg is not None else "-",
                }
            v = verdict(rows)
            avg = next((r for r in rows if r["model"] == dr.AVG), None)
            if v is None or avg is None:
                continue
            b = v["best"]
            od = objective_diff(root, m, n, b["model"], weight)
            verdicts[f"{m} {n}"] = {
                "model": b["model"],
                "interruption": f"{b['mean_interruption_h']:.2f} ({avg['mean_interruption_h']:.2f})",
                "diff": _ci(b["diff_vs_avg_h"], b["diff_vs_avg_ci_lo"], b["diff_vs_avg_ci_hi"], "{:+.2f}"),
                "waste": _ci(
                    b["wasted_diff_vs_avg"], b["wasted_diff_vs_avg_ci_lo"], b["wasted_diff_vs_avg_ci_hi"], "{:+.2f}"
                ),
                "beats": "yes"
                if v["beats_avg"]
                else (
                    "no: interval includes zero or is above it"
                    if not v["interval_excludes_zero"]
                    else "no: wastes more"
                ),
                "objective": "-" if od is None else _ci(*od, "{:+.2f}"),
            }
    return {"page": page.as_posix(), "label": _labels(args)[1], "verdicts": verdicts, "models": models}
