"""Nodes in service over time (``capacity_*``) and the short partition
(``short_partition_limit_s``): hand-made schedules, the trace-read capacity uses only the
past, and configurations that leave both off give the schedules of the engine before them."""

from __future__ import annotations

import argparse
import hashlib

import numpy as np
import pandas as pd
import pytest
from test_sim_support import T0, frame, run_jobs, starts, tiny_cfg

from mirage_tasks.calibration.calibrate import _as_params, _suggest, search_space, trace_facts
from mirage_tasks.data.schema import read_trace
from mirage_tasks.sim import PRESETS, SimConfig, Simulator, Workload
from mirage_tasks.sim.config import add_config_arguments, config_from_args
from mirage_tasks.sim.workload import capacity_schedule
from stepkit import StepError

H = 3600


def _rows():
    return [
        # 2 nodes busy from 10 h before T0 to 2 h after
        {"submit": T0 - 10 * H, "start": T0 - 10 * H, "end": T0 + 2 * H, "limit": 20 * H, "nodes": 2},
        # 1 more node from T0 + 1 h to T0 + 3 h
        {"submit": T0 + H, "start": T0 + H, "end": T0 + 3 * H, "limit": 20 * H, "nodes": 1},
        # the last submission: T0 + 5 h
        {"submit": T0 + 5 * H, "start": T0 + 5 * H, "end": T0 + 6 * H, "limit": 20 * H, "nodes": 1},
    ]


def test_capacity_schedule_is_the_busy_maximum_of_the_past_window():
    wl = Workload.from_frame(frame(_rows()))
    sched = capacity_schedule(wl, nodes=4, window_s=H, quantile=1.0, step_s=H, t0=T0, t_end=T0 + 8 * H)
    assert T0 % H == 1200  # re-read at T0, then at every whole hour: T0 + 40 min, T0 + 100 min, ...
    m = 60
    # T0: 2 busy in the past hour; T0 + 100 min: the 3rd node (busy since T0 + 60 min) is in the
    # window; T0 + 220 min: only the 1-node job was busy in the past hour (the 2-node job ended at
    # T0 + 120 min, out of the window); T0 + 280 min: nothing busy in the past hour, no evidence:
    # the whole partition (and after the last submission at T0 + 300 min, the whole partition)
    assert sched == ((T0, 2), (T0 + 100 * m, 3), (T0 + 220 * m, 1), (T0 + 280 * m, 4))


def test_capacity_schedule_never_reads_the_future():
    base = _rows()
    wl = Workload.from_frame(frame(base))
    later = [dict(r) for r in base]
    later[1]["start"] = later[1]["submit"] + 3 * H  # the same job, started 3 h later
    later[1]["end"] = later[1]["start"] + 2 * H
    wl2 = Workload.from_frame(frame(later))
    kw = dict(nodes=4, window_s=2 * H, quantile=1.0, step_s=600, t0=T0 - 4 * H, t_end=T0 + 8 * H)
    a, b = capacity_schedule(wl, **kw), capacity_schedule(wl2, **kw)
    cut = T0 + H  # the changed job's first start: nothing at or before it may differ
    assert [e for e in a if e[0] <= cut] == [e for e in b if e[0] <= cut]
    assert a != b


def test_capacity_quantile_and_whole_partition_without_history():
    wl = Workload.from_frame(frame(_rows()))
    # before the trace's first job: no busy node seen -> the whole partition
    early = capacity_schedule(wl, nodes=4, window_s=H, quantile=1.0, step_s=H, t0=T0 - 20 * H, t_end=T0 - 15 * H)
    assert early == ((T0 - 20 * H, 4),)
    lo = capacity_schedule(wl, nodes=4, window_s=4 * H, quantile=0.5, step_s=H, t0=T0 + 3 * H, t_end=T0 + 4 * H)
    hi = capacity_schedule(wl, nodes=4, window_s=4 * H, quantile=1.0, step_s=H, t0=T0 + 3 * H, t_end=T0 + 4 * H)
    assert lo[0][1] < hi[0][1] == 3


def test_nodes_out_of_service_drain_and_come_back():
    cfg = tiny_cfg(backfill="none")
    sim = Simulator(cfg, 0)
    sim.cap_sched = ((50, 2), (200, 4))
    ids = []
    for sub, n, d in ((0, 2, 100), (0, 2, 100), (60, 1, 10), (110, 3, 10)):
        j = sim.add_job(sub, d, d, n)
        sim.schedule_submit(j)
        ids.append(j)
    sim.run_until(60)
    assert sim.cap == 2 and sim.free == -2  # two nodes leave service while busy: they drain
    sim.drain()
    # C waits until both 2-node jobs end (100); D (3 nodes) until the nodes return (200)
    assert starts(sim, ids) == [0, 0, 100, 200]
    sim.run_until(1000)
    assert sim.cap == 4 and sim.free == 4 and not sim.running


def test_short_partition_keeps_its_own_priority_order():
    jobs = [(0, 3, 1000, 1000), (1, 4, 50, 500), (2, 1, 10, 60)]
    one, ids = run_jobs(tiny_cfg(backfill="none"), jobs)
    two, ids2 = run_jobs(tiny_cfg(backfill="none", short_partition_limit_s=100), jobs)
    # one partition: the short job waits behind the blocked 4-node head; two: it starts at once
    assert starts(one, ids) == [0, 1000, 1050]
    assert starts(two, ids2) == [0, 1000, 2]
    # and a blocked short job does not hold back a long one that fits
    jobs = [(0, 3, 1000, 1000), (1, 2, 50, 60), (2, 1, 10, 1000)]
    two, ids2 = run_jobs(tiny_cfg(backfill="none", short_partition_limit_s=100), jobs)
    assert starts(two, ids2) == [0, 1000, 2]


def test_capacity_from_a_trace_in_a_replay():
    wl = Workload.from_frame(
        frame(
            _rows()
            + [
                {"submit": T0 + 30, "start": T0 + 30, "end": T0 + 90, "limit": 100, "nodes": 2},
            ]
        )
    )
    off = Simulator.from_workload(wl, tiny_cfg(warm_start=True), T0, T0 + 6 * H)
    on = Simulator.from_workload(wl, tiny_cfg(warm_start=True, capacity_window_s=H), T0, T0 + 6 * H)
    assert off.cap == 4 and off.free == 2
    assert on.cap == 2 and on.free == 0  # the past hour showed 2 busy nodes: 2 in service
    off.drain()
    on.drain()
    k = int(np.flatnonzero(wl.submit == T0 + 30)[0])  # the 2-node job submitted at T0 + 30

    def start_of(sim):
        return sim.j_start[sim.j_tag.index(k)]

    assert start_of(off) == T0 + 30
    assert start_of(on) == T0 + 2 * H  # it waits for the running 2-node job's nodes (its end)


def test_config_fields_validate_and_have_flags():
    with pytest.raises(StepError, match="capacity_quantile"):
        SimConfig(nodes=4, capacity_quantile=1.5)
    with pytest.raises(StepError, match="capacity_window_s"):
        SimConfig(nodes=4, capacity_window_s=-1)
    with pytest.raises(StepError, match="short_partition_limit_s"):
        SimConfig(nodes=4, short_partition_limit_s=-5)
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    cfg = config_from_args(
        p.parse_args(
            [
                "--cluster-config",
                "ls6",
                "--capacity-window",
                "86400",
                "--capacity-quantile",
                "0.9",
                "--short-partition-limit",
                "3600",
            ]
        )
    )
    assert (cfg.capacity_window_s, cfg.capacity_quantile, cfg.short_partition_limit_s) == (86400, 0.9, 3600)
    # off by default: the presets are unchanged
    for name in PRESETS:
        c = PRESETS[name]
        assert (c.capacity_window_s, c.short_partition_limit_s) == (0, 0)


def test_calibration_searches_both():
    wl = Workload.from_frame(frame(_rows()))
    space = search_space(trace_facts(wl, T0 - 10 * H, T0 + 6 * H))
    assert 0 in space["capacity_window_s"] and max(space["capacity_window_s"]) > 0
    assert 0 in space["short_partition_limit_s"] and max(space["short_partition_limit_s"]) > 0
    p = _as_params(PRESETS["ls6"].replace(priority="age_size"), space)  # (no recorded priorities here)
    assert p["capacity_window_s"] == 0 and p["short_partition_limit_s"] == 0 and "nodes" in p
    # with the capacity model on, the size is not searched (the top of its range bounds it)
    import optuna

    on = _as_params(PRESETS["ls6"].replace(priority="age_size", capacity_window_s=86400, capacity_quantile=0.9), space)
    assert "nodes" not in on and on["capacity_quantile"] == 0.9
    cfg = _suggest(optuna.trial.FixedTrial(on), space, PRESETS["ls6"])
    assert cfg.nodes == space["nodes"][1] and cfg.capacity_window_s == 86400 and cfg.capacity_quantile == 0.9


# The engine before these fields existed (commit 66cb587) gave these schedules on a busy
# February window: the digests of every start time and backfill flag.
OLD_DIGESTS = {"ls6": "f5f6719c9e1d2ad3", "reference": "3e6ee5426dde51da"}


@pytest.mark.parametrize("name", sorted(OLD_DIGESTS))
def test_configurations_without_the_new_fields_schedule_as_before(ls6_parquet, name):
    df, _ = read_trace(str(ls6_parquet))
    wl = Workload.from_frame(df)
    cfg = PRESETS[name]
    if name == "reference":
        cfg = cfg.replace(warm_start=True)
    t0 = int(pd.Timestamp("2023-02-06", tz="UTC").timestamp())
    sim = Simulator.from_workload(wl, cfg, t0, t0 + 4 * 86400)
    sim.drain()
    digest = hashlib.sha256(
        np.asarray(sim.j_start, dtype=np.int64).tobytes() + np.asarray(sim.j_bf, dtype=np.int8).tobytes()
    ).hexdigest()[:16]
    assert len(sim.j_start) == 758 and digest == OLD_DIGESTS[name]
    assert sim.cap_sched == ()
