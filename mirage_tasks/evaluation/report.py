"""``python -m mirage_tasks report --in URI... --out URI``: one self-contained results page.

Each ``--in`` is a committed step output; its ``_SUCCESS.json`` ``step`` field says what
it is:

* ``metrics``: the metrics tables and the per-sample rows the plots use;
* ``validate``: validation rows (metrics are computed here when no ``metrics`` output is
  given; otherwise they only add to the provenance);
* ``fidelity``: the simulator fidelity tables;
* ``train``: training curves (``curves.json``) and held-out scores (``metrics.json``);
* anything else (``ingest``, ``sample``, ``merge``, ...): parameters and fingerprints only.

Outputs under ``--out``: ``report.html`` (plots embedded as base64 PNG, no external
files), ``report.md`` (the same tables, figures linked from ``figures/``), the PNGs in
``figures/``, then ``_SUCCESS.json``. Every section is always present (with a note when
its inputs were not given); section ids: ``summary``, ``metrics``, ``cdf``, ``box``,
``fidelity``, ``training``, ``parameters``, ``provenance``.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError, provenance, require_committed, storage

from .. import __version__
from ..data.artifacts import load_metrics
from ..sim import decision_rules as dr
from ..sim.probes import BASELINES
from . import metrics as M

log = logging.getLogger(__name__)

SECTIONS = [
    ("summary", "Summary"),
    ("metrics", "Metrics by model, node size and load level"),
    ("cdf", "Distribution of the signed interruption (CDF)"),
    ("box", "Signed interruption by model (box plots)"),
    ("fidelity", "Simulator fidelity"),
    ("training", "Training curves"),
    ("parameters", "Run parameters"),
    ("provenance", "Data and step fingerprints"),
]
KNOWN_STEPS = ("metrics", "validate", "fidelity", "train")
X_KEYS = ("epoch", "round")
FIDELITY_COLS = ("n", "real_mean_h", "sim_mean_h", "mae_h", "medae_h", "zero_mae_h", "spearman", "ks", "ks_1min")


# ----------------------------------------------------------------------------- inputs


def classify(uris: list[str]) -> list[dict[str, Any]]:
    out = []
    for uri in uris:
        marker = require_committed(uri, "report input")
        out.append({"uri": storage.normalize(uri), "step": marker.get("step"), "marker": marker})
    return out


def gather_metrics(items: list[dict], n_boot: int, seed: int) -> tuple[pd.DataFrame | None, pd.DataFrame | None, dict]:
    mets = [i for i in items if i["step"] == "metrics"]
    vals = [i for i in items if i["step"] == "validate"]
    if mets:
        tables, samples, counts = [], [], {}
        for i in mets:
            t, s, doc = load_metrics(i["uri"])
            tables.append(t)
            samples.append(s)
            counts.update(doc.get("level_counts", {}))
        table = pd.concat(tables, ignore_index=True)
        dup = table.duplicated(["model", "node", "level"])
        if dup.any():
            raise StepError(f"metrics inputs overlap: {int(dup.sum())} (model, node, level) rows appear twice")
        return table, pd.concat(samples, ignore_index=True), counts
    if vals:
        df, _runs = M.load_inputs([i["uri"] for i in vals])
        return M.compute(df, n_boot, seed)
    return None, None, {}


# ----------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.grid": True, "grid.alpha": 0.3, "figure.dpi": 100})
    return plt


def _png(fig: Any) -> bytes:
    fig.tight_layout(h_pad=2.5)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return buf.getvalue()


def _levels_present(g: pd.DataFrame) -> list[str]:
    return ["all"] + [lv for lv in M.LEVELS[1:] if (g["level"] == lv).any()]


def _grid(plt: Any, n: int, w: float, h: float) -> tuple[Any, list]:
    """A figure of ``n`` panels, at most two per row (readable when scaled to the page width)."""
    cols = min(2, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False)
    flat = list(axes.ravel())
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _level_name(level: str) -> str:
    return "all samples" if level == "all" else f"{level} load"


def _counts_text(c: dict) -> str:
    return ", ".join(f"{lv} {int(c.get(lv, 0))}" for lv in M.LEVELS[1:])


def _line_style(model: str) -> dict[str, Any]:
    """Baselines dashed and on top (a model identical to one stays visible)."""
    base = model in BASELINES
    return {"linewidth": 1.6 if base else 1.2, "linestyle": "--" if base else "-", "zorder": 3 if base else 2}


def _colors(models: list[str]) -> dict[str, Any]:
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return {m: cmap(i % 10) for i, m in enumerate(models)}


def cdf_figure(samples: pd.DataFrame, node: int) -> bytes:
    plt = _plt()
    g = samples[samples["node"] == node]
    levels = _levels_present(g)
    models = M.model_order(list(g["model"].unique()))
    colors = _colors(models)
    fig, axes = _grid(plt, len(levels), 5.4, 3.8)
    for ax, level in zip(axes, levels):
        sub = g if level == "all" else g[g["level"] == level]
        for m in models:
            x = np.sort(sub.loc[sub["model"] == m, "signed_interruption_h"].to_numpy(np.float64))
            if len(x) == 0:
                continue
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(
                np.concatenate([[x[0]], x]),
                np.concatenate([[0.0], y]),
                where="post",
                color=colors[m],
                label=f"{m} (n={len(x)})",
                **_line_style(m),
            )
        ax.axvline(0.0, color="0.4", linewidth=0.8)
        n = int((sub["model"] == dr.REACTIVE).sum())
        ax.set_title(f"{node}-node jobs, {_level_name(level)} ({n} samples)")
        ax.set_xlabel("signed interruption (h): succ. start - pred. end")
        ax.set_ylabel("fraction of samples <= x")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("CDF of the signed interruption (left of 0: overlap, right of 0: service gap)", y=1.02)
    return _png(fig)


def box_figure(samples: pd.DataFrame, node: int) -> bytes:
    plt = _plt()
    g = samples[samples["node"] == node]
    levels = _levels_present(g)
    models = M.model_order(list(g["model"].unique()))
    fig, axes = _grid(plt, len(levels), max(5.4, 0.9 * len(models) + 1.5), 4.2)
    for ax, level in zip(axes, levels):
        sub = g if level == "all" else g[g["level"] == level]
        data = [sub.loc[sub["model"] == m, "signed_interruption_h"].to_numpy(np.float64) for m in models]
        keep = [i for i, d in enumerate(data) if len(d)]
        data, names = [data[i] for i in keep], [models[i] for i in keep]
        ax.boxplot(
            data, showmeans=True, meanprops={"marker": "^", "markerfacecolor": "tab:red", "markeredgecolor": "tab:red"}
        )
        ax.set_xticks(range(1, len(names) + 1), names, rotation=30, ha="right")
        for i, d in enumerate(data, start=1):
            ax.annotate(
                f"mean {d.mean():.2f}\nmed {np.median(d):.2f}",
                (i, 1.0),
                xycoords=("data", "axes fraction"),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.axhline(0.0, color="0.4", linewidth=0.8)
        ax.set_title(f"{node}-node jobs, {_level_name(level)}", pad=22)
        ax.set_ylabel("signed interruption (h)")
        ax.set_xlabel("model (red triangle: mean)")
    return _png(fig)


def curve_series(curves: list[dict]) -> tuple[np.ndarray, dict[str, np.ndarray], list[tuple[int, str]]]:
    """x (running epoch/round over all phases), numeric series, and phase boundaries."""
    xs, series, bounds, last_phase = [], {}, [], object()
    keys = [
        k
        for k in sorted({k for c in curves for k in c})
        if k not in X_KEYS
        and k != "phase"
        and not k.endswith("_std")
        and any(isinstance(c.get(k), (int, float)) and not isinstance(c.get(k), bool) for c in curves)
    ]
    own = next((k for k in X_KEYS if all(isinstance(c.get(k), (int, float)) for c in curves)), None)
    single = len({str(c.get("phase", "")) for c in curves}) == 1
    for i, c in enumerate(curves):
        if c.get("phase") != last_phase:
            bounds.append((i + 1, str(c.get("phase", ""))))
            last_phase = c.get("phase")
        xs.append(c[own] if (own and single) else i + 1)
        for k in keys:
            v = c.get(k)
            series.setdefault(k, []).append(float(v) if isinstance(v, (int, float)) else np.nan)
    return np.array(xs), {k: np.array(v) for k, v in series.items()}, bounds


def curves_figure(name: str, curves: list[dict]) -> bytes | None:
    xs, series, bounds = curve_series(curves)
    if not len(xs) or not series:
        return None
    plt = _plt()
    groups = [
        ("MAE (h)", [k for k in series if k.endswith("_mae_h")]),
        ("loss (scaled target)", [k for k in series if k.endswith("_loss")]),
        ("return (-|interruption| min)", [k for k in series if "return" in k]),
    ]
    groups = [(lab, ks) for lab, ks in groups if ks]
    if not groups:
        groups = [("value", list(series))]
    fig, axes = plt.subplots(1, len(groups), figsize=(4.6 * len(groups), 3.4), squeeze=False)
    xlabel = (
        "round" if any("round" in c for c in curves) else "epoch" if len(bounds) <= 1 else "epoch (all phases in order)"
    )
    for ax, (lab, ks) in zip(axes[0], groups):
        for k in ks:
            ax.plot(xs, series[k], marker="." if len(xs) < 60 else None, label=k)
        if len(bounds) > 1:
            for x0, _ph in bounds[1:]:
                ax.axvline(x0 - 0.5, color="0.8", linewidth=0.6)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(lab)
        ax.legend(fontsize=7)
        ax.set_title(name + (f" ({len(bounds)} phases)" if len(bounds) > 1 else ""))
    return _png(fig)


def hpo_figure(name: str, trials: list[dict]) -> bytes | None:
    """Each trial's validation loss and the best so far, in trial order."""
    pts = [(t["number"], t["value"]) for t in trials if t.get("state") == "COMPLETE" and t.get("value") is not None]
    if not pts:
        return None
    plt = _plt()
    xs = np.array([p[0] for p in pts])
    ys = np.array([p[1] for p in pts], dtype=np.float64)
    fig, ax = plt.subplots(figsize=(5.2, 3.2))
    ax.scatter(xs, ys, s=14, label="trial")
    ax.step(xs, np.minimum.accumulate(ys), where="post", color="C3", label="best so far")
    ax.scatter(xs[:1], ys[:1], marker="x", color="k", label="preset (trial 0)")
    ax.set_xlabel("trial")
    ax.set_ylabel("validation loss (training period)")
    ax.set_title(f"hyper-parameter search: {name}", fontsize=9)
    ax.legend(fontsize=7)
    return _png(fig)


# ----------------------------------------------------------------------------- HTML / Markdown

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1250px;
color:#222;line-height:1.4;padding:0 1em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.85em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f3f3f3}
td:first-child,td:nth-child(2),th:first-child{text-align:left}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}
pre{background:#f7f7f7;padding:.6em;overflow:auto;font-size:.8em}
.note{color:#666;font-style:italic}nav a{margin-right:1em}
"""


class Page:
    def __init__(self) -> None:
        self.html: list[str] = []
        self.md: list[str] = []
        self.figures: dict[str, bytes] = {}

    def section(self, sid: str, title: str) -> None:
        self.html.append(f'<section id="{sid}"><h2>{html.escape(title)}</h2>')
        self.md += [f"## {title}", ""]

    def end(self) -> None:
        self.html.append("</section>")

    def h3(self, text: str) -> None:
        self.html.append(f"<h3>{html.escape(text)}</h3>")
        self.md += [f"### {text}", ""]

    def p(self, text: str, note: bool = False) -> None:
        cls = ' class="note"' if note else ""
        self.html.append(f"<p{cls}>{html.escape(text)}</p>")
        self.md += [f"_{text}_" if note else text, ""]

    def table(self, head: list[str], rows: list[list[str]]) -> None:
        h = "".join(f"<th>{html.escape(str(c))}</th>" for c in head)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows)
        self.html.append(f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>")
        esc = lambda c: str(c).replace("|", "\\|")  # noqa: E731
        self.md += ["| " + " | ".join(esc(c) for c in head) + " |", "|" + "---|" * len(head)]
        self.md += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
        self.md.append("")

    def image(self, name: str, png: bytes, alt: str) -> None:
        self.figures[name] = png
        b64 = base64.b64encode(png).decode()
        self.html.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}"></figure>')
        self.md += [f"![{alt}](figures/{name})", ""]

    def pre(self, text: str, summary: str) -> None:
        self.html.append(f"<details><summary>{html.escape(summary)}</summary><pre>{html.escape(text)}</pre></details>")
        self.md += [f"<details><summary>{summary}</summary>", "", "```json", text, "```", "", "</details>", ""]


def _load_term(load: dict | None) -> str:
    """The load term of a calibrated decision rule (``calibration.load``), or '-' for a fixed threshold."""
    if not load:
        return "-"
    return f"{load.get('feature')}: slope {_fmt(load.get('slope'))} (beta {_fmt(load.get('beta'))})"


def _fmt(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v)
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return "-" if not np.isfinite(v) else (f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}")
    return str(v)


def _given(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _short(uri: str, prefix: str | None) -> str:
    """``uri`` below the run prefix as ``<run>/...`` (the storage root is not the reader's business)."""
    if prefix and uri.startswith(prefix.rstrip("/") + "/"):
        return "<run>/" + uri[len(prefix.rstrip("/")) + 1 :]
    return uri


def build(
    items: list[dict], title: str, n_boot: int, seed: int, *, runs: list[dict] | None = None, prefix: str | None = None
) -> tuple[str, str, dict[str, bytes], dict]:
    """The page, its Markdown, its figures and the marker summary. ``runs``: the DAG-run records of
    the run prefix (:func:`mirage_tasks.run.runlog.read_runs`), named with their size and params
    as given; ``prefix``: the run prefix, shown as ``<run>`` in output paths."""
    table, samples, counts = gather_metrics(items, n_boot, seed)
    pg = Page()
    stamp = pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds")
    steps_seen = sorted({str(i["step"]) for i in items})
    summary: dict[str, Any] = {}
    runs = runs or []

    # summary ------------------------------------------------------------------
    pg.section("summary", SECTIONS[0][1])
    if runs:
        last = runs[-1]
        size = (last.get("params") or {}).get("size")
        if last.get("run_type") == "scheduled":  # scheduled runs have size "scheduled" whatever the form says
            size = "scheduled"
        pg.p(
            f"DAG run {last.get('run_id')} ({last.get('run_type') or 'trigger not recorded'}, logical date "
            f"{last.get('logical_date') or 'none'}), size {size if size is not None else 'not given'}"
            + (
                f"; {len(runs) - 1} earlier DAG run(s) of the same configuration: "
                + ", ".join(str(r.get("run_id")) for r in runs[:-1])
                if len(runs) > 1
                else ""
            )
            + "."
        )
        changed = last.get("changed") or {}
        pg.p(
            "Params as given: "
            + (
                ", ".join(
                    f"{k}={_given(v.get('value') if isinstance(v, dict) else v)}" for k, v in sorted(changed.items())
                )
                if changed
                else "the DAG's defaults"
            )
            + " (all params: Parameters below)."
        )
        summary.update({"run_id": last.get("run_id"), "size": size, "runs": [r.get("run_id") for r in runs]})
    else:
        pg.p(
            "Not made by a DAG run (no run record beside the report): the step outputs below are its inputs.", note=True
        )
    if counts:
        summary["samples"] = {str(k): v for k, v in counts.items()}
    code = provenance.code_version()
    summary["code"] = code
    pg.p(
        f"Generated {stamp} by mirage_tasks {__version__} ({provenance.describe(code)}) from {len(items)} step "
        f"output(s): {', '.join(steps_seen)}; each output's code is under Provenance."
    )
    if table is not None and len(table):
        pg.p(
            "Signed interruption = successor start - predecessor end, hours (> 0: service gap, < 0: both jobs run "
            "and the overlap wastes node x overlap node-hours). Zero interruption = share of samples with signed <= 0. "
            "Reduction = 1 - mean interruption / the reactive baseline's on the same samples. Load levels come from "
            "the reactive baseline's interruption on each sample: low <= 2 h, medium 2-12 h, heavy > 12 h. "
            "Brackets: paired bootstrap 95% intervals."
        )
        for node in sorted(table["node"].unique()):
            c = counts.get(str(int(node)), {})
            pg.h3(f"{int(node)}-node jobs, all samples (samples per load level: {_counts_text(c)})")
            sub = table[(table["node"] == node) & (table["level"] == "all")]
            pg.table(M.TABLE_HEAD, [M.table_cells(r) for r in M.records(sub)])
            for d in M.never_submits(table[table["node"] == node]):
                pg.p(
                    f"{d['model']} never submitted before the predecessor ended on any of its {d['n']} "
                    f"{int(node)}-node samples: online it is the reactive baseline."
                )
        summary["never_submits"] = M.never_submits(table)
        summary["headline"] = {
            f"{r['model']}@{r['node']}": {
                k: r[k] for k in ("n", "mean_interruption_h", "zero_share", "reduction_vs_reactive")
            }
            for r in M.records(table[table["level"] == "all"])
        }
    else:
        pg.p("No metrics or validate output among the inputs: no results to summarise.", note=True)
    pg.end()

    # metrics ------------------------------------------------------------------
    pg.section("metrics", SECTIONS[1][1])
    if table is not None and len(table):
        for node in sorted(table["node"].unique()):
            pg.h3(f"{int(node)}-node jobs")
            pg.table(M.TABLE_HEAD, [M.table_cells(r) for r in M.records(table[table["node"] == node])])
    else:
        pg.p("Not available: give a metrics output (or validate outputs) with --in.", note=True)
    pg.end()

    # plots --------------------------------------------------------------------
    for sid, heading, fn, what in (
        ("cdf", SECTIONS[2][1], cdf_figure, "CDF"),
        ("box", SECTIONS[3][1], box_figure, "box plot"),
    ):
        pg.section(sid, heading)
        if samples is not None and len(samples):
            for node in sorted(samples["node"].unique()):
                pg.image(
                    f"{sid}_node{int(node)}.png",
                    fn(samples, int(node)),
                    f"{what} of the signed interruption, {int(node)}-node jobs, per load level and model",
                )
        else:
            pg.p("Not available: no validation rows among the inputs.", note=True)
        pg.end()

    # fidelity -----------------------------------------------------------------
    pg.section("fidelity", SECTIONS[4][1])
    fids = [i for i in items if i["step"] == "fidelity"]
    if fids:
        for i in fids:
            doc = storage.read_json(storage.join(i["uri"], "fidelity.json"))
            pg.p(
                f"{i['uri']}: jobs submitted {doc.get('from')} to {doc.get('to')} (exclusive); per-job wait "
                f"(start - submit) simulated vs real, hours. Targets: {json.dumps(doc.get('targets', {}))}."
            )
            reps = doc.get("reports") or {}
            for name in sorted(reps, key=lambda k: (k != "tested", k)):
                rep = reps[name]
                cfg = rep.get("config", {})
                pg.h3(
                    f"{name}: {cfg.get('nodes')} nodes, backfill {cfg.get('backfill')}, priority {cfg.get('priority')}, "
                    f"warm start {cfg.get('warm_start')}"
                )
                pooled = rep.get("pooled") or {}
                cols = [c for c in FIDELITY_COLS if c in pooled] + sorted(c for c in pooled if c not in FIDELITY_COLS)
                rows = [[m] + [_fmt(r.get(c)) for c in cols] for m, r in (rep.get("months") or {}).items()]
                rows.append(["pooled"] + [_fmt(rep["pooled"].get(c)) for c in cols])
                pg.table(["month"] + cols, rows)
    else:
        pg.p("Not available: no fidelity output among the inputs.", note=True)
    pg.end()

    # training -----------------------------------------------------------------
    pg.section("training", SECTIONS[5][1])
    trains = [i for i in items if i["step"] == "train"]
    if trains:
        score_rows = []
        for n, i in enumerate(trains):
            params = i["marker"].get("params", {})
            name = f"{params.get('model', '?')} ({i['uri'].rstrip('/').split('/')[-1]})"
            cu = storage.join(i["uri"], "curves.json")
            curves = storage.read_json(cu) if storage.exists(cu) else []
            png = curves_figure(name, curves) if curves else None
            if png is not None:
                pg.image(f"training_{n}.png", png, f"training curves of {name}")
            else:
                pg.p(f"{name}: no per-epoch curves recorded.", note=True)
            hu = storage.join(i["uri"], "hpo_trials.json")
            if storage.exists(hu):
                hdoc = storage.read_json(hu)
                hpng = hpo_figure(name, hdoc.get("trials") or [])
                if hpng is not None:
                    pg.image(f"hpo_{n}.png", hpng, f"hyper-parameter search of {name}")
                hs = hdoc.get("summary") or {}
                pg.p(
                    f"{name}: {hs.get('library')} {hs.get('sampler')}, {hs.get('n_complete')} of "
                    f"{hs.get('n_trials')} trials complete in {_fmt(hs.get('seconds'))} s on {hs.get('data')}; "
                    f"{hs.get('objective')}: preset {_fmt(hs.get('preset_value'))}, best {_fmt(hs.get('best_value'))} "
                    f"(trial {hs.get('best_number')}: {json.dumps(hs.get('best_params'), default=str)})."
                )
            mu = storage.join(i["uri"], "metrics.json")
            met = storage.read_json(mu) if storage.exists(mu) else i["marker"].get("summary", {})
            cal = met.get("calibration") or {}
            never = met.get("never_submits_early") or (met.get("threshold") is None and "threshold" in met)
            thr = met.get("threshold_h", met.get("threshold"))
            score_rows.append(
                [name]
                + [
                    _fmt(met.get(k))
                    for k in ("val_mae_h", "val_constant_mae_h", "train_mae_h", "initial_val_return", "best_val_return")
                ]
                + [
                    "never early" if never else _fmt(thr),
                    _load_term(cal.get("load")),
                    _fmt((cal.get("chosen") or {}).get("objective")),
                    _fmt((cal.get("default") or {}).get("objective")),
                    "yes" if met.get("argmax_never_submits") else ("no" if "argmax_never_submits" in met else "-"),
                    _fmt(met.get("wall_s")),
                ]
            )
        pg.h3("Held-out scores and calibrated decision rules")
        pg.p(
            "Threshold: regressors submit when the predicted signed interruption (h) reaches it, policies when "
            "P(submit) does; chosen on the training period's own validation split by minimising mean interruption "
            "+ waste weight x wasted node-hours (objective; 'fixed' = the seed's -0.5 h, or 0.5 for a policy). "
            "'argmax never submits': the policy's P(submit) never exceeds 0.5 there. Load term: where the "
            "split preferred it, the score minus slope x z(load at the decision) is compared with the "
            "threshold (z standardised on the split, clipped to its range); '-' = a fixed threshold."
        )
        pg.table(
            [
                "model",
                "val MAE h",
                "constant MAE h",
                "train MAE h",
                "policy val return (start)",
                "policy val return (best)",
                "threshold",
                "load term",
                "objective (calibrated)",
                "objective (fixed)",
                "argmax never submits",
                "wall s",
            ],
            score_rows,
        )
    else:
        pg.p("Not available: no train output among the inputs.", note=True)
    pg.end()

    # parameters ---------------------------------------------------------------
    pg.section("parameters", SECTIONS[6][1])
    if runs:
        given = runs[-1].get("params") or {}
        changed = runs[-1].get("changed") or {}
        pg.p(f"The DAG run's params as given (run {runs[-1].get('run_id')}; * = not the DAG's default):")
        pg.table(
            ["param", "value"], [[f"{k}{' *' if k in changed else ''}", _given(v)] for k, v in sorted(given.items())]
        )
    rows = []
    for i in items:
        p = i["marker"].get("params", {})
        short = {k: v for k, v in p.items() if not isinstance(v, (dict, list)) or k in ("shard",)}
        rows.append([i["step"], _short(i["uri"], prefix), ", ".join(f"{k}={v}" for k, v in short.items())])
    pg.p("What each step computed with (the resolved values, from its marker):")
    pg.table(["step", "output", "parameters (scalars)"], rows)
    for i in items:
        pg.pre(
            json.dumps(i["marker"].get("params", {}), indent=1, sort_keys=True, default=str),
            f"all parameters of {i['step']} {_short(i['uri'], prefix)}",
        )
    pg.end()

    # provenance ---------------------------------------------------------------
    pg.section("provenance", SECTIONS[7][1])
    rows = []
    for i in items:
        m = i["marker"]
        ins = "; ".join(f"{x.get('uri')} ({str(x.get('fingerprint'))[:23]})" for x in m.get("inputs", []))
        rows.append(
            [
                i["step"],
                i["uri"],
                str(m.get("fingerprint", ""))[:16],
                m.get("finished", ""),
                m.get("version", ""),
                provenance.describe(m.get("code")),
                ins or "-",
            ]
        )
    pg.table(["step", "output", "fingerprint", "finished", "version", "code", "inputs (fingerprint)"], rows)
    traces = set()
    for i in items:
        if i["step"] == "validate":
            vj = storage.join(i["uri"], "validate.json")
            if storage.exists(vj):
                traces.add(str(storage.read_json(vj).get("trace_fingerprint")))
    if traces:
        pg.p("Trace fingerprints of the validation runs: " + ", ".join(sorted(traces)) + ".")
    pg.end()

    nav = " ".join(f'<a href="#{sid}">{html.escape(t)}</a>' for sid, t in SECTIONS)
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><nav>{nav}</nav>\n"
        + "\n".join(pg.html)
        + "\n</body></html>\n"
    )
    md = "\n".join([f"# {title}", ""] + pg.md)
    summary.update({"inputs": len(items), "steps": steps_seen, "figures": sorted(pg.figures)})
    return page, md, pg.figures, summary
