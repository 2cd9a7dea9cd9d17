"""A history of daily Faasm runs written through the real results API (``Attempt``), for the
trend, check and UI tests; and the tests that it reads back as written.

Import with ``from test_trends_history import write_history`` (tests/faasm on sys.path).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from faasm_tasks.results import Attempt, point_prefix

END = "2026-11-20"

#: (experiment, system, params, metrics at factor 1)
POINTS: list[tuple[str, str, dict[str, Any], dict[str, float]]] = [
    (
        "tf_inference_latency",
        "native",
        {"cold_start_interval": 5, "duration_s": 3},
        {"p50_us": 4000.0, "p99_us": 12000.0, "throughput_ok": 240.0},
    ),
    (
        "tf_inference_latency",
        "wasm",
        {"cold_start_interval": 5, "duration_s": 3},
        {"p50_us": 2500.0, "p99_us": 8000.0, "throughput_ok": 380.0},
    ),
    (
        "tf_inference_throughput",
        "wasm",
        {"cold_start_interval": 500, "max_delay_ms": 100, "duration_s": 3},
        {"p50_us": 9000.0, "p99_us": 30000.0, "throughput_ok": 900.0},
    ),
    ("sgd_reuters_svm", "wasm", {"n_workers": 2, "sync_interval": 200, "epochs": 3}, {"run_time_ms": 5000.0}),
    ("sgd_reuters_svm", "wasm", {"n_workers": 4, "sync_interval": 200, "epochs": 3}, {"run_time_ms": 3200.0}),
    ("matrix_multiplication", "native", {"n_workers": 2, "matrix_size": 100}, {"run_time_ms": 800.0}),
    ("matrix_multiplication", "native", {"n_workers": 2, "matrix_size": 200}, {"run_time_ms": 2400.0}),
]


def day(offset: int, end: str = END) -> str:
    return (dt.date.fromisoformat(end) + dt.timedelta(days=offset)).isoformat()


def _attempt(root, date, run_id, exp, system, params, repeat, arm=None) -> Attempt:
    """The local target's attempt record of one point's repeat (of an A/A arm when ``arm`` is given)."""
    base = {"run_id": run_id, "date": date, "experiment": exp, "system": system, "target": "local"}
    base.update(params=params, repeat=repeat, **({"arm": arm} if arm is not None else {}))
    return Attempt(point_prefix(root, date, run_id, exp, system, params, repeat, arm), base)


def write_run(
    root: str,
    date: str,
    run_id: str,
    factor: dict[str, float] | None = None,
    jitter: float = 0.0,
    failed: tuple[str, ...] = (),
) -> None:
    """One run of every point of :data:`POINTS` (one repeat), values times ``factor[metric]``.

    ``failed``: experiments whose attempts are recorded as failed (their numbers must not count).
    """
    factor = factor or {}
    for i, (exp, system, params, metrics) in enumerate(POINTS):
        att = _attempt(root, date, run_id, exp, system, params, 0)
        wobble = 1.0 + jitter * (((i * 7 + int(date[-2:]) * 3) % 5) - 2) / 2.0
        m = {k: round(v * wobble * factor.get(k, 1.0), 3) for k, v in metrics.items()}
        if "p99_us" in m:
            m.update(requests_ok=int(m["throughput_ok"] * 3), requests_all=int(m["throughput_ok"] * 3))
        ok = exp not in failed
        att.finish(ok, None if ok else "injected failure", m, 0 if ok else 1)
        if exp == "matrix_multiplication" and ok:
            att.update(
                billing={"hosts": 1, "memory_gb_s": round(0.5 * m["run_time_ms"] / 1000.0, 4), "peak_memory_mb": 512.0}
            )


def write_history(
    root: str,
    days: int = 6,
    end: str = END,
    last: dict[str, float] | None = None,
    jitter: float = 0.04,
    run_id: str = "scheduled__{date}",
) -> str:
    """``days`` daily runs ending on ``end`` (run id ``run_id`` formatted with the date); the last one
    scaled by ``last``. Returns the last run's id.
    """
    for k in range(days - 1, -1, -1):
        date = day(-k, end)
        write_run(root, date, run_id.format(date=date), last if k == 0 else None, jitter)
    return run_id.format(date=end)


def write_aa_run(root: str, date: str, run_id: str, fail: bool, n: int = 6) -> None:
    """The A/A arms of one matrix point of a run (:data:`faasm_tasks.order.AA_ARMS`), values set so
    that the verdict is certain: A' equal to A (``pass``) or A' 1.3 times every value of A, no
    overlap (``fail``). Under 3 values per arm (``n``) there is no interval."""
    from faasm_tasks.order import AA_ARMS

    exp, system, params = "matrix_multiplication", "native", {"n_workers": 2, "matrix_size": 100}
    for arm in AA_ARMS:
        for r in range(n):
            att = _attempt(root, date, run_id, exp, system, params, r, arm)
            v = 800.0 * (1 + 0.004 * r) * (1.3 if fail and arm == AA_ARMS[1] else 1.0)
            att.finish(True, None, {"run_time_ms": round(v, 3)}, 0)


def test_history_reads_back_one_row_per_point_and_day(tmp_path):
    from faasm_tasks import trends

    root = str(tmp_path / "faasm_benchmarks")
    write_history(root, days=4)
    # a second attempt of a point replaces the first; a failed day is not measured
    write_run(root, day(0), "manual__rerun", failed=("sgd_reuters_svm",))
    df = trends.load_window(root, END, 30)
    assert sorted(df["date"].unique()) == [day(-3), day(-2), day(-1), day(0)]
    assert len(df) == 5 * len(POINTS)
    assert set(df[~df["measured"]]["experiment"]) == {"sgd_reuters_svm"}
    d = trends.daily(df)
    assert len(d) == 4 * len(POINTS)
    lat = d[(d["experiment"] == "tf_inference_latency") & (d["system"] == "wasm")]
    assert lat["point"].tolist() == ["cold_start_interval-5_duration_s-3"] * 4
    # the window: 2 days up to END leaves the older folders out
    assert sorted(trends.load_window(root, END, 2)["date"].unique()) == [day(-1), day(0)]
    assert trends.load_window(str(tmp_path / "nothing"), END, 30).empty
