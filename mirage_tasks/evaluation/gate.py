"""The monthly gate's judgement: is a month's primary decision rule a regression?

Read from the ``metrics`` outputs of the monthly ``mirage_pipeline`` runs
(:mod:`mirage_tasks.evaluation.metrics`, the ``level == "all"`` rows): the objective is the
mean interruption hours per node size, with the month's paired bootstrap 95 % intervals. For
each node size the rule fails the month when the **whole interval** is worse than its bar by
more than ``margin`` (a fraction), so sampling noise alone never fails a month:

* **reactive**: the reduction against reactive (``1 - rule / reactive`` on the same samples)
  has its upper bound below ``-margin`` (the rule interrupts more than reactive, by more than
  ``margin`` of reactive's hours, at the interval's best);
* **the average**: ``avg-cal`` (the calibrated average) when the month validated it, else the
  ``avg`` baseline: the paired difference rule - average has its lower bound above ``margin``
  times the average's mean (for ``avg-cal``, which the metrics pair with nothing, the rule's
  own interval against avg-cal's mean);
* **the months before**: the reduction's upper bound is below the median reduction of the
  earlier months by more than ``margin`` (reductions, not hours: a month of heavier load
  interrupts everyone more). Only months strictly before are read; a month without earlier
  ones is judged on the first two bars only.

Overlap hours are reported beside, not judged (an earlier successor is the price of fewer
interruptions). Pure functions over plain dicts; the ``gate`` step does the reading.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from stepkit import StepError

REACTIVE, AVG, AVG_CAL = "reactive", "avg", "avg-cal"


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def rows_by_model(doc: dict[str, Any], where: str) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(model, node): row}`` of the ``all`` level of a ``metrics.json``; StepError naming ``where``."""
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list):
        raise StepError(f"{where}: no 'rows' list (not a metrics.json)")
    out = {}
    for r in rows:
        if isinstance(r, dict) and r.get("level") == "all":
            out[(str(r.get("model")), int(r.get("node")))] = r
    return out


def month_numbers(doc: dict[str, Any], rule: str, where: str) -> dict[int, dict[str, Any]]:
    """Per node size: the rule's objective, its interval and the references', from one month's metrics."""
    rows = rows_by_model(doc, where)
    nodes = sorted({n for (m, n) in rows if m == rule})
    if not nodes:
        models = sorted({m for (m, _) in rows})
        raise StepError(f"{where}: no rows of rule {rule!r} (the month validated: {', '.join(models) or 'nothing'})")
    out = {}
    for node in nodes:
        r = rows[(rule, node)]
        react = rows.get((REACTIVE, node))
        if react is None:
            raise StepError(f"{where}: node {node} has no {REACTIVE} rows to judge {rule!r} against")
        avg_name = AVG_CAL if (AVG_CAL, node) in rows else AVG
        avg = rows.get((avg_name, node))
        if avg is None:
            raise StepError(f"{where}: node {node} has neither {AVG_CAL} nor {AVG} rows")
        mean, avg_mean = _num(r.get("mean_interruption_h")), _num(avg.get("mean_interruption_h"))
        lo, hi = _num(r.get("mean_interruption_ci_lo")), _num(r.get("mean_interruption_ci_hi"))
        if avg_name == AVG:
            diff = _num(r.get("diff_vs_avg_h"))
            d_lo, d_hi = _num(r.get("diff_vs_avg_ci_lo")), _num(r.get("diff_vs_avg_ci_hi"))
        else:  # avg-cal is paired with nothing in the metrics: the rule's own interval against its mean
            diff = None if mean is None or avg_mean is None else mean - avg_mean
            d_lo = None if lo is None or avg_mean is None else lo - avg_mean
            d_hi = None if hi is None or avg_mean is None else hi - avg_mean
        out[node] = {
            "n": r.get("n"),
            "rule_interruption_h": mean,
            "rule_interruption_ci": [lo, hi],
            "rule_overlap_h": _num(r.get("mean_overlap_h")),
            "reactive_interruption_h": _num(react.get("mean_interruption_h")),
            "reactive_overlap_h": _num(react.get("mean_overlap_h")),
            "reduction_vs_reactive": _num(r.get("reduction_vs_reactive")),
            "reduction_ci": [_num(r.get("reduction_ci_lo")), _num(r.get("reduction_ci_hi"))],
            "average": avg_name,
            "average_interruption_h": avg_mean,
            "average_overlap_h": _num(avg.get("mean_overlap_h")),
            "diff_vs_average_h": diff,
            "diff_vs_average_ci": [d_lo, d_hi],
        }
    return out


def judge(
    month: str, numbers: dict[int, dict[str, Any]], earlier: dict[str, dict[int, dict[str, Any]]], margin: float
) -> dict[str, Any]:
    """The gate's verdict of ``month``: one check per bar and node size, ``passed`` when none failed.

    ``earlier``: ``{month: numbers}`` of earlier months; any month not strictly before ``month`` is
    dropped here, whatever the caller passed (the gate never judges a month by later ones)."""
    before = {m: v for m, v in earlier.items() if m < month}
    checks = []
    for node, x in sorted(numbers.items()):
        red_hi = x["reduction_ci"][1]
        checks.append(
            {
                "node": node,
                "bar": "reactive",
                "value": x["reduction_vs_reactive"],
                "interval": x["reduction_ci"],
                "limit": -margin,
                "failed": red_hi is not None and red_hi < -margin,
                "why": "the reduction against reactive has its upper bound below -margin",
            }
        )
        d_lo, avg_mean = x["diff_vs_average_ci"][0], x["average_interruption_h"]
        limit = None if avg_mean is None else margin * avg_mean
        checks.append(
            {
                "node": node,
                "bar": x["average"],
                "value": x["diff_vs_average_h"],
                "interval": x["diff_vs_average_ci"],
                "limit": limit,
                "failed": d_lo is not None and limit is not None and d_lo > limit,
                "why": f"rule - {x['average']} (h) has its lower bound above margin x {x['average']}'s mean",
            }
        )
        past = [
            v[node]["reduction_vs_reactive"]
            for v in before.values()
            if node in v and v[node].get("reduction_vs_reactive") is not None
        ]
        if past:
            median = statistics.median(past)
            checks.append(
                {
                    "node": node,
                    "bar": "earlier months",
                    "value": x["reduction_vs_reactive"],
                    "interval": x["reduction_ci"],
                    "limit": median - margin,
                    "earlier_median": median,
                    "earlier_months": sorted(m for m, v in before.items() if node in v),
                    "failed": red_hi is not None and red_hi < median - margin,
                    "why": "the reduction's upper bound is below the earlier months' median by more than margin",
                }
            )
    return {
        "month": month,
        "margin": margin,
        "passed": not any(c["failed"] for c in checks),
        "checks": checks,
        "numbers": {str(n): v for n, v in sorted(numbers.items())},
        "earlier_months": sorted(before),
    }


def _f(v: Any) -> str:
    return "n/a" if v is None else f"{v:+.3f}" if isinstance(v, float) else str(v)


def lines(verdict: dict[str, Any], rule: str) -> list[str]:
    """The verdict as log lines: the numbers of every check, failed ones marked."""
    out = [f"gate {verdict['month']}: rule {rule}, margin {verdict['margin']:.3f}"]
    for node, x in verdict["numbers"].items():
        lo, hi = x["rule_interruption_ci"]
        out.append(
            f"  node {node}: {rule} {_f(x['rule_interruption_h'])} h [{_f(lo)}, {_f(hi)}] interruption, "
            f"{_f(x['rule_overlap_h'])} h overlap; reactive {_f(x['reactive_interruption_h'])} h; "
            f"{x['average']} {_f(x['average_interruption_h'])} h"
        )
    for c in verdict["checks"]:
        lo, hi = c["interval"]
        mark = "FAIL" if c["failed"] else "ok"
        extra = f" (earlier months {', '.join(c['earlier_months'])})" if "earlier_months" in c else ""
        out.append(
            f"  [{mark}] node {c['node']} vs {c['bar']}: {_f(c['value'])} [{_f(lo)}, {_f(hi)}], "
            f"limit {_f(c['limit'])}{extra}" + (f": {c['why']}" if c["failed"] else "")
        )
    out.append(f"gate {verdict['month']}: {'PASSED' if verdict['passed'] else 'FAILED'}")
    return out
