"""The QBETS reference bound (mirage_tasks/calibration/qbets.py): the binomial order statistic,
its coverage on a stationary stream, the change-point reset after a jump, and that each answer
reads only waits known at the submission (jobs started before it)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from mirage_tasks.calibration import qbets


def test_order_index_matches_a_hand_computed_binomial_case():
    # Binomial(10, 0.5): P(B <= 6) = 848/1024 = 0.828 < 0.9, P(B <= 7) = 968/1024 = 0.945 >= 0.9,
    # so P(B < k) >= 0.9 first at k = 8: the 8th smallest of 10 waits
    assert qbets.order_index(10, q=0.5, c=0.9) == 8
    # q = 0.9, c = 0.95: P(B < n) = 1 - 0.9^n, 1 - 0.9^28 = 0.9477 < 0.95 <= 1 - 0.9^29 = 0.9529: 29 waits
    # are the fewest that admit a bound (their largest), 28 admit none
    assert qbets.order_index(28) == 0 and qbets.order_index(29) == 29 and qbets.min_history() == 29
    # a run of misses: 0.1 >= 0.05 > 0.1^2, so two in a row are a change point
    assert qbets.change_run() == 2
    # every n up to 400, against the definition itself
    k = qbets.order_indices(400)
    for n in range(401):
        reach = np.flatnonzero(binom.cdf(np.arange(n), n, 0.9) >= 0.95)  # P(B < j) for j = 1 .. n
        want = int(reach[0]) + 1 if len(reach) else 0
        assert k[n] == want, n


def _reference(submit, start, groups, q, c, change_points):
    """The bound by its definition, quadratic: at each start (start order) the wait is judged
    against the class's sorted history, added, and a run of misses trims; each submission reads the
    histories after every start strictly before it."""
    K = qbets.order_indices(len(submit), q, c)
    keep, run_max = qbets.min_history(q, c), qbets.change_run(q, c)
    hist: dict = {}
    run: dict = {}

    def bnd(h):
        k = K[len(h)]
        return sorted(h)[k - 1] if k else None

    def observe(g, w):
        h = hist.setdefault(g, [])
        b = bnd(h)
        run[g] = run.get(g, 0) + 1 if b is not None and w > b else 0
        h.append(w)
        if change_points and run[g] >= run_max:
            del h[: max(0, len(h) - keep)]
            run[g] = 0

    out = np.full(len(submit), np.nan)
    order = np.argsort(start, kind="stable")
    p = 0
    for i, t in enumerate(submit):
        while p < len(order) and start[order[p]] < t:
            k = order[p]
            p += 1
            observe(groups[k], start[k] - submit[k])
            observe(None, start[k] - submit[k])
        b = bnd(hist.get(groups[i], []))
        b = bnd(hist.get(None, [])) if b is None else b
        out[i] = np.nan if b is None else b
    return out


def _stream(rng, n, mean, step=1.0):
    submit = np.floor(np.arange(n) * step)  # whole seconds: equal instants happen
    return submit, submit + np.floor(rng.exponential(mean, n))


@pytest.mark.parametrize("change_points", [True, False])
def test_the_heaps_give_the_order_statistic_of_the_definition(change_points):
    rng = np.random.default_rng(3)
    submit, start = _stream(rng, 700, 20.0, step=0.7)
    start[300:420] += np.floor(rng.exponential(200.0, 120))  # a burst of long waits: resets
    groups = rng.choice(np.array(["1", "2-3", "4-7"], dtype=object), size=len(submit), p=[0.7, 0.25, 0.05])
    got, info = qbets.bounds(submit, start, groups, 0.9, 0.95, change_points=change_points)
    want = _reference(submit, start, groups, 0.9, 0.95, change_points)
    np.testing.assert_array_equal(got, want)
    assert (sum(info["resets"].values()) > 0) == change_points
    assert info["answered_from_pooled"] > 0  # the rare class is answered from all classes' waits


def test_coverage_near_the_quantile_on_a_stationary_stream():
    rng = np.random.default_rng(0)
    n = 3000
    submit = np.arange(n, dtype=np.float64)
    wait = rng.exponential(10.0, n)
    b, info = qbets.bounds(submit, submit + wait, np.full(n, "1", dtype=object))
    m = qbets.bound_metrics(wait, b)
    # the first jobs see fewer than 29 known waits: no bound, a miss in the coverage
    assert info["no_bound_log"] == m["no_bound"] < 60
    has = np.isfinite(b)
    cov = float((wait[has] <= b[has]).mean())
    assert 0.87 <= cov <= 0.95, cov
    assert 0.87 <= m["coverage"] <= 0.95, m
    # the bound sits near the true 0.9 quantile of Exp(10) (23.0 s), not far above it
    assert 20.0 <= m["bound_median_h"] * 3600 <= 32.0, m


def test_a_jump_is_reset_and_the_coverage_recovers():
    rng = np.random.default_rng(1)
    jump, n = 2000, 3000
    submit = np.arange(n, dtype=np.float64)
    wait = np.r_[rng.exponential(10.0, jump), rng.exponential(100.0, n - jump)]  # waits jump 10x
    groups = np.full(n, "1", dtype=object)
    b, info = qbets.bounds(submit, submit + wait, groups)
    b0, info0 = qbets.bounds(submit, submit + wait, groups, change_points=False)
    assert info["resets"]["1"] >= 1 and info0["resets"]["1"] == 0
    cov = wait <= b
    # a wait after the jump is known only once its job starts, about 100 submissions later; within
    # 300 jobs of the jump every later window of 200 is covered again
    after = jump + 300
    windows = [cov[s : s + 200].mean() for s in range(after, n - 199, 50)]
    assert min(windows) >= 0.85, windows
    # without the reset the old regime's waits hold the bound down for the rest of the stream
    assert (wait[after:] <= b0[after:]).mean() < 0.75


def test_nothing_started_after_an_instant_changes_a_bound_given_before_it():
    rng = np.random.default_rng(7)
    n = 2500
    submit, start = _stream(rng, n, 60.0, step=0.8)
    groups = rng.choice(np.array(["1", "2-3", "4-7"], dtype=object), size=n, p=[0.6, 0.3, 0.1])
    t = float(submit[1500])
    later = start >= t  # jobs still waiting at t (submitted before it) among them
    assert (later & (submit < t)).sum() >= 20
    alt = start.copy()
    alt[later] = np.maximum(submit[later], t + np.floor(rng.exponential(5000.0, int(later.sum()))))
    a, _ = qbets.bounds(submit, start, groups)
    b, _ = qbets.bounds(submit, alt, groups)
    before = submit < t
    np.testing.assert_array_equal(a[before], b[before])
    assert not np.array_equal(a[~before], b[~before])  # the rewrite did reach the later answers


def test_a_job_without_a_bound_is_a_miss():
    m = qbets.bound_metrics(np.array([1.0, 2.0, 3.0, 4.0]), np.array([np.nan, 5.0, 5.0, 1.0]))
    assert m["coverage"] == 0.5 and m["no_bound"] == 1 and m["bound_median_h"] == 5.0 / 3600


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="ascending"):
        qbets.bounds(np.array([2.0, 1.0]), np.array([3.0, 3.0]), np.array(["1", "1"], dtype=object))
    with pytest.raises(ValueError, match="before its submission"):
        qbets.bounds(np.array([1.0, 2.0]), np.array([0.0, 3.0]), np.array(["1", "1"], dtype=object))
