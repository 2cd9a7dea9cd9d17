"""E2E tier: a real local Slurm (Debian's slurmctld/slurmd/munge, as root) started by the
fixture in a temporary root and stopped after; skips only where Slurm is not installed (or
the tests do not run as root, which the daemons need)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from proctree import wait_for

from lab.slurm import compare, replay
from lab.slurm.cluster import LocalSlurm, _alive, missing_binaries
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.workload import Workload
from mirage_tasks.slurm import keeper
from mirage_tasks.slurm.queue import read_jobcomp, run_client, squeue

pytestmark = pytest.mark.skipif(
    bool(missing_binaries()) or os.geteuid() != 0,
    reason=(
        f"Slurm not installed ({', '.join(missing_binaries())}; make system-deps installs slurmctld slurmd "
        "slurm-client munge)"
        if missing_binaries()
        else "the local Slurm's daemons run as root"
    ),
)

FACTOR = 60


@pytest.fixture
def slurm(tmp_path):
    c = LocalSlurm(tmp_path / "slurm")
    c.start(SimConfig(nodes=3, bf_interval_s=60, bf_resolution_s=60), FACTOR)
    yield c
    c.stop()
    left = c.leftovers() + list(c.running().values())
    assert not left, f"left running: {left}"


def test_cluster_schedules_jobs_and_stop_leaves_nothing(tmp_path):
    c = LocalSlurm(tmp_path / "s")
    info = c.start(SimConfig(nodes=3), 1.0)
    try:
        assert c.idle_nodes() == 3 and info["nodes"] == 3
        env = c.env()
        ids = [
            run_client(
                [
                    "sbatch",
                    "--parsable",
                    "-N",
                    "2",
                    "-t",
                    "1",
                    "--output=/dev/null",
                    "--chdir=/tmp",
                    "--wrap=exec sleep 3",
                ],
                env,
            ).strip()
            for _ in range(2)
        ]
        # two 2-node jobs on 3 nodes: one runs, one waits for Resources, then runs
        q = wait_for(lambda: [j for j in squeue(env) if j.state == "RUNNING"], "a running job")
        assert len(q) == 1
        wait_for(lambda: set(ids) <= read_jobcomp(c.paths.jobcomp).keys(), "both jobs completed")
        comp = read_jobcomp(c.paths.jobcomp)
        assert all(comp[i]["JobState"] == "COMPLETED" for i in ids)
        # and one more that is still running when the cluster stops
        run_client(
            [
                "sbatch",
                "--parsable",
                "-N",
                "1",
                "-t",
                "5",
                "--output=/dev/null",
                "--chdir=/tmp",
                "--wrap=exec sleep 300",
            ],
            env,
        )
        wait_for(lambda: [j for j in squeue(env) if j.state == "RUNNING"], "the long job running")
        pids = c.running()
        assert set(pids) >= {"munged", "slurmctld", "slurmd-n1", "slurmd-n2", "slurmd-n3"}
    finally:
        c.stop()
    assert not any(_alive(p) for p in pids.values())
    assert c.leftovers() == []


def _wl(rows):
    df = pd.DataFrame(rows, columns=["job_id", "submit", "start", "end", "time_limit_s", "nodes", "user", "priority"])
    for col in ("submit", "start", "end"):
        df[col] = pd.to_datetime(df[col], unit="s", utc=True)
    df["procs"] = np.nan
    return Workload.from_frame(df)


def test_replay_matches_the_simulator_on_a_backfill_case(slurm):
    """3 nodes, x60: a 3-node job must wait for a running 2-node job; a short 1-node job
    submitted later fits beside it (backfill); a long one would delay the big one: it waits.
    About 2 trace hours = 2 real minutes."""
    h = 3600
    t0 = 100 * h
    # (id, submit, start, end, limit, nodes, user, recorded priority); durations = end - start
    wl = _wl(
        [
            ("r", t0 - 600, t0 - 600, t0 + h, 2 * h + 600, 2, "u", 10.0),  # running at t0: ends at t0 + 1 h,
            #                                                                     planned (limit) t0 + 2 h
            ("big", t0 + 300, t0 + h, t0 + 2 * h, h, 3, "u", 100.0),  # needs all 3 nodes: waits for r
            ("short", t0 + 600, t0 + 600, t0 + 600 + h // 2, h, 1, "u", 1.0),  # ends (planned) before r: backfill
            ("long", t0 + 1200, t0 + 2 * h, t0 + 3 * h, 2 * h, 1, "u", 1.0),
        ]
    )  # would delay big: waits for it
    cfg = SimConfig(nodes=3, bf_interval_s=60, bf_resolution_s=60)
    jobs = replay.plan(wl, cfg, t0, t0 + 3 * h, FACTOR)
    assert list(jobs["kind"]) == ["running_at_start", "window", "window", "window"]
    out, facts = replay.run(jobs, slurm.env(), slurm.paths.jobcomp, FACTOR, t0, drain_s=600)
    assert facts["scored"] == 3 and facts["scored_started"] == 3
    doc, frame = compare.compare(out, cfg, FACTOR, horizon_t=facts["horizon_t"])
    f = frame.set_index("trace_job_id")
    wait = (f["start_t"] - f["submit_t"]) / h
    assert wait["short"] < 0.25 and bool(f.loc["short", "slurm_backfilled"])  # Slurm backfilled it
    assert wait["big"] > 0.5 and f.loc["long", "start_t"] >= f.loc["big", "start_t"] + 0.5 * h
    # the simulator, given the same submissions, agrees within a few real seconds x the factor
    assert doc["compared"] == 3
    assert doc["start_error_h"]["max"] <= 6 * FACTOR / h, doc
    assert doc["sim_vs_slurm"]["within_1h"] == 1.0
    # the replay cancelled what it left; a job that just ended may show COMPLETING (CG) for a moment
    wait_for(lambda: slurm.cmd("squeue", "-h").stdout.strip() == "", "an empty queue", deadline_s=30)


def test_keeper_keeps_a_chain_on_real_slurm(slurm, tmp_path):
    env = slurm.env()
    # a foreign job the keeper must leave alone
    other = run_client(
        ["sbatch", "--parsable", "-N", "1", "-t", "5", "--output=/dev/null", "--chdir=/tmp", "--wrap=exec sleep 200"],
        env,
    ).strip()
    k = keeper.Keeper(
        env=env,
        policy="reactive",
        node=1,
        service_s=3600,
        scale=FACTOR,
        step_s=600,
        log_path=str(tmp_path / "d.jsonl"),
        stop_chain=True,
    )
    (r,) = k.run(deadline_s=300)
    assert r["forced"] and r["succ_submit"] >= r["pred_end"] - 0.5
    # a few real seconds of dispatch, x60; Slurm records whole seconds, so an end and a start in
    # the same real second can read one second apart either way (seen under load: -1 s)
    assert -FACTOR / 3600 <= r["signed_interruption_h"] <= 5 * FACTOR / 3600
    with pytest.raises(keeper.RefusedError):
        k.cancel(other)
    assert other in {j.job_id for j in squeue(env)}
    assert '"event": "decision"' in (tmp_path / "d.jsonl").read_text()


def test_slurm_reserves_named_nodes_as_the_named_backfill_does(tmp_path):
    """6 nodes, x60 (about 3 real minutes). F, A and C start at once on n1-n3, n4-n5 and n6.
    F ends at 58 min; the top job T (4 nodes) cannot start and is reserved at A's planned end on
    n1-n4 (select/linear's best fit among the then free n1-n5). B (1 node, 1 h) arrives behind T:
    every idle node (n1-n3) is reserved for T, so Slurm holds B until A ends, on n5. A free-node
    count (the ``conservative`` backfill) leaves one node over and starts B at once; ``named``
    (the comparison's default for a conservative configuration) reproduces Slurm's starts and
    nodes (test_sim_named.py has the same case, made small)."""
    h, m = 3600, 60
    t0 = 100 * h
    wl = _wl(
        [
            ("F", t0, t0, t0 + 58 * m, h, 3, "u", 10.0),
            ("A", t0, t0, t0 + 118 * m, 2 * h, 2, "u", 10.0),
            ("C", t0, t0, t0 + 178 * m, 3 * h, 1, "u", 10.0),
            ("T", t0 + 66 * m, t0 + 118 * m, t0 + 176 * m, h, 4, "u", 10.0),
            ("B", t0 + 69 * m, t0 + 118 * m, t0 + 176 * m, h, 1, "u", 10.0),
        ]
    )
    cfg = SimConfig(nodes=6, bf_interval_s=60, bf_resolution_s=60, weight_size=0.0)
    c = LocalSlurm(tmp_path / "slurm")
    c.start(cfg, FACTOR)
    try:
        jobs = replay.plan(wl, cfg, t0, t0 + 3 * h, FACTOR)
        out, facts = replay.run(jobs, c.env(), c.paths.jobcomp, FACTOR, t0, drain_s=600)
    finally:
        c.stop()
    assert not c.leftovers()
    f = out.set_index("trace_job_id")
    assert dict(f["slurm_nodes"]) == {"F": "n[1-3]", "A": "n[4-5]", "C": "n6", "T": "n[1-4]", "B": "n5"}
    start_h = (f["start_t"] - t0) / h
    assert abs(start_h["B"] - start_h["T"]) < 0.1 and start_h["B"] > 1.8, dict(start_h)
    got = {}
    for bf in ("conservative", "named"):
        doc, frame = compare.compare(out, cfg, FACTOR, horizon_t=facts["horizon_t"], sim_backfill=bf)
        g = frame.set_index("trace_job_id")
        got[bf] = (g["sim_start_t"] - g["start_t"]).abs() / h
        if bf == "named":
            assert dict(g["sim_nodes"]) == dict(f["slurm_nodes"])  # the same nodes for every job
            assert doc["same_nodes"] == {"jobs": 5, "same": 5, "within_1h": 5, "same_within_1h": 5}
    assert got["conservative"]["B"] > 0.7  # the count starts B about 50 min early
    assert got["named"].max() < 0.1, dict(got["named"])


def _keep_service(tmp_path: Path, trace: str, t0: int, *flags: str) -> dict:
    """``keep-service``'s measurement mode (``python -m lab keeper-slurm``) through its command
    line on a local Slurm of its own at x120, 1-node service jobs, the trace's first hour from
    ``t0`` replayed as background; its ``keeper.json``
    (the step must exit 0)."""
    import json
    import subprocess
    import sys

    from mirage_tasks.data.times import iso

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab",
            "keeper-slurm",
            "--node",
            "1",
            "--factor",
            "120",
            "--slurm-root",
            str(tmp_path / "slurm"),
            "--trace",
            trace,
            "--background-from",
            iso(t0),
            "--background-to",
            iso(t0 + 3600),
            "--cluster-config",
            "ls6",
            "--stop-chain",
            "--out",
            str(tmp_path / "out"),
            *flags,
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp_path / "out" / "keeper.json").read_text())


def test_keep_service_chains_in_a_held_background_as_the_simulator_predicts(tmp_path):
    """keep-service through its command line (the measurement mode, the lab's keeper-slurm: a
    local 4-node Slurm at x120, a background replayed while two chains per policy run, the second started half a
    trace hour after the first). The background holds the whole cluster until 3 h in (a
    running 4-node job; its 1 h window submits one more job, of a lower priority than the
    service's, at 10 min), so every predecessor waits for it, and that window's submissions
    end long before the chains do.

    * The background stays until the chains are done: every successor started before the
      background's jobs were cancelled. (Before, a background was cancelled once its window's
      jobs had started, and the predecessors then started at once, where the simulator, whose
      background goes on, predicted the wait: 39 h against 1.9 h on an 8-node check.)
    * The simulator's prediction of each chain's predecessor start agrees with Slurm's.
    * Each chain has its own job names, links and decision lines, and keeper.json's summary
      pairs the policies on them."""
    import json

    from test_sim_support import frame, write_committed_trace

    h, m = 3600, 60
    t0 = 1_700_006_400
    trace = write_committed_trace(
        tmp_path / "trace",
        frame(
            [
                {"submit": t0 - h, "start": t0 - h, "end": t0 + 3 * h, "limit": 5 * h, "nodes": 4, "priority": 3000},
                {
                    "submit": t0 + 10 * m,
                    "start": t0 + 3 * h,
                    "end": t0 + 4 * h,
                    "limit": 2 * h,
                    "nodes": 1,
                    "priority": 1000,
                },
                {
                    "submit": t0 + 2 * h,
                    "start": t0 + 2 * h,
                    "end": t0 + 3 * h,
                    "limit": 2 * h,
                    "nodes": 1,
                    "priority": 3000,
                },
            ]
        ),
    )
    out = tmp_path / "out"
    k = _keep_service(
        tmp_path,
        trace,
        t0,
        "--policy",
        "reactive,avg",
        "--chains",
        "2",
        "--stagger-hours",
        "0.5",
        "--offset-hours",
        "0.25",
        "--service-hours",
        "2",
        "--nodes",
        "4",
        "--deadline-s",
        "900",
    )
    links = pd.DataFrame(k["links"])
    assert sorted(zip(links["policy"], links["chain"])) == [("avg", 0), ("avg", 1), ("reactive", 0), ("reactive", 1)]
    bg = k["facts"]["background"]
    origin, fac = bg["origin_epoch"], k["factor"]
    assert bg["submissions"] == 2  # the running job and the window's job (the 3rd is after the window)
    # held: cancelled only after every successor had started (it was gone at about 10 min before)
    assert origin + bg["wall_s"] >= links["succ_start"].max(), (bg, links[["succ_start"]])
    pred_wait_h = (links["pred_start"] - links["pred_submit"]) * fac / h
    pred_start_t = t0 + (links["pred_start"] - origin) * fac
    assert (pred_start_t >= t0 + 2.9 * h).all(), pred_start_t  # waited for the background's 3 h
    assert ((pred_start_t - links["sim_pred_start"]).abs() <= 0.5 * h).all(), (
        list(pred_start_t),
        list(links["sim_pred_start"]),
        list(pred_wait_h),
    )
    # the first chains started a quarter of an hour after the background's origin, the second half an hour
    # after the first (a few real seconds of slack, x120)
    sub_t = (links["pred_submit"] - origin) * fac
    c0, c1 = sub_t[links["chain"] == 0], sub_t[links["chain"] == 1]
    assert 0.2 * h <= c0.min() and c0.max() <= 0.45 * h, list(c0)
    assert 0.4 * h <= c1.min() - c0.max() and c1.max() - c0.min() <= 0.75 * h, (list(c0), list(c1))
    names = (tmp_path / "slurm" / "log" / "jobcomp.txt").read_text()
    assert all(f"Name=svc-{p}-{c}0 " in names for p in ("avg", "reactive") for c in ("", "c1-")), names
    decisions = [json.loads(x) for x in (out / "decisions.jsonl").read_text().splitlines()]
    assert {d["chain"] for d in decisions if d["event"] == "decision"} == {0, 1}
    s = {r["policy"]: r for r in k["summary"]}
    assert s["avg"]["links"] == 2 and s["avg"]["chains"] == 2 and s["avg"]["vs_reactive_n"] == 2
    assert "| reactive | 1 | 2 | 2 |" in (out / "keeper.md").read_text()
    bgj = pd.read_parquet(out / "background.parquet")
    assert list(bgj["kind"]) == ["running_at_start", "window"] and bgj["slurm_start"].notna().iloc[0]


def test_keep_service_late_nodes_join_when_the_first_chain_starts(tmp_path):
    """``--late-nodes``: nodes added for the chains stay drained until the first chain starts.
    A 2-node local Slurm at x120, the second node late by the chains' half-hour offset; the
    background holds node 1 for 3 h, and its window submits a 2 h 1-node job at 10 min, of a
    lower priority than the service's. On the cluster without late nodes that job takes node 2
    at 10 min and the predecessor, submitted at 30 min, waits until 2 h 10 min; here node 2 joins
    once the predecessor is queued, and the predecessor takes it at once. The simulator's
    prediction has node 2 join at the same instant, so it predicts that start too."""
    import json

    from test_sim_support import frame, write_committed_trace

    h, m = 3600, 60
    t0 = 1_700_006_400
    trace = write_committed_trace(
        tmp_path / "trace",
        frame(
            [
                {"submit": t0 - h, "start": t0 - h, "end": t0 + 3 * h, "limit": 5 * h, "nodes": 1, "priority": 3000},
                {
                    "submit": t0 + 10 * m,
                    "start": t0 + 10 * m,
                    "end": t0 + 130 * m,
                    "limit": 3 * h,
                    "nodes": 1,
                    "priority": 1000,
                },
                {
                    "submit": t0 + 2 * h,
                    "start": t0 + 2 * h,
                    "end": t0 + 3 * h,
                    "limit": 2 * h,
                    "nodes": 1,
                    "priority": 3000,
                },
            ]
        ),
    )
    out = tmp_path / "out"
    k = _keep_service(
        tmp_path,
        trace,
        t0,
        "--policy",
        "reactive",
        "--offset-hours",
        "0.5",
        "--late-nodes",
        "1",
        "--service-hours",
        "1",
        "--nodes",
        "2",
        "--deadline-s",
        "600",
    )
    assert k["late_nodes"] == 1 and not k["facts"]["errors"], k["facts"]
    link = pd.DataFrame(k["links"]).iloc[0]
    origin, fac = k["facts"]["background"]["origin_epoch"], k["factor"]
    pred_start_t = t0 + (link["pred_start"] - origin) * fac
    assert 0.4 * h <= pred_start_t - t0 <= 0.75 * h, (pred_start_t - t0) / h  # node 2 free for it, not at 2.2 h
    assert abs(pred_start_t - link["sim_pred_start"]) <= 0.25 * h, (pred_start_t - t0, link["sim_pred_start"] - t0)
    bgj = pd.read_parquet(out / "background.parquet")
    win = bgj[bgj["kind"] == "window"].iloc[0]
    assert not win["start_t"] - t0 < 1.4 * h, (win["start_t"] - t0) / h  # not at 10 min on node 2 (or never)
    # the campaign's repredict rebuilds the prediction from what the run stored: the same numbers, also where
    # the join instant was not recorded (runs before it was: then the last chain-0 predecessor's submission)
    from lab.campaigns import keeper_campaign as bench

    cols = ["sim_pred_start", "sim_succ_submit", "sim_succ_start"]
    again = bench.repredict_run(out, tmp_path / "slurm")
    assert again[cols].to_dict("records") == pd.read_parquet(out / "links.parquet")[cols].to_dict("records")
    k["facts"].pop("late_nodes_joined_epoch")
    (out / "keeper.json").write_text(json.dumps(k))
    fallback = bench.repredict_run(out, tmp_path / "slurm")
    assert abs(fallback["sim_pred_start"].iloc[0] - link["sim_pred_start"]) <= 0.1 * h
