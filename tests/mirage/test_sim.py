"""The event-driven simulator on hand-made schedules and random traces (properties)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from test_sim_support import T0, frame, random_trace, run_jobs, starts, tiny_cfg

from mirage_tasks.sim import PRESETS, SimConfig, Simulator, Workload
from mirage_tasks.sim.config import config_from_args
from stepkit import StepError

# ---------------------------------------------------------------- known schedules


def test_fcfs_order_without_backfill():
    cfg = tiny_cfg(backfill="none")
    sim, ids = run_jobs(cfg, [(0, 4, 100, 100), (1, 3, 50, 50), (2, 2, 50, 50), (3, 1, 10, 10)])
    # B waits for A; C (2 nodes) does not fit beside B (3); D (1 node) would fit beside B
    # but strict priority order stops at C.
    assert starts(sim, ids) == [0, 100, 150, 150]


def test_backfill_starts_a_short_job_ahead_of_a_blocked_head():
    jobs = [(0, 3, 100, 100), (1, 4, 50, 50), (2, 1, 50, 50)]
    sim, ids = run_jobs(tiny_cfg(backfill="easy"), jobs)
    assert starts(sim, ids) == [0, 100, 2]
    assert sim.j_bf[ids[2]] and not sim.j_bf[ids[1]]
    sim, ids = run_jobs(tiny_cfg(backfill="none"), jobs)
    assert starts(sim, ids) == [0, 100, 150]


@pytest.mark.parametrize("mode", ["easy", "conservative"])
def test_backfill_never_delays_the_head_reservation(mode):
    # C fits now but its *limit* (200 s) would overlap the head's reservation at 100, even
    # though its real run time is only 10 s: it must not start before B.
    sim, ids = run_jobs(tiny_cfg(backfill=mode), [(0, 3, 100, 100), (1, 4, 100, 100), (2, 1, 10, 200)])
    assert starts(sim, ids) == [0, 100, 200]


def test_conservative_and_easy_differ():
    jobs = [
        (0, 2, 100, 100),  # A: 2 nodes until 100
        (0, 1, 50, 50),  # B: 1 node until 50
        (1, 4, 100, 100),  # H: head, needs the whole cluster -> reserved at 100
        (2, 2, 50, 50),  # J: fits [50, 100) -> reserved there in conservative mode only
        (10, 1, 60, 60),  # K: [10, 70) fits now, does not delay H, but delays J
    ]
    easy, ids = run_jobs(tiny_cfg(backfill="easy"), jobs)
    cons, ids2 = run_jobs(tiny_cfg(backfill="conservative"), jobs)
    assert starts(easy, ids) == [0, 0, 100, 200, 10]
    assert starts(cons, ids2) == [0, 0, 100, 50, 200]


def test_bf_interval_limits_when_backfill_happens():
    # backfill passes only at multiples of 60 s: C is backfilled at 60, not at 2
    jobs = [(0, 3, 1000, 1000), (1, 4, 50, 50), (2, 1, 50, 50)]
    sim, ids = run_jobs(tiny_cfg(backfill="easy", bf_interval_s=60), jobs)
    assert starts(sim, ids) == [0, 1000, 60]


def test_bf_window_stops_reservations_beyond_it():
    # conservative, window 50 s: H cannot be reserved (earliest start 100 > now + 50), so J
    # (2 nodes, limit 200) may start now although it delays H.
    jobs = [(0, 2, 100, 100), (1, 4, 100, 100), (2, 2, 200, 200)]
    narrow, ids = run_jobs(tiny_cfg(bf_window_s=50), jobs)
    wide, ids2 = run_jobs(tiny_cfg(bf_window_s=10**6), jobs)
    assert starts(narrow, ids)[2] == 2 and starts(narrow, ids)[1] == 202
    assert starts(wide, ids2) == [0, 100, 200]


def test_priority_age_size_and_cap():
    # size term: the 4-node job outranks an older 1-node job when both wait
    cfg = tiny_cfg(backfill="none", weight_size=1000.0, weight_age=1.0)
    sim, ids = run_jobs(cfg, [(0, 4, 100, 100), (1, 1, 10, 10), (2, 4, 10, 10)])
    assert starts(sim, ids) == [0, 110, 100]
    # without the size term it is FCFS
    sim, ids = run_jobs(tiny_cfg(backfill="none"), [(0, 4, 100, 100), (1, 1, 10, 10), (2, 4, 10, 10)])
    assert starts(sim, ids) == [0, 100, 110]


def test_user_job_limit_skips_without_blocking():
    cfg = tiny_cfg(backfill="none", max_jobs_per_user=1)
    sim, ids = run_jobs(cfg, [(0, 1, 100, 100, 7), (1, 1, 100, 100, 7), (2, 1, 100, 100, 8)])
    assert starts(sim, ids) == [0, 100, 2]


def test_tick_mode_rounds_to_the_clock():
    sim, ids = run_jobs(tiny_cfg(tick_s=60), [(30, 1, 90, 200), (31, 4, 10, 100)])
    # submits round up to 60; run 90 s rounds down to 60; the 4-node job waits for it
    assert starts(sim, ids) == [60, 120]


def test_config_validation_and_presets():
    with pytest.raises(StepError):
        SimConfig(nodes=0)
    with pytest.raises(StepError):
        SimConfig(nodes=4, backfill="fifo")
    assert PRESETS["reference"].nodes == 88 and PRESETS["reference"].tick_s == 60
    import argparse

    from mirage_tasks.sim import add_config_arguments

    p = argparse.ArgumentParser()
    add_config_arguments(p)
    with pytest.raises(StepError, match="cluster size"):
        config_from_args(p.parse_args([]))
    cfg = config_from_args(p.parse_args(["--cluster-config", "ls6", "--nodes", "70", "--backfill", "easy"]))
    assert cfg.nodes == 70 and cfg.backfill == "easy" and cfg.max_jobs_per_user == 8
    assert config_from_args(p.parse_args([]), machine_nodes=100).nodes == 100


# ---------------------------------------------------------------- warm start


def _warm_rows():
    return [
        # running at T0 (started an hour before), ends at T0 + 1000
        {"submit": T0 - 7200, "start": T0 - 3600, "end": T0 + 1000, "limit": 20000, "nodes": 3},
        # pending at T0 (really started at T0 + 5000)
        {"submit": T0 - 600, "start": T0 + 5000, "end": T0 + 6000, "limit": 2000, "nodes": 2},
        # finished before T0: ignored
        {"submit": T0 - 9000, "start": T0 - 9000, "end": T0 - 100, "limit": 9000, "nodes": 4},
        # submitted at T0 + 10
        {"submit": T0 + 10, "start": T0 + 10, "end": T0 + 110, "limit": 200, "nodes": 1},
    ]


def test_warm_start_reconstructs_running_and_pending_jobs():
    wl = Workload.from_frame(frame(_warm_rows()))
    sim = Simulator.from_workload(wl, tiny_cfg(warm_start=True), T0, T0 + 86400)
    assert sim.free == 1 and len(sim.running) == 1 and len(sim.pending) == 1
    sim.drain()
    by_tag = {sim.j_tag[j]: sim.j_start[j] - T0 for j in range(len(sim.j_tag))}
    # the pending 2-node job needs the running job's nodes (free at T0 + 1000); the
    # 1-node job at T0 + 10 fits in the one free node
    assert by_tag == {1: -3600, 2: 1000, 3: 10}  # workload index = submit order
    cold = Simulator.from_workload(wl, tiny_cfg(warm_start=False), T0, T0 + 86400)
    assert cold.free == 4 and not cold.pending and not cold.running
    cold.drain()
    assert [cold.j_start[j] - T0 for j in range(len(cold.j_tag))] == [10]


def test_warm_start_recent_waits_and_trace_priority():
    rows = [
        {"submit": T0 + 1, "start": T0 + 1, "end": T0 + 100, "limit": 100, "nodes": 4, "priority": 100},
        {"submit": T0 + 2, "start": T0 + 400, "end": T0 + 500, "limit": 100, "nodes": 4, "priority": 1000},
        {"submit": T0 + 3, "start": T0 + 100, "end": T0 + 200, "limit": 100, "nodes": 4, "priority": 5000},
    ]
    wl = Workload.from_frame(frame(rows))
    cfg = tiny_cfg(priority="trace", weight_age=0.0, backfill="none")
    sim = Simulator.from_workload(wl, cfg, T0, T0 + 1000)
    sim.drain()
    # the job submitted last has the highest recorded priority and overtakes the second
    assert [sim.j_start[j] - T0 for j in range(3)] == [1, 200, 100]
    assert sim.avg_wait_s() == pytest.approx((0 + 198 + 97) / 3)


def test_workload_drops_jobs_larger_than_the_cluster():
    rows = [
        {"submit": T0, "start": T0, "end": T0 + 10, "limit": 100, "nodes": 8},
        {"submit": T0, "start": T0, "end": T0 + 10, "limit": 100, "nodes": 1},
    ]
    sim = Simulator.from_workload(Workload.from_frame(frame(rows)), tiny_cfg(), T0, T0 + 100)
    assert sim.dropped_too_big == 1
    sim.drain()


# ---------------------------------------------------------------- properties


def _check_schedule(sim: Simulator, nodes: int) -> None:
    st_ = np.asarray(sim.j_start)
    assert (st_ >= 0).all(), "every job starts"
    assert (st_ >= np.asarray(sim.j_submit)).all(), "no job starts before its submission"
    ends = st_ + np.asarray(sim.j_dur)
    ev = sorted([(t, -n) for t, n in zip(ends, sim.j_nodes)] + [(t, n) for t, n in zip(st_, sim.j_nodes)])
    used = 0
    for _, dn in ev:  # ends sort before starts at the same instant (negative first)
        used += dn
        assert used <= nodes, "nodes over-subscribed"
    assert not sim.running or max(sim.running.values()) == ends.max()


job_st = st.tuples(
    st.integers(0, 2000), st.integers(1, 4), st.integers(1, 500), st.integers(0, 500), st.integers(-1, 2)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    jobs=st.lists(job_st, min_size=1, max_size=25),
    mode=st.sampled_from(["easy", "conservative", "none"]),
    interval=st.sampled_from([1, 7, 60]),
    res=st.sampled_from([1, 60]),
    ulim=st.sampled_from([0, 1, 2]),
    tick=st.sampled_from([0, 0, 60]),
)
def test_random_traces_are_valid_and_deterministic(jobs, mode, interval, res, ulim, tick):
    cfg = tiny_cfg(
        backfill=mode,
        bf_interval_s=interval,
        bf_resolution_s=res,
        max_jobs_per_user=ulim,
        tick_s=tick,
        weight_size=50.0,
    )
    spec = [(s, n, d, d + extra, u) for s, n, d, extra, u in jobs]
    a, ids = run_jobs(cfg, spec, t0=T0)
    _check_schedule(a, cfg.nodes)
    b, _ = run_jobs(cfg, spec, t0=T0)
    assert a.j_start == b.j_start and a.j_bf == b.j_bf


@settings(max_examples=40, deadline=None)
@given(
    jobs=st.lists(job_st, min_size=1, max_size=25),
    cut=st.integers(0, 2500),
    mode=st.sampled_from(["easy", "conservative"]),
)
def test_fork_continues_exactly_like_the_original(jobs, cut, mode):
    cfg = tiny_cfg(backfill=mode, bf_interval_s=7, max_jobs_per_user=2)
    spec = [(s, n, d, d + extra, u) for s, n, d, extra, u in jobs]
    full, _ = run_jobs(cfg, spec, t0=T0)
    sim = Simulator(cfg, T0)
    for s, n, d, lim, u in spec:
        sim.schedule_submit(sim.add_job(T0 + s, d, lim, n, user=u))
    sim.run_until(T0 + cut)
    child = sim.fork()
    child.drain()
    assert child.j_start == full.j_start
    sim.drain()  # the parent is unaffected by its child
    assert sim.j_start == full.j_start


def test_random_trace_replay_with_warm_start_is_valid():
    wl = Workload.from_frame(random_trace(3, days=6, nodes=16))
    cfg = PRESETS["ls6"].replace(nodes=16)
    t0 = T0 + 2 * 86400
    sim = Simulator.from_workload(wl, cfg, t0, t0 + 3 * 86400)
    assert sim.running or sim.pending
    sim.drain()
    _check_schedule(sim, 16)


def test_ten_day_random_trace_replays_completely():
    """A 10-day, 16-node random trace (720 jobs, ~80% load) replays to the end with every job
    started (its speed is measured by bench/simulator.py, not asserted here)."""
    wl = Workload.from_frame(random_trace(5, days=10, nodes=16))
    sim = Simulator.from_workload(wl, PRESETS["ls6"].replace(nodes=16, max_jobs_per_user=0), T0, T0 + 10 * 86400)
    sim.drain()
    assert pd.Series(sim.j_start).ge(0).all()
    _check_schedule(sim, 16)


def test_processor_only_traces_need_procs_per_node():
    df = frame([{"submit": T0, "start": T0, "end": T0 + 10, "limit": 100, "nodes": 1}] * 2)
    df["procs"] = pd.array([48, 100], dtype="Int32")
    df["nodes"] = pd.array([None, None], dtype="Int32")
    with pytest.raises(StepError, match="--procs-per-node"):
        Workload.from_frame(df)
    wl = Workload.from_frame(df, procs_per_node=48)
    assert list(wl.nodes) == [1, 3]
