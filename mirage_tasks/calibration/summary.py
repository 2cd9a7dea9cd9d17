"""The ``calibrate`` step's verdict and report: how a chosen configuration compares with the
zero-wait predictor (:func:`beats_zero`, :func:`zero_comparison`, :func:`mae_reduction`) and its
``calibration.md`` (:func:`markdown`), from the ``calibration.json`` document the step writes;
:func:`fair_share_text` is the fair-share part of a configuration line (also the calibration
page's, :mod:`.tables`)."""

from __future__ import annotations

import json

import numpy as np


def fair_share_text(c: dict) -> str:
    """The fair-share part of a configuration line (nothing without fair share)."""
    if c.get("priority") != "multifactor" or not c.get("weight_fairshare"):
        return ""
    return (
        f", fair-share weight {c['weight_fairshare']:.0f} with a "
        f"{c.get('fs_halflife_s', 7 * 86400) / 86400:g} d usage half-life"
    )


def _block(m: dict) -> dict:
    return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in m.items()}


def beats_zero(m: dict) -> bool:
    return bool(m.get("n")) and m["mae_h"] < m["zero_mae_h"] and m["within_1h"] > m["zero_within_1h"]


def zero_comparison(m: dict) -> str:
    """Where the simulator loses (and wins) against the zero-wait predictor."""
    mae = f"MAE {m['mae_h']:.2f} h vs {m['zero_mae_h']:.2f} h"
    w1 = f"within 1 h {m['within_1h']:.1%} vs {m['zero_within_1h']:.1%}"
    lose = [x for x, bad in ((mae, m["mae_h"] >= m["zero_mae_h"]), (w1, m["within_1h"] <= m["zero_within_1h"])) if bad]
    win = [x for x in (mae, w1) if x not in lose]
    return "worse or equal on " + ", ".join(lose) + (f" (better on {', '.join(win)})" if win else "")


def mae_reduction(m: dict) -> float | None:
    """1 - MAE / zero-wait MAE: the issue's bar for other logs is >= 0.25."""
    return round(1 - m["mae_h"] / m["zero_mae_h"], 4) if m.get("n") and m["zero_mae_h"] > 0 else None


ROWS = [
    ("mae_h", "MAE (h)", "{:.2f}"),
    ("zero_mae_h", "zero-wait MAE (h)", "{:.2f}"),
    ("within_1h", "within 1 h", "{:.1%}"),
    ("zero_within_1h", "zero-wait within 1 h", "{:.1%}"),
    ("within_10m", "within 10 min", "{:.1%}"),
    ("zero_within_10m", "zero-wait within 10 min", "{:.1%}"),
    ("spearman", "Spearman", "{:.2f}"),
    ("daily_corr", "daily-mean correlation", "{:.2f}"),
    ("ks_1min", "KS (whole minutes)", "{:.3f}"),
    ("real_mean_h", "real mean wait (h)", "{:.2f}"),
    ("sim_mean_h", "simulated mean wait (h)", "{:.2f}"),
    ("n", "jobs", "{:d}"),
]


def _fmt(v, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else fmt.format(v)


def _fair_share_choice(doc: dict) -> list[str]:
    """What the search chose about fair share, when it was asked to search it."""
    if not doc["search"].get("fairshare"):
        return []
    c = doc["config"]
    if c.get("priority") == "multifactor" and c.get("weight_fairshare"):
        said = f"Slurm's multifactor priority with fair share{fair_share_text(c)}"
    else:
        said = f"no fair share (priority {c['priority']})"
    return [f"Fair share was searched (`--search-fairshare`); the search chose {said}.", ""]


def markdown(doc: dict) -> str:
    w = doc["windows"]
    out = [f"# Calibration of {doc['trace']}", ""]
    for msg in doc["warnings"]:
        out += [f"> **WARNING:** {msg}", ""]
    out += [
        f"Calibrated on jobs submitted {w['calibrate_from']} to {w['calibrate_to']} (exclusive), scored on "
        f"{w['score_from']} to {w['score_to']}; each month replayed from a warm start {doc['lead_in_days']:g} "
        f"days before it. Search: {doc['search']['trials_run']} trials in {doc['search']['elapsed_s']} s "
        f"(budget {doc['search']['trials']} trials / {doc['search']['timeout_s']:g} s, stopped by "
        f"{doc['search']['stopped_by']}), seed {doc['search']['seed']}.",
        "",
        "These are **replay fidelity** figures: each month is replayed with every job's real run time, which "
        "is not known when a job is submitted. They say how well the simulator reproduces the log, not how "
        "well it predicts a wait; for prediction at submission see `python -m mirage_tasks waitpred`.",
        "",
        f"MAE reduction against the zero-wait predictor: in sample "
        f"{_fmt(doc['mae_reduction_vs_zero']['in_sample'], '{:.1%}')}, out of sample "
        f"{_fmt(doc['mae_reduction_vs_zero']['out_of_sample'], '{:.1%}')}.",
        "",
        "| figure | in sample | out of sample | default config, out of sample |",
        "|---|---|---|---|",
    ]
    for key, label, fmt in ROWS:
        out.append(
            f"| {label} | {_fmt(doc['in_sample'].get(key), fmt)} | {_fmt(doc['out_of_sample'].get(key), fmt)} "
            f"| {_fmt(doc['default_out_of_sample'].get(key), fmt)} |"
        )
    out += [
        "",
        "Out of sample, per month:",
        "",
        "| month | n | MAE (h) | zero-wait MAE (h) | within 1 h | zero-wait within 1 h | Spearman | daily corr |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, r in doc["out_of_sample_months"].items():
        out.append(
            f"| {m} | {r['n']} | {_fmt(r.get('mae_h'), '{:.2f}')} | {_fmt(r.get('zero_mae_h'), '{:.2f}')} | "
            f"{_fmt(r.get('within_1h'), '{:.1%}')} | {_fmt(r.get('zero_within_1h'), '{:.1%}')} | "
            f"{_fmt(r.get('spearman'), '{:.2f}')} | {_fmt(r.get('daily_corr'), '{:.2f}')} |"
        )
    f = doc["trace_facts"]
    out += [
        "",
        "Read from the trace (calibration window): "
        f"{f['jobs']} jobs, busy nodes at most {f['peak_busy_nodes']} held for an hour (instantaneous maximum "
        f"{f['instant_max_busy_nodes']}, mean {f['mean_busy_nodes']}), largest job {f['max_job_nodes']} nodes, per user at most {f['user_max_jobs']} "
        f"running jobs and {f['user_max_nodes']} nodes held for an hour, {f['quick_start_share']:.1%} of jobs start within 60 s "
        f"(median {f['dispatch_latency_s']} s: the dispatch latency), machine size "
        f"{f['machine_nodes'] or 'not recorded'}.",
        "",
        *_fair_share_choice(doc),
        "Chosen configuration (`config.json`, usable as `--cluster-config`):",
        "",
        "```json",
        json.dumps(doc["config"], indent=2, sort_keys=True),
        "```",
        "",
    ]
    return "\n".join(out)
