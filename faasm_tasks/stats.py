"""Intervals of benchmark figures (SeBS' practice: n, the median with its non-parametric
interval, the mean with its Student-t interval; ratios with an interval from ranks).

* :func:`median_ci`: the distribution-free interval of the median from order statistics
  (Le Boudec, *Performance Evaluation of Computer and Communication Systems*, Thm. 2.1): the
  j-th and (n+1-j)-th smallest values, j the largest with ``P(Binomial(n, 1/2) < j) <=
  alpha / 2``, whose coverage is at least the level. Under 6 values no such j exists at 95 %:
  the interval is refused (None) and the reason said;
* :func:`mean_ci`: ``mean +- t_{n-1} * s / sqrt(n)`` (scipy.stats.t), n >= 2;
* :func:`ratio_ci`: the ratio of ``a`` to ``b`` with a distribution-free interval from ranks, on
  the logarithms (so a ratio is a shift): unpaired, the Hodges-Lehmann estimate and the
  Mann-Whitney interval (the c-th smallest and largest of the pairwise differences
  ``log a_i - log b_j``); paired (the same repeats), the Walsh averages of ``log a_i - log b_i``
  and the Wilcoxon signed-rank interval. ``c`` comes from the exact null distribution of the
  rank statistic (a normal approximation above 50 values a side), so the coverage is at least
  the level for continuous values at any n: a percentile bootstrap of medians under-covers at
  the daily run's 6 repeats, and the A/A control (:func:`aa_verdict`) would call identical
  systems different more often than it says. An interval that excludes 1 says which side of 1
  the ratio is on.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as st

LEVEL = 0.95


def min_n_for_median(level: float = LEVEL) -> int:
    """The fewest values with an order-statistic interval of the median at ``level``."""
    n = 1
    while 2 * 0.5**n > 1 - level:
        n += 1
    return n


def median_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float] | None:
    """``(low, high, coverage)`` of the median, or None when there are too few values."""
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    if n < min_n_for_median(level):
        return None
    alpha = 1 - level
    # the largest j (1-based) with P(B < j) = cdf(j - 1) <= alpha / 2
    j = int(st.binom.ppf(alpha / 2, n, 0.5))
    while j >= 1 and st.binom.cdf(j - 1, n, 0.5) > alpha / 2:
        j -= 1
    while st.binom.cdf(j, n, 0.5) <= alpha / 2:
        j += 1
    if j < 1:
        return None
    coverage = 1 - 2 * float(st.binom.cdf(j - 1, n, 0.5))
    return float(x[j - 1]), float(x[n - j]), coverage


def mean_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float] | None:
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return None
    sem = float(st.sem(x))
    if sem == 0:
        return float(x.mean()), float(x.mean())
    lo, hi = st.t.interval(level, len(x) - 1, loc=float(x.mean()), scale=sem)
    return float(lo), float(hi)


def describe(values: Sequence[float], level: float = LEVEL) -> dict[str, Any]:
    """n, median and mean of ``values`` with their intervals (or why there is none)."""
    x = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict[str, Any] = {"n": len(x)}
    if not x:
        return out
    out["median"] = float(np.median(x))
    out["mean"] = float(np.mean(x))
    med = median_ci(x, level)
    if med is None:
        out["median_ci_note"] = f"n = {len(x)} < {min_n_for_median(level)}: no {level:.0%} interval of the median"
    else:
        out["median_lo"], out["median_hi"], out["median_coverage"] = med
    mci = mean_ci(x, level)
    if mci is None:
        out["mean_ci_note"] = f"n = {len(x)} < 2: no Student-t interval"
    else:
        out["mean_lo"], out["mean_hi"] = mci
    return out


#: Above this many values a side the rank statistics' null distributions are taken as normal.
EXACT_MAX_N = 50


def _frozen(a: np.ndarray) -> np.ndarray:
    """A cached array, read-only so that no caller can change what the next one reads."""
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=64)  # the same sizes recur for every figure of a day
def _mwu_cdf(n: int, m: int) -> np.ndarray:
    """``P(U <= u)`` for u = 0 .. n*m, the Mann-Whitney statistic of samples of n and m under
    the null (every interleaving of the two samples equally likely)."""
    p = {(0, j): np.ones(1) for j in range(m + 1)}
    p.update({(i, 0): np.ones(1) for i in range(n + 1)})
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            out = np.zeros(i * j + 1)
            # the largest value is from the first sample (it exceeds all j of the second) or not
            a, b = p[i - 1, j], p[i, j - 1]
            out[j : j + len(a)] += a * i / (i + j)
            out[: len(b)] += b * j / (i + j)
            p[i, j] = out
    return _frozen(np.cumsum(p[n, m]))


@functools.lru_cache(maxsize=64)
def _signed_rank_cdf(n: int) -> np.ndarray:
    """``P(W+ <= w)`` for w = 0 .. n(n+1)/2, the Wilcoxon signed-rank statistic under the null."""
    dist = np.ones(1)
    for k in range(1, n + 1):
        nxt = np.zeros(len(dist) + k)
        nxt[: len(dist)] += dist / 2
        nxt[k:] += dist / 2
        dist = nxt
    return _frozen(np.cumsum(dist))


def _rank_cut(cdf: np.ndarray | None, mean: float, var: float, alpha: float) -> int:
    """How many of the sorted differences each end of the interval leaves out: the largest ``c``
    with ``P(T <= c - 1) <= alpha / 2`` (0: too few values for an interval at this level)."""
    if cdf is not None:
        return int(np.searchsorted(cdf, alpha / 2 * (1 + 1e-12), side="right"))
    return max(0, int(math.floor(mean - st.norm.ppf(1 - alpha / 2) * math.sqrt(var) - 0.5)) + 1)


def ratio_ci(a: Sequence[float], b: Sequence[float], paired: bool, level: float = LEVEL) -> dict[str, Any]:
    """The ratio of ``a`` to ``b`` with its distribution-free interval from ranks (see the module):
    ``ratio`` the Hodges-Lehmann estimate (for a pure change of scale, the ratio of medians,
    ``ratio_of_medians`` beside it), ``ratio_lo``/``ratio_hi`` the interval at ``level`` and
    ``verdict`` which side of 1 it lies on. ``paired``: ``a[i]`` and ``b[i]`` come from the same
    repeat."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    out: dict[str, Any] = {"n_a": int(len(a)), "n_b": int(len(b)), "paired": paired}
    if not len(a) or not len(b) or np.median(b) == 0:
        return out
    out["ratio_of_medians"] = float(np.median(a) / np.median(b))
    out["ratio"] = out["ratio_of_medians"]
    if paired and len(a) != len(b):
        raise ValueError("paired samples need the same length")
    if min(len(a), len(b)) < 3:
        out["ci_note"] = "fewer than 3 runs per side: no interval"
        return out
    if (a <= 0).any() or (b <= 0).any() or not (np.isfinite(a).all() and np.isfinite(b).all()):
        out["ci_note"] = "a value that is not a positive number: no ratio interval"
        return out
    la, lb = np.log(a), np.log(b)
    alpha = 1 - level
    if paired:
        d = la - lb
        n = len(d)
        i, j = np.triu_indices(n)
        diffs = np.sort((d[i] + d[j]) / 2)  # the Walsh averages
        cdf = _signed_rank_cdf(n) if n <= EXACT_MAX_N else None
        c = _rank_cut(cdf, n * (n + 1) / 4, n * (n + 1) * (2 * n + 1) / 24, alpha)
    else:
        n, m = len(la), len(lb)
        diffs = np.sort((la[:, None] - lb[None, :]).ravel())
        cdf = _mwu_cdf(n, m) if max(n, m) <= EXACT_MAX_N else None
        c = _rank_cut(cdf, n * m / 2, n * m * (n + m + 1) / 12, alpha)
    out["ratio"] = float(np.exp(np.median(diffs)))
    if c < 1:
        out["ci_note"] = f"too few runs for a {level:.0%} rank interval ({len(a)} and {len(b)})"
        return out
    lo, hi = float(np.exp(diffs[c - 1])), float(np.exp(diffs[len(diffs) - c]))
    out.update(ratio_lo=lo, ratio_hi=hi, verdict=verdict(lo, hi))
    return out


def verdict(lo: float | None, hi: float | None) -> str:
    """Which side of 1 a ratio's interval lies on."""
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "no interval"
    if hi < 1:
        return "below 1"
    if lo > 1:
        return "above 1"
    return "includes 1"


def aa_verdict(
    comparisons: Sequence[tuple[str, Sequence[float], Sequence[float]]], level: float = LEVEL
) -> dict[str, Any]:
    """The A/A control's verdict: each ``(label, a, a_prime)`` is one figure of the same system
    measured as two arms; every ratio of medians ``a / a_prime`` must have an interval that
    contains 1. The intervals are at ``1 - (1 - level) / m`` (Bonferroni over the ``m``
    comparisons with an interval), so the chance that a day without any difference fails its
    A/A is at most ``1 - level`` however many figures it compares (``aa-rate`` measures it).

    ``verdict``: ``pass`` (every interval contains 1), ``fail`` (one or more do not: listed in
    ``excluding_1``) or ``no interval`` (no comparison had 3 values per arm)."""
    rows = []
    usable = [(lab, a, b) for lab, a, b in comparisons if min(len(a), len(b)) >= 3]
    m = len(usable)
    each = 1 - (1 - level) / m if m else level
    for label, a, b in comparisons:
        ci = ratio_ci(a, b, paired=False, level=each)
        rows.append({"figure": label, **ci})
    bad = [r["figure"] for r in rows if r.get("verdict") in ("below 1", "above 1")]
    verdict = "no interval" if not m else ("fail" if bad else "pass")
    return {
        "verdict": verdict,
        "level": level,
        "level_each": each,
        "comparisons": m,
        "excluding_1": bad,
        "figures": rows,
    }


def rate_ci(failed: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The Clopper-Pearson ("exact") interval of a binomial proportion ``failed / n`` at ``level``
    (scipy.stats.binomtest): its coverage is at least the level at any n."""
    if n < 1 or not 0 <= failed <= n:
        raise ValueError(f"a rate needs 0 <= failed <= n and n >= 1, got {failed} of {n}")
    ci = st.binomtest(failed, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def false_difference_rate(failed: int, n: int, level: float = LEVEL) -> dict[str, Any]:
    """The A/A control's false-difference rate: ``failed`` of ``n`` A/A verdicts (days) said
    "fail", with its Clopper-Pearson interval at ``level`` (:func:`rate_ci`), against the target
    the verdicts' level states, at most ``1 - level``. ``target_status``: ``met`` when the whole
    interval lies at or below the target, ``not met`` when it lies above, ``undecided`` when it
    contains the target (too few days to tell), ``no verdicts`` when ``n`` is 0."""
    target = round(1 - level, 12)
    out: dict[str, Any] = {
        "verdicts": n,
        "failed_days": failed,
        "false_difference_rate": None,
        "rate_lo": None,
        "rate_hi": None,
        "level": level,
        "target": target,
        "interval": "Clopper-Pearson",
        "target_status": "no verdicts",
    }
    if n:
        lo, hi = rate_ci(failed, n, level)
        status = "met" if hi <= target else ("not met" if lo > target else "undecided")
        out.update(false_difference_rate=failed / n, rate_lo=lo, rate_hi=hi, target_status=status)
    return out


def rate_text(r: dict[str, Any]) -> str:
    """One line of a :func:`false_difference_rate` for the logs and the trend page."""
    target = f"target at most {r['target']:.0%} at the {r['level']:.0%} level"
    if not r["verdicts"]:
        return f"false-difference rate n/a (no A/A verdict); {target}"
    why = {
        "met": "the interval lies at or below it",
        "not met": "the interval lies above it",
        "undecided": "the interval contains it: too few days to tell",
    }[r["target_status"]]
    return (
        f"{r['failed_days']} of {r['verdicts']} A/A verdict(s) failed: false-difference rate "
        f"{r['false_difference_rate']:.1%} ({r['level']:.0%} {r['interval']} interval "
        f"{r['rate_lo']:.1%} to {r['rate_hi']:.1%}); {target}: {r['target_status']} ({why})"
    )


#: The level of the effect sizes beside the 95 % intervals.
EFFECT_LEVEL = 0.99


def effect(
    a: Sequence[float],
    b: Sequence[float],
    paired: bool,
    lower_is_better: bool = True,
    words: tuple[str, str] = ("faster", "slower"),
) -> dict[str, Any]:
    """The effect of ``a`` against ``b`` as "x % faster (± y %) at 99 %": ``x`` the ratio of
    medians as a percentage change (``1 - a/b`` when a smaller value is better, ``a/b - 1``
    otherwise; ``words``: how better and worse read, e.g. ``("higher", "lower")`` for throughput),
    ``y`` the half-width of its 99 % interval (:func:`ratio_ci`) in percentage points
    (:func:`ratio_ci` at :data:`EFFECT_LEVEL`). ``text`` is None, with ``note`` saying why, when
    there is no interval."""
    ci = ratio_ci(a, b, paired=paired, level=EFFECT_LEVEL)
    if "ratio_lo" not in ci:
        return {"text": None, "note": ci.get("ci_note", "no values"), **ci}
    r, lo, hi = ci["ratio"], ci["ratio_lo"], ci["ratio_hi"]
    pct = (1 - r) * 100 if lower_is_better else (r - 1) * 100
    half = (hi - lo) / 2 * 100
    word = words[0] if pct >= 0 else words[1]
    text = f"{abs(pct):.1f} % {word} (± {half:.1f} %) at {EFFECT_LEVEL * 100:.0f} %"
    return {"text": text, "pct": pct, "half_width_pct": half, **ci}
