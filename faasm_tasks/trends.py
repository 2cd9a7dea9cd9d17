"""Trends across days of Faasm results, and the regression check built on them.

Input: the run records written by :mod:`faasm_tasks.results` under
``<results>/<YYYY-MM-DD>/<run-id>/<experiment>/<system>/<point>/repeat-<r>/attempt-<k>/run.json``.
For every point and repeat of a run only the latest attempt counts, and only a measured
one (``status == "succeeded"``, ``outcome.ok``, not marked invalid). A point's value for a
day is the median over that day's runs and repeats.

* :func:`load_window` reads the last ``days`` date folders up to a date (one row per
  run, point and repeat);
* :func:`daily` reduces them to one value per point and day;
* :func:`write_report` writes ``trends.html`` (self-contained: PNGs embedded as base64),
  ``trends.md`` (figures in ``figures/``), ``trends.json`` and the PNGs;
* :func:`compare` checks this run's points against the trailing median of the previous
  days (``check`` step);
* :func:`aa_history` tracks the A/A control over the window: each run's verdict and the
  false-difference rate with its interval against the target (the page's "A/A
  false-difference rate over the days", ``aa-rate --results``).
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from stepkit import provenance, storage

from .order import AA_ARMS
from .results import iter_records, run_prefix

DAY_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: Columns of one row of :func:`load_window`.
METRICS = ("p50_us", "p99_us", "throughput_ok", "run_time_ms", "memory_gb_s")
#: The metrics :func:`compare` can check: (metric, direction that is bad, label).
CHECKED = {
    "p99_us": ("increase", "p99 latency (us)"),
    "throughput_ok": ("drop", "throughput (req/s)"),
    "run_time_ms": ("increase", "run time (ms)"),
}


def window_dates(root: str, end: str, days: int) -> list[str]:
    """Date folders under ``root`` in ``(end - days, end]`` (sorted)."""
    if days < 1:
        raise ValueError(f"--days must be at least 1, got {days}")
    last = dt.date.fromisoformat(end)
    first = last - dt.timedelta(days=days - 1)
    fs, path = storage.filesystem(root)
    if hasattr(fs, "invalidate_cache"):
        fs.invalidate_cache(path)
    try:
        names = [os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)]
    except FileNotFoundError:
        return []
    out = []
    for n in names:
        if DAY_RE.match(n):
            try:
                d = dt.date.fromisoformat(n)
            except ValueError:
                continue
            if first <= d <= last:
                out.append(n)
    return sorted(out)


def _runs(root: str, date: str) -> list[str]:
    fs, path = storage.filesystem(storage.join(root, date))
    try:
        return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False) if fs.isdir(p))
    except FileNotFoundError:
        return []


def measured(rec: dict[str, Any]) -> bool:
    """A record whose numbers count: finished, ok and not marked invalid."""
    if rec.get("status") != "succeeded" or not (rec.get("outcome") or {}).get("ok"):
        return False
    return rec.get("valid", True) is not False and not rec.get("invalid")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def run_rows(root: str, date: str, run_id: str, problems: list[dict[str, str]] | None = None) -> list[dict[str, Any]]:
    """One row per point and repeat of a run: its latest attempt (unreadable ones to ``problems``)."""
    base = storage.normalize(run_prefix(root, date, run_id))
    latest: dict[tuple, tuple[dict, str]] = {}
    for uri, rec in iter_records(root, date, run_id, problems):
        rel = storage.normalize(uri)[len(base) :].strip("/").split("/")
        rep = next((i for i, p in enumerate(rel) if p.startswith("repeat-")), None)
        if rep is None or rep < 3:
            continue
        key = (rel[0], rel[1], "/".join(rel[2:rep]), rel[rep])
        if key not in latest or rec.get("attempt", 0) > latest[key][0].get("attempt", 0):
            latest[key] = (rec, uri)
    rows = []
    for (exp, system, point, _rep), (rec, uri) in sorted(latest.items()):
        m, b = rec.get("metrics") or {}, rec.get("billing") or {}
        params = rec.get("params") or {}
        row = {
            "date": date,
            "run_id": run_id,
            "experiment": rec.get("experiment", exp),
            "system": rec.get("system", system),
            "point": point,
            "repeat": rec.get("repeat"),
            "arm": rec.get("arm"),
            "attempt": rec.get("attempt"),
            "status": rec.get("status"),
            "measured": measured(rec),
            "params": " ".join(f"{k}={v}" for k, v in sorted(params.items())),
            "uri": uri,
            "n_workers": _num(params.get("n_workers")),
            "matrix_size": _num(params.get("matrix_size")),
        }
        for k in METRICS:
            row[k] = _num(b.get(k) if k == "memory_gb_s" else m.get(k))
        row["send_lag_p99_us"] = _num(m.get("send_lag_p99_us"))  # the driver's own lag, beside the latency
        row["send_lag_exceeded"] = bool(m.get("send_lag_exceeded"))
        rows.append(row)
    return rows


def load_window(root: str, end: str, days: int, problems: list[dict[str, str]] | None = None) -> pd.DataFrame:
    """Every run's rows in the last ``days`` date folders up to ``end``; a ``run.json`` that cannot
    be read goes to ``problems`` (its URI and why) when given."""
    rows: list[dict[str, Any]] = []
    for date in window_dates(root, end, days):
        for run_id in _runs(root, date):
            rows += run_rows(root, date, run_id, problems)
    cols = [
        "date",
        "run_id",
        "experiment",
        "system",
        "point",
        "repeat",
        "arm",
        "attempt",
        "status",
        "measured",
        "params",
        "uri",
        "n_workers",
        "matrix_size",
        *METRICS,
        "send_lag_p99_us",
        "send_lag_exceeded",
    ]
    return pd.DataFrame(rows, columns=cols)


def daily(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (experiment, system, point, date): medians of the measured rows."""
    keys = ["experiment", "system", "point", "date"]
    ok = df[df["measured"]]
    if ok.empty:
        return pd.DataFrame(columns=[*keys, "params", "n_workers", "matrix_size", "runs", *METRICS])
    agg = {k: "median" for k in METRICS}
    agg.update(params="first", n_workers="first", matrix_size="first", run_id="nunique")
    out = ok.groupby(keys, as_index=False).agg(agg).rename(columns={"run_id": "runs"})
    return out.sort_values(keys).reset_index(drop=True)


# ------------------------------------------------------------------------------ check


@dataclass
class Thresholds:
    p99_increase_pct: float | None = None
    throughput_drop_pct: float | None = None
    run_time_increase_pct: float | None = None
    min_history: int = 3

    def for_metric(self, metric: str) -> float | None:
        return {
            "p99_us": self.p99_increase_pct,
            "throughput_ok": self.throughput_drop_pct,
            "run_time_ms": self.run_time_increase_pct,
        }[metric]


@dataclass
class CheckResult:
    breaches: list[dict[str, Any]] = field(default_factory=list)
    checked: list[dict[str, Any]] = field(default_factory=list)
    too_little_history: list[dict[str, Any]] = field(default_factory=list)
    no_data: bool = False
    #: the run's A/A control (:func:`aa_control`); ``fail``: the day is untrustworthy
    aa: dict[str, Any] = field(default_factory=dict)
    #: breaches of an untrustworthy day: listed, not judged as regressions
    not_judged: list[dict[str, Any]] = field(default_factory=list)
    #: previous runs left out of the trailing medians because their A/A control failed
    untrustworthy_history: list[dict[str, str]] = field(default_factory=list)
    #: changes past their threshold whose interval against the trailing days' values includes 1:
    #: within the day-to-day noise, listed and not called regressions
    within_noise: list[dict[str, Any]] = field(default_factory=list)

    @property
    def trustworthy(self) -> bool:
        return self.aa.get("verdict") != "fail"

    def to_dict(self) -> dict[str, Any]:
        return {
            "breaches": self.breaches,
            "checked": self.checked,
            "too_little_history": self.too_little_history,
            "no_data": self.no_data,
            "trustworthy": self.trustworthy,
            "aa": self.aa,
            "not_judged": self.not_judged,
            "untrustworthy_history": self.untrustworthy_history,
            "within_noise": self.within_noise,
        }


def breach_text(b: dict[str, Any]) -> str:
    sign = "+" if b["direction"] == "increase" else "-"
    return (
        f"{b['experiment']}/{b['system']} point {b['point']}: {b['metric']} = {b['value']:.6g}, "
        f"{b['change_pct']:+.1f}% vs the trailing median {b['trailing_median']:.6g} of {b['history_days']} "
        f"previous days (threshold {sign}{b['threshold_pct']:g}%)"
        + (
            f"; ratio to the trailing days' values [{b['ratio_lo']:.3g}, {b['ratio_hi']:.3g}] at 95 %"
            if b.get("ratio_lo") is not None
            else ""
        )
    )


def aa_control(run: pd.DataFrame, level: float = 0.95) -> dict[str, Any]:
    """The A/A control of one run: for every experiment, system, point and checked metric
    measured as the two arms of :data:`faasm_tasks.order.AA_ARMS`, the ratio of the arms'
    medians with its interval (:func:`faasm_tasks.stats.aa_verdict`: Bonferroni over the
    figures). ``verdict`` ``none`` when the run had no A/A arms."""
    from . import stats  # scipy only here

    if run.empty or "arm" not in run:
        return {"verdict": "none", "figures": []}
    ok = run[run["measured"].astype(bool) & run["arm"].isin(AA_ARMS)]
    comparisons = []
    for (exp, system, point), g in ok.groupby(["experiment", "system", "point"]):
        a, b = g[g["arm"] == AA_ARMS[0]], g[g["arm"] == AA_ARMS[1]]
        for metric in CHECKED:
            va, vb = a[metric].dropna().tolist(), b[metric].dropna().tolist()
            if va and vb:
                comparisons.append((f"{exp}/{system} {point} {metric}", va, vb))
    if not comparisons:
        return {"verdict": "none", "figures": []}
    out = stats.aa_verdict(comparisons, level)
    out["arms"] = list(AA_ARMS)
    return out


def aa_text(aa: dict[str, Any]) -> str:
    """One line of an A/A verdict for the logs and the report."""
    v = aa.get("verdict", "none")
    if v == "none":
        return "no A/A control in this run"
    if v == "no interval":
        return f"A/A control without an interval ({len(aa.get('figures', []))} figure(s), under 3 values per arm)"
    head = (
        f"A/A {v}: {aa['comparisons']} figure(s), each {AA_ARMS[0]}/{AA_ARMS[1]} ratio interval at "
        f"{aa['level_each']:.2%} (Bonferroni for {aa['level']:.0%} over the day)"
    )
    if v == "fail":
        return head + "; excluding 1: " + ", ".join(aa["excluding_1"])
    return head + " contains 1"


def aa_runs(df: pd.DataFrame, level: float = 0.95) -> list[dict[str, Any]]:
    """Every run in ``df`` that measured A/A arms, oldest first: its date, run id, A/A verdict
    (:func:`aa_control` over its arms' rows: ``pass``, ``fail`` or ``no interval``), the figures
    whose interval excluded 1 and the verdict's line (:func:`aa_text`). A run whose arms have no
    measured value has no verdict and is left out."""
    out: list[dict[str, Any]] = []
    if df.empty or "arm" not in df or not df["arm"].isin(AA_ARMS).any():
        return out
    for (date, run_id), g in df[df["arm"].isin(AA_ARMS)].groupby(["date", "run_id"]):
        aa = aa_control(g, level)  # only the arms' rows count
        if aa["verdict"] != "none":
            out.append(
                {
                    "date": date,
                    "run_id": run_id,
                    "verdict": aa["verdict"],
                    "excluding_1": aa.get("excluding_1", []),
                    "text": aa_text(aa),
                }
            )
    return out


def aa_history(df: pd.DataFrame, level: float = 0.95) -> dict[str, Any]:
    """The A/A false-difference rate over the runs in ``df`` (the trend page's window; ``aa-rate
    --results``): ``runs`` as :func:`aa_runs`, each counted one (``pass`` or ``fail``) with the
    running rate up to it (``running_failed`` of ``running_n``, ``running_rate`` and its
    Clopper-Pearson interval ``running_lo``/``running_hi``), and the window's rate, interval and
    target status (:func:`faasm_tasks.stats.false_difference_rate`)."""
    from . import stats  # scipy only here

    runs = aa_runs(df, level)
    failed = n = 0
    for r in runs:
        if r["verdict"] not in ("pass", "fail"):
            continue
        n += 1
        failed += r["verdict"] == "fail"
        lo, hi = stats.rate_ci(failed, n, level)
        r.update(running_failed=failed, running_n=n, running_rate=failed / n, running_lo=lo, running_hi=hi)
    return {"runs": runs, **stats.false_difference_rate(failed, n, level)}


def untrustworthy_runs(history: pd.DataFrame, level: float = 0.95) -> list[dict[str, str]]:
    """The runs in ``history`` whose A/A control failed (date, run id and why)."""
    return [
        {"date": r["date"], "run_id": r["run_id"], "aa": r["text"]}
        for r in aa_runs(history, level)
        if r["verdict"] == "fail"
    ]


def compare(history: pd.DataFrame, current: pd.DataFrame, date: str, th: Thresholds) -> CheckResult:
    """This run's measured points (``current``) against the days before ``date`` in ``history``.

    A run whose A/A control fails (:func:`aa_control`) is untrustworthy: its breaches go to
    ``not_judged`` instead of ``breaches``, and previous runs whose A/A failed are left out of
    the trailing medians (``untrustworthy_history``). A change past its threshold is a breach only
    when the 95 % ratio interval of this run's repeats against every value of the trailing days
    (:func:`faasm_tasks.stats.ratio_ci`) lies on the change's side of 1; one whose interval
    includes 1 is within the days' noise (``within_noise``). With fewer than 3 values a side there
    is no interval and the medians alone decide, as before repeats were measured."""
    from . import stats  # scipy only here

    res = CheckResult()
    cur = current[current["measured"]]
    if cur.empty:
        res.no_data = True
        return res
    res.aa = aa_control(current)
    before = history[history["date"] < date]
    res.untrustworthy_history = untrustworthy_runs(before)
    drop = {(u["date"], u["run_id"]) for u in res.untrustworthy_history}
    if drop:
        keep = [(d, r) not in drop for d, r in zip(history["date"], history["run_id"])]
        history = history[keep]
    day = daily(history)
    prev = day[day["date"] < date]
    raw_prev = history[(history["date"] < date) & history["measured"]]
    for (exp, system, point), g in cur.groupby(["experiment", "system", "point"]):
        h = prev[(prev["experiment"] == exp) & (prev["system"] == system) & (prev["point"] == point)]
        h_raw = raw_prev[
            (raw_prev["experiment"] == exp) & (raw_prev["system"] == system) & (raw_prev["point"] == point)
        ]
        for metric, (direction, _label) in CHECKED.items():
            limit = th.for_metric(metric)
            value = g[metric].dropna()
            if limit is None or value.empty:
                continue
            hist = h[metric].dropna()
            item = {
                "experiment": exp,
                "system": system,
                "point": point,
                "metric": metric,
                "value": float(value.median()),
                "history_days": int(len(hist)),
            }
            if len(hist) < th.min_history:
                res.too_little_history.append(item)
                continue
            med = float(hist.median())
            if med == 0:
                continue
            change = (item["value"] - med) / med * 100.0
            item.update(trailing_median=med, change_pct=round(change, 2), threshold_pct=limit, direction=direction)
            # today's repeats against every value of the trailing days: the change counts only when
            # its 95 % interval lies on its side of 1 (with fewer than 3 values a side, the medians alone)
            ci = stats.ratio_ci(value.to_numpy(), h_raw[metric].dropna().to_numpy(), paired=False)
            item.update(ratio_lo=ci.get("ratio_lo"), ratio_hi=ci.get("ratio_hi"))
            res.checked.append(item)
            if (direction == "increase" and change > limit) or (direction == "drop" and -change > limit):
                shown = "ratio_lo" not in ci or (ci["ratio_lo"] > 1 if direction == "increase" else ci["ratio_hi"] < 1)
                if not shown:
                    res.within_noise.append(item)
                else:
                    (res.breaches if res.trustworthy else res.not_judged).append(item)
    return res


# ------------------------------------------------------------------------------ report


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def figures(day: pd.DataFrame, run_date: str) -> list[tuple[str, str, bytes | None]]:
    """(name, caption, PNG or None when there is no data) for every trend plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: list[tuple[str, str, bytes | None]] = []
    lat = day.dropna(subset=["p99_us"]) if not day.empty else day
    for exp in sorted(lat["experiment"].unique()) if not lat.empty else []:
        e = lat[lat["experiment"] == exp]
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharex=True)
        lines = 0
        for (system, point), g in e.groupby(["system", "point"]):
            g = g.sort_values("date")
            x = pd.to_datetime(g["date"])
            for ax, col in zip(axes, ("p50_us", "p99_us"), strict=True):
                ax.plot(x, g[col] / 1000.0, marker="o", ms=3, label=f"{system} {point}")
            lines += 1
        for ax, title in zip(axes, ("p50 latency (ms)", "p99 latency (ms)"), strict=True):
            ax.set_title(f"{exp}: {title}")
            ax.grid(alpha=0.3)
            ax.tick_params(axis="x", rotation=30)
        if lines <= 12:
            axes[1].legend(fontsize=7, loc="best")
        out.append(
            (f"latency_{exp}", f"{exp}: p50 and p99 latency per system and point over days ({lines} series)", _png(fig))
        )
    tl = lat.dropna(subset=["throughput_ok"]) if not lat.empty else lat
    if not tl.empty:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for (exp, system), g in tl.groupby(["experiment", "system"]):
            old, new = g[g["date"] != run_date], g[g["date"] == run_date].sort_values("throughput_ok")
            pts = ax.scatter(old["throughput_ok"], old["p99_us"] / 1000.0, s=10, alpha=0.3)
            ax.plot(
                new["throughput_ok"],
                new["p99_us"] / 1000.0,
                marker="o",
                color=pts.get_facecolor()[0][:3],
                label=f"{exp} {system}",
            )
        ax.set_xlabel("throughput (successful req/s)")
        ax.set_ylabel("p99 latency (ms)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"Throughput against latency (line: {run_date}; dots: earlier days)")
        out.append(("throughput_latency", "Throughput against p99 latency", _png(fig)))
    else:
        out.append(("throughput_latency", "Throughput against p99 latency", None))
    for name, col, title in (
        ("sgd_workers", "n_workers", "SGD time against workers"),
        ("matrix_size", "matrix_size", "Matrix multiplication time against size"),
    ):
        sub = day.dropna(subset=[col, "run_time_ms"]) if not day.empty else day
        if name == "sgd_workers" and not sub.empty:
            sub = sub[sub["matrix_size"].isna()]
        if sub.empty:
            out.append((name, title, None))
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for (exp, system), g in sub.groupby(["experiment", "system"]):
            old = g[g["date"] != run_date]
            new = g[g["date"] == (run_date if (g["date"] == run_date).any() else g["date"].max())]
            new = new.sort_values(col)
            pts = ax.scatter(old[col], old["run_time_ms"] / 1000.0, s=10, alpha=0.3)
            ax.plot(
                new[col],
                new["run_time_ms"] / 1000.0,
                marker="o",
                color=pts.get_facecolor()[0][:3],
                label=f"{exp} {system} ({new['date'].iloc[0]})",
            )
        ax.set_xlabel(col.replace("_", " "))
        ax.set_ylabel("time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(f"{title} (line: latest day; dots: earlier days)")
        out.append((name, title, _png(fig)))
    bill = day.dropna(subset=["memory_gb_s"]) if not day.empty else day
    if bill.empty:
        out.append(("billing", "Billing (memory GB-s per day)", None))
    else:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        per = bill.groupby(["experiment", "system", "date"], as_index=False)["memory_gb_s"].sum()
        for (exp, system), g in per.groupby(["experiment", "system"]):
            ax.plot(pd.to_datetime(g["date"]), g["memory_gb_s"], marker="o", label=f"{exp} {system}")
        ax.set_ylabel("memory GB-s (sum over points)")
        ax.grid(alpha=0.3)
        ax.tick_params(axis="x", rotation=30)
        ax.legend(fontsize=7)
        ax.set_title("Billing over time")
        out.append(("billing", "Billing: memory GB-s per day, experiment and system", _png(fig)))
    return out


def aa_rate_figure(hist: dict[str, Any]) -> tuple[str, str, bytes | None]:
    """The A/A false-difference rate over the days (:func:`aa_history`): the running rate with its
    interval as a band, each run's verdict as a marker on it, and the target as a line."""
    caption = "A/A false-difference rate over the days: running rate, its interval and the target"
    counted = [r for r in hist["runs"] if "running_rate" in r]
    if not counted:
        return ("aa_rate", caption, None)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = pd.to_datetime([r["date"] for r in counted])
    pct = [100.0 * r["running_rate"] for r in counted]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.fill_between(
        x,
        [100.0 * r["running_lo"] for r in counted],
        [100.0 * r["running_hi"] for r in counted],
        step="post",
        alpha=0.2,
        label=f"{hist['level']:.0%} {hist['interval']} interval",
    )
    ax.step(x, pct, where="post", label="running rate")
    for verdict, marker, color in (("pass", "o", "tab:green"), ("fail", "X", "tab:red")):
        sel = [i for i, r in enumerate(counted) if r["verdict"] == verdict]
        if sel:
            ax.scatter(x[sel], [pct[i] for i in sel], marker=marker, color=color, zorder=3, label=f"A/A {verdict}")
    ax.axhline(100.0 * hist["target"], color="black", ls="--", lw=1, label=f"target {hist['target']:.0%}")
    ax.set_ylabel("A/A verdicts failed so far (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(
        f"A/A false-difference rate: {hist['failed_days']} of {hist['verdicts']} failed, "
        f"target {hist['target']:.0%}: {hist['target_status']}"
    )
    return ("aa_rate", caption, _png(fig))


def trend_table(day: pd.DataFrame, run_date: str) -> list[dict[str, Any]]:
    """Per point: the latest day's value next to the median of the days before it."""
    rows = []
    if day.empty:
        return rows
    for (exp, system, point), g in day.groupby(["experiment", "system", "point"]):
        g = g.sort_values("date")
        last = g.iloc[-1]
        prev = g[g["date"] < last["date"]]
        row = {"experiment": exp, "system": system, "point": point, "days": int(len(g)), "latest": last["date"]}
        for metric in ("p50_us", "p99_us", "throughput_ok", "run_time_ms", "memory_gb_s"):
            v = _num(last[metric])
            if v is None:
                continue
            med = _num(prev[metric].median()) if not prev[metric].dropna().empty else None
            row[metric] = v
            row[f"{metric}_median_before"] = med
            row[f"{metric}_change_pct"] = round((v - med) / med * 100, 1) if med else None
        rows.append(row)
    return rows


# The ATC'20 paper's headline ratios (wasm / native; abstract), per experiment and metric.
PAPER_RATIOS = {
    ("sgd_reuters_svm", "run_time_ms"): "0.5 (2x speed-up)",
    ("sgd_reuters_svm", "memory_gb_s"): "0.1 (10x less memory)",
    ("tf_inference_throughput", "throughput_ok"): "2 (double the throughput)",
    ("tf_inference_throughput", "p99_us"): "0.1 (tail latency -90 %)",
    ("tf_inference_latency", "p99_us"): "0.1 (tail latency -90 %)",
}
COMPARED = ("run_time_ms", "p50_us", "p99_us", "throughput_ok", "memory_gb_s")
#: How wasm's effect against native reads per compared metric: (smaller is better, words).
EFFECT_WORDS = {
    "run_time_ms": (True, ("faster", "slower")),
    "p50_us": (True, ("faster", "slower")),
    "p99_us": (True, ("faster", "slower")),
    "throughput_ok": (False, ("higher", "lower")),
    "memory_gb_s": (True, ("less", "more")),
}


def point_intervals(run: pd.DataFrame) -> list[dict[str, Any]]:
    """Per experiment, system, point and metric of one run: n of its measured repeats, the
    median with its order-statistic 95 % interval (none under 6 repeats, and said) and the
    mean with its Student-t interval (:mod:`faasm_tasks.stats`)."""
    from . import stats  # scipy only here

    rows: list[dict[str, Any]] = []
    if run.empty:
        return rows
    ok = run[run["measured"].astype(bool)]
    for (exp, system, point), g in ok.groupby(["experiment", "system", "point"]):
        for metric in METRICS:
            vals = [v for v in g[metric] if _num(v) is not None]
            if vals:
                d = stats.describe(vals)
                rows.append(
                    {
                        "experiment": exp,
                        "system": system,
                        "point": point,
                        "metric": metric,
                        **d,
                        "note": d.get("median_ci_note", ""),
                    }
                )
    return rows


def system_comparison(run: pd.DataFrame) -> list[dict[str, Any]]:
    """wasm against native in one run: per experiment and metric, the ratio of the medians
    (``effect_99``: the same as "x % faster (± y %) at 99 %", :func:`faasm_tasks.stats.effect`)
    over the measured runs of each system (the points the two sweeps share, when they share
    any) with a 95 % bootstrap interval: paired over (point, repeat) when the sweeps share
    points (each wasm run against the native run of the same point and repeat), else the two
    samples resampled apart. ``verdict`` says on which side of 1 the interval lies."""
    from . import stats  # scipy only here

    rows: list[dict[str, Any]] = []
    if run.empty:
        return rows
    ok = run[run["measured"].astype(bool)]
    if "arm" in ok:  # the A/A control's second arm is its own figure, not a second native sample
        ok = ok[ok["arm"] != AA_ARMS[1]]
    for exp, g in ok.groupby("experiment"):
        w, n = g[g["system"] == "wasm"], g[g["system"] == "native"]
        if w.empty or n.empty:
            continue
        shared = sorted(set(w["point"]) & set(n["point"]))
        if shared:
            w, n = w[w["point"].isin(shared)], n[n["point"].isin(shared)]
        for metric in COMPARED:
            a, b = _num(w[metric].median()), _num(n[metric].median())
            if a is None or b is None:
                continue
            if shared:
                pairs = (
                    w[["point", "repeat", metric]]
                    .merge(n[["point", "repeat", metric]], on=["point", "repeat"], suffixes=("_w", "_n"))
                    .dropna()
                )
                xa, xb, paired = pairs[f"{metric}_w"], pairs[f"{metric}_n"], True
            else:
                xa, xb, paired = w[metric].dropna(), n[metric].dropna(), False
            ci = stats.ratio_ci(xa, xb, paired=paired)
            lower, words = EFFECT_WORDS[metric]
            eff = stats.effect(xa, xb, paired=paired, lower_is_better=lower, words=words)
            rows.append(
                {
                    "experiment": exp,
                    "metric": metric,
                    "wasm": a,
                    "native": b,
                    "ratio": round(a / b, 4) if b else None,
                    "ratio_lo": ci.get("ratio_lo"),
                    "ratio_hi": ci.get("ratio_hi"),
                    "n_wasm": ci.get("n_a"),
                    "n_native": ci.get("n_b"),
                    "paired": ci.get("paired"),
                    "verdict": ci.get("verdict", ci.get("ci_note", "")),
                    "effect_99": eff["text"] or eff["note"],
                    "points": "shared" if shared else "all",
                    "paper": PAPER_RATIOS.get((exp, metric), ""),
                }
            )
    return rows


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return ""
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


TABLE_COLS = [
    ("experiment", "experiment"),
    ("system", "system"),
    ("point", "point"),
    ("days", "days"),
    ("latest", "latest day"),
    ("p50_us", "p50 us"),
    ("p99_us", "p99 us"),
    ("p99_us_change_pct", "p99 vs median %"),
    ("throughput_ok", "req/s"),
    ("throughput_ok_change_pct", "req/s vs median %"),
    ("run_time_ms", "run time ms"),
    ("run_time_ms_change_pct", "run time vs median %"),
    ("memory_gb_s", "memory GB-s"),
]
CMP_COLS = [
    ("experiment", "experiment"),
    ("metric", "metric"),
    ("wasm", "wasm"),
    ("native", "native"),
    ("ratio", "wasm/native"),
    ("ratio_lo", "95 % low"),
    ("ratio_hi", "95 % high"),
    ("verdict", "interval"),
    ("effect_99", "wasm effect (99 %)"),
    ("n_wasm", "n wasm"),
    ("n_native", "n native"),
    ("points", "points"),
    ("paper", "paper (wasm/native)"),
]
CI_COLS = [
    ("experiment", "experiment"),
    ("system", "system"),
    ("point", "point"),
    ("metric", "metric"),
    ("n", "n"),
    ("median", "median"),
    ("median_lo", "median 95 % low"),
    ("median_hi", "median 95 % high"),
    ("mean", "mean"),
    ("mean_lo", "mean 95 % low (t)"),
    ("mean_hi", "mean 95 % high (t)"),
    ("note", "note"),
]
RUN_COLS = [
    ("experiment", "experiment"),
    ("system", "system"),
    ("params", "params"),
    ("repeat", "repeat"),
    ("arm", "A/A arm"),
    ("attempt", "attempt"),
    ("status", "status"),
    ("p50_us", "p50 us"),
    ("p99_us", "p99 us"),
    ("send_lag_p99_us", "driver send lag p99 us"),
    ("send_lag_exceeded", "send lag over bound"),
    ("throughput_ok", "req/s"),
    ("run_time_ms", "run time ms"),
    ("memory_gb_s", "memory GB-s"),
]

AA_COLS = [
    ("figure", "figure"),
    ("ratio", "A/A' ratio of medians"),
    ("ratio_lo", "low"),
    ("ratio_hi", "high"),
    ("verdict", "interval"),
    ("n_a", "n A"),
    ("n_b", "n A'"),
]

AA_RATE_COLS = [
    ("date", "date"),
    ("run_id", "run"),
    ("verdict", "A/A verdict"),
    ("running_failed", "failed so far"),
    ("running_n", "verdicts so far"),
    ("running_rate", "running rate"),
    ("running_lo", "low"),
    ("running_hi", "high"),
]
AA_RATE_NOTE = (
    "Each run with A/A arms in the window, oldest first: its A/A verdict (fail: a ratio interval "
    "excluded 1 although nothing differs) and the rate of failed verdicts up to it with its "
    "Clopper-Pearson interval at the A/A level. A verdict without an interval (under 3 values per "
    "arm) is listed, not counted. The target: at most 1 - level of the days fail; met when the "
    "whole interval lies at or below it, not met when it lies above it, else undecided."
)


INTERVALS_NOTE = (
    "n: measured repeats (failed, invalid and failed-check points are not counted). Median: "
    "order-statistic 95 % interval (Le Boudec), refused under 6 repeats; mean: Student-t 95 % "
    "interval. Ratios: percentile bootstrap (2,000 resamples) of the ratio of medians, paired over "
    "(point, repeat) where the systems share points."
)


def _html_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    if not rows:
        return "<p class='empty'>No data.</p>"
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(r.get(k)))}</td>" for k, _ in cols) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _md_table(rows: list[dict[str, Any]], cols: list[tuple[str, str]]) -> str:
    if not rows:
        return "_No data._\n"
    lines = ["| " + " | ".join(t for _, t in cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(r.get(k)).replace("|", "/") for k, _ in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


FAIL_COLS = [("what", "what"), ("step", "step"), ("error", "cause")]


def failure_rows(run: pd.DataFrame, failures: dict[str, list[dict[str, Any]]] | None) -> list[dict[str, Any]]:
    """Every failure of this run, one row each: failed points, experiment groups that failed
    before they had a point, unreadable results (file and cause)."""
    rows = [
        {
            "what": f"{r['experiment']}/{r['system']} {r['params']} repeat {r['repeat']}",
            "step": "run",
            "error": "point failed",
        }
        for r in run[run["status"] == "failed"].to_dict("records")
    ]
    for g in (failures or {}).get("failed_groups", []):
        rows.append(
            {"what": f"{g['experiment']}/{g['system']} (whole group)", "step": g.get("step"), "error": g.get("error")}
        )
    for p in (failures or {}).get("unreadable", []):
        rows.append({"what": p["uri"], "step": "read", "error": p["error"]})
    return rows


def render(
    df: pd.DataFrame,
    run_id: str,
    run_date: str,
    days: int,
    failures: dict[str, list[dict[str, Any]]] | None = None,
    code: dict[str, Any] | None = None,
) -> dict[str, bytes]:
    """The report files: ``trends.html``, ``trends.md``, ``trends.json`` and ``figures/*.png``.
    ``failures`` (``failed_groups``, ``unreadable``: :func:`faasm_tasks.results.failed_groups`,
    :func:`~faasm_tasks.results.iter_records`) head the page as FAILED with the failed points.
    ``code``: the code that made the report (:func:`stepkit.provenance.code_version`, this process's
    by default), named in the header and in ``trends.json``."""
    from . import stats  # scipy only here

    code = provenance.code_version() if code is None else code
    day = daily(df)
    figs = figures(day, run_date)
    table = trend_table(day, run_date)
    run = df[(df["run_id"] == run_id) & (df["date"] == run_date)]
    run_rows_ = [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in run.drop(columns=["uri"]).to_dict("records")
    ]
    dates = sorted(df["date"].unique()) if not df.empty else []
    title = f"Faasm benchmarks: trends over {days} days to {run_date}"
    meta = (
        f"Run <code>{html.escape(run_id)}</code> on {html.escape(run_date)}; {len(dates)} days with results "
        f"({html.escape(dates[0]) if dates else '-'} to {html.escape(dates[-1]) if dates else '-'}), "
        f"{df['run_id'].nunique() if not df.empty else 0} runs, {int(df['measured'].sum()) if not df.empty else 0}"
        f" measured points of {len(df)}. Made by <code>{html.escape(provenance.describe(code))}</code>."
    )
    fails = failure_rows(run, failures)
    if fails:
        banner = (
            f"FAILED: {len(fails)} failure(s) in this run (failed points, experiment groups that failed "
            "before their first point, unreadable results); the figures below leave them out."
        )
        fail_html = [f"<h2 id='failed' class='failed'>{html.escape(banner)}</h2>", _html_table(fails, FAIL_COLS)]
        fail_md = [f"## {banner}\n", _md_table(fails, FAIL_COLS)]
    else:
        fail_html, fail_md = [], []
    files: dict[str, bytes] = {}
    cmp = system_comparison(run)
    cis = point_intervals(run)
    aa = aa_control(run)
    trustworthy = aa.get("verdict") != "fail"
    aa_line = aa_text(aa) if trustworthy else "UNTRUSTWORTHY day: " + aa_text(aa)
    aa_html = [
        "<h2 id='aa'>A/A control</h2>",
        ("<p>" if trustworthy else "<p class='failed'>") + html.escape(aa_line) + "</p>",
        _html_table(aa.get("figures", []), AA_COLS),
    ]
    aa_md = ["## A/A control\n", aa_line + "\n", _md_table(aa.get("figures", []), AA_COLS)]
    aa_hist = aa_history(df)
    rate_line = f"Over the {days} days to {run_date}: " + stats.rate_text(aa_hist)
    rate_rows = [
        {**r, **{k: f"{r[k]:.1%}" for k in ("running_rate", "running_lo", "running_hi") if k in r}}
        for r in aa_hist["runs"]
    ]
    rate_cls = "<p class='failed'>" if aa_hist["target_status"] == "not met" else "<p>"
    aa_html += [
        "<h3 id='aa-rate'>A/A false-difference rate over the days</h3>",
        rate_cls + html.escape(rate_line) + "</p>",
        f"<p>{html.escape(AA_RATE_NOTE)}</p>",
        _html_table(rate_rows, AA_RATE_COLS),
    ]
    aa_md += [
        "### A/A false-difference rate over the days\n",
        rate_line + "\n",
        AA_RATE_NOTE + "\n",
        _md_table(rate_rows, AA_RATE_COLS),
    ]
    figs.append(aa_rate_figure(aa_hist))
    parts_html = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{meta}</p>",
        *fail_html,
        *aa_html,
        "<h2 id='run'>This run</h2>",
        _html_table(run_rows_, RUN_COLS),
        "<h2 id='intervals'>Each figure of this run with its intervals</h2>",
        f"<p>{html.escape(INTERVALS_NOTE)}</p>",
        _html_table(cis, CI_COLS),
        "<h2 id='systems'>wasm against native in this run</h2>",
        _html_table(cmp, CMP_COLS),
        "<h2 id='trend'>Latest value against the days before</h2>",
        _html_table(table, TABLE_COLS),
        "<h2 id='plots'>Plots</h2>",
    ]
    parts_md = [
        f"# {title}\n",
        re.sub(r"</?code>", "`", meta) + "\n",
        *fail_md,
        *aa_md,
        "## This run\n",
        _md_table(run_rows_, RUN_COLS),
        "## Each figure of this run with its intervals\n",
        INTERVALS_NOTE + "\n",
        _md_table(cis, CI_COLS),
        "## wasm against native in this run\n",
        _md_table(cmp, CMP_COLS),
        "## Latest value against the days before\n",
        _md_table(table, TABLE_COLS),
        "## Plots\n",
    ]
    for name, caption, png in figs:
        parts_html.append(f"<h3 id='fig-{html.escape(name)}'>{html.escape(caption)}</h3>")
        parts_md.append(f"### {caption}\n")
        if png is None:
            parts_html.append("<p class='empty'>No data for this plot in the window.</p>")
            parts_md.append("_No data for this plot in the window._\n")
            continue
        files[f"figures/{name}.png"] = png
        b64 = base64.b64encode(png).decode()
        parts_html.append(f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{b64}'>")
        parts_md.append(f"![{caption}](figures/{name}.png)\n")
    style = (
        "body{font-family:sans-serif;margin:1.5em;max-width:1200px}table{border-collapse:collapse;"
        "font-size:12px;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        "td:nth-child(-n+3),th{text-align:left}img{max-width:100%}.empty{color:#888}.failed{color:#b00}"
    )
    files["trends.html"] = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{style}</style></head><body>"
        + "\n".join(parts_html)
        + "</body></html>\n"
    ).encode()
    files["trends.md"] = "\n".join(parts_md).encode()
    files["trends.json"] = (
        json.dumps(
            {
                "run_id": run_id,
                "date": run_date,
                "days": days,
                "dates": dates,
                "trend": table,
                "daily": daily_records(day),
                "systems": cmp,
                "intervals": cis,
                "status": "FAILED" if fails else "ok",
                "failures": fails,
                "code": code,
                "aa": aa,
                "trustworthy": trustworthy,
                "aa_rate": aa_hist,
            },
            indent=2,
            sort_keys=True,
            default=str,
        )
        + "\n"
    ).encode()
    return files


def daily_records(day: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
        for r in day.to_dict("records")
    ]


def signature(df: pd.DataFrame) -> list[str]:
    """What the report depends on: every row's identity, attempt and status (for the step fingerprint)."""
    if df.empty:
        return []
    return sorted(
        f"{r.date}/{r.run_id}/{r.experiment}/{r.system}/{r.point}/{r.repeat}{_arm(r)}:{r.attempt}:{r.status}:{r.memory_gb_s}"
        for r in df.itertuples()
    )


def _arm(row: Any) -> str:
    arm = getattr(row, "arm", None)
    return "" if arm is None or (isinstance(arm, float) and math.isnan(arm)) else f".{arm}"
