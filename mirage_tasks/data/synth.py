"""Synthetic traces: fit a workload profile to a real trace, or generate one (the ``synth`` step).

The real traces may not be redistributed with the project and are not on a user's fresh
machine, so the embedded default runs on a synthetic trace drawn from a profile fitted
to the real one. The profile is numbers only (no job ids, names or times):

* **arrivals** in *batches* (a user submitting several jobs within ``batch_gap_s`` of each
  other, as job arrays and scripted sweeps do): the batch rate for each of the 168
  hours of the week, the batch-size distribution and the gaps inside a batch;
* **shape**: the joint distribution of (nodes, time limit) per batch, which keeps their
  correlation (wide jobs ask for long limits);
* **runtimes** as a fraction of the time limit, per time-limit class (quantiles), with
  the share of jobs that run into their limit;
* **users**: how batches spread over users (activity shares by rank);
* **waits** per node-count class (quantiles), only to give generated jobs a plausible
  start for warm-starting the simulator; the simulator recomputes every start.

Fit:      ``synth --fit TRACE --out PROFILE_PREFIX [--compare-month 2023-02]``
          writes ``profile.json`` and ``fit_report.{json,md}`` (real vs generated month).
Generate: ``synth --profile ls6-a100|PROFILE.json --from ISO --to ISO --seed S --out URI``
          writes ``trace.parquet`` in the normalised schema.
"""

from __future__ import annotations

import logging
from importlib import resources
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError, storage

from .profiles import PACKAGED
from .schema import TraceMeta

log = logging.getLogger(__name__)

PROFILE_VERSION = 1
QUANTILES = np.linspace(0.0, 1.0, 101)
LIMIT_CLASSES_S = [3600, 6 * 3600, 24 * 3600]  # <=1 h, <=6 h, <=24 h, longer
NODE_CLASSES = [1, 4]  # 1, 2-4, >4


# ------------------------------------------------------------------ fitting


def _limit_class(limit_s: np.ndarray) -> np.ndarray:
    return np.searchsorted(LIMIT_CLASSES_S, limit_s, side="left")


def _node_class(nodes: np.ndarray) -> np.ndarray:
    return np.searchsorted(NODE_CLASSES, nodes, side="left")


def _batches(df: pd.DataFrame, gap_s: float) -> np.ndarray:
    """Batch id per job (jobs sorted by submit): same user, each submit within gap_s of the previous."""
    t = _seconds(df["submit"])
    users = df["user"].fillna("?").to_numpy()
    order = np.lexsort((t, users))
    tu, uu = t[order], users[order]
    new = np.ones(len(df), dtype=bool)
    new[1:] = (uu[1:] != uu[:-1]) | ((tu[1:] - tu[:-1]) > gap_s)
    ids_sorted = np.cumsum(new) - 1
    ids = np.empty(len(df), dtype=np.int64)
    ids[order] = ids_sorted
    return ids


def _seconds(s: pd.Series) -> np.ndarray:
    unit = getattr(s.dtype, "unit", "ns")
    div = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
    return s.astype("int64").to_numpy() // div


def fit_profile(df: pd.DataFrame, meta: TraceMeta, gap_s: float = 60.0) -> dict[str, Any]:
    """A workload profile (numbers only) from a normalised trace frame."""
    df = df[df["submit"].notna() & df["time_limit_s"].notna()].copy()
    if "nodes" not in df or df["nodes"].isna().all():
        df["nodes"] = df["procs"]
    df = df[df["nodes"].notna() & (df["nodes"] > 0)].sort_values("submit").reset_index(drop=True)
    if len(df) < 100:
        raise StepError(f"{meta.source}: only {len(df)} usable jobs; a profile needs at least 100")
    submit = _seconds(df["submit"])
    limit = df["time_limit_s"].astype("int64").to_numpy()
    nodes = df["nodes"].astype("int64").to_numpy()
    start = df["start"]
    run = np.where(
        df["end"].notna() & start.notna(),
        (_seconds(df["end"].fillna(df["submit"])) - _seconds(start.fillna(df["submit"]))),
        -1,
    )
    wait = np.where(start.notna(), _seconds(start.fillna(df["submit"])) - submit, -1)

    bid = _batches(df, gap_s)
    first = pd.Series(submit).groupby(bid).min()
    size = pd.Series(bid).value_counts().sort_index()
    t_first = pd.to_datetime(first.to_numpy(), unit="s", utc=True)
    how = (t_first.day_of_week * 24 + t_first.hour).to_numpy()
    # The rate is averaged over the trace's dense span: a log's first and last days are often
    # sparse (ls6 holds 61 October jobs before the partition opened), which would dilute it.
    lo, hi = np.quantile(submit, [0.005, 0.995])
    span_h = max((hi - lo) / 3600.0, 1.0)
    hours_per_slot = span_h / 168.0
    rate = np.bincount(how, minlength=168) / hours_per_slot
    # Gaps between consecutive jobs inside a batch.
    order = np.lexsort((submit, bid))
    same = bid[order][1:] == bid[order][:-1]
    intra = np.diff(submit[order])[same]

    # Joint (nodes, limit) per batch: the first job of each batch represents it.
    firsts = pd.DataFrame({"bid": bid, "nodes": nodes, "limit": limit}).groupby("bid").first()
    pairs = firsts.value_counts(["nodes", "limit"]).sort_index()
    shape = [[int(n), int(lim), int(c)] for (n, lim), c in pairs.items()]

    ratio = np.where((run >= 0) & (limit > 0), run / np.maximum(limit, 1), np.nan)
    runtime = {}
    lc = _limit_class(limit)
    for c in range(len(LIMIT_CLASSES_S) + 1):
        r = ratio[(lc == c) & ~np.isnan(ratio)]
        if len(r) == 0:
            r = ratio[~np.isnan(ratio)]
        runtime[str(c)] = {
            "to_limit_share": float(np.mean(r >= 0.999)),
            "ratio_quantiles": np.round(np.quantile(np.clip(r[r < 0.999], 0, 1), QUANTILES), 6).tolist()
            if np.any(r < 0.999)
            else [0.5] * len(QUANTILES),
        }
    waits = {}
    nc = _node_class(nodes)
    for c in range(len(NODE_CLASSES) + 1):
        w = wait[(nc == c) & (wait >= 0)]
        if len(w) == 0:
            w = wait[wait >= 0] if np.any(wait >= 0) else np.zeros(1)
        waits[str(c)] = np.round(np.quantile(w, QUANTILES)).astype(int).tolist()
    user_batches = pd.Series(df["user"].fillna("?").to_numpy()).groupby(bid).first().value_counts().to_numpy()
    status_nt = df["status"][ratio < 0.999].value_counts(normalize=True)
    return {
        "profile_version": PROFILE_VERSION,
        "fitted_on": {
            "format": meta.format,
            "timezone": meta.timezone,
            "jobs": int(len(df)),
            "first_submit": pd.Timestamp(submit.min(), unit="s", tz="UTC").isoformat(),
            "last_submit": pd.Timestamp(submit.max(), unit="s", tz="UTC").isoformat(),
        },
        "machine_nodes": meta.machine_nodes,
        "batch_gap_s": gap_s,
        "arrivals": {
            "batch_rate_per_hour_of_week": np.round(rate, 5).tolist(),
            "batch_size_pmf": _pmf(size.to_numpy(), cap=1000),
            "intra_batch_gap_quantiles_s": np.round(np.quantile(intra, QUANTILES), 1).tolist()
            if len(intra)
            else [0.0] * len(QUANTILES),
        },
        "shape_nodes_limit_counts": shape,
        "runtime_by_limit_class": runtime,
        "limit_classes_s": LIMIT_CLASSES_S,
        "wait_quantiles_s_by_node_class": waits,
        "node_classes": NODE_CLASSES,
        "user_batch_shares": np.round(user_batches / user_batches.sum(), 6).tolist(),
        "status_when_not_timeout": {str(k): round(float(v), 6) for k, v in status_nt.items()},
    }


def _pmf(values: np.ndarray, cap: int) -> list[list[float]]:
    v = np.minimum(values, cap)
    uniq, counts = np.unique(v, return_counts=True)
    return [[int(u), round(float(c) / len(v), 8)] for u, c in zip(uniq, counts, strict=True)]


# ------------------------------------------------------------------ generating


#: The keys of a workload profile (what :func:`fit_profile` writes); any other key is refused.
PROFILE_KEYS = frozenset(
    {
        "profile_version",
        "fitted_on",
        "machine_nodes",
        "batch_gap_s",
        "arrivals",
        "shape_nodes_limit_counts",
        "runtime_by_limit_class",
        "limit_classes_s",
        "wait_quantiles_s_by_node_class",
        "node_classes",
        "user_batch_shares",
        "status_when_not_timeout",
    }
)
ARRIVAL_KEYS = frozenset({"batch_rate_per_hour_of_week", "batch_size_pmf", "intra_batch_gap_quantiles_s"})


def _numbers(
    where: str, key: str, v: Any, n: int | None = None, width: int | None = None, nonneg: bool = True
) -> np.ndarray:
    """``v`` as a float array of ``n`` numbers (rows of ``width``), finite and (``nonneg``) >= 0;
    a :class:`StepError` naming ``key`` otherwise."""
    shape = f"{n if n else 'a non-empty list of'} " + (f"[{width} numbers] rows" if width else "numbers")
    ok = isinstance(v, list) and len(v) > 0 and (n is None or len(v) == n)
    rows = v if width is None else (v if ok else [])
    if ok and width is not None:
        ok = all(isinstance(r, list) and len(r) == width for r in rows)
        rows = [x for r in rows for x in r] if ok else []
    ok = ok and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in rows)
    arr = np.asarray(rows, dtype=float) if ok else np.zeros(0)
    if not ok or not np.isfinite(arr).all() or (nonneg and (arr < 0).any()):
        raise StepError(f"{where}: {key} must be {shape}" + (" (finite, >= 0)" if nonneg else " (finite)"))
    return arr


def validate_profile(p: dict[str, Any], where: str) -> None:
    """A workload profile's shape: its version, no unknown keys (a misspelt key would be
    silently ignored otherwise), and every array :func:`generate` draws from."""
    from stepkit.safeload import refuse_unknown

    if not isinstance(p, dict) or p.get("profile_version") != PROFILE_VERSION:
        raise StepError(f"{where}: not a workload profile of version {PROFILE_VERSION}")
    refuse_unknown(p, PROFILE_KEYS, where)
    a = p.get("arrivals")
    if not isinstance(a, dict):
        raise StepError(f"{where}: arrivals must be an object")
    refuse_unknown(a, ARRIVAL_KEYS, where, "key in arrivals")
    _numbers(where, "arrivals.batch_rate_per_hour_of_week", a.get("batch_rate_per_hour_of_week"), n=168)
    pmf = _numbers(where, "arrivals.batch_size_pmf", a.get("batch_size_pmf"), width=2).reshape(-1, 2)
    if (pmf[:, 0] < 1).any() or pmf[:, 1].sum() <= 0:
        raise StepError(f"{where}: arrivals.batch_size_pmf needs sizes >= 1 and a positive total probability")
    _numbers(where, "arrivals.intra_batch_gap_quantiles_s", a.get("intra_batch_gap_quantiles_s"), n=len(QUANTILES))
    if not p.get("shape_nodes_limit_counts"):
        raise StepError(f"{where}: shape_nodes_limit_counts is empty")
    shape = _numbers(where, "shape_nodes_limit_counts", p["shape_nodes_limit_counts"], width=3).reshape(-1, 3)
    if (shape[:, 0] < 1).any() or shape[:, 2].sum() <= 0:
        raise StepError(f"{where}: shape_nodes_limit_counts needs nodes >= 1 and a positive count")
    if _numbers(where, "user_batch_shares", p.get("user_batch_shares")).sum() <= 0:
        raise StepError(f"{where}: user_batch_shares must not all be 0")
    for key, classes in (
        ("runtime_by_limit_class", len(LIMIT_CLASSES_S) + 1),
        ("wait_quantiles_s_by_node_class", len(NODE_CLASSES) + 1),
    ):
        d = p.get(key)
        if not isinstance(d, dict) or any(str(c) not in d for c in range(classes)):
            raise StepError(f"{where}: {key} must map each class 0..{classes - 1} (as a string)")
        for c in range(classes):
            if key == "wait_quantiles_s_by_node_class":
                _numbers(where, f"{key}.{c}", d[str(c)], n=len(QUANTILES))
                continue
            spec = d[str(c)]
            if not isinstance(spec, dict):
                raise StepError(f"{where}: {key}.{c} must be an object")
            refuse_unknown(spec, {"to_limit_share", "ratio_quantiles"}, where, f"key in {key}.{c}")
            share = spec.get("to_limit_share")
            if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 <= share <= 1:
                raise StepError(f"{where}: {key}.{c}.to_limit_share must be a number in [0, 1]")
            _numbers(where, f"{key}.{c}.ratio_quantiles", spec.get("ratio_quantiles"), n=len(QUANTILES))
    _values(p, where, shape, pmf)
    st = p.get("status_when_not_timeout")
    if st is not None and st != {}:
        if not isinstance(st, dict) or not all(isinstance(k, str) for k in st):
            raise StepError(f"{where}: status_when_not_timeout must map status names to shares")
        if _numbers(where, "status_when_not_timeout", list(st.values())).sum() <= 0:
            raise StepError(f"{where}: status_when_not_timeout must not be all 0")


#: Upper bounds of a profile's values (beyond them a value is a typo or a corrupt file, and
#: the generator would overflow or run for ever): nodes, seconds and arrival rates.
PROFILE_MAX_NODES = 10_000_000
PROFILE_MAX_LIMIT_S = 366 * 86400
PROFILE_MAX_BATCH = 100_000
PROFILE_MAX_RATE_PER_H = 1_000_000.0


def _values(p: dict[str, Any], where: str, shape: np.ndarray, pmf: np.ndarray) -> None:
    """The values :func:`validate_profile`'s shape checks leave open: whole, positive node
    counts and batch sizes, positive limits, the machine size, rising quantiles, upper bounds."""

    def bad(key: str, why: str) -> StepError:
        return StepError(f"{where}: {key} {why}")

    m = p.get("machine_nodes")
    if m is not None and (not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= PROFILE_MAX_NODES):
        raise bad(
            "machine_nodes", f"must be a whole number of nodes in 1 .. {PROFILE_MAX_NODES} (or absent), got {m!r}"
        )
    g = p.get("batch_gap_s")
    if g is not None and (not isinstance(g, (int, float)) or isinstance(g, bool) or not 0 <= g <= 86400):
        raise bad("batch_gap_s", f"must be a number of seconds in 0 .. 86400 (or absent), got {g!r}")
    nodes, limit = shape[:, 0], shape[:, 1]
    if (nodes != np.round(nodes)).any() or (nodes > PROFILE_MAX_NODES).any():
        raise bad("shape_nodes_limit_counts", f"node counts must be whole numbers in 1 .. {PROFILE_MAX_NODES}")
    if (limit <= 0).any() or (limit > PROFILE_MAX_LIMIT_S).any():
        raise bad("shape_nodes_limit_counts", f"time limits must be > 0 and at most {PROFILE_MAX_LIMIT_S} s")
    if m is not None and (nodes > m).any():
        raise bad(
            "shape_nodes_limit_counts", f"has jobs of up to {int(nodes.max())} nodes, more than machine_nodes {m}"
        )
    if (pmf[:, 0] != np.round(pmf[:, 0])).any() or (pmf[:, 0] > PROFILE_MAX_BATCH).any():
        raise bad("arrivals.batch_size_pmf", f"batch sizes must be whole numbers in 1 .. {PROFILE_MAX_BATCH}")
    if (np.asarray(p["arrivals"]["batch_rate_per_hour_of_week"], float) > PROFILE_MAX_RATE_PER_H).any():
        raise bad("arrivals.batch_rate_per_hour_of_week", f"rates must be at most {PROFILE_MAX_RATE_PER_H:g} per hour")
    quantiles = [("arrivals.intra_batch_gap_quantiles_s", p["arrivals"]["intra_batch_gap_quantiles_s"])]
    # only the classes validate_profile checked (0 .. n-1): other keys are never read by generate
    quantiles += [
        (f"wait_quantiles_s_by_node_class.{c}", p["wait_quantiles_s_by_node_class"][str(c)])
        for c in range(len(NODE_CLASSES) + 1)
    ]
    quantiles += [
        (f"runtime_by_limit_class.{c}.ratio_quantiles", p["runtime_by_limit_class"][str(c)]["ratio_quantiles"])
        for c in range(len(LIMIT_CLASSES_S) + 1)
    ]
    for key, q in quantiles:
        q = np.asarray(q, float)
        if (np.diff(q) < 0).any():
            raise bad(key, "must not decrease (quantiles in rising order)")
        if "ratio" in key and (q > 1).any():
            raise bad(key, "are run time / limit ratios: at most 1")
        if "ratio" not in key and (q > PROFILE_MAX_LIMIT_S * 10).any():
            raise bad(key, f"must be at most {PROFILE_MAX_LIMIT_S * 10} s")


def expected_jobs(profile: dict[str, Any], days: float, load_scale: float = 1.0) -> float:
    """The mean number of jobs :func:`generate` draws over ``days`` (the work a window asks for)."""
    a = profile["arrivals"]
    rate = float(np.mean(np.asarray(a["batch_rate_per_hour_of_week"], float)))
    pmf = np.asarray(a["batch_size_pmf"], float).reshape(-1, 2)
    size = float((pmf[:, 0] * pmf[:, 1]).sum() / pmf[:, 1].sum())
    return rate * 24 * days * load_scale * size


def _draw_quantile(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling by linear interpolation between stored quantiles."""
    return np.interp(u, QUANTILES, q)


def generate(
    profile: dict[str, Any], t_from: pd.Timestamp, t_to: pd.Timestamp, seed: int, load_scale: float = 1.0
) -> pd.DataFrame:
    """A synthetic trace frame (normalised schema) covering submits in [t_from, t_to)."""
    rng = np.random.default_rng(seed)
    a = profile["arrivals"]
    rate = np.asarray(a["batch_rate_per_hour_of_week"], dtype=float) * load_scale
    hours = pd.date_range(t_from.floor("h"), t_to, freq="h", inclusive="left", tz="UTC")
    slot = (hours.day_of_week * 24 + hours.hour).to_numpy()
    n_per_hour = rng.poisson(rate[slot])
    base = hours.as_unit("s").asi8
    batch_t = np.repeat(base, n_per_hour) + rng.uniform(0, 3600, n_per_hour.sum())
    batch_t.sort()
    nb = len(batch_t)
    sizes_pmf = np.asarray(a["batch_size_pmf"], dtype=float)
    sizes = rng.choice(sizes_pmf[:, 0].astype(int), size=nb, p=sizes_pmf[:, 1] / sizes_pmf[:, 1].sum())
    shape = np.asarray(profile["shape_nodes_limit_counts"], dtype=float)
    pick = rng.choice(len(shape), size=nb, p=shape[:, 2] / shape[:, 2].sum())
    shares = np.asarray(profile["user_batch_shares"], dtype=float)
    user_rank = rng.choice(len(shares), size=nb, p=shares / shares.sum())

    total = int(sizes.sum())
    b_of_job = np.repeat(np.arange(nb), sizes)
    pos = np.arange(total) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    gaps = _draw_quantile(np.asarray(a["intra_batch_gap_quantiles_s"]), rng.uniform(size=total))
    gaps[pos == 0] = 0.0
    # Cumulative gaps within each batch.
    csum = np.cumsum(gaps)
    offsets = csum - np.repeat(csum[np.cumsum(sizes) - sizes], sizes)
    submit = np.floor(batch_t[b_of_job] + offsets).astype(np.int64)
    nodes = shape[pick, 0].astype(np.int64)[b_of_job]
    limit = shape[pick, 1].astype(np.int64)[b_of_job]

    lc = _limit_class(limit)
    runtime = np.empty(total, dtype=np.int64)
    to_limit = np.zeros(total, dtype=bool)
    for c in range(len(LIMIT_CLASSES_S) + 1):
        m = lc == c
        if not m.any():
            continue
        spec = profile["runtime_by_limit_class"][str(c)]
        tl = rng.uniform(size=m.sum()) < spec["to_limit_share"]
        r = _draw_quantile(np.asarray(spec["ratio_quantiles"]), rng.uniform(size=m.sum()))
        r[tl] = 1.0
        runtime[m] = np.maximum(1, np.round(r * limit[m])).astype(np.int64)
        to_limit[m] = tl
    nc = _node_class(nodes)
    wait = np.zeros(total, dtype=np.int64)
    for c in range(len(NODE_CLASSES) + 1):
        m = nc == c
        if m.any():
            q = np.asarray(profile["wait_quantiles_s_by_node_class"][str(c)], dtype=float)
            wait[m] = np.round(_draw_quantile(q, rng.uniform(size=m.sum()))).astype(np.int64)
    st_p = profile.get("status_when_not_timeout") or {"COMPLETED": 1.0}
    names, probs = list(st_p), np.asarray(list(st_p.values()), dtype=float)
    status = np.asarray(names, dtype=object)[rng.choice(len(names), size=total, p=probs / probs.sum())]
    status[to_limit] = "TIMEOUT"

    keep = (submit >= t_from.value // 10**9) & (submit < t_to.value // 10**9)
    order = np.argsort(submit[keep], kind="stable")

    def ts(x: np.ndarray) -> pd.Series:
        return pd.to_datetime(pd.Series(x[keep][order]), unit="s", utc=True).dt.as_unit("s")

    n = int(keep.sum())
    return pd.DataFrame(
        {
            "job_id": pd.Series([f"s{i + 1}" for i in range(n)], dtype="string"),
            "submit": ts(submit),
            "start": ts(submit + wait),
            "end": ts(submit + wait + runtime),
            "time_limit_s": pd.array(limit[keep][order], dtype="Int64"),
            "nodes": pd.array(nodes[keep][order], dtype="Int32"),
            "procs": pd.array([pd.NA] * n, dtype="Int32"),
            "partition": pd.Series(["synthetic"] * n, dtype="string"),
            "user": pd.Series([f"u{r}" for r in user_rank[b_of_job][keep][order]], dtype="string"),
            "status": pd.Series(status[keep][order], dtype="string"),
            "priority": pd.array([pd.NA] * n, dtype="Int64"),
        }
    )


def load_profile(ref: str) -> dict[str, Any]:
    from stepkit.safeload import parse_document, read_bounded

    if ref in PACKAGED:
        data = resources.files("mirage_tasks.data.profiles").joinpath(PACKAGED[ref]).read_bytes()
        where = f"packaged profile {ref}"
    else:
        if not storage.exists(ref):
            raise StepError(f"--profile {ref}: no such file (packaged profiles: {', '.join(PACKAGED)})")
        data = read_bounded(ref)
        where = ref
    prof = parse_document(data, where, "json")  # bounded: size, nesting (stepkit.safeload)
    validate_profile(prof, where)
    return prof


# ------------------------------------------------------------------ comparison


def month_stats(df: pd.DataFrame) -> dict[str, float]:
    """The statistics compared between a real and a generated month."""
    if df.empty:
        return {}
    days = max((df["submit"].max() - df["submit"].min()).total_seconds() / 86400, 1.0)
    run = (df["end"] - df["start"]).dt.total_seconds().clip(upper=df["time_limit_s"].astype(float))
    nodes = df["nodes"].fillna(df["procs"]).astype(float)
    ia = np.diff(np.sort(_seconds(df["submit"]))).astype(float)
    hourly = df["submit"].dt.hour.value_counts(normalize=True).reindex(range(24), fill_value=0)
    return {
        "jobs": float(len(df)),
        "jobs_per_day": len(df) / days,
        "node_hours_per_day": float((run * nodes).sum() / 3600 / days),
        "share_1_node": float((nodes == 1).mean()),
        "share_8plus_nodes": float((nodes >= 8).mean()),
        "limit_median_h": float(df["time_limit_s"].median() / 3600),
        "limit_p90_h": float(df["time_limit_s"].quantile(0.9) / 3600),
        "runtime_median_h": float(run.median() / 3600),
        "runtime_p90_h": float(run.quantile(0.9) / 3600),
        "runtime_over_limit_mean": float((run / df["time_limit_s"].astype(float)).mean()),
        "interarrival_cv": float(ia.std() / ia.mean()) if len(ia) > 1 and ia.mean() > 0 else float("nan"),
        "users": float(df["user"].nunique()),
        "peak_hour_share": float(hourly.max()),
        "corr_nodes_limit": float(np.corrcoef(nodes, df["time_limit_s"].astype(float))[0, 1])
        if len(df) > 2
        else float("nan"),
    }


def compare(real: pd.DataFrame, synth: pd.DataFrame) -> list[dict[str, Any]]:
    a, b = month_stats(real), month_stats(synth)
    return [{"statistic": k, "real": a[k], "synthetic": b.get(k)} for k in a]


def fit_markdown(rows: list[dict[str, Any]], month: str) -> str:
    out = [f"# Synthetic vs real: {month}", "", "| statistic | real | synthetic |", "|---|---:|---:|"]
    out += [f"| {r['statistic']} | {r['real']:.3f} | {r['synthetic']:.3f} |" for r in rows]
    return "\n".join(out) + "\n"
