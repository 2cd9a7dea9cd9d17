"""Load driver, measurement: latency histograms (microseconds) and the summary of a window."""

from __future__ import annotations

from typing import Any

from hdrh.histogram import HdrHistogram

LOWEST_US, HIGHEST_US, SIGFIG = 1, 3_600_000_000, 3
LATE_S = 0.005  # open loop: a request sent more than 5 ms after its slot counts as late
ERROR_KINDS = ("connect", "timeout", "read", "non2xx")


def new_hist() -> HdrHistogram:
    return HdrHistogram(LOWEST_US, HIGHEST_US, SIGFIG)


def merge_histograms(encoded: list[str]) -> HdrHistogram:
    """One histogram holding every value of the encoded ones (HdrHistogram's own add)."""
    out = new_hist()
    for e in encoded:
        out.decode_and_add(e)
    return out


def summarize(hist: HdrHistogram, duration_s: float, ok: int, total: int, errors: dict[str, int]) -> dict[str, Any]:
    n = hist.get_total_count()
    pct = lambda p: hist.get_value_at_percentile(p) if n else None  # noqa: E731
    return {
        "unit": "us",
        "duration_s": duration_s,
        "measured_duration_s": duration_s,
        "requests_ok": ok,
        "requests_all": total,
        "throughput_ok": ok / duration_s,
        "throughput_all": total / duration_s,
        "errors": dict(errors),
        "errors_total": sum(errors.values()),
        "min_us": hist.get_min_value() if n else None,
        "max_us": hist.get_max_value() if n else None,
        "mean_us": hist.get_mean_value() if n else None,
        "stddev_us": hist.get_stddev() if n else None,
        "p10_us": pct(10),
        "p50_us": pct(50),
        "p90_us": pct(90),
        "p99_us": pct(99),
        "p999_us": pct(99.9),
        # the seed's LATENCIES list: entry 0 is the literal 0, then p1 .. p99
        "latencies_us": [0] + [pct(p) for p in range(1, 100)] if n else [],
    }
