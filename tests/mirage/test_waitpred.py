"""The wait predictor at submission time: no hindsight, the scheduler's plan, online
bounds whose feedback comes only when it is known, the guard's within-1-h rule, the command line."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_sim_support import T0, random_trace

from mirage_tasks.calibration import atcut, atsubmit, calibrate as cal, fidelity, waitpred as wp
from mirage_tasks.sim import SimConfig, Simulator, Workload

H = 3600


def _workload(submit, start, dur, nodes, limit=None, user=None) -> Workload:
    n = len(submit)
    submit, start, dur = (np.asarray(x, np.int64) for x in (submit, start, dur))
    return Workload(
        job_id=np.arange(n).astype(str),
        submit=submit,
        real_start=start,
        real_end=start + dur,
        duration=dur,
        limit=np.asarray(limit if limit is not None else dur, np.int64),
        nodes=np.asarray(nodes, np.int64),
        user=np.asarray(user if user is not None else np.zeros(n), np.int64),
        priority=np.full(n, np.nan),
    )


# ----------------------------------------------------------------------------- the plan


def _brute_start(
    free0: int, ends: list[tuple[int, int]], placed: list[tuple[int, int, int]], cap: int, n: int, d: int, now: int
) -> int:
    """Earliest integer start >= now where n nodes are free for d seconds (second by second)."""

    def free(t):
        f = free0 + sum(k for e, k in ends if e <= t)
        return f - sum(k for s, e, k in placed if s <= t < e)

    t = now
    while True:
        if all(free(u) >= n for u in range(t, t + d)):
            return t
        t += 1


def test_plan_places_each_job_where_a_second_by_second_search_does():
    rng = np.random.default_rng(4)
    for _ in range(40):
        cap = int(rng.integers(4, 12))
        now = 100
        r_nodes = rng.integers(1, 4, int(rng.integers(0, 4)))
        r_nodes = r_nodes[np.cumsum(r_nodes) <= cap]
        r_end = now + rng.integers(1, 40, len(r_nodes))
        ahead_n = rng.integers(1, cap + 1, int(rng.integers(0, 6)))
        ahead_d = rng.integers(1, 30, len(ahead_n))
        n, d = int(rng.integers(1, cap + 1)), int(rng.integers(1, 30))
        got = atsubmit.plan_start(
            now, cap, r_end.astype(float), r_nodes.astype(float), ahead_n.astype(float), ahead_d.astype(float), n, d
        )
        ends = list(zip(r_end.tolist(), r_nodes.tolist()))
        placed: list[tuple[int, int, int]] = []
        free0 = cap - int(r_nodes.sum())
        for an, ad in zip(ahead_n.tolist(), ahead_d.tolist()):
            s = _brute_start(free0, ends, placed, cap, an, ad, now)
            placed.append((s, s + ad, an))
        assert got == _brute_start(free0, ends, placed, cap, n, d, now)


def test_a_job_larger_than_the_machine_cannot_be_planned():
    assert atsubmit.plan_start(0, 8, np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), 9, 60) == np.inf


# ----------------------------------------------------------------------------- no hindsight


def _log(seed: int = 0, n: int = 400, nodes: int = 16, days: int = 20):
    rng = np.random.default_rng(seed)
    submit = np.sort(rng.integers(0, days * 86400, n)) + T0
    dur = rng.integers(600, 10 * H, n)
    limit = dur + rng.integers(0, 12 * H, n)
    jn = rng.integers(1, 9, n)
    user = rng.integers(0, 12, n)
    wl0 = _workload(submit, submit, dur, jn, limit, user)
    sim = Simulator.from_workload(
        wl0, SimConfig(nodes=nodes, backfill="conservative", weight_size=0.0), int(submit[0]), int(submit[-1])
    )
    sim.drain()
    start = np.zeros(n, np.int64)
    for j, tag in enumerate(sim.j_tag):
        if tag >= 0:
            start[tag] = sim.j_start[j]
    return submit, start, dur, jn, limit, user


def test_the_answer_for_a_job_does_not_change_with_anything_known_only_later():
    submit, start, dur, jn, limit, user = _log()
    cfg = SimConfig(nodes=16, weight_size=0.0)
    full = atsubmit.sweep(_workload(submit, start, dur, jn, limit, user), cfg, int(submit[0]), int(submit[-1]) + 1)
    k = 250
    t = int(submit[k])
    # rewrite the future of job k's submission: every job running then runs 3 h longer (still within
    # its limit where it can), every job not started by then starts 5 h later, later jobs vanish
    s2, d2 = start.copy(), dur.copy()
    running = (start < t) & (start + dur > t)
    d2[running] = np.minimum(dur[running] + 3 * H, limit[running])
    later = start >= t
    s2[later] += 5 * H
    keep = np.arange(k + 1)
    part = atsubmit.sweep(
        _workload(submit[keep], s2[keep], d2[keep], jn[keep], limit[keep], user[keep]), cfg, int(submit[0]), t + 1
    )
    cols = ["plan_s", "plan_request_s", "plan_easy_s", "est_s", *atsubmit.FEATURES]
    a = full.loc[full.job_id == str(k), cols].to_numpy(float)
    b = part.loc[part.job_id == str(k), cols].to_numpy(float)
    np.testing.assert_allclose(b, a)
    # the counts are what they say: pending = submitted before t and not started before t
    row = full.loc[full.job_id == str(k)].iloc[0]
    assert (
        row["pending_jobs"]
        == ((submit < t) & (start >= t)).sum() + ((submit == t) & (np.arange(len(submit)) < k) & (start < t)).sum()
    )
    # and the control: a replay with real run times (the old "simulator" candidate) does change
    wl_a = _workload(submit, start, dur, jn, limit, user)
    wl_b = _workload(submit, s2, d2, jn, limit, user)
    ra = fidelity.replay(wl_a, cfg, int(submit[0]), int(submit[-1]) + 1, 0).set_index("job_id")["sim_wait_s"]
    rb = fidelity.replay(wl_b, cfg, int(submit[0]), int(submit[-1]) + 1, 0).set_index("job_id")["sim_wait_s"]
    changed = (ra != rb) & (submit >= t)
    assert changed.sum() > 10  # hindsight would have changed later jobs' answers


def test_run_time_estimates_use_only_runs_that_had_ended():
    # one user: job 0 (1 h), job 1 (3 h), job 2 submitted while job 1 still runs, job 3 after both end
    submit = np.array([0, 10, 2 * H, 5 * H]) + T0
    start = submit.copy()
    dur = np.array([1 * H, 3 * H, 1 * H, 1 * H])
    limit = np.array([10 * H, 10 * H, 10 * H, 90 * 60])
    fr = atsubmit.sweep(
        _workload(submit, start, dur, [1, 1, 1, 1], limit), SimConfig(nodes=8), int(T0), int(T0 + 6 * H)
    )
    est = fr["est_s"].to_numpy()
    assert est[0] == 10 * H  # no history: the request
    assert est[1] == 10 * H  # job 0 still running at job 1's submission
    assert est[2] == 1 * H  # job 0 ended (1 h); job 1 has not
    assert est[3] == 90 * 60  # mean of 1 h and 3 h = 2 h, capped by the 1.5 h request


# ----------------------------------------------------------------------------- bounds


def test_online_bound_learns_an_outcome_only_once_it_is_known():
    rng = np.random.default_rng(0)
    n = 3000
    submit = np.sort(rng.integers(0, 60 * 86400, n)).astype(float)
    real = rng.exponential(2 * H, n)
    base = np.zeros(n)
    b1, th1 = atsubmit.online_bound(base, submit, real, 0.9, theta0=0.0)
    # the bound of job i is a function of outcomes known before submit[i]: change the wait of a job
    # whose outcome becomes known only after job k's submission, and job k's bound stays the same
    k = 2000
    known = atsubmit.next_outcomes(submit, real, b1)
    late = np.flatnonzero((np.arange(n) < k) & (known > submit[k]))
    assert len(late) > 0
    real2 = real.copy()
    real2[late] = real2[late] * 5 + 10 * H
    b2, _ = atsubmit.online_bound(base, submit, real2, 0.9, theta0=0.0)
    assert b2[k] == b1[k]
    assert 0.87 <= (real[1000:] <= b1[1000:]).mean() <= 0.93  # and it covers what it says


def test_a_groups_offset_moves_only_on_its_own_outcomes_each_once_known():
    # A: a miss known at 600 s (+ the tie: not known to a submission at that very second)
    submit = np.array([0.0, 600.0, 700.0, 700.0])
    base = np.full(4, 600.0)
    real = np.array([10 * H, 0.0, 0.0, 0.0])
    group = np.array(["A", "A", "B", "A"], dtype=object)
    eta = 0.5
    _, th = atsubmit.online_bound(base, submit, real, 0.9, {"A": 0.0, "B": 0.2}, eta=eta, group=group)
    assert th[1] == 0.0  # known at 600 s + a tick: not yet at 600 s
    assert th[2] == 0.2  # B's offset: A's miss does not move it
    assert th[3] == pytest.approx(eta * (1 - 0.1))  # A's: moved once the miss is known
    # ungrouped, the same miss moves the one offset every job shares
    _, th1 = atsubmit.online_bound(base, submit, real, 0.9, 0.0, eta=eta)
    assert th1[2] == pytest.approx(eta * 0.9)


def test_a_groups_bounds_read_neither_other_groups_outcomes_nor_its_own_not_yet_known():
    rng = np.random.default_rng(3)
    n = 4000
    submit = np.sort(rng.integers(0, 60 * 86400, n)).astype(float)
    group = rng.choice(np.array(["1", "2-3", "4-7"], dtype=object), n)
    real = rng.exponential(2 * H, n) * np.where(group == "4-7", 10, 1)
    base = np.full(n, 600.0)
    t0 = {None: 0.0, "1": 0.5, "2-3": 1.0}  # "4-7" starts at the pooled offset
    b1, th1 = atsubmit.online_bound(base, submit, real, 0.9, t0, group=group)
    assert th1[np.flatnonzero(group == "4-7")[0]] == 0.0 and th1[np.flatnonzero(group == "1")[0]] == 0.5
    # every other group's waits rewritten: group "1"'s bounds are the same, the others' are not
    other = group != "1"
    real2 = np.where(other, real * 7 + 5 * H, real)
    b2, _ = atsubmit.online_bound(base, submit, real2, 0.9, t0, group=group)
    np.testing.assert_array_equal(b2[~other], b1[~other])
    assert not np.array_equal(b2[other], b1[other])
    # group "1"'s own outcomes not yet known at job k's submission: job k's bound is the same
    k = int(np.flatnonzero(group == "1")[1000])
    known = atsubmit.next_outcomes(submit, real, b1)
    late = (np.arange(n) < k) & (known > submit[k]) & (group == "1")
    assert late.any()
    b3, _ = atsubmit.online_bound(base, submit, np.where(late, real + 100 * H, real), 0.9, t0, group=group)
    assert b3[k] == b1[k]
    # ... while its own outcomes known before it do move it
    early = (np.arange(n) < k) & (known <= submit[k]) & (group == "1")
    b4, _ = atsubmit.online_bound(base, submit, np.where(early, real + 100 * H, real), 0.9, t0, group=group)
    assert b4[k] > b1[k]
    for g in ("1", "2-3", "4-7"):  # and each group covers what it says
        m = (group == g) & (np.arange(n) > 1000)
        assert 0.86 <= (real[m] <= b1[m]).mean() <= 0.94, g


def test_a_group_starts_at_its_own_offset_only_with_enough_known_calibration_waits():
    rng = np.random.default_rng(5)
    n = 390
    group = np.array(["1"] * 300 + ["8-15"] * 60 + ["64-127"] * 30, dtype=object)
    real = rng.exponential(H, n) * np.where(group == "1", 1, 20)
    base = np.full(n, 600.0)
    cen = np.zeros(n, bool)
    cen[300:304] = True  # 8-15: 60 jobs, 56 of them known
    th, info = atsubmit.group_theta0(base, real, 0.9, cen, [group], cap_s=1000 * H, min_known=35)
    assert info["1"]["source"] == "calibrated" and info["1"]["n_known"] == 300
    assert th["1"] == atsubmit.static_theta(base[:300], real[:300], 0.9, cen[:300], 1000 * H)
    assert info["8-15"]["source"] == "calibrated" and info["8-15"]["n_known"] == 56
    assert info["64-127"]["source"] == "pooled fallback" and th["64-127"] == th[None]
    assert th[None] == atsubmit.static_theta(base, real, 0.9, cen, 1000 * H)
    assert th["1"] < th[None] < th["8-15"]
    _, info2 = atsubmit.group_theta0(base, real, 0.9, cen, [group], cap_s=1000 * H, min_known=57)
    assert info2["8-15"]["source"] == "pooled fallback"


def test_a_thin_group_merges_with_its_larger_neighbours_first_then_the_smaller():
    order = ["1", "2-3", "4-7", "8-15", "16-31", "64-127"]
    known = {"1": 1700, "2-3": 70, "4-7": 215, "8-15": 18, "16-31": 13, "64-127": 0}

    def enough(run):
        return sum(known[g] for g in run) >= 50

    # 8-15 + 16-31 + 64-127 hold 31 known: past the largest it takes the next smaller, 4-7
    assert atsubmit.neighbour_run(order, "8-15", enough) == ("4-7", "8-15", "16-31", "64-127")
    assert atsubmit.neighbour_run(order, "64-127", enough) == ("4-7", "8-15", "16-31", "64-127")
    assert atsubmit.neighbour_run(order, "2-3", enough) == ("2-3", "4-7")
    # larger neighbours enough on their own: no smaller one
    known2 = {**known, "16-31": 40}
    assert atsubmit.neighbour_run(order, "8-15", lambda r: sum(known2[g] for g in r) >= 50) == ("8-15", "16-31")
    # nothing is ever enough: no run
    assert atsubmit.neighbour_run(order, "8-15", lambda r: False) is None
    # the rule reads only the order and the predicate: the same answer every time
    assert len({atsubmit.neighbour_run(order, "16-31", enough) for _ in range(5)}) == 1


def test_a_thin_group_starts_at_its_merged_neighbours_offset_from_the_calibration_sample_only():
    rng = np.random.default_rng(7)
    group = np.array(["1"] * 300 + ["4-7"] * 40 + ["8-15"] * 20 + ["16-31"] * 30, dtype=object)
    real = rng.exponential(H, len(group)) * np.where(group == "1", 1, 20)
    base = np.full(len(group), 600.0)
    cen = np.zeros(len(group), bool)
    cen[340:342] = True  # 8-15: 18 of its 20 known
    scored = [np.array(["64-127", "8-15"], dtype=object)]
    th, info = atsubmit.group_theta0(
        base, real, 0.9, cen, [group], cap_s=1000 * H, min_known=35, also=scored, merge_order=wp.size_key
    )
    assert info["1"]["source"] == "calibrated" and info["4-7"]["source"] == "calibrated"
    # 8-15 (18 known) + 16-31 (30) = 48: its larger neighbour is enough
    m = np.isin(group, ["8-15", "16-31"])
    assert info["8-15"]["merged"] == ["8-15", "16-31"] and info["8-15"]["source"] == "merged (8-15, 16-31)"
    assert th["8-15"] == atsubmit.static_theta(base[m], real[m], 0.9, cen[m], 1000 * H)
    # 16-31 (30) + 64-127 (none in the sample) = 30: then its smaller neighbour 8-15
    assert info["16-31"]["merged"] == ["8-15", "16-31", "64-127"]
    assert info["64-127"]["merged"] == ["8-15", "16-31", "64-127"] and info["64-127"]["n"] == 0
    assert th["16-31"] == th["64-127"] == th["8-15"]
    # the large classes wait long: the merged start lies above the pooled one, as their own would
    assert th["8-15"] > th[None] > th["1"]
    # without merge_order the thin ones start at the pooled offset, as before
    th3, info3 = atsubmit.group_theta0(base, real, 0.9, cen, [group], cap_s=1000 * H, min_known=35, also=scored)
    assert info3["8-15"]["source"] == "pooled fallback" and th3["8-15"] == th3[None]
    with pytest.raises(ValueError, match="one level"):
        atsubmit.group_theta0(base, real, 0.9, cen, [group, group], merge_order=wp.size_key)


def test_a_group_falls_back_level_by_level_and_never_calibrates_on_a_censored_quantile():
    rng = np.random.default_rng(6)
    size = np.array(["1"] * 200 + ["8-15"] * 100, dtype=object)
    req = np.array((["<=1h"] * 150 + [">24h"] * 50) + (["<=1h"] * 60 + [">24h"] * 40), dtype=object)
    real = rng.exponential(H, 300) * np.where(req == ">24h", 30, 1)
    base = np.full(300, 600.0)
    cen = np.zeros(300, bool)
    cen[200:215] = True  # 8-15: 15 of its 100 still waiting at the cut, more than 1 - level
    th, info = atsubmit.group_theta0(
        base, real, 0.9, cen, [size, req], cap_s=1000 * H, min_known=50, also=[np.array(["2-3"]), np.array(["1-4h"])]
    )
    assert info["1 / <=1h"]["source"] == "calibrated"
    assert info["1 / >24h"]["source"] == "calibrated" and th["1 / >24h"] > th["1 / <=1h"]
    # 8-15 / <=1h: 45 known, too few; its size class's quantile is a censored wait: pooled
    assert info["8-15 / <=1h"]["n_known"] == 45 and info["8-15 / <=1h"]["source"] == "pooled fallback"
    s8 = size == "8-15"
    assert not np.isfinite(atsubmit._score_quantile(base[s8], real[s8], 0.9, cen[s8]))
    assert th["8-15 / <=1h"] == th[None] == atsubmit.static_theta(base, real, 0.9, cen, 1000 * H)
    assert info["2-3 / 1-4h"]["source"] == "pooled fallback" and info["2-3 / 1-4h"]["n"] == 0
    # the first level alone: "1" holds 200 known, its own offset; with less censored, 8-15 its own
    th1, info1 = atsubmit.group_theta0(base, real, 0.9, np.zeros(300, bool), [size], cap_s=1000 * H)
    assert info1["8-15"]["source"] == "calibrated" and np.isfinite(th1["8-15"])
    # one size class with too few at the finer level: the coarser level's offset
    _, info2 = atsubmit.group_theta0(base, real, 0.9, np.zeros(300, bool), [size, req], cap_s=1000 * H)
    assert info2["8-15 / >24h"]["source"] == "level 1 (8-15)"
    assert info2["8-15 / >24h"]["theta0"] == th1["8-15"]


def test_every_outcome_is_learned_when_its_bound_runs_out_covered_or_not():
    # the instant an outcome is fed back must not depend on the outcome: learning a miss when a
    # short bound ran out but a cover only at the job's start fed back misses before covers
    submit = np.array([0.0, 0.0, 0.0])
    bound = np.array([H, H, 10 * H])
    got = atsubmit.next_outcomes(submit, np.array([0.5 * H, 5 * H, 2 * H]), bound)
    np.testing.assert_array_equal(got, submit + bound)


def test_the_online_offset_stays_bounded_under_a_burst_of_misses_and_comes_back():
    rng = np.random.default_rng(7)
    n, burst = 9000, (2000, 2600)
    submit = np.arange(n) * 60.0
    real = rng.exponential(H, n)
    real[burst[0] : burst[1]] = 1000 * H  # a burst of jobs that wait far beyond anything seen
    cap = 20 * H
    bound, theta = atsubmit.online_bound(np.full(n, 600.0), submit, real, 0.9, theta0=0.0, eta=0.05, cap_s=cap)
    lim = atsubmit.theta_limit(cap)
    assert np.all(np.abs(theta) <= lim + 1e-12) and np.all(bound <= cap)
    assert theta[burst[1] :].max() > theta[: burst[0]].max() + 1  # the burst did push it up
    settled = theta[1000 : burst[0]].mean()
    assert abs(theta[-500:].mean() - settled) < 0.3  # and it came back
    assert 0.87 <= (real[-2000:] <= bound[-2000:]).mean() <= 0.95


def test_a_censored_calibration_wait_counts_as_a_miss_for_the_offset():
    base = np.zeros(10)
    real = np.full(10, 60.0)  # every job 1 minute ...
    cen = np.zeros(10, bool)
    cen[:3] = True  # ... but three were still waiting at the cut: their 1 minute is "at least"
    assert atsubmit.static_theta(base, real, 0.7) == pytest.approx(np.log(2))
    assert atsubmit.static_theta(base, real, 0.7, cen, cap_s=10 * H) == pytest.approx(atsubmit.theta_limit(10 * H))


def test_the_log_as_it_stood_at_the_cut_keeps_the_past_and_censors_the_rest():
    # ended before the cut / running at it / waiting at it / submitted after it
    submit = np.array([0, 0, 2 * H, 5 * H]) + T0
    start = np.array([0, H, 4 * H, 6 * H]) + T0
    dur = np.array([H, 5 * H, H, H])
    wl = _workload(submit, start, dur, [1, 2, 3, 4], limit=[2 * H, 8 * H, 3 * H, 2 * H])
    wl.priority = np.array([1.0, 2.0, 3.0, 4.0])
    cut = T0 + 3 * H
    got, cen = atcut.as_known(wl, cut)
    assert len(got) == 3 and cen.tolist() == [False, False, True]
    assert got.real_start.tolist() == [T0, T0 + H, cut]  # a wait still going on: "at least" the cut
    assert got.duration.tolist() == [H, 8 * H, 3 * H]  # unknown run times: the request
    assert got.real_end.tolist() == (got.real_start + got.duration).tolist()
    assert np.isnan(got.priority[2]) and got.priority[:2].tolist() == [1.0, 2.0]


def test_static_conformal_offset_covers_its_sample():
    rng = np.random.default_rng(1)
    real = rng.exponential(H, 2000)
    base = rng.exponential(H, 2000)
    th = atsubmit.static_theta(base, real, 0.9)
    bound = 60 * np.expm1(np.maximum(np.log1p(base / 60) + th, 0))
    assert (real <= bound + 1e-9).mean() >= 0.9


# ----------------------------------------------------------------------------- guard


def test_the_guard_refuses_a_lower_mae_bought_with_jobs_that_start_at_once():
    rng = np.random.default_rng(3)
    n = 2000
    real = np.where(rng.random(n) < 0.7, 0.0, rng.exponential(8 * H, n))
    tail = pd.DataFrame({"real_wait_s": real})
    # right on the long waits, 1.5 h on every job that starts at once: a lower MAE than zero wait's,
    # bought with the within-1-h share of the many jobs that start at once
    hours = np.where(real > 0, real, 1.5 * H)
    pt = {k: np.zeros(n) for k in wp.CANDIDATES}
    pt["plan"] = hours
    assert wp.wait_metrics(real, hours)["mae_h"] < wp.wait_metrics(real, np.zeros(n))["mae_h"]
    pick, m, why = wp.guard(tail, pt, 0.05)
    assert pick == "zero" and "plan" in why and "not eligible" in why
    good = np.where(real > 0, real, 0.0) * 0.5  # close on the long waits, exact on the rest
    pt["corrected_q40"] = good
    pick, _, _ = wp.guard(tail, pt, 0.05)
    assert pick == "corrected_q40"


def _judged(real: np.ndarray, day0: pd.Timestamp) -> pd.DataFrame:
    """Jobs with these real waits, submitted a few per day from ``day0`` (the day clusters of the SE)."""
    sub = day0.timestamp() + (np.arange(len(real)) // 10) * 86400 + 3600
    return pd.DataFrame({"real_wait_s": real, "submit": sub.astype(np.int64)})


def test_the_guard_refuses_a_candidate_that_broke_the_promise_in_an_earlier_fold():
    # two months of the calibration period, each judged out of sample. In the later month (where the
    # single held-back tail sits) "corrected_q50" is within a point of zero wait on within 1 h and has
    # the least MAE; in the earlier month it predicted long waits for 9 % of the jobs, which started at once.
    rng = np.random.default_rng(7)
    folds, tail = [], None
    for label, day0, n, miss in (("1996-11", "1996-11-01", 200, 0.09), ("1996-12", "1996-12-01", 600, 0.01)):
        # 60 % start at once, the rest wait over 2 h (neither zero nor half the wait is within 1 h there)
        real = np.where(rng.random(n) < 0.6, 0.0, 2 * H + 60 + rng.exponential(8 * H, n))
        pt = {k: np.zeros(n) for k in wp.CANDIDATES}
        q50 = real * 0.5  # half the long waits: the least MAE
        q50[rng.choice(np.flatnonzero(real == 0), int(miss * n), replace=False)] = 2 * H  # wrong on `miss` of all
        pt["corrected_q50"] = q50
        pt["corrected_q20"] = real * 0.3  # never wrong where zero wait is right, a higher MAE
        fr = _judged(real, pd.Timestamp(day0, tz="UTC"))
        folds.append((label, fr, pt))
        tail = (fr, pt)
    d = {f[0]: wp._hit_diff(f[1]["real_wait_s"].to_numpy(), f[2]["corrected_q50"]).mean() for f in folds}
    assert d["1996-11"] == pytest.approx(-0.09) and d["1996-12"] == pytest.approx(-0.01)
    old, _, _ = wp.guard(*tail, 0.05)  # the single held-back tail lets it through
    assert old == "corrected_q50"
    pick, m, why = wp.guard_folds(folds, 0.05)
    assert pick == "corrected_q20" and not m["corrected_q50"]["eligible"] and m["zero"]["eligible"]
    # pooled over both months it is confidently within the margin: the per-fold check refuses it
    assert m["corrected_q50"]["refused_by"] == "fold 1996-11" and m["corrected_q50"]["worst_fold"] == "1996-11"
    assert "corrected_q50 (-3.0% ± " in why and "worst fold 1996-11 -9.0%" in why
    assert m["corrected_q50"]["folds"]["1996-12"]["within_1h_diff_vs_zero"] == pytest.approx(-0.01)
    assert json.dumps(wp.guard_folds(folds, 0.05)) == json.dumps((pick, m, why))  # deterministic


def test_the_guard_folds_are_months_fitted_only_on_what_was_known_at_their_cut():
    # three months of calibration jobs: folds judge November and December, each fitted before it
    rng = np.random.default_rng(1)
    a, b = (int(pd.Timestamp(x, tz="UTC").timestamp()) for x in ("1996-10-08", "1997-01-01"))
    n = 600
    sub = np.sort(rng.integers(a, b, n))
    cal = pd.DataFrame({f: rng.random(n) for f in atsubmit.FEATURES})
    cal["submit"] = sub
    cal["recent_wait_h"], cal["plan_request_s"], cal["plan_s"] = rng.random(n), rng.random(n) * H, rng.random(n) * H
    cal["real_wait_s"] = np.minimum(rng.exponential(4 * H, n), b - sub)
    censored = sub + cal["real_wait_s"].to_numpy() >= b
    folds, info = wp._guard_folds(cal, censored, a, b, "UTC", 0.9, 0)
    assert [f[0] for f in folds] == ["1996-11", "1996-12"] and [i["label"] for i in info] == ["1996-11", "1996-12"]
    nov = int(pd.Timestamp("1996-11-01", tz="UTC").timestamp())
    assert info[0]["n_fit"] == int((sub < nov).sum()) and info[0]["n_judged"] == len(folds[0][1])
    assert (folds[0][1]["submit"] >= nov).all() and (folds[0][1]["submit"] < nov + 30 * 86400).all()
    # rewrite everything not known at November's start: later jobs' waits, and the waits of jobs
    # still waiting then. The November fold's points do not move; December's do
    later = cal.copy()
    running_past = sub + cal["real_wait_s"].to_numpy() > nov
    later.loc[running_past, "real_wait_s"] = np.minimum(cal["real_wait_s"][running_past] * 3 + H, b - sub[running_past])
    f2, _ = wp._guard_folds(later, censored, a, b, "UTC", 0.9, 0)
    for k in wp.CORRECTED:
        np.testing.assert_array_equal(f2[0][2][k], folds[0][2][k])
        assert not np.array_equal(f2[1][2][k], folds[1][2][k])
    # a month with too few known waits merges into the one before; none left: no folds (the tail's turn)
    short = sub < int(pd.Timestamp("1996-12-03", tz="UTC").timestamp())
    assert [x[0] for x in wp.month_folds(sub[short], ~censored[short], a, b, "UTC")] == ["1996-11 to 1996-12"]
    assert wp.month_folds(sub[sub < nov], ~censored[sub < nov], a, nov, "UTC") == []
    # months in the trace's zone: the cuts are its local midnights
    a2, b2 = (int(pd.Timestamp(x, tz="Europe/Stockholm").timestamp()) for x in ("1996-10-08", "1997-01-01"))
    inside = (sub >= a2) & (sub < b2)
    sth = wp.month_folds(sub[inside], ~censored[inside], a2, b2, "Europe/Stockholm")
    assert [(lab, pd.Timestamp(c, unit="s", tz="Europe/Stockholm").strftime("%d %H:%M")) for lab, c, _ in sth] == [
        ("1996-11", "01 00:00"),
        ("1996-12", "01 00:00"),
    ]


def test_the_report_says_per_month_whether_the_pick_kept_the_promise():
    # two scored months: the pick is 3 points below zero wait in January (kept), 10 in February (broken)
    jan, feb = (int(pd.Timestamp(x, tz="UTC").timestamp()) for x in ("1997-01-10", "1997-02-10"))
    real = np.zeros(200)
    pick = np.zeros(200)
    pick[:3] = 2 * H  # January: 3 of 100 wrong at once
    pick[100:110] = 2 * H  # February: 10 of 100
    pred = pd.DataFrame(
        {
            "submit": np.r_[np.full(100, jan), np.full(100, feb)],
            "real_wait_s": real,
            "nodes": 1,
            "limit_s": H,
        }
    )
    for k in wp.PREDICTORS:
        pred[k] = pick if k in ("corrected_q40", "guarded") else np.zeros(200)
        pred[f"{k}_bound"] = np.full(200, H, float)
    res = wp.score(pred, "UTC")
    pr = wp.promise(res, "guarded", 0.05)
    assert list(pr) == ["1997-01", "1997-02"]
    assert pr["1997-01"]["points_vs_zero"] == pytest.approx(-3.0) and pr["1997-01"]["kept"]
    assert pr["1997-02"]["points_vs_zero"] == pytest.approx(-10.0) and not pr["1997-02"]["kept"]
    assert pr["1997-02"]["within_1h"] == pytest.approx(0.9) and pr["1997-02"]["zero_within_1h"] == 1.0
    c = wp.criteria(res, 0.9, margin=0.05)
    assert c["within_1h_promise_kept_months"] == {"1997-01": True, "1997-02": False}
    assert not c["within_1h_promise_kept_every_month"]
    lines = wp.promise_lines({"pick": "corrected_q40", "promise": {"margin": 0.05, "months": pr}})
    assert "| 1997-01 | 100 | 97.0% | 100.0% | -3.0 | yes |" in lines
    assert "| 1997-02 | 100 | 90.0% | 100.0% | -10.0 | no |" in lines


def test_metrics_count_the_long_waits_apart():
    real = np.array([0, 0, 2 * H, 3 * H], float)
    m = wp.wait_metrics(real, np.array([0, 0, 2 * H + 300, 0], float), np.array([60, 60, 3 * H, 4 * H], float))
    assert m["within_1h"] == 0.75 and m["n_waited_over_1h"] == 2 and m["within_10m_waited_over_1h"] == 0.5
    assert m["coverage"] == 1.0


# ----------------------------------------------------------------------------- calibration respects the machine


def test_the_search_never_exceeds_the_stated_machine_and_says_why():
    rng = np.random.default_rng(0)
    n = 200
    submit = np.sort(rng.integers(0, 5 * 86400, n)) + T0
    wl = _workload(submit, submit, rng.integers(H, 6 * H, n), rng.integers(4, 20, n))
    facts = cal.trace_facts(wl, int(T0), int(T0 + 5 * 86400), machine_nodes=40)
    assert facts.peak_busy_nodes > 40
    assert cal.search_space(facts)["nodes"][1] <= 40
    assert "40 nodes" in cal.machine_warning(facts) and str(facts.peak_busy_nodes) in cal.machine_warning(facts)


def test_shared_nodes_count_as_node_equivalents():
    df = random_trace(3, days=2, nodes=16)
    df["procs"] = 4  # 4 processors per job on 16-processor nodes: each job holds a quarter node
    df["nodes"] = pd.array([pd.NA] * len(df), dtype="Int32")
    wl = Workload.from_frame(df, procs_per_node=16)
    assert (wl.nodes == 1).all() and np.allclose(wl.node_equiv, 0.25)


# ----------------------------------------------------------------------------- jobs that never ran


def _log_with_a_cancelled_job() -> Workload:
    """A 4-node job runs [0, 1000); job C (1 node) is queued at 10 and cancelled at 500, never
    running; B (1 node, 100 s) is submitted at 20, D (1 node) at 600."""
    ts = lambda x: pd.Timestamp(T0 + x, unit="s", tz="UTC") if x is not None else pd.NaT  # noqa: E731
    rows = [  # job, submit, start, end, limit, nodes, user
        ("A", 0, 0, 1000, 1000, 4, "a"),
        ("C", 10, None, 500, 3600, 1, "c"),
        ("B", 20, 1000, 1100, 200, 1, "b"),
        ("D", 600, 1000, 1050, 200, 1, "d"),
    ]
    df = pd.DataFrame(
        {
            "job_id": [r[0] for r in rows],
            "submit": [ts(r[1]) for r in rows],
            "start": [ts(r[2]) for r in rows],
            "end": [ts(r[3]) for r in rows],
            "time_limit_s": pd.array([r[4] for r in rows], dtype="Int64"),
            "nodes": pd.array([r[5] for r in rows], dtype="Int32"),
            "procs": pd.array([None] * 4, dtype="Int32"),
            "partition": "p",
            "user": [r[6] for r in rows],
            "status": ["COMPLETED", "CANCELLED", "COMPLETED", "COMPLETED"],
            "priority": pd.array([None] * 4, dtype="Int64"),
        }
    )
    for c in ("submit", "start", "end"):
        df[c] = df[c].astype("datetime64[s, UTC]")
    return Workload.from_frame(df)


def _tiny(**kw) -> SimConfig:
    base = dict(nodes=4, backfill="conservative", bf_interval_s=1, bf_resolution_s=1, bf_window_s=10**6)
    base.update(priority="age_size", weight_age=1000.0, max_age_s=10**6, weight_size=0.0, warm_start=False)
    return SimConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "kw",
    [
        {"backfill": "conservative"},
        {"backfill": "easy"},
        {"backfill": "none"},
        {"backfill": "named"},
        {"priority": "multifactor", "weight_fairshare": 1000.0},
    ],
)
def test_a_job_that_never_ran_waits_in_the_queue_until_it_left_and_never_runs(kw):
    wl = _log_with_a_cancelled_job()
    assert list(wl.job_id) == ["A", "B", "D"] and list(wl.never_ran.job_id) == ["C"]
    sim = Simulator.from_workload(wl, _tiny(**kw), T0, T0 + 700)
    sim.run_until(T0 + 100)
    tags = [sim.j_tag[j] for j in sim.pending]
    assert len(tags) == 2 and tags[0] < 0 and tags[1] == 1  # C (queued first), then B
    sim.run_until(T0 + 600)
    assert [sim.j_tag[j] for j in sim.pending] == [1, 2]  # C left at 500
    sim.drain()
    gone = [j for j, t in enumerate(sim.j_tag) if t < 0]
    assert len(gone) == 1 and sim.j_start[gone[0]] == -1  # never started
    assert sim.j_start[sim.j_tag.index(1)] == T0 + 1000  # B was not held back by C
    real = fidelity.replay(wl, _tiny(**kw), T0, T0 + 700)
    assert list(real["job_id"]) == ["A", "B", "D"]  # scored: the jobs that ran, only


def test_a_job_that_never_ran_is_pending_at_submission_until_it_left():
    wl = _log_with_a_cancelled_job()
    frame = atsubmit.sweep(wl, _tiny(), T0, T0 + 700)
    pend = dict(zip(frame["job_id"], frame["pending_jobs"]))
    assert list(frame["job_id"]) == ["A", "B", "D"]  # never scored
    assert pend == {"A": 0, "B": 1, "D": 1}  # B sees C queued; D (after C left) sees B only
    # the log as it stood at 300: C still queued then (its leaving unknown) is a censored waiting job
    known, waiting = atcut.as_known(wl, T0 + 300)
    assert list(known.job_id) == ["A", "C", "B"] and list(waiting) == [False, True, True]
    assert len(known.never_ran) == 0
    known, _ = atcut.as_known(wl, T0 + 700)
    assert list(known.never_ran.job_id) == ["C"] and "C" not in set(known.job_id)


def test_a_job_without_a_limit_is_never_given_its_own_run_time():
    df = pd.DataFrame(
        {
            "job_id": ["1", "2", "3"],
            "submit": pd.to_datetime([T0, T0 + 100, T0 + 200], unit="s", utc=True).astype("datetime64[s, UTC]"),
            "start": pd.to_datetime([T0, T0 + 100, T0 + 200], unit="s", utc=True).astype("datetime64[s, UTC]"),
            "end": pd.to_datetime([T0 + 50, T0 + 9100, T0 + 300], unit="s", utc=True).astype("datetime64[s, UTC]"),
            "time_limit_s": pd.array([600, None, None], dtype="Int64"),
            "nodes": pd.array([1, 1, 1], dtype="Int32"),
            "procs": pd.array([None] * 3, dtype="Int32"),
            "partition": "p",
            "user": ["u", "u", "v"],
            "status": "COMPLETED",
            "priority": pd.array([None] * 3, dtype="Int64"),
        }
    )
    w = Workload.from_frame(df)
    # job 2: its user's finished job asked 600 s (not its own 9000 s); job 3: no history, one day
    assert list(w.limit) == [600, 600, 86400] and list(w.duration) == [50, 600, 100]
    assert w.limit_fill["user_history"] == 1 and w.limit_fill["log_default"] == 1
