"""Inferred job holds (``holds="inferred"``): the pairing rule read from a trace, and the
engine holding a dependent job until its predecessor has ended in the simulation."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest
from test_sim_support import T0, frame, tiny_cfg

from mirage_tasks.calibration.fidelity import replay
from mirage_tasks.data.schema import read_trace
from mirage_tasks.sim import PRESETS, SimConfig, Simulator, Workload
from mirage_tasks.sim.config import add_config_arguments, config_from_args
from mirage_tasks.sim.workload import infer_holds, infer_holds_frame, workload_holds
from stepkit import StepError

H = 3600


def test_infer_holds_pairs_a_users_job_that_started_as_the_previous_ended():
    #            submit  start  end   user
    jobs = [
        (0, 0, 100, 0),  # 0: P
        (10, 130, 200, 0),  # 1: submitted while 0 ran, started 30 s after it ended -> 0
        (20, 100, 300, 1),  # 2: another user's job starting as 0 ended: never paired with 0
        (20, 50, 400, 0),  # 3: started while 0 ran -> none
        (30, 200, 250, 0),  # 4: started as 1 ended (and 0 ended before) -> the latest end, 1
        (150, 250, 260, 0),  # 5: submitted after 1 ended; 4 ended at 250 -> 4
        (40, 500, 600, 0),
    ]  # 6: nothing ended within 60 s before 500 -> none
    s, st, e, u = (np.array(c) for c in zip(*jobs))
    assert infer_holds(s, st, e, u, 60).tolist() == [-1, 0, -1, -1, 1, 4, -1]
    # a tighter tolerance drops the 30 s pair only
    assert infer_holds(s, st, e, u, 10).tolist() == [-1, -1, -1, -1, 1, 4, -1]
    # unknown users are never paired
    assert (infer_holds(s, st, e, np.full(7, -1), 60) == -1).all()


def test_jobs_that_ran_for_no_time_at_one_instant_are_not_chained():
    s, st, e, u = np.array([0, 0]), np.array([50, 50]), np.array([50, 50]), np.array([3, 3])
    assert infer_holds(s, st, e, u, 60).tolist() == [-1, -1]


def test_infer_holds_frame_names_the_predecessor_job_ids():
    df = frame(
        [
            {"job_id": "a", "submit": T0, "start": T0, "end": T0 + 100, "limit": H, "nodes": 1},
            {"job_id": "b", "submit": T0 + 5, "start": T0 + 120, "end": T0 + 200, "limit": H, "nodes": 1},
        ]
    )
    out = infer_holds_frame(df)
    assert out.isna().tolist() == [True, False] and out.iloc[1] == "a"


def _chain_trace():
    """P really waited 1000 s (a busy real cluster) and ran 500 s; J was submitted 10 s
    after P and really started 20 s after P's real end. A third user's job is independent."""
    return frame(
        [
            {"job_id": "P", "submit": T0, "start": T0 + 1000, "end": T0 + 1500, "limit": H, "nodes": 1, "user": "u"},
            {
                "job_id": "J",
                "submit": T0 + 10,
                "start": T0 + 1520,
                "end": T0 + 1620,
                "limit": H,
                "nodes": 1,
                "user": "u",
            },
            {
                "job_id": "K",
                "submit": T0 + 10,
                "start": T0 + 1520,
                "end": T0 + 1620,
                "limit": H,
                "nodes": 1,
                "user": "v",
            },
        ]
    )


def test_a_held_job_starts_when_its_predecessor_ends_in_the_simulation():
    wl = Workload.from_frame(_chain_trace())
    assert workload_holds(wl, 60).tolist() == [-1, 0, -1]
    off = Simulator.from_workload(wl, tiny_cfg(), T0, T0 + H)
    off.drain()
    on = Simulator.from_workload(wl, tiny_cfg(holds="inferred"), T0, T0 + H)
    on.drain()
    # off: everything starts at submission on the empty 4-node partition
    assert [s - T0 for s in off.j_start] == [0, 10, 10]
    # on: J waits for P's *simulated* end (0 + 500), not its real start (1520) nor its submit
    assert [s - T0 for s in on.j_start] == [0, 500, 10]
    p, j = 0, 1
    assert on.j_start[j] >= on.j_start[p] + on.j_dur[p]
    assert on.j_elig[j] == T0 + 500 and on.j_submit[j] == T0 + 10  # the wait still counts from submission
    df = replay(wl, tiny_cfg(holds="inferred"), T0, T0 + H)
    assert df.set_index("job_id").loc["J", "sim_wait_s"] == 490


def test_holds_under_random_load_never_start_a_dependent_early():
    from test_sim_support import random_trace

    df = random_trace(3, days=4)
    # a few users, so that the rule finds pairs in the trace's own FCFS starts
    df["user"] = (np.arange(len(df)) % 3).astype(str)
    wl = Workload.from_frame(df)
    pred = workload_holds(wl, 60)
    assert (pred >= 0).sum() > 5
    cfg = tiny_cfg(nodes=16, holds="inferred", warm_start=True)
    sim = Simulator.from_workload(wl, cfg, T0 + 86400, T0 + 3 * 86400)
    sim.drain()
    n = 0
    for j, p in enumerate(sim.j_pred):
        if p >= 0:
            n += 1
            assert sim.j_start[j] >= sim.j_start[p] + sim.j_dur[p]
            assert sim.j_tag[p] == pred[sim.j_tag[j]]
    assert n > 0 and min(sim.j_start) >= 0 and not sim.held


def test_fork_copies_the_held_jobs():
    wl = Workload.from_frame(_chain_trace())
    sim = Simulator.from_workload(wl, tiny_cfg(holds="inferred"), T0, T0 + H)
    sim.run_until(T0 + 100)
    assert sim.held == {0: [1]}
    c = sim.fork()
    c.drain()
    assert sim.held == {0: [1]} and not c.held and c.j_start[1] == T0 + 500
    sim.drain()
    assert sim.j_start == c.j_start


def test_holds_config_field_flag_and_json(tmp_path):
    assert all(PRESETS[n].holds == "none" for n in PRESETS)  # the shipped presets are unchanged
    with pytest.raises(StepError, match="holds must be one of"):
        SimConfig(nodes=4, holds="all")
    with pytest.raises(StepError, match="holds_tolerance_s"):
        SimConfig(nodes=4, holds_tolerance_s=-1)
    p = argparse.ArgumentParser()
    add_config_arguments(p)
    cfg = config_from_args(p.parse_args(["--cluster-config", "ls6", "--holds", "inferred", "--holds-tolerance", "30"]))
    assert (cfg.holds, cfg.holds_tolerance_s) == ("inferred", 30)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(PRESETS["ls6"].replace(holds="inferred").to_dict()))
    assert config_from_args(p.parse_args(["--cluster-config", str(path)])).holds == "inferred"


def test_holds_on_ls6_start_dependents_after_their_predecessors(ls6_parquet):
    df, _ = read_trace(str(ls6_parquet))
    wl = Workload.from_frame(df)
    t0 = int(pd.Timestamp("2023-02-06", tz="UTC").timestamp())
    cfg = PRESETS["ls6"].replace(holds="inferred")
    sim = Simulator.from_workload(wl, cfg, t0, t0 + 4 * 86400)
    sim.drain()
    dep = [j for j, p in enumerate(sim.j_pred) if p >= 0]
    assert len(dep) > 20 and not sim.held and min(sim.j_start) >= 0
    for j in dep:
        p = sim.j_pred[j]
        assert sim.j_start[j] >= sim.j_start[p] + sim.j_dur[p]
    # "none" (the default) gives the preset's schedule
    a = Simulator.from_workload(wl, PRESETS["ls6"].replace(holds="none"), t0, t0 + 4 * 86400)
    b = Simulator.from_workload(wl, PRESETS["ls6"], t0, t0 + 4 * 86400)
    a.drain()
    b.drain()
    assert a.j_start == b.j_start and sim.j_start != b.j_start
