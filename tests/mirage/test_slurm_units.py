"""Unit tier for mirage_tasks.slurm: config rendering, queue parsing, live features, replay
planning, the Slurm-vs-simulator comparison and the keeper's decisions on a fake cluster."""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import pytest
from step_cli import refused

from lab.slurm import compare, replay, slurmconf as slurm_conf
from lab.slurm.slurmconf import Paths, back_to_sim, render, scaled, unsupported
from mirage_tasks.sim import features
from mirage_tasks.sim.config import PRESETS, SimConfig
from mirage_tasks.sim.engine import Simulator
from mirage_tasks.sim.workload import Workload
from mirage_tasks.slurm import keeper
from mirage_tasks.slurm.queue import LiveView, QJob, limit_seconds, parse_squeue, read_jobcomp


def test_render_scales_the_simulator_config():
    cfg = PRESETS["ls6"]
    text = render(cfg, 60, Paths("/x"), 6817, (7001, 7078))
    assert "NodeName=n[1-78] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[7001-7078]" in text
    assert "SelectType=select/linear" in text and "SchedulerType=sched/backfill" in text
    assert "JobCompType=jobcomp/filetxt" in text and "JobCompLoc=/x/log/jobcomp.txt" in text
    # 60 s interval / 60 -> 1 s; 48 h window / 60 -> 48 min; 600 s resolution / 60 -> 10 s
    assert "bf_interval=1,bf_window=48,bf_resolution=10,bf_max_job_test=3000" in text
    assert "PriorityMaxAge=0-02:48" in text  # 7 days / 60
    assert scaled(cfg, 120)["bf_resolution_s"] == 5
    assert any("per-user limits" in u for u in unsupported(cfg))
    with pytest.raises(ValueError):
        render(cfg, 60, Paths("/x"), 6817, (7001, 7002))
    assert "SchedulerType=sched/builtin" in render(cfg.replace(backfill="none", nodes=2), 1, Paths("/x"), 1, (2, 3))


def test_back_to_sim_matches_what_slurm_enforces():
    cfg = PRESETS["ls6"].replace(bf_interval_s=90)
    s = back_to_sim(cfg, 60)
    assert s.bf_interval_s == 120  # 90/60 rounds to 2 real s = 120 trace s
    assert s.max_jobs_per_user == 0 and not s.warm_start and s.nodes == 78
    assert slurm_conf.sim_config(cfg, 60).weight_age == 0.0


def test_squeue_and_jobcomp_parsing(tmp_path):
    jobs = parse_squeue(
        "12|RUNNING|2|1:00|2026-01-01T00:00:00|2026-01-01T00:00:05|root|mr\n"
        "13|PENDING|1|2-00:00:00|2026-01-01T00:00:01|N/A|root|mr\n"
    )
    assert [j.state for j in jobs] == ["RUNNING", "PENDING"]
    assert jobs[0].limit_s == 60 and jobs[1].limit_s == 172800 and jobs[1].start is None
    assert jobs[0].start - jobs[0].submit == 5
    assert limit_seconds("UNLIMITED") is None and limit_seconds("01:02:03") == 3723
    f = tmp_path / "jc.txt"
    f.write_text(
        "JobId=7 UserId=root(0) JobState=COMPLETED StartTime=2026-01-01T00:00:01 EndTime=2026-01-01T00:00:09\n"
    )
    assert read_jobcomp(str(f))["7"]["JobState"] == "COMPLETED"
    with pytest.raises(RuntimeError):
        parse_squeue("1|RUNNING|2\n")


def test_live_view_gives_the_simulators_features():
    """A queue reading of the same state yields exactly the snapshot the simulator records."""
    cfg = SimConfig(nodes=4, backfill="none")
    sim = Simulator(cfg, 0)
    spec = [(0, 5000, 7200, 2), (0, 3000, 3600, 2), (100, 4000, 7200, 3), (200, 100, 600, 1)]
    ids = [sim.add_job(s, d, lim, n) for s, d, lim, n in spec]
    for j in ids:
        sim.schedule_submit(j)
    sim.run_until(1000)
    want = features.snapshot(sim)
    q = []
    for j in ids:
        state = "RUNNING" if j in sim.running else ("PENDING" if sim.j_start[j] < 0 else "COMPLETED")
        q.append(
            QJob(
                str(j),
                state,
                sim.j_nodes[j],
                sim.j_limit[j],
                float(sim.j_submit[j]),
                float(sim.j_start[j]) if sim.j_start[j] >= 0 else None,
                "u",
                "x",
            )
        )
    view = LiveView(q, {"total": 4, "idle": sim.free, "down": 0}, now=1000.0)
    got = features.snapshot_direct(view)
    np.testing.assert_allclose(got, want)
    # a compressed cluster: every time multiplied back by the factor
    q2 = [
        QJob(
            x.job_id,
            x.state,
            x.nodes,
            x.limit_s / 60 if x.limit_s else None,
            x.submit / 60,
            x.start / 60 if x.start is not None else None,
            "u",
            "x",
        )
        for x in q
    ]
    got2 = features.snapshot_direct(LiveView(q2, {"total": 4, "idle": sim.free, "down": 0}, now=1000 / 60, scale=60))
    np.testing.assert_allclose(got2, want, rtol=1e-9, atol=1e-6)


def _wl(rows):
    df = pd.DataFrame(rows, columns=["job_id", "submit", "start", "end", "time_limit_s", "nodes", "user", "priority"])
    for c in ("submit", "start", "end"):
        df[c] = pd.to_datetime(df[c], unit="s", utc=True)
    df["procs"] = np.nan
    return Workload.from_frame(df)


def test_replay_plan_scales_and_warm_starts():
    wl = _wl(
        [
            ("a", 0, 0, 7200, 10800, 2, "u1", 100.0),  # running at t0=3600
            ("b", 1000, 9000, 10000, 3600, 1, "u1", 200.0),  # pending at t0
            ("c", 4000, 4000, 5000, 1800, 1, "u2", 300.0),  # window
            ("d", 5000, 5000, 6000, 60, 9, "u2", 300.0),
        ]
    )  # too big for 4 nodes
    cfg = SimConfig(nodes=4, priority="trace")
    p = replay.plan(wl, cfg, 3600, 7200, 60)
    kinds = dict(zip(p["trace_job_id"], p["kind"]))
    assert kinds == {"a": "running_at_start", "b": "pending_at_start", "c": "window", "d": "window"}
    a = p.set_index("trace_job_id").loc["a"]
    assert a["duration_s"] == 3600 and a["sleep_s"] == 60 and a["limit_min"] == 2  # 7200 s left / 60 -> 2 min
    c = p.set_index("trace_job_id").loc["c"]
    assert c["offset_real_s"] == pytest.approx(400 / 60) and c["limit_min"] == 1 and c["nice"] == -300
    assert bool(p.set_index("trace_job_id").loc["d", "too_big"])
    assert p.set_index("trace_job_id").loc["a", "priority"] == replay.RUNNING_BOOST


def test_compare_agrees_with_itself_and_names_rules():
    """A replay table whose 'Slurm' starts are the simulator's own: full agreement; then one
    job moved to start ahead of its queue: the rule is backfill."""
    rows = []
    # 2 nodes: j0 (2 nodes, 1 h) runs; j1 (2 nodes) waits; j2 (1 node, short) backfill candidate
    for k, (sub, dur, lim, n, pr) in enumerate(
        [(0, 3600, 3600, 2, 10.0), (60, 3600, 3600, 2, 10.0), (120, 600, 600, 1, 1.0)]
    ):
        rows.append(
            {
                "trace_job_id": str(k),
                "kind": "window",
                "trace_submit": sub,
                "trace_start": sub,
                "nodes": n,
                "duration_s": dur,
                "limit_s": lim,
                "priority": pr,
                "sleep_s": dur / 60,
                "limit_min": max(1, -(-lim // 3600)),
                "slurm_id": str(k),
                "submit_t": float(sub),
            }
        )
    jobs = pd.DataFrame(rows)
    cfg = SimConfig(nodes=2)
    sim = compare.simulate(jobs, cfg, 60)
    jobs["start_t"] = sim["sim_start_t"]
    doc, frame = compare.compare(jobs, cfg, 60)
    assert doc["compared"] == 3 and doc["sim_vs_slurm"]["within_1h"] == 1.0 and doc["why"] == {}
    assert doc["start_error_h"]["max"] == 0.0
    moved = jobs.copy()
    moved.loc[2, "start_t"] = 7200 + 4 * 3600.0  # Slurm (pretend) started it hours later than the sim
    moved.loc[1, "start_t"] = 3600.0
    _, f2 = compare.compare(moved, cfg, 60)
    assert f2.loc[2, "why"] in ("backfill", "priority order", "timing")
    assert (f2["why"].fillna("") != "").sum() >= 1


class FakeSlurm:
    """A one-partition cluster on a fake clock: jobs start in submit order when nodes are free."""

    def __init__(self, nodes=4, busy_until=0.0):
        self.t = 1000.0
        self.nodes = nodes
        self.jobs = {}
        self.next = 100
        self.cancelled = []
        # a foreign job holding 1 node until busy_until
        self.jobs["1"] = dict(nodes=1, limit=10**6, submit=0.0, start=0.0, end=busy_until, mine=False)

    def clock(self):
        return self.t

    def sleep(self, s):
        self.t += max(s, 0.01)
        self._tick()

    def _tick(self):
        for j in self.jobs.values():
            if j["start"] is not None and j["end"] is not None and j["end"] <= self.t:
                j["done"] = True
        used = sum(j["nodes"] for j in self.jobs.values() if j["start"] is not None and not j.get("done"))
        for jid in sorted((k for k, j in self.jobs.items() if j["start"] is None), key=int):
            j = self.jobs[jid]
            if used + j["nodes"] <= self.nodes:
                j["start"] = float(int(self.t))
                j["end"] = j["start"] + j["limit"]
                used += j["nodes"]

    def run_client(self, args, env=None, timeout=60):
        if args[0] == "sbatch":
            n = int(args[args.index("-N") + 1])
            lim = int([a for a in args if a.startswith("--time=")][0].split("=")[1]) * 60
            jid = str(self.next)
            self.next += 1
            self.jobs[jid] = dict(nodes=n, limit=lim, submit=float(int(self.t)), start=None, end=None)
            self._tick()
            return jid + "\n"
        if args[0] == "scancel":
            self.cancelled += args[1:]
            return ""
        raise AssertionError(args)

    def squeue(self, env=None, partition=None):
        out = []
        for jid, j in self.jobs.items():
            if j.get("done"):
                continue
            st = "RUNNING" if j["start"] is not None else "PENDING"
            out.append(QJob(jid, st, j["nodes"], j["limit"], j["submit"], j["start"], "u", "x"))
        return out

    def sinfo(self, env=None, partition=None):
        used = sum(j["nodes"] for j in self.jobs.values() if j["start"] is not None and not j.get("done"))
        return {"total": self.nodes, "idle": self.nodes - used, "down": 0}


@pytest.fixture
def fake(monkeypatch):
    f = FakeSlurm()
    monkeypatch.setattr(keeper, "run_client", f.run_client)
    monkeypatch.setattr(keeper, "squeue", f.squeue)
    monkeypatch.setattr(keeper, "sinfo_nodes", f.sinfo)
    return f


def _keeper(f, policy, decide=None, log=None):
    return keeper.Keeper(
        env={},
        policy=policy,
        node=1,
        service_s=4 * 3600,
        scale=60,
        step_s=600,
        decide=decide,
        clock=f.clock,
        sleep=f.sleep,
        log_path=log,
    )


def test_keeper_reactive_submits_at_the_end_never_later(fake, tmp_path):
    k = _keeper(fake, "reactive", log=str(tmp_path / "d.jsonl"))
    (r,) = k.run(deadline_s=10_000)
    assert r["forced"] and r["succ_submit"] >= r["pred_end"] - 0.5
    assert r["succ_submit"] - r["pred_end"] < 1.0  # at the end, not a poll later
    assert r["signed_interruption_h"] >= 0 and r["signed_interruption_h"] <= 60 / 3600 * 60
    lines = (tmp_path / "d.jsonl").read_text().splitlines()
    assert any('"decision"' in ln and '"inputs"' in ln for ln in lines)


def test_keeper_model_decides_from_features_and_never_cancels_foreign_jobs(fake):
    seen = []

    def decide(hist):
        seen.append(hist.copy())
        elapsed = hist[-1, features.PRED_COL + 3]
        return bool(elapsed >= 3 * 3600), float(elapsed)

    k = _keeper(fake, "model", decide)
    (r,) = k.run(deadline_s=10_000)
    assert not r["forced"] and r["n_decisions"] >= 2
    lead = r["decision_lead_trace_h"]
    assert 0.5 <= lead <= 1.0 + 1e-6  # submitted once 3 of 4 h had run (decided every 10 trace minutes)
    assert seen[-1].shape == (144, features.N_FEATURES) and seen[-1][-1, features.PRED_COL] == 240  # 4 h limit, min
    assert r["signed_interruption_h"] < 0  # submitted early on a free cluster: overlap
    with pytest.raises(keeper.RefusedError):
        k.cancel("1")
    k.cancel(r["succ"])
    assert fake.cancelled == [r["succ"]]


def test_keeper_asks_the_model_only_within_its_trained_span(fake):
    """An end-spaced model (trained on the last 24 h before the end) is asked only there: with a
    2-trace-hour span on a 4 h job, a model that always says "submit" submits 2 h before the end,
    not at the first reading; without a span, at the first reading."""
    asked = []

    def always(hist):
        asked.append(hist[-1, features.PRED_COL + 3])
        return True, 0.0

    k = keeper.Keeper(
        env={},
        policy="model",
        node=1,
        service_s=4 * 3600,
        scale=60,
        step_s=600,
        decide=always,
        clock=fake.clock,
        sleep=fake.sleep,
        decide_within_s=2 * 3600,
    )
    (r,) = k.run(deadline_s=10_000)
    assert not r["forced"] and r["n_decisions"] == 1
    assert 2.0 - 600 / 3600 <= r["decision_lead_trace_h"] <= 2.0 + 1e-6
    assert asked == [pytest.approx(2 * 3600, abs=600)]  # the first ask: 2 of 4 h run
    asked.clear()
    k = _keeper(fake, "model", always)
    (r,) = k.run(deadline_s=10_000)
    assert r["decision_lead_trace_h"] > 3.5 and asked[0] < 600


def test_keeper_asks_the_model_only_at_its_probe_times(fake):
    """decide_at_s: one ask at the first reading at or past each time before the end (a 4 h job read
    every 10 trace minutes; times 3 h, 1 h and 30 min): three asks, none between them."""
    asked = []

    def never(hist):
        asked.append(hist[-1, features.PRED_COL + 3])
        return False, 0.0

    k = keeper.Keeper(
        env={},
        policy="model",
        node=1,
        service_s=4 * 3600,
        scale=60,
        step_s=600,
        decide=never,
        clock=fake.clock,
        sleep=fake.sleep,
        decide_at_s=(3 * 3600, 3600, 1800),
    )
    (r,) = k.run(deadline_s=10_000)
    assert r["forced"] and r["n_decisions"] == 3
    np.testing.assert_allclose(asked, [3600, 3 * 3600, 3.5 * 3600], atol=600)  # run so far: 1 h, 3 h, 3.5 h


def test_keeper_avg_uses_the_waits_it_saw(fake):
    fake.jobs["2"] = dict(nodes=1, limit=10**6, submit=900.0, start=960.0, end=None, mine=False)  # waited 60 s
    k = _keeper(fake, "avg")
    (r,) = k.run(deadline_s=10_000)
    # jobs seen starting: "2" (waited 60 real s) and the predecessor (0 s): mean 30 s x 60 = 0.5 trace h
    # ("1" ended before the keeper looked); the successor goes in that long before the end
    assert r["decision_lead_trace_h"] == pytest.approx(0.5, abs=2 / 60)
    assert not r["forced"]
    with pytest.raises(ValueError):
        keeper.Keeper(env={}, policy="model", node=1, service_s=3600)


@pytest.mark.parametrize("policy", ["model", "reactive,model"])
def test_keep_service_policy_model_without_model_refuses_before_anything_starts(tmp_path, monkeypatch, policy):
    """mirage_service's form may leave model empty: the step refuses at once (exit 2 naming --model),
    before it reads SLURM_CONF, starts a cluster or writes its output."""
    import argparse

    from mirage_tasks.__main__ import STEPS
    from mirage_tasks.steps import keep_service
    from stepkit import StepError
    from stepkit.cli import main

    monkeypatch.delenv("SLURM_CONF", raising=False)
    p = argparse.ArgumentParser()
    keep_service.add_arguments(p)
    out = tmp_path / "out"
    with pytest.raises(StepError, match="--policy model needs --model"):
        keep_service.run(p.parse_args(["--policy", policy, "--out", str(out)]))
    assert main("mirage_tasks", STEPS, ["keep-service", "--policy", policy, "--out", str(out)]) == 2
    assert not out.exists()


def test_association_tree_matches_the_simulators_siblings():
    cfg = SimConfig(nodes=4, max_jobs_per_user=3, max_nodes_per_user=2, grp_jobs=5, grp_nodes=3)
    cmds = slurm_conf.associations(cfg, 450)
    flat = [" ".join(a) for a in cmds]
    assert "modify qos where name=normal set GrpJobs=5 GrpTRES=node=3" in flat
    accounts = [a for a in cmds if a[:2] == ["add", "account"] and a[3] == f"parent={slurm_conf.TRACE_ACCOUNT}"]
    names = [n for a in accounts for n in a[2].split(",")]
    # one sibling per trace user plus the service: the simulator's S = 1 / (users + 1)
    assert names == [f"u{i}" for i in range(450)] + [slurm_conf.SERVICE_ACCOUNT]
    assert all(len(a[2].split(",")) <= slurm_conf.ACCOUNTS_PER_CALL for a in accounts)
    users = [a for a in cmds if a[:3] == ["add", "user", "root"]]
    assert all("MaxJobs=3" in a and "GrpTRES=node=2" in a for a in users if "service" not in a[3])
    assert not any("MaxJobs" in x for x in users[-1])  # the service: no per-user limit
    assert slurm_conf.UNKNOWN_ACCOUNT in " ".join(slurm_conf.associations(cfg, 2, unknown=True)[-1])
    assert slurm_conf.account_of(7) == "u7" and slurm_conf.account_of(-1) == slurm_conf.UNKNOWN_ACCOUNT
    none = " ".join(" ".join(a) for a in slurm_conf.associations(SimConfig(nodes=4), 1))
    assert "GrpJobs=-1 GrpTRES=node=-1" in none and "MaxJobs" not in none


def test_local_cluster_ports_avoid_the_ephemeral_range(monkeypatch):
    """slurmd ports found free inside the kernel's ephemeral range were taken by slurmctld's
    connection to slurmdbd before slurmd bound them (a 78-node start with accounting failed so):
    the range is chosen below it, or above it where there is no room below."""
    from lab.slurm import cluster

    monkeypatch.setattr(cluster, "ephemeral_ports", lambda: (32768, 60999))
    for _ in range(20):
        p = cluster.free_port_range(81)
        assert 1024 <= p and p + 81 <= 32768
    monkeypatch.setattr(cluster, "ephemeral_ports", lambda: (1100, 60999))
    p = cluster.free_port_range(81)
    assert p > 60999 and p + 81 <= 65535


def test_accounting_renders_slurmdbd_and_keeps_what_it_enforces_in_the_simulator():
    cfg = SimConfig(
        nodes=4,
        priority="multifactor",
        weight_fairshare=3000.0,
        weight_age=1000.0,
        fs_halflife_s=7 * 86400,
        fs_calc_period_s=300,
        max_jobs_per_user=8,
        grp_nodes=3,
    )
    plain = render(cfg, 60, Paths("/x"), 1, (2, 5))
    text = render(cfg, 60, Paths("/x"), 1, (2, 5), dbd_port=9, debug_flags="Backfill")
    assert "AccountingStorageType=accounting_storage/none" in plain and "DebugFlags" not in plain
    for line in (
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStoragePort=9",
        "AccountingStoragePass=/x/munge-run/munge.socket",
        "AccountingStorageEnforce=associations,limits,qos",
        "DebugFlags=Backfill",
        "PriorityFlags=NO_FAIR_TREE",
        "PriorityDecayHalfLife=0-02:48",
    ):
        assert line in text.splitlines(), line
    dbd = slurm_conf.render_dbd(Paths("/x"), 9, 10, "pw")
    assert "DbdPort=9" in dbd and "StoragePort=10" in dbd and "StoragePass=pw" in dbd
    off, on = back_to_sim(cfg, 60), back_to_sim(cfg, 60, accounting=True)
    assert (off.weight_fairshare, off.weight_age, off.max_jobs_per_user, off.grp_nodes) == (0.0, 0.0, 0, 0)
    assert (on.weight_fairshare, on.weight_age, on.max_jobs_per_user, on.grp_nodes) == (3000.0, 1000.0, 8, 3)
    # Slurm's half-life and re-read period in whole real minutes, times the factor; no warm start
    assert on.fs_halflife_s == 168 * 60 * 60 and on.fs_calc_period_s == 3600 and not on.warm_start
    assert not any(
        "fair share (" in n or "per-user" in n or "group limits" in n or "PriorityWeightAge" in n
        for n in unsupported(cfg, accounting=True)
    )
    assert any("larger than max_nodes_per_user or grp_nodes" in n for n in unsupported(cfg, accounting=True))


def _replayed(rows: list[dict], t_from: int, t_to: int, factor: float):
    """(a 2-node config, the replay plan of these trace rows over [t_from, t_to), that plan as a
    replay's job table with every job submitted at its trace instant): the background the
    prediction tests give ``keeper_sim.predict`` and ``Session.links``."""
    from mirage_tasks.sim.workload import Workload

    df = pd.DataFrame([{"user": "u", "priority": 1.0, "procs": 1, **r} for r in rows])
    for col in ("submit", "start", "end"):
        df[col] = pd.to_datetime(df[col], unit="s", utc=True)
    cfg = SimConfig(nodes=2, bf_interval_s=60, bf_resolution_s=60)
    jobs = replay.plan(Workload.from_frame(df), cfg, t_from, t_to, factor)
    return (
        cfg,
        jobs,
        jobs.assign(slurm_id=[str(i + 1) for i in range(len(jobs))], submit_t=jobs["trace_submit"].astype(float)),
    )


def test_session_links_put_the_simulators_prediction_beside_each_chain():
    """The measurement session's links (lab.slurm.keeper_session) map a chain's real submission back to trace time and asks
    the simulator for the same link on the replayed background: a 2-node cluster held by one
    job until t0 + 2 h, a 1-node chain submitted at t0 (reactive: the successor at the
    predecessor's end) is predicted to start at once and run its 1 h limit."""
    from lab.slurm.keeper_session import MeasuredSession as Session

    h, t0, factor = 3600, 1_000 * 3600, 60.0
    cfg, jobs, bg = _replayed(
        [{"job_id": "bg", "submit": t0 + 60, "start": t0 + 60, "end": t0 + 2 * h, "time_limit_s": 2 * h, "nodes": 1}],
        t0,
        t0 + h,
        factor,
    )
    origin = 1.7e9
    s = Session(env={}, jobcomp=None, policies=["reactive"], keeper={}, background=jobs, t0=t0)
    s.results = {"reactive": [{"policy": "reactive", "link": 0, "pred_submit": origin, "signed_interruption_h": 0.0}]}
    s.bg_out, s.bg_facts = bg, {"origin_epoch": origin}
    frame = s.links(cfg, factor, service_s=h, node=1, nice=0, step_s=600)
    r = frame.iloc[0]
    assert r["sim_pred_start"] == t0 and r["sim_pred_end"] == t0 + h  # a node was free at t0
    assert r["sim_succ_submit"] == t0 + h and r["sim_signed_interruption_h"] == 0.0  # and one at its end
    assert list(Session(env={}, jobcomp=None, policies=["avg"], keeper={}).links(cfg, factor, h, 1, 0, 600)) == []


def test_the_prediction_has_the_late_nodes_join_when_they_joined():
    """A session's late nodes (``keeper-slurm --late-nodes``) join at the instant they were
    resumed: a 2-node cluster, one node held by the background from t0 + 1 min to t0 + 2 h, the
    other late until t0 + 1.5 h (real epoch mapped to trace time, x60). A chain submitted at
    t0 + 2 min is predicted to start when the node joins, not at once as on the cluster with
    both nodes."""
    from lab.slurm.keeper_session import MeasuredSession as Session

    h, t0, factor = 3600, 1_000 * 3600, 60.0
    cfg, jobs, bg = _replayed(
        [{"job_id": "bg", "submit": t0 + 60, "start": t0 + 60, "end": t0 + 2 * h, "time_limit_s": 2 * h, "nodes": 1}],
        t0,
        t0 + h,
        factor,
    )
    origin = 1.7e9

    def first(**late):
        s = Session(env={}, jobcomp=None, policies=["reactive"], keeper={}, background=jobs, t0=t0, **late)
        s.results = {
            "reactive": [
                {"policy": "reactive", "link": 0, "pred_submit": origin + 120 / factor, "signed_interruption_h": 0.0}
            ]
        }
        s.bg_out, s.bg_facts = bg, {"origin_epoch": origin}
        return s.links(cfg, factor, service_s=h, node=1, nice=0, step_s=600).iloc[0]

    assert first()["sim_pred_start"] == t0 + 120
    r = first(late_nodes=["n2"], join_epoch=origin + 1.5 * h / factor)
    assert r["sim_pred_start"] == t0 + 1.5 * h and r["sim_pred_end"] == t0 + 2.5 * h
    assert r["sim_succ_start"] == t0 + 2.5 * h  # both nodes in service by then
    # joined before the chain's submission: it starts at once
    assert first(late_nodes=["n2"], join_epoch=origin + 60 / factor)["sim_pred_start"] == t0 + 120


def test_keeper_slurm_late_nodes_need_a_local_cluster_and_an_offset(tmp_path):
    """The keeper never changes a real cluster's nodes, and late nodes join when the first
    chain starts: without --slurm-root or without --offset-hours the lab's keeper-slurm refuses, naming the
    flag, before anything starts."""
    import argparse

    from lab.slurm.keeper_slurm import StepError, add_arguments, run

    for extra in (
        ["--slurm-conf", str(tmp_path / "slurm.conf"), "--offset-hours", "1"],
        ["--slurm-root", str(tmp_path / "s")],
    ):
        p = argparse.ArgumentParser()
        add_arguments(p)
        a = p.parse_args(["--policy", "reactive", "--late-nodes", "2", "--out", str(tmp_path / "o"), *extra])
        with pytest.raises(StepError, match="--late-nodes 2 needs --slurm-root"):
            run(a)
    assert not (tmp_path / "o").exists() and not (tmp_path / "s").exists()


def test_each_chains_prediction_sees_the_other_chains_jobs():
    """Two chains on a 2-node cluster whose background holds one node for 2 h: chain 1's
    predecessor (submitted first, at t0) takes the free node; chain 0's, submitted 30 trace
    minutes later, is predicted to wait for it (1 h), not to start at once as it would alone.
    Submission instants come from slurmctld's log where it has them."""
    from lab.slurm.keeper_session import MeasuredSession as Session
    from mirage_tasks.sim.workload import Workload

    h, t0, factor = 3600, 1_000 * 3600, 60.0
    df = pd.DataFrame(
        [
            {
                "job_id": "bg",
                "submit": t0 - 60,
                "start": t0 - 60,
                "end": t0 + 2 * h,
                "time_limit_s": 2 * h,
                "nodes": 1,
                "user": "u",
                "priority": 1.0,
                "procs": 1,
            }
        ]
    )
    for col in ("submit", "start", "end"):
        df[col] = pd.to_datetime(df[col], unit="s", utc=True)
    cfg = SimConfig(nodes=2, bf_interval_s=60, bf_resolution_s=60)
    jobs = replay.plan(Workload.from_frame(df), cfg, t0, t0 + h, factor)
    origin = 1.7e9
    bg = jobs.assign(slurm_id=["1"], submit_t=float(t0))

    def row(chain, pred, sub, succ, succ_sub):
        return {
            "policy": "reactive",
            "chain": chain,
            "link": 0,
            "pred": pred,
            "pred_submit": sub,
            "succ": succ,
            "succ_submit": succ_sub,
            "signed_interruption_h": 0.0,
        }

    s = Session(env={}, jobcomp=None, policies=["reactive"], keeper={}, background=jobs, t0=t0, chains=2)
    s.results = {
        "reactive": [row(0, "11", origin + 30.4, "13", origin + 90.4), row(1, "10", origin + 0.2, "12", origin + 60.2)]
    }
    s.bg_out, s.bg_facts = bg, {"origin_epoch": origin}
    s.submit_epochs = {"11": origin + 30.0}  # slurmctld's instant for chain 0's predecessor
    f = s.links(cfg, factor, service_s=h, node=1, nice=0, step_s=600).set_index("chain")
    assert f.loc[1, "sim_pred_start"] == t0 + 12  # alone in the free node: at once
    assert f.loc[0, "sim_pred_start"] == t0 + 12 + h  # behind chain 1's predecessor, not at t0 + 30 min
    alone = Session(env={}, jobcomp=None, policies=["reactive"], keeper={}, background=jobs, t0=t0)
    alone.results = {"reactive": [row(0, "11", origin + 30.4, "13", origin + 90.4)]}
    alone.bg_out, alone.bg_facts, alone.submit_epochs = bg, {"origin_epoch": origin}, {"11": origin + 30.0}
    assert alone.links(cfg, factor, h, 1, 0, 600).iloc[0]["sim_pred_start"] == t0 + 30 * 60


def test_the_simulators_fair_share_rereads_follow_slurms_phase(tmp_path):
    """Slurm re-reads usage every PriorityCalcPeriod from slurmctld's start (its decay thread
    writes priority_last_decay_ran each time); the comparison puts the simulator's re-reads at
    the same instants instead of at multiples of the period since the epoch."""
    import os

    from mirage_tasks.sim.engine import Simulator

    cfg = SimConfig(nodes=2, priority="multifactor", weight_fairshare=1000.0, fs_calc_period_s=7200)
    sim = Simulator(cfg, 10_000)
    assert sim.next_calc == 14_400  # the epoch's phase
    compare.align_recalc(sim, 10_000 - 175)  # Slurm re-read 175 s (trace) before the replay's first instant
    assert sim.next_calc == sim.fs.next == 10_000 - 175 + 7200
    compare.align_recalc(sim, 10_000 + 30_000)  # an instant after: the same phase, the first one to come
    assert sim.next_calc == 10_000 + 30_000 - 4 * 7200
    assert sim.fs.running_lag  # and Slurm's timing of usage (test_sim_fairshare, the accounting e2e test)
    assert not Simulator(cfg, 10_000).fs.running_lag  # the simulator's own default is unchanged
    unknown = Simulator(cfg, 10_000)
    compare.align_recalc(unknown, None)  # a cluster whose phase was not recorded: Slurm's timing still
    assert unknown.fs.running_lag and unknown.next_calc == 14_400
    plain = Simulator(cfg.replace(weight_fairshare=0.0), 10_000)
    compare.align_recalc(plain, 5.0)  # no fair share: nothing to align
    assert plain.fs is None and plain.next_calc == float("inf")
    (tmp_path / "priority_last_decay_ran").write_bytes(b"\0" * 16)
    os.utime(tmp_path / "priority_last_decay_ran", (1_700_000_042.5, 1_700_000_042.5))
    assert compare.last_recalc_epoch(str(tmp_path)) == 1_700_000_042.5
    assert compare.last_recalc_epoch(str(tmp_path / "none")) is None


def test_the_simulator_takes_slurms_submissions_in_job_id_order():
    """Jobs Slurm recorded in the same second (one submit_t) and of equal priority run in job id
    order, and so in the simulator: id 99 before id 100 (a string sort had put 100 first)."""
    rows = [
        {
            "trace_job_id": t,
            "kind": "window",
            "trace_submit": 0,
            "trace_start": 0,
            "nodes": 1,
            "duration_s": 600,
            "limit_s": 3600,
            "priority": 0.0,
            "sleep_s": 10.0,
            "limit_min": 1,
            "slurm_id": sid,
            "submit_t": 0.0,
        }
        for t, sid in (("a", "100"), ("b", "99"), ("c", "101"))
    ]
    out = compare.simulate(pd.DataFrame(rows), SimConfig(nodes=1, backfill="none"), 60.0).set_index("slurm_id")
    assert out.loc["99", "sim_start_t"] < out.loc["100", "sim_start_t"] < out.loc["101", "sim_start_t"]
    assert list(compare.submission_order(pd.DataFrame(rows))["slurm_id"]) == ["99", "100", "101"]


def test_submission_instants_come_from_slurmctlds_log_where_they_fit_the_jobcomp_second(tmp_path):
    from datetime import datetime

    from lab.slurm.compare import precise_submits
    from mirage_tasks.slurm.queue import read_submit_log

    log = tmp_path / "slurmctld.log"
    log.write_text(
        "[2026-12-04T20:06:03.998] _slurm_rpc_submit_batch_job: JobId=16 InitPrio=3008 usec=182\n"
        "[2026-12-04T20:06:04.074] _slurm_rpc_submit_batch_job: JobId=28 InitPrio=3004 usec=254\n"
        "[2026-12-04T20:06:04.203] sched/backfill: _start_job: Started JobId=28 in main on n[89-92]\n"
        "[2026-12-04T20:06:09.500] _slurm_rpc_submit_batch_job: JobId=30 InitPrio=1 usec=1\n"
        "[2026-12-04T20:06:07.004] _slurm_rpc_submit_batch_job: JobId=32 InitPrio=1 usec=1\n"
    )
    got = read_submit_log(str(log))
    base = datetime(2026, 12, 4, 20, 6, 3).timestamp()
    assert set(got) == {"16", "28", "30", "32"} and got["16"] == pytest.approx(base + 0.998)
    assert read_submit_log(str(tmp_path / "none.log")) == {}
    # jobcomp's whole seconds: 16 at :03, 28 at :04, 30 at :05 (not the log's :09: left as it was), 31 not
    # logged, 32 at :06 with its log line stamped 4 ms into the next second (the RPC ended then)
    jobs = pd.DataFrame(
        {
            "slurm_id": ["16", "28", "30", "31", "32"],
            "slurm_submit": [base, base + 1, base + 2, base + 3, base + 3],
            "submit_t": [0.0, 120.0, 240.0, 360.0, 360.0],
            "start_t": [120.0, 120.0, 240.0, np.nan, np.nan],
        }
    )
    out = precise_submits(jobs, got, origin=base, t0=0, factor=120)
    assert out["submit_t"].tolist() == pytest.approx([0.998 * 120, 1.074 * 120, 240.0, 360.0, 3.999 * 120])
    # 28 started in the second it was submitted (jobcomp: :04 = 120): not before its submission
    assert out["start_t"].tolist()[:3] == pytest.approx([120.0, 1.074 * 120, 240.0])
    assert out["slurm_submit_ms"].notna().tolist() == [True, True, False, False, True]
    assert jobs["submit_t"].tolist() == [0.0, 120.0, 240.0, 360.0, 360.0]  # the input is not changed


def test_the_late_nodes_join_when_slurmctld_logged_their_resume(tmp_path):
    """read_resume_log: the first ``state set to IDLE`` of one of the named nodes (the drain's own
    lines and other nodes' are not it); None without one or without a log."""
    from datetime import datetime

    from mirage_tasks.slurm.queue import read_resume_log

    log = tmp_path / "slurmctld.log"
    log.write_text(
        "[2026-12-06T17:50:51.037] update_node: node n79 state set to DRAINED\n"
        "[2026-12-06T17:55:01.100] update_node: node n3 state set to IDLE\n"
        "[2026-12-06T17:55:01.782] update_node: node n80 state set to IDLE\n"
        "[2026-12-06T17:55:01.790] update_node: node n79 state set to IDLE\n"
    )
    want = datetime.strptime("2026-12-06T17:55:01.782", "%Y-%m-%dT%H:%M:%S.%f").timestamp()
    assert read_resume_log(str(log), ["n79", "n80"]) == pytest.approx(want)
    assert read_resume_log(str(log), ["n81"]) is None and read_resume_log(str(tmp_path / "none"), ["n79"]) is None


def test_same_nodes_counts_matching_node_sets_and_skips_foreign_node_names():
    from lab.slurm.compare import same_nodes

    both = pd.DataFrame(
        {
            "slurm_nodes": ["n[1-3]", "n5", "n[7-8]", None],
            "sim_nodes": ["n[1-3]", "n6", "n[7-8]", "n1"],
            "start_t": [0.0, 0.0, 0.0, 0.0],
            "sim_start_t": [0.0, 100.0, 7200.0, 0.0],
        }
    )
    assert same_nodes(both) == {"jobs": 3, "same": 2, "within_1h": 2, "same_within_1h": 1}
    assert same_nodes(both.drop(columns="sim_nodes")) is None  # not a named-node comparison
    foreign = both.assign(slurm_nodes=["gpu[001-003]", "gpu005", "gpu[007-008]", None])
    assert same_nodes(foreign) is None  # another cluster's names


@pytest.mark.parametrize("hold", [True, False])
def test_a_held_background_keeps_its_jobs_until_the_session_stops(monkeypatch, tmp_path, hold):
    """A kept service's background (replay.run with hold=True, as the lab's keeper session runs it) leaves
    every job it submitted to run until the session's stop event, even when its window's
    submissions ran out long before and all its scored jobs started; only then it cancels
    them. Without hold the replay cancels them as soon as the scored jobs have started: the
    keep-service runs measured before this change lost their background then (a predecessor
    on an 8-node cluster started 1.9 trace h in, when the background vanished, where the
    simulator, whose background goes on, predicted 39 h)."""
    import threading
    import time

    calls: list[tuple[float, list[str]]] = []
    ids = iter(range(1, 100))

    def client(args, env=None, timeout=60):
        if args[0] == "sbatch":
            return f"{next(ids)}\n"
        calls.append((time.monotonic(), list(args)))
        return ""

    from mirage_tasks.slurm import queue

    monkeypatch.setattr(replay, "run_client", client)
    monkeypatch.setattr(queue, "run_client", client)  # cancel_ours's scancel
    monkeypatch.setattr(
        replay, "squeue", lambda env=None: [QJob(str(i), "RUNNING", 1, 600, 0.0, 1.0, "u", "bg") for i in (1, 2)]
    )
    (tmp_path / "jobcomp.txt").write_text("")
    monkeypatch.setattr(replay, "read_jobcomp", lambda path: {str(i): {"JobState": "CANCELLED"} for i in (1, 2)})
    jobs = pd.DataFrame(
        [
            {
                "trace_job_id": str(k),
                "kind": kind,
                "user": 0,
                "nodes": 1,
                "limit_min": 10,
                "sleep_s": 600.0,
                "nice": 0,
                "offset_real_s": 0.0,
                "too_big": False,
                "priority": 0.0,
            }
            for k, kind in ((1, "running_at_start"), (2, "window"))
        ]
    )
    stop = threading.Event()
    set_at = time.monotonic() + 2.5
    threading.Timer(2.5, stop.set).start()
    t = time.monotonic()
    out, facts = replay.run(
        jobs, {}, str(tmp_path / "jobcomp.txt"), 60.0, 0, tag="bg", drain_s=0.0, stop=stop, poll_s=0.1, hold=hold
    )
    cancels = [(at, a) for at, a in calls if a[0] == "scancel"]
    assert cancels and sorted(cancels[0][1][1:]) == ["1", "2"]  # every job of its own, once, at the end
    if hold:
        assert cancels[0][0] >= set_at - 0.05, "a held background was cancelled before the session stopped"
    else:
        assert cancels[0][0] - t < 2.0  # the old behaviour: gone as soon as the scored job had started
        stop.set()
    assert facts["cancelled_at_end"] == 2


def test_hold_without_a_stop_event_is_refused():
    with pytest.raises(ValueError, match="stop event"):
        replay.run(pd.DataFrame(), {}, "/nonexistent", 60.0, 0, hold=True)


def test_keeper_avg_cal_submits_where_the_mean_wait_minus_the_time_left_reaches_its_offset(fake):
    """avg-cal (protocol v2's reference): submit once (mean wait seen - time left) >= the calibrated
    offset, i.e. (mean wait - offset) before the end; an offset at or above the mean wait, or
    none (calibration chose never early), submits at the end like reactive."""
    fake.jobs["2"] = dict(nodes=1, limit=10**6, submit=900.0, start=960.0, end=None, mine=False)  # waited 60 s
    k = keeper.Keeper(
        env={},
        policy="avg-cal",
        node=1,
        service_s=4 * 3600,
        scale=60,
        step_s=600,
        avg_offset_h=0.25,
        clock=fake.clock,
        sleep=fake.sleep,
    )
    (r,) = k.run(deadline_s=10_000)
    # mean wait 0.5 trace h (as test_keeper_avg_uses_the_waits_it_saw), offset 0.25 h: 0.25 h before the end
    assert r["decision_lead_trace_h"] == pytest.approx(0.25, abs=2 / 60) and not r["forced"]
    never = keeper.Keeper(env={}, policy="avg-cal", node=1, service_s=4 * 3600, scale=60, avg_offset_h=None)
    assert never.avg_due(1000.0, 1800.0) is None
    above = keeper.Keeper(env={}, policy="avg-cal", node=1, service_s=4 * 3600, scale=60, avg_offset_h=0.5)
    assert above.avg_due(1000.0, 1800.0) is None  # lead 0.5 - 0.5 h = 0: at the end
    below = keeper.Keeper(env={}, policy="avg-cal", node=1, service_s=4 * 3600, scale=60, avg_offset_h=-1.0)
    assert below.avg_due(1000.0, 1800.0) == pytest.approx(1000.0 - 1.5 * 3600 / 60)  # earlier than avg
    with pytest.raises(ValueError, match="avg_offset_h"):
        keeper.Keeper(env={}, policy="avg-cal", node=1, service_s=3600, avg_offset_h=float("inf"))


def test_keeper_prediction_for_avg_cal_is_avg_moved_by_its_offset_or_reactive():
    """keeper_sim.predict: avg-cal with offset 0 decides as avg, without one (never early) as
    reactive, and with a negative offset earlier than avg."""
    from lab.slurm.keeper_sim import predict

    h, t0, factor = 3600, 1_000 * 3600, 60.0
    # a 2-node job holds the cluster 2 h; a 1-node job submitted a minute later waits for it (a mean wait > 0)
    cfg, _, bg = _replayed(
        [
            {
                "job_id": "a",
                "submit": t0 - 3 * h,
                "start": t0 - 3 * h,
                "end": t0 - h,
                "time_limit_s": 2 * h,
                "nodes": 2,
            },
            {"job_id": "b", "submit": t0 - 3 * h + 60, "start": t0 - h, "end": t0, "time_limit_s": h, "nodes": 1},
        ],
        t0 - 3 * h,
        t0,
        factor,
    )

    def lead(policy, off=None):
        return predict(bg, cfg, factor, t0, 1, 4 * h, policy, avg_offset_h=off)["sim_decision_lead_h"]

    assert lead("avg") > 0
    assert lead("avg-cal", 0.0) == lead("avg")
    assert lead("avg-cal", None) == lead("reactive") == 0
    assert lead("avg-cal", -1.0) == pytest.approx(lead("avg") + 1.0)


def test_keeper_prediction_asks_the_model_where_the_keeper_asks_it():
    """keeper_sim.predict asks a model (here one that always says submit) where the keeper does
    (:func:`keeper.asks`): every step from the predecessor's start, within its trained span, or at
    the first step at or past each probe time. Before, the prediction asked every step from the
    start whatever the keeper did, so a model the keeper asked only in its last 24 h was predicted
    to submit 48 h ahead."""
    from lab.slurm.keeper_sim import predict

    h, t0, factor = 3600, 1_000 * 3600, 60.0
    cfg, _, bg = _replayed(
        [{"job_id": "a", "submit": t0 - 3 * h, "start": t0 - 3 * h, "end": t0 - h, "time_limit_s": 2 * h, "nodes": 1}],
        t0 - 3 * h,
        t0,
        factor,
    )
    calls = []

    def always(hist):
        calls.append(hist.shape)
        return True, 1.0

    def ask(**where):
        calls.clear()
        r = predict(bg, cfg, factor, t0, 1, 4 * h, "model", decide=always, **where)
        return r["sim_decision_lead_h"], r["sim_n_decisions"], len(calls)

    assert ask() == (4.0, 1, 1)  # at the predecessor's start (t0, a node free)
    assert ask(decide_within_s=2 * h) == (2.0, 1, 1)
    assert ask(decide_at_s=(3 * h + 300, 1800)) == (3.0, 1, 1)  # the first step at or past 3 h 5 min left
    never = predict(bg, cfg, factor, t0, 1, 4 * h, "model", decide=lambda hist: (False, -1.0), decide_at_s=(7200, 600))
    assert never["sim_n_decisions"] == 2 and never["sim_decision_lead_h"] == 0.0


def test_keep_service_avg_cal_needs_training_samples_of_its_node_size(tmp_path, monkeypatch):
    """--policy avg-cal without --avg-cal-samples is refused before anything starts; a sample output
    of another node size is refused naming the flag; one of the right size gives the calibrated
    threshold with its objective (ties toward never early)."""
    import argparse

    from mirage_tasks.steps import keep_service
    from stepkit import StepError

    monkeypatch.delenv("SLURM_CONF", raising=False)
    p = argparse.ArgumentParser()
    keep_service.add_arguments(p)
    with pytest.raises(StepError, match="--avg-cal-samples"):
        keep_service.run(p.parse_args(["--policy", "avg-cal,reactive", "--out", str(tmp_path / "o")]))
    assert not (tmp_path / "o").exists()
    with pytest.raises(StepError, match="--avg-cal-samples"):
        keep_service.calibrate_avg_cal(str(tmp_path / "nothing"), 1)


class _FixedWait:
    """A wait predictor that always answers ``wait_h`` with bound ``bound_h`` (and, called on a
    simulator as keeper_sim calls it, the same)."""

    def __init__(self, wait_h, bound_h):
        self.ans = {"wp_wait_s": wait_h * 3600.0, "wp_bound_s": bound_h * 3600.0, "wp_plan_request_s": 0.0}
        self.rows = []

    def finish(self, row, t, nodes, limit_s):
        self.rows.append((row, t, nodes, limit_s))
        return row

    def answer(self, row):
        return dict(self.ans)

    def __call__(self, sim, nodes, limit_s):
        return dict(self.ans)


@pytest.mark.parametrize("policy, lead_h", [("wait-pred", 0.5), ("guarantee", 2.0 + 1 / 6)])
def test_keeper_wait_predictor_rules_submit_where_the_wait_or_bound_reaches_the_time_left(fake, policy, lead_h):
    """wait-pred submits once the predicted wait (0.5 h) reaches the time left; guarantee once the
    bound (2 h) reaches the time left at the next decision (10 trace minutes on): 2 h 10 min early.
    The predictor is asked with the successor's request and a trace clock."""
    wp = _FixedWait(0.5, 2.0)
    k = keeper.Keeper(
        env={},
        policy=policy,
        node=1,
        service_s=4 * 3600,
        scale=60,
        step_s=600,
        waitpred=wp,
        wait_cfg=SimConfig(nodes=4),
        clock=fake.clock,
        sleep=fake.sleep,
    )
    (r,) = k.run(deadline_s=10_000)
    assert not r["forced"] and r["decision_lead_trace_h"] == pytest.approx(lead_h, abs=1 / 60)
    assert r["model_output"] == pytest.approx(0.5 if policy == "wait-pred" else 2.0)
    row, t, nodes, limit_s = wp.rows[-1]
    assert (nodes, limit_s) == (1, 4 * 3600) and row["capacity"] == 4
    with pytest.raises(ValueError, match="wait predictor"):
        keeper.Keeper(env={}, policy=policy, node=1, service_s=3600)


def test_keeper_prediction_of_the_wait_predictor_rules_asks_every_step():
    """keeper_sim.predict for guarantee: a bound of 2 h on a free cluster submits 2 h 10 min before
    the end (the step after which waiting would leave less than the bound), wait-pred at 0 h wait
    only at the end."""
    from lab.slurm.keeper_sim import predict

    h, t0, factor = 3600, 1_000 * 3600, 60.0
    cfg, _, bg = _replayed(
        [{"job_id": "a", "submit": t0 - h, "start": t0 - h, "end": t0 - 1800, "time_limit_s": h, "nodes": 1}],
        t0 - h,
        t0,
        factor,
    )
    g = predict(bg, cfg, factor, t0, 1, 4 * h, "guarantee", waitpred=_FixedWait(0.0, 2.0))
    assert g["sim_decision_lead_h"] == pytest.approx(2.0 + 1 / 6) and g["sim_wasted_node_h"] > 2
    w = predict(bg, cfg, factor, t0, 1, 4 * h, "wait-pred", waitpred=_FixedWait(0.0, 2.0))
    assert w["sim_decision_lead_h"] == 0 and w["sim_n_decisions"] > 20


@pytest.mark.parametrize("margin_h, lead_h, asked", [(0.5, 2.0, 1), (1.5, 1.0, 2), (None, 0.0, 4)])
def test_guarantee_cal_is_asked_at_its_probe_times_with_its_margin(fake, margin_h, lead_h, asked):
    """guarantee-cal (bound 2 h, probes 2 h, 1 h, 30 min and 10 min before the end): asked only at
    the first reading at or past each probe time, it submits when the bound minus the time left at
    the next probe reaches its margin. Margin 0.5 h: at 2 h left (2 - 1 >= 0.5); 1.5 h: at 1 h left
    (2 - 0.5); None (never early): at the end after its 4 asks. The simulator's prediction decides
    the same on a free cluster."""
    from lab.slurm.keeper_sim import predict

    at = (7200, 3600, 1800, 600)
    wp = _FixedWait(0.0, 2.0)
    k = keeper.Keeper(
        env={},
        policy="guarantee-cal",
        node=1,
        service_s=4 * 3600,
        scale=60,
        step_s=600,
        waitpred=wp,
        wait_cfg=SimConfig(nodes=4),
        guarantee_margin_h=margin_h,
        guarantee_at_s=at,
        clock=fake.clock,
        sleep=fake.sleep,
    )
    (r,) = k.run(deadline_s=10_000)
    assert r["decision_lead_trace_h"] == pytest.approx(lead_h, abs=1 / 60) and r["forced"] == (margin_h is None)
    assert r["n_decisions"] == asked and len(wp.rows) == asked
    h, t0, factor = 3600, 1_000 * 3600, 60.0
    cfg, _, bg = _replayed(
        [{"job_id": "a", "submit": t0 - h, "start": t0 - h, "end": t0 - 1800, "time_limit_s": h, "nodes": 1}],
        t0 - h,
        t0,
        factor,
    )
    g = predict(
        bg,
        cfg,
        factor,
        t0,
        1,
        4 * h,
        "guarantee-cal",
        waitpred=_FixedWait(0.0, 2.0),
        guarantee_margin_h=margin_h,
        guarantee_at_s=at,
    )
    assert g["sim_decision_lead_h"] == pytest.approx(lead_h) and g["sim_n_decisions"] == asked
    with pytest.raises(ValueError, match="probes' times"):
        keeper.Keeper(env={}, policy="guarantee-cal", node=1, service_s=3600, waitpred=wp, wait_cfg=SimConfig(nodes=4))


def test_guarantee_cal_needs_end_spaced_samples_of_the_same_predictor(tmp_path, monkeypatch):
    """keep-service --policy guarantee-cal: without --guarantee-samples the step refuses before
    anything starts; samples that are not end-spaced, or drawn without the keeper's predictor, are
    refused naming the flag."""
    import argparse

    from mirage_tasks.data import artifacts
    from mirage_tasks.steps import keep_service
    from stepkit import StepError

    p = argparse.ArgumentParser()
    keep_service.add_arguments(p)
    a = p.parse_args(["--policy", "guarantee-cal,reactive", "--waitpred", "wp", "--out", str(tmp_path / "o")])
    with pytest.raises(StepError, match="--policy guarantee-cal needs --guarantee-samples"):
        keep_service.run(a)
    for params, why in (
        ({"probe_spacing": "uniform"}, "needs end-spaced samples"),
        ({"probe_spacing": "end", "baseline": "default"}, "drawn without --waitpred"),
    ):
        monkeypatch.setattr(artifacts, "require_input", lambda uri, flag, step=None, _p=params: {"params": _p})
        with pytest.raises(StepError, match=f"--guarantee-samples s: .*{why}"):
            keep_service.calibrate_guarantee_cal("s", 1, str(tmp_path), 0.1)
    assert not (tmp_path / "o").exists()


def test_keep_service_wait_predictor_rules_need_a_waitpred_output(tmp_path, monkeypatch):
    import argparse

    from mirage_tasks.slurm import livewait
    from mirage_tasks.steps import keep_service
    from stepkit import StepError

    monkeypatch.delenv("SLURM_CONF", raising=False)
    p = argparse.ArgumentParser()
    keep_service.add_arguments(p)
    with pytest.raises(StepError, match="guarantee needs --waitpred"):
        keep_service.run(p.parse_args(["--policy", "guarantee,reactive", "--out", str(tmp_path / "o")]))
    assert not (tmp_path / "o").exists()
    with pytest.raises(StepError, match="--waitpred"):
        livewait.load(str(tmp_path / "nothing"), "UTC")


def test_keeper_submits_at_the_end_before_reading_a_slow_queue(fake, monkeypatch):
    """On a loaded machine squeue and sinfo take seconds (the campaign of keeper-campaign.md saw
    reactive submit up to 5 real s late at x180, 0.27 trace h): at the predecessor's end the keeper
    submits first and reads after, so a 4-second reading does not delay the successor."""
    slow = fake.squeue

    def squeue(env=None, partition=None):
        fake.t += 4.0
        fake._tick()
        return slow(env, partition)

    monkeypatch.setattr(keeper, "squeue", squeue)
    (r,) = _keeper(fake, "reactive").run(deadline_s=10_000)
    assert r["forced"] and -0.5 <= r["succ_submit"] - r["pred_end"] < 1.0


def test_clusters_started_at_once_choose_their_ports_one_after_another(tmp_path, monkeypatch):
    """Two local clusters started at the same instant must not pick one port block (the keeper
    campaign's ten clusters did once: "Address already in use"): under cluster.port_lock the second
    chooses only after the first's daemons listen. Here the "daemons" are sockets bound inside the
    lock, and the random start of free_port_range is pinned so both would pick the same block."""
    import socket
    import threading

    from lab.slurm import cluster

    monkeypatch.setattr(cluster, "PORT_LOCK", str(tmp_path / "ports.lock"))
    monkeypatch.setattr("random.randrange", lambda a, b: 24000)
    got, socks, go = [], [], threading.Barrier(2)

    def start():
        go.wait()
        with cluster.port_lock(str(tmp_path / "ports.lock")):
            base = cluster.free_port_range(4)
            time.sleep(0.2)  # the daemons start
            for p in range(base, base + 4):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                s.listen()
                socks.append(s)
            got.append(base)

    import time

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(got) == 2 and abs(got[0] - got[1]) >= 4, got
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--accounting", "--users", "20000"], "--users (SLURM_USERS) 20000: at most 10000"),
        (["--nodes", "300"], "at most 256"),
        (["--nodes", "0"], "--nodes: nodes must be a positive number"),
        (["--factor", "1e7"], "--factor (SLURM_FACTOR) 1e+07: must be > 0 and at most 1e+06"),
        (["--factor", "nan"], "--factor (SLURM_FACTOR) nan"),
        (["--cluster-config", "nosuchpreset"], "--cluster-config 'nosuchpreset'"),
    ],
)
def test_make_slurm_counts_are_bounded_before_anything_starts(tmp_path, monkeypatch, capsys, argv, named):
    """``make slurm``'s counts (SLURM_USERS, SLURM_NODES, SLURM_FACTOR) each have an upper bound:
    exit 2 naming the flag, its make variable and the bound, before a daemon starts (before,
    SLURM_USERS had none: 20,000 accounts were created one sacctmgr call after another)."""
    from lab.slurm import cluster

    def started(*a, **k):
        raise AssertionError("a cluster was started")

    monkeypatch.setattr(cluster.LocalSlurm, "start", started)
    assert cluster.main(["start", "--root", str(tmp_path / "s"), *argv]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_slurm_conf_binds_every_daemon_to_the_host_name_address():
    """Slurm 22.05 listens on any address unless told to bind to its host name's (which the local
    daemons' namespace sets to localhost): slurm.conf and slurmdbd.conf both say so."""
    from lab.slurm.slurmconf import render_dbd

    text = render(SimConfig(nodes=2), 1, Paths("/x"), 6817, (7001, 7002), dbd_port=7003)
    assert "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" in text
    assert "SlurmctldHost=localhost(127.0.0.1)" in text and "NodeAddr=127.0.0.1" in text
    dbd = render_dbd(Paths("/x"), 7003, 7004, "pw")
    assert "CommunicationParameters=NoInAddrAny" in dbd and "DbdAddr=127.0.0.1" in dbd


def test_keeper_adopts_a_queued_job_and_announces_what_it_submits(fake):
    """``run(first=...)``: the adopted job is the first predecessor (no sbatch for it), this keeper's
    own (it may cancel it); every job it does submit goes to ``on_submit`` at once."""
    seen = []
    k = _keeper(fake, "reactive")
    k.on_submit = seen.append
    before = set(fake.jobs)
    adopted = fake.run_client(["sbatch", "-N", "1", "--time=240"]).strip()  # an earlier try's job
    (r,) = k.run(first=adopted, deadline_s=10_000)
    assert r["pred"] == adopted and seen == [r["succ"]]
    assert set(fake.jobs) - before == {adopted, r["succ"]}  # one sbatch by the keeper: the successor
    assert adopted in k.submitted


def test_adopted_chains_take_each_chains_newest_queued_job(monkeypatch):
    """``keep-service --adopt-jobs``: the chain of each job is its name's tag; the newest queued job
    of a chain wins; a job no longer queued is not adopted."""
    from mirage_tasks.slurm import queue
    from mirage_tasks.steps import keep_service

    def squeue(env=None, partition=None):
        names = {"7": "svc-reactive-0", "8": "svc-reactive-1", "9": "svc-avg-c1-0"}
        return [QJob(j, "RUNNING", 1, 60, 0.0, 1.0, "u", n) for j, n in names.items()]

    monkeypatch.setattr(queue, "squeue", squeue)
    got = keep_service.adopted_chains(["5", "7", "8", "9"], {}, None)
    assert got == {"svc-reactive": "8", "svc-avg-c1": "9"}
    assert keep_service.adopted_chains([], {}, None) == {}


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


def test_keep_service_refuses_a_policy_named_twice(tmp_path, capsys):
    """(more chains of one rule: the lab's keeper-slurm --chains, tests/lab/test_keeper_slurm_bad_inputs.py)"""
    out = tmp_path / "k"
    refused(capsys, out, "keep-service", "--policy", "reactive,reactive", "--out", out, names="--chains")


def test_a_missing_slurm_conf_is_refused_at_once(tmp_path, capsys, monkeypatch):
    """A Slurm client retries a missing slurm.conf for 60 s per call: keep-service sat silent."""
    out = tmp_path / "o"
    refused(
        capsys,
        out,
        "keep-service",
        "--policy",
        "reactive",
        "--slurm-conf",
        tmp_path / "none.conf",
        "--out",
        out,
        names="--slurm-conf",
    )
    refused(capsys, out, "keep-service", "--policy", "reactive", "--out", out, names="no cluster")


def test_keeper_on_a_real_cluster_has_no_limit_of_its_own(fake):
    """At real speed (scale 1) a 48 h job's successor is decided two days after the chain starts: the
    step's default (``--deadline-s`` unset) never gives up before that, while a limit given stops it."""
    from mirage_tasks.steps import keep_service

    parser = argparse.ArgumentParser()
    keep_service.add_arguments(parser)
    default = parser.parse_args(["--out", "file:///unused"]).deadline_s
    assert default is None

    def real_speed():
        return keeper.Keeper(
            env={}, policy="reactive", node=1, service_s=48 * 3600, scale=1, step_s=600,
            clock=fake.clock, sleep=fake.sleep,
        )  # fmt: skip

    start = fake.clock()
    (r,) = real_speed().run(deadline_s=default)
    assert r["forced"] and r["succ_submit"] - start >= 48 * 3600 - 0.5  # two days on, still keeping
    with pytest.raises(TimeoutError, match="no successor decision before the deadline"):
        real_speed().run(deadline_s=7200)
