"""Intervals of benchmark figures (SeBS' practice: n, the median with its non-parametric
interval, the mean with its Student-t interval; ratios with a bootstrap interval).

* :func:`median_ci`: the distribution-free interval of the median from order statistics
  (Le Boudec, *Performance Evaluation of Computer and Communication Systems*, Thm. 2.1): the
  j-th and (n+1-j)-th smallest values, j the largest with ``P(Binomial(n, 1/2) < j) <=
  alpha / 2``, whose coverage is at least the level. Under 6 values no such j exists at 95 %:
  the interval is refused (None) and the reason said;
* :func:`mean_ci`: ``mean +- t_{n-1} * s / sqrt(n)`` (scipy.stats.t), n >= 2;
* :func:`ratio_ci`: ``statistic(a) / statistic(b)`` with a percentile bootstrap
  (scipy.stats.bootstrap), paired (the same repeats resampled together) when ``a`` and ``b``
  are paired runs; an interval that excludes 1 says which side of 1 the ratio is on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as st

LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000


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


def ratio_ci(
    a: Sequence[float], b: Sequence[float], paired: bool, statistic=np.median, level: float = LEVEL, seed: int = 0
) -> dict[str, Any]:
    """``statistic(a) / statistic(b)`` and its bootstrap interval (``paired``: ``a[i]`` and
    ``b[i]`` come from the same repeat and are resampled together)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    out: dict[str, Any] = {"n_a": int(len(a)), "n_b": int(len(b)), "paired": paired}
    if not len(a) or not len(b) or statistic(b) == 0:
        return out
    out["ratio"] = float(statistic(a) / statistic(b))
    if paired and len(a) != len(b):
        raise ValueError("paired samples need the same length")
    if min(len(a), len(b)) < 3:
        out["ci_note"] = "fewer than 3 runs per side: no bootstrap interval"
        return out

    def ratio(x, y, axis=-1):
        den = statistic(y, axis=axis)
        return np.where(den == 0, np.nan, statistic(x, axis=axis) / np.where(den == 0, 1, den))

    res = st.bootstrap(
        (a, b),
        ratio,
        paired=paired,
        vectorized=True,
        n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=level,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
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
    comparisons: Sequence[tuple[str, Sequence[float], Sequence[float]]], level: float = LEVEL, seed: int = 0
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
    for i, (label, a, b) in enumerate(comparisons):
        ci = ratio_ci(a, b, paired=False, level=each, seed=seed + i)
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


#: The level of the effect sizes beside the 95 % intervals.
EFFECT_LEVEL = 0.99


def effect(
    a: Sequence[float],
    b: Sequence[float],
    paired: bool,
    lower_is_better: bool = True,
    words: tuple[str, str] = ("faster", "slower"),
    seed: int = 0,
) -> dict[str, Any]:
    """The effect of ``a`` against ``b`` as "x % faster (± y %) at 99 %": ``x`` the ratio of
    medians as a percentage change (``1 - a/b`` when a smaller value is better, ``a/b - 1``
    otherwise; ``words``: how better and worse read, e.g. ``("higher", "lower")`` for throughput),
    ``y`` the half-width of its 99 % bootstrap interval in percentage points
    (:func:`ratio_ci` at :data:`EFFECT_LEVEL`). ``text`` is None, with ``note`` saying why, when
    there is no interval."""
    ci = ratio_ci(a, b, paired=paired, level=EFFECT_LEVEL, seed=seed)
    if "ratio_lo" not in ci:
        return {"text": None, "note": ci.get("ci_note", "no values"), **ci}
    r, lo, hi = ci["ratio"], ci["ratio_lo"], ci["ratio_hi"]
    pct = (1 - r) * 100 if lower_is_better else (r - 1) * 100
    half = (hi - lo) / 2 * 100
    word = words[0] if pct >= 0 else words[1]
    text = f"{abs(pct):.1f} % {word} (± {half:.1f} %) at {EFFECT_LEVEL * 100:.0f} %"
    return {"text": text, "pct": pct, "half_width_pct": half, **ci}
