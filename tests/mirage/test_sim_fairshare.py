"""Slurm's multifactor priority with the classic fair share (mirage_tasks/sim/fairshare.py):
factors and decayed usage against values computed by hand from Slurm's formulas, and the
engine's queue order following them; the partition QOS's group limits (GrpJobs, GrpTRES=node)."""

from __future__ import annotations

import math

import pytest
from test_sim_support import T0, frame, random_trace, run_jobs, starts, tiny_cfg

from lab.slurm import slurmconf as conf
from mirage_tasks.sim import SimConfig, Simulator, Workload
from mirage_tasks.sim.fairshare import FairShare, past_usage
from stepkit import StepError

LN2 = math.log(2.0)


def decayed(nodes, a, b, t, hl):
    """By hand: the integral over [a, b] of nodes * 2^(-(t - s) / hl) ds."""
    return nodes * hl / LN2 * (2.0 ** (-(t - b) / hl) - 2.0 ** (-(t - a) / hl))


def test_one_user_with_all_the_usage_gets_two_to_the_minus_users_plus_one():
    fs = FairShare(users=2, halflife_s=100, period_s=10, weight=1.0, t0=0)
    assert fs.next == 10 and fs.term(0) == 1.0 and fs.term(-1) == 1.0  # no usage anywhere: every factor is 1
    fs.start(0, user=0, nodes=2, t=0)
    fs.recalc(10)
    assert fs.usage[0] == pytest.approx(decayed(2, 0, 10, 10, 100), rel=1e-12)
    # S = 1/3 (two users and the service); UN_0 = 1, so UE_0 = 1 and F_0 = 2^-(1 / (1/3)) = 1/8
    assert fs.factor[0] == pytest.approx(0.125)
    assert fs.term(1) == 0.5 and fs.term(-1) == 0.5  # no usage of their own: UE = S, F = 1/2
    assert fs.next == 20


def test_two_users_classic_effective_usage():
    fs = FairShare(users=2, halflife_s=1e12, period_s=10, weight=1000.0, t0=0)
    fs.usage = {0: 3.0, 1: 1.0}
    fs.refresh()
    # S = 1/3; UN = 0.75, 0.25; UE = UN + (1 - UN) * S = 0.8333, 0.5; F = 2^(-UE / S)
    assert fs.factor[0] == pytest.approx(2**-2.5)
    assert fs.factor[1] == pytest.approx(2**-1.5)
    assert fs.term(1) == pytest.approx(1000 * 2**-1.5)


def test_usage_halves_in_one_half_life_and_a_job_ending_mid_period_counts_to_its_end():
    fs = FairShare(users=1, halflife_s=100, period_s=10, weight=1.0, t0=0)
    fs.start(0, user=0, nodes=2, t=0)
    fs.finish(0, t=5)  # ends between two re-reads
    fs.recalc(10)
    assert fs.usage[0] == pytest.approx(decayed(2, 0, 5, 10, 100), rel=1e-12)
    at10 = fs.usage[0]
    fs.recalc(110)
    assert fs.usage[0] == pytest.approx(at10 / 2, rel=1e-12)
    # a job running across re-reads adds up exactly as one integral
    fs2 = FairShare(users=1, halflife_s=100, period_s=10, weight=1.0, t0=0)
    fs2.start(7, user=0, nodes=3, t=4)
    for t in (10, 20, 30):
        fs2.recalc(t)
    fs2.finish(7, t=33)
    fs2.recalc(40)
    assert fs2.usage[0] == pytest.approx(decayed(3, 4, 33, 40, 100), rel=1e-12)


def test_running_lag_counts_running_jobs_through_the_reread_before():
    """Slurm's timing (running_lag): a re-read's factors hold each ended job's use through its end
    and a running job's through the previous re-read; the ledger itself is the same."""

    def classic(use: dict, users=2):
        total, s = sum(use.values()), 1.0 / (users + 1)
        return {u: 2.0 ** (-((v / total) + (1 - v / total) * s) / s) for u, v in use.items()}

    fs = FairShare(users=2, halflife_s=100, period_s=10, weight=1.0, t0=0)
    fs.running_lag = True
    fs.start(0, user=0, nodes=2, t=0)  # runs across the re-reads
    fs.start(1, user=1, nodes=1, t=2)
    fs.finish(1, t=8)  # ends before the first re-read: counted at it
    fs.recalc(10)
    assert fs.term(1) == pytest.approx(2.0**-3) and fs.term(0) == 0.5  # u0's running job not yet
    assert fs.usage[0] == pytest.approx(decayed(2, 0, 10, 10, 100), rel=1e-12)  # but charged
    fs.recalc(20)
    want = classic({0: decayed(2, 0, 10, 20, 100), 1: decayed(1, 2, 8, 20, 100)})  # u0 through 10 only
    assert fs.term(0) == pytest.approx(want[0], rel=1e-9) and fs.term(1) == pytest.approx(want[1], rel=1e-9)
    plain = FairShare(users=2, halflife_s=100, period_s=10, weight=1.0, t0=0)
    plain.start(0, user=0, nodes=2, t=0)
    plain.start(1, user=1, nodes=1, t=2)
    plain.finish(1, t=8)
    plain.recalc(10)
    plain.recalc(20)
    assert plain.usage == pytest.approx(fs.usage, rel=1e-12)  # the same ledger
    now = classic({0: decayed(2, 0, 20, 20, 100), 1: decayed(1, 2, 8, 20, 100)})
    assert plain.term(0) == pytest.approx(now[0], rel=1e-9)  # the default: through this re-read
    assert abs(now[0] - want[0]) > 0.01 * want[0]


def test_past_usage_reads_only_runs_before_the_first_instant():
    t0 = T0 + 20_000
    df = frame(
        [
            dict(submit=T0, start=T0, end=T0 + 10_000, limit=20_000, nodes=2, user="a"),  # ended before t0
            dict(submit=T0, start=T0 + 15_000, end=t0 + 50_000, limit=90_000, nodes=1, user="b"),  # running at t0
            dict(submit=t0 + 10, start=t0 + 10, end=t0 + 100, limit=100, nodes=4, user="a"),  # after t0
        ]
    )
    wl = Workload.from_frame(df)
    hl = 7 * 86400
    got = past_usage(wl, t0, hl)
    a, b = (int(wl.user[0]), int(wl.user[1]))
    assert got[a] == pytest.approx(decayed(2, T0, T0 + 10_000, t0, hl), rel=1e-12)
    assert got[b] == pytest.approx(decayed(1, T0 + 15_000, t0, t0, hl), rel=1e-12)  # only up to t0


def test_the_heavy_user_waits_behind_the_light_one():
    """One node. User 0 runs 0-1000; at 500 user 0 and at 501 user 1 submit a job each.
    First come first served starts user 0's job first; with fair share user 1's (F 1/2
    against 1/8) goes first, then user 0's."""
    jobs = [(0, 1, 1000, 1000, 0), (500, 1, 100, 100, 0), (501, 1, 100, 100, 1)]
    fifo, ids = run_jobs(tiny_cfg(nodes=1), jobs)
    assert starts(fifo, ids) == [0, 1000, 1100]
    cfg = tiny_cfg(nodes=1, priority="multifactor", weight_fairshare=10_000.0, fs_calc_period_s=100)
    fair, ids = run_jobs(cfg, jobs)
    assert starts(fair, ids) == [0, 1100, 1000]
    assert fair.fs.factor[0] < fair.fs.factor[1]
    # priorities only change at a re-read: a job submitted between two gets the last one's factors
    assert fair.fs.t % 100 == 0


def test_multifactor_without_fair_share_schedules_as_age_size_and_keeps_the_old_keys():
    wl = Workload.from_frame(random_trace(3, days=6, nodes=16))
    base = SimConfig(nodes=16, priority="age_size", weight_age=1000.0, weight_size=50.0, bf_interval_s=60)
    mf = base.replace(priority="multifactor")
    a = Simulator.from_workload(wl, base, int(wl.submit[0]), int(wl.submit[-1]))
    b = Simulator.from_workload(wl, mf, int(wl.submit[0]), int(wl.submit[-1]))
    a.drain()
    b.drain()
    assert a.j_start == b.j_start and b.fs is None
    assert set(mf.to_dict()) == set(base.to_dict())  # the new fields at their defaults are left out
    on = mf.replace(weight_fairshare=5000.0)
    assert on.to_dict()["weight_fairshare"] == 5000.0 and SimConfig.from_dict(on.to_dict()) == on


def test_fair_share_changes_a_busy_replay_and_forks_stay_exact():
    wl = Workload.from_frame(random_trace(5, days=8, nodes=16, rate_per_h=4.0))
    t0, t1 = int(wl.submit[0]) + 86400, int(wl.submit[-1])
    plain = SimConfig(nodes=16, priority="multifactor", weight_age=1000.0, weight_size=0.0, bf_interval_s=60)
    fair = plain.replace(weight_fairshare=100_000.0, fs_halflife_s=86400)
    a = Simulator.from_workload(wl, plain, t0, t1)
    b = Simulator.from_workload(wl, fair, t0, t1)
    # a warm start reads the trace's past usage: the factors differ from the start
    assert b.fs.usage and len(set(b.fs.factor.values())) > 1
    c = b.fork()
    a.drain()
    b.drain()
    c.drain()
    assert a.j_start != b.j_start  # fair share reorders the queue on a loaded cluster
    assert b.j_start == c.j_start  # a fork carries the ledger and continues exactly
    assert all(s >= 0 for s in b.j_start)


def test_bad_fair_share_settings_are_refused_by_name():
    with pytest.raises(StepError, match="weight_fairshare"):
        SimConfig(nodes=4, weight_fairshare=-1.0)
    with pytest.raises(StepError, match="fs_halflife_s"):
        SimConfig(nodes=4, fs_halflife_s=0)
    with pytest.raises(StepError, match="short_partition_factor"):
        SimConfig(nodes=4, short_partition_factor=2.0)


def test_partition_factor_ranks_the_main_partition_above_the_short_one():
    """Two jobs queued behind a running one; the short-partition job is older but its
    partition's job factor is 0 against the main partition's 1."""
    cfg = tiny_cfg(
        nodes=1,
        priority="multifactor",
        weight_partition=10_000.0,
        short_partition_factor=0.0,
        short_partition_limit_s=200,
    )
    df = frame(
        [
            dict(submit=T0, start=T0, end=T0 + 1000, limit=1000, nodes=1, user="a"),
            dict(submit=T0 + 10, start=T0 + 1000, end=T0 + 1100, limit=100, nodes=1, user="b"),  # short
            dict(submit=T0 + 20, start=T0 + 1100, end=T0 + 1200, limit=1000, nodes=1, user="c"),  # main
        ]
    )
    wl = Workload.from_frame(df)
    sim = Simulator.from_workload(wl, cfg, T0, T0 + 100)
    sim.drain()
    by_tag = {t: sim.j_start[j] - T0 for j, t in enumerate(sim.j_tag)}
    assert by_tag == {0: 0, 2: 1000, 1: 1100}


def test_slurm_conf_renders_the_fair_share_settings():
    cfg = SimConfig(
        nodes=4,
        priority="multifactor",
        weight_fairshare=5000.0,
        fs_halflife_s=86400,
        fs_calc_period_s=300,
        weight_partition=10.0,
    )
    s = conf.scaled(cfg, 60.0)
    assert (s["weight_fairshare"], s["fs_halflife_min"], s["fs_calc_period_min"], s["weight_partition"]) == (
        5000,
        24,
        1,
        10,
    )
    text = conf.render(cfg, 60.0, conf.Paths("/tmp/x"), 6817, (6818, 6821))
    for line in (
        "PriorityWeightFairshare=5000",
        "PriorityDecayHalfLife=0-00:24",
        "PriorityFlags=NO_FAIR_TREE",
        "PriorityCalcPeriod=1",
        "PriorityWeightPartition=10",
        "PriorityType=priority/multifactor",
    ):
        assert line in text.splitlines()
    assert any(n.startswith("fair share") for n in conf.unsupported(cfg))
    assert conf.back_to_sim(cfg, 60.0).weight_fairshare == 0.0
    # without fair share the text and the scaled settings are as before
    plain = cfg.replace(weight_fairshare=0.0)
    assert "weight_fairshare" not in conf.scaled(plain, 60.0)
    assert "PriorityWeightFairshare=0" in conf.render(plain, 60.0, conf.Paths("/tmp/x"), 6817, (6818, 6821))


def test_calibrate_with_search_fairshare_recovers_a_fair_share_trace(tmp_path):
    """A trace whose real starts are a fair-share configuration's own schedule: calibrate
    --search-fairshare, started from that configuration, keeps it (its replay is exact) and
    its report names the fair-share weight and half-life it chose."""
    import json

    import pandas as pd

    from mirage_tasks.data.schema import TraceMeta, write_trace
    from mirage_tasks.sim.config import load_config
    from stepkit.cli import main

    made = SimConfig(
        nodes=16,
        backfill="conservative",
        bf_interval_s=60,
        priority="multifactor",
        weight_size=0.0,
        weight_age=1000.0,
        weight_fairshare=20_000.0,
        fs_halflife_s=86400,
        warm_start=True,
    )
    from test_fidelity import _self_made_trace

    df = _self_made_trace(made, days=45)
    wl = Workload.from_frame(df)
    uri = str(tmp_path / "trace")
    write_trace(uri + "/trace.parquet", df, TraceMeta(source="self", format="test", timezone="UTC"))
    (tmp_path / "cfg.json").write_text(json.dumps(made.to_dict()))

    def day(k):
        return pd.Timestamp(T0 + k * 86400, unit="s", tz="UTC").isoformat()

    out = tmp_path / "cal"
    rc = main(
        "mirage_tasks",
        {"calibrate": ("mirage_tasks.steps.calibrate", "")},
        [
            "calibrate",
            "--trace",
            uri,
            "--calibrate-from",
            day(20),
            "--calibrate-to",
            day(30),
            "--score-from",
            day(30),
            "--score-to",
            day(40),
            "--out",
            str(out),
            "--trials",
            "3",
            "--start-config",
            str(tmp_path / "cfg.json"),
            "--lead-in-days",
            "3",
            "--search-fairshare",
        ],
    )
    assert rc == 0
    doc = json.loads((out / "calibration.json").read_text())
    chosen = SimConfig.from_dict(load_config(str(out / "config.json")))
    assert chosen.priority == "multifactor" and chosen.weight_fairshare == pytest.approx(20_000.0)
    # not exact as with age and size alone: the replay of a month stops submitting at its end, and
    # with fair share a later job of a light user may overtake a job still queued then
    assert chosen.fs_halflife_s == 86400 and doc["in_sample"]["within_1h"] > 0.95
    trials = pd.read_parquet(out / "trials.parquet")
    best = trials.loc[trials.objective.idxmin()]
    assert best.priority == "multifactor" and best.objective < 0.5 * trials.objective.max()
    assert "fair-share weight 20000 with a 1 d usage half-life" in (out / "calibration.md").read_text()
    # the same trace replayed without fair share fits worse: the factor is what made the schedule
    fifo = made.replace(priority="age_size")
    a = Simulator.from_workload(wl, fifo, int(wl.submit[0]), int(wl.submit[-1]))
    a.drain()
    assert any(a.j_start[j] != wl.real_start[t] for j, t in enumerate(a.j_tag))


def test_group_limits_hold_the_trace_jobs_together_but_not_the_service():
    """Four nodes, three one-node jobs of three users at 0 (100 s each): GrpJobs=2 holds the
    third until one ends; GrpTRES=node=3 holds a 2-node job while 2 nodes are in use; a probe
    (the service) is not held."""
    jobs = [(0, 1, 100, 100, 0), (0, 1, 100, 100, 1), (0, 1, 100, 100, 2)]
    sim, ids = run_jobs(tiny_cfg(grp_jobs=2), jobs)
    assert starts(sim, ids) == [0, 0, 100]
    sim, ids = run_jobs(tiny_cfg(), jobs)
    assert starts(sim, ids) == [0, 0, 0]
    sim, ids = run_jobs(tiny_cfg(grp_nodes=3), [(0, 2, 100, 100, 0), (0, 2, 100, 100, 1), (0, 1, 50, 50, 2)])
    assert starts(sim, ids) == [0, 100, 0]  # 2 + 1 nodes fit the limit, 2 + 2 do not
    sim, ids = run_jobs(tiny_cfg(grp_nodes=1), [(0, 3, 100, 100, 0), (0, 1, 10, 10, 1)])
    assert starts(sim, ids) == [0, 100]  # a job larger than the limit runs alone
    s = Simulator(tiny_cfg(grp_jobs=1), 0)
    a = s.add_job(0, 100, 100, 1, user=0)
    s.schedule_submit(a)
    p = s.add_probe_job(0, 100, 1, tag=-1)
    s.schedule_submit(p)
    s.drain()
    assert s.j_start[a] == 0 and s.j_start[p] == 0
    assert any("QOS group limits" in n for n in conf.unsupported(tiny_cfg(grp_jobs=2)))
    assert conf.back_to_sim(tiny_cfg(grp_nodes=3), 1.0).grp_nodes == 0
    assert "grp_jobs" not in tiny_cfg().to_dict() and tiny_cfg(grp_jobs=2).to_dict()["grp_jobs"] == 2


def test_group_node_limit_gives_the_same_schedule_on_the_plain_path():
    """GrpTRES=node binding on a loaded random trace: the engine's shortcuts (Simulator.fast)
    and the plain algorithm agree start for start (ls6 windows: tests/mirage/test_sim_fastpath.py)."""
    wl = Workload.from_frame(random_trace(9, days=8, nodes=16, rate_per_h=4.0))
    cfg = SimConfig(
        nodes=16,
        priority="multifactor",
        weight_fairshare=1000.0,
        grp_nodes=12,
        grp_jobs=9,
        max_jobs_per_user=5,
        bf_interval_s=60,
    )
    t0, t1 = int(wl.submit[0]) + 86400, int(wl.submit[-1])

    def replay():
        s = Simulator.from_workload(wl, cfg, t0, t1)
        s.drain()
        return s.j_start

    try:
        Simulator.fast = False
        slow = replay()
    finally:
        Simulator.fast = True
    fast = replay()
    assert slow == fast
    unlimited = Simulator.from_workload(wl, cfg.replace(grp_nodes=0, grp_jobs=0), t0, t1)
    unlimited.drain()
    assert unlimited.j_start != fast  # the limits bind


def test_the_planners_running_ledger_equals_the_closed_form_at_every_instant():
    """RunningUsage (the at-submission planner's ledger) fed the log's starts and ends in time
    order gives the usage past_usage computes from scratch, also across a re-base."""
    from mirage_tasks.sim.fairshare import RunningUsage

    wl = Workload.from_frame(random_trace(4, days=6, nodes=16))
    hl = 3600.0  # short: x grows past 2^64 within the log, so the ledger re-bases
    led = RunningUsage(int(wl.user.max()) + 1, hl, 1.0, int(wl.submit[0]))
    events = sorted(
        [(int(wl.real_start[k]), 1, k) for k in range(len(wl))] + [(int(wl.real_end[k]), 0, k) for k in range(len(wl))]
    )
    checks = 0
    for n, (t, kind, k) in enumerate(events):
        if kind == 1:
            led.start(int(wl.user[k]), float(wl.nodes[k]), t)
        else:
            led.end(int(wl.user[k]), float(wl.nodes[k]), int(wl.real_start[k]), t)
        if n % 31 == 0 and n + 1 < len(events) and events[n + 1][0] > t:  # every event at t fed
            want = past_usage(wl, t + 1, hl)
            got = led.usage(t + 1)
            for u, v in want.items():
                assert got[u] == pytest.approx(v, rel=1e-6, abs=1e-6)
            checks += 1
    assert checks > 5 and led.t0 > int(wl.submit[0])  # it re-based


def test_the_plan_at_submission_puts_the_light_users_job_first():
    """One node busy until 1000 (user 0, heavy), then user 0 and user 1 each queue a job: with fair
    share in the configuration the plan starts user 1's job first, as the simulator does."""
    from mirage_tasks.calibration import atsubmit

    df = frame(
        [
            dict(submit=T0, start=T0, end=T0 + 1000, limit=1000, nodes=1, user="a"),
            dict(submit=T0 + 500, start=T0 + 1100, end=T0 + 1200, limit=100, nodes=1, user="a"),
            dict(submit=T0 + 501, start=T0 + 1000, end=T0 + 1100, limit=100, nodes=1, user="b"),
            dict(submit=T0 + 502, start=T0 + 1200, end=T0 + 1300, limit=100, nodes=1, user="c"),
        ]
    )
    wl = Workload.from_frame(df)
    plain = tiny_cfg(nodes=1)
    fair = tiny_cfg(nodes=1, priority="multifactor", weight_fairshare=10_000.0)
    a = atsubmit.sweep(wl, plain, T0 + 502, T0 + 503)
    b = atsubmit.sweep(wl, fair, T0 + 502, T0 + 503)
    # user c's job (no usage, F 1/2) behind a's (F 1/8)? no: ahead of it, behind b's (also 1/2, older)
    assert a.ahead_jobs.iloc[0] == 2 and b.ahead_jobs.iloc[0] == 1
    assert b.plan_request_s.iloc[0] < a.plan_request_s.iloc[0]


def test_simulators_copy_and_pickle_as_before():
    """Simulator.__new__ picks the fair-share class from the config; copy and pickle (which call it
    without one) still rebuild either kind, and the copy runs on exactly as the original."""
    import copy
    import pickle

    wl = Workload.from_frame(random_trace(6, days=4, nodes=16, rate_per_h=4.0))
    t0, t1 = int(wl.submit[0]) + 86400, int(wl.submit[-1])
    for cfg in (SimConfig(nodes=16), SimConfig(nodes=16, priority="multifactor", weight_fairshare=5000.0)):
        sim = Simulator.from_workload(wl, cfg, t0, t1)
        sim.run_until(t0 + 3600)
        for other in (pickle.loads(pickle.dumps(sim)), copy.deepcopy(sim)):
            assert type(other) is type(sim)
            other.drain()
        sim.drain()
        assert other.j_start == sim.j_start
