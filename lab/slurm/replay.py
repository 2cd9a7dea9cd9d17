"""Replay a trace window on a real Slurm cluster, time-compressed, and record real starts.

Time runs ``factor`` times faster than in the trace: a job submitted ``d`` trace seconds
after the window's start ``t0`` is submitted ``d / factor`` real seconds after the replay
began; it runs ``sleep duration / factor`` on its nodes; its time limit is ``limit /
factor`` rounded *up* to Slurm's whole minute (so at factor F a limit carries up to F
trace minutes of slack: the backfill planner sees longer limits than the trace had).

Jobs active at ``t0`` (the trace's warm start, the same set the simulator's warm start
uses) are submitted first, at the replay's start: jobs *running* at ``t0`` with their
remaining run time and limit and a priority above everything (``--nice`` far below 0) so
they take their nodes at once, jobs *pending* at ``t0`` with their recorded priority.
Neither is scored (Slurm cannot backdate a submission); they only load the cluster.

Priority: with a priority policy that renders per job (``slurm_per_job``: ``priority="trace"``)
each job gets ``--nice=-<its priority>`` (for trace the recorded one; Slurm's priority is then
its job-size term plus that value); otherwise 0. Every time the
comparison needs is taken from Slurm itself (SubmitTime, StartTime, EndTime from squeue and
the jobcomp log), mapped back to trace time: ``t0 + (slurm_time - origin) * factor``.
"""

from __future__ import annotations

import logging
import math
import os
import time

import numpy as np
import pandas as pd

from lab.slurm.slurmconf import account_of
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.policies import priority_policy
from mirage_tasks.sim.workload import Workload
from mirage_tasks.slurm.queue import Progress, cancel_ours, read_jobcomp, run_client, slurm_time, squeue

log = logging.getLogger(__name__)

RUNNING_BOOST = 10_000_000  # priority of the jobs already running at t0: above any recorded one


def plan(wl: Workload, cfg: SimConfig, t0: int, t1: int, factor: float) -> pd.DataFrame:
    """One row per job to submit, in submission order (columns documented in replay_jobs)."""
    rows = []
    running, pending = wl.active_at(t0) if cfg.warm_start else (np.array([], int), np.array([], int))
    policy = priority_policy(cfg.priority)
    static_default = policy.slurm_default(wl) if policy.slurm_per_job else 0.0

    def prio(i: int) -> float:
        if not policy.slurm_per_job:
            return 0.0
        return policy.slurm_priority(wl, i, static_default)

    def add(i: int, kind: str, at_s: float, dur: int, limit: int, p: float) -> None:
        rows.append(
            {
                "trace_job_id": str(wl.job_id[i]),
                "kind": kind,
                "user": int(wl.user[i]),
                "trace_submit": int(wl.submit[i]),
                "trace_start": int(wl.real_start[i]),
                "nodes": int(wl.nodes[i]),
                "duration_s": int(dur),
                "limit_s": int(limit),
                "priority": p,
                "offset_real_s": at_s,
                "sleep_s": round(max(dur, 1) / factor, 3),
                "limit_min": max(1, math.ceil(limit / factor / 60)),
                "too_big": bool(wl.nodes[i] > cfg.nodes),
            }
        )

    for i in running[np.lexsort((running, wl.real_start[running]))]:
        rem = int(wl.real_start[i] + wl.duration[i] - t0)
        lim = int(wl.real_start[i] + wl.limit[i] - t0)
        add(int(i), "running_at_start", 0.0, rem, max(lim, rem), float(RUNNING_BOOST))
    for i in pending:
        add(int(i), "pending_at_start", 0.0, int(wl.duration[i]), int(wl.limit[i]), prio(int(i)))
    for i in wl.window(t0, t1 - 1):
        add(int(i), "window", (int(wl.submit[i]) - t0) / factor, int(wl.duration[i]), int(wl.limit[i]), prio(int(i)))
    df = pd.DataFrame(rows)
    if len(df):
        df["nice"] = -np.round(df["priority"]).astype(np.int64)
    return df


def users_of(jobs: pd.DataFrame | None) -> tuple[int, bool]:
    """(trace users, whether any job has none) of a plan: the accounts a cluster with accounting
    needs for it (ids 0..users-1), which is also the simulator's count of fair-share siblings
    (its highest user id + 1) when it replays the same plan."""
    if jobs is None or not len(jobs):
        return 0, False
    u = jobs["user"]
    return int(max(int(u.max()), -1)) + 1, bool((u < 0).any())


def _sbatch(row: dict, env: dict[str, str], tag: str, workdir: str, accounts: bool = False) -> str:
    args = [
        "sbatch",
        "--parsable",
        f"--job-name={tag}",
        "-N",
        str(row["nodes"]),
        "--exclusive",
        f"--time={row['limit_min']}",
        f"--chdir={workdir}",
        "--output=/dev/null",
        f"--comment=trace:{row['trace_job_id']}",
        f"--wrap=exec sleep {row['sleep_s']}",
    ]
    if row["nice"]:
        args.insert(2, f"--nice={int(row['nice'])}")
    if accounts:  # the trace user's account (a cluster with accounting: conf.associations)
        args.insert(2, f"--account={account_of(int(row.get('user', -1)))}")
    return run_client(args, env, timeout=60).strip().split(";")[0]


def run(
    jobs: pd.DataFrame,
    env: dict[str, str],
    jobcomp: str,
    factor: float,
    t0: int,
    tag: str = "mr",
    drain_s: float = 600.0,
    poll_s: float = 1.0,
    workdir: str = "/tmp",
    stop=None,
    submitted: dict[int, str] | None = None,
    progress_s: float = 60.0,
    accounts: bool = False,
    hold: bool = False,
) -> tuple[pd.DataFrame, dict]:
    """Submit ``jobs`` (from :func:`plan`) on schedule, wait until every scored job has started
    (or ``drain_s`` real seconds after the last submission), record Slurm's times, cancel
    what is left of *these* jobs. Returns (jobs with Slurm times, run facts). ``stop`` (a
    :class:`threading.Event`) ends submissions and the wait early (a background workload);
    ``submitted`` (a dict) is filled with the Slurm id of each job as it is submitted, so a
    caller can cancel them; if the submissions or the wait end by an exception (SIGTERM's
    :class:`stepkit.pool.Terminated` included) every job submitted so far is cancelled first.
    Progress is logged at least every ``progress_s`` seconds. ``accounts``: each job names its
    trace user's account (:func:`~.conf.account_of`; a cluster started with accounting).
    ``hold`` (a background, with ``stop``): after the last submission every job is left to run
    or wait until ``stop`` is set, however long that is (``drain_s`` and the scored jobs' starts
    do not end it): the workload a kept service is judged in must not vanish while a chain is
    still running because the window's submissions ran out."""
    if hold and stop is None:
        raise ValueError("hold=True needs a stop event: nothing else would end the replay")
    todo = jobs[~jobs["too_big"]].sort_values("offset_real_s", kind="stable")
    ids: dict[int, str] = {} if submitted is None else submitted
    lateness = []
    t_cpu = time.process_time()
    origin = time.time()
    n_scored = int((todo["kind"] == "window").sum())
    said = Progress(f"replay ({tag})", every_s=progress_s)
    try:
        for idx, row in todo.iterrows():
            due = origin + float(row["offset_real_s"])
            now = time.time()
            while due > now and not (stop is not None and stop.is_set()):  # wake at least once a minute to say so
                said.maybe("submitted %d of %d jobs; the next is due in %.0f s", len(ids), len(todo), due - now)
                nap = min(due - now, said.every_s)
                if stop is not None:
                    stop.wait(nap)
                else:
                    time.sleep(nap)
                now = time.time()
            if stop is not None and stop.is_set():
                break
            lateness.append(time.time() - due)
            ids[idx] = _sbatch(row.to_dict(), env, tag, workdir, accounts)
            said.maybe("submitted %d of %d jobs", len(ids), len(todo))
        last_sub = time.time()
        scored = {ids[i] for i in todo.index if i in ids and todo.at[i, "kind"] == "window"}
        started: dict[str, float] = {}
        deadline = math.inf if hold else last_sub + drain_s
        ours = set(ids.values())
        while time.time() < deadline and not (stop is not None and stop.is_set()):
            q = {j.job_id: j for j in squeue(env)}
            for jid in ours:
                j = q.get(jid)
                if j is not None and j.start is not None and j.state != "PENDING":
                    started.setdefault(jid, j.start)
                elif j is None:
                    started.setdefault(jid, float("nan"))  # finished: the jobcomp log has it
            if hold:  # only ``stop`` ends a held background
                said.maybe(
                    "all %d jobs submitted; %d of %d scored jobs started; held until the session stops",
                    len(ids),
                    len(scored & started.keys()),
                    n_scored,
                )
            elif scored <= started.keys():
                break
            else:
                said.maybe(
                    "all %d jobs submitted; %d of %d scored jobs started; waiting up to %.0f s more",
                    len(ids),
                    len(scored & started.keys()),
                    n_scored,
                    deadline - time.time(),
                )
            if stop is not None:
                stop.wait(poll_s)
            else:
                time.sleep(poll_s)
    except BaseException:  # SIGTERM (Terminated), a failed client call: these jobs are cancelled before it leaves
        cancel_ours(ids.values(), env)
        raise
    final = {j.job_id: j for j in squeue(env)}
    left = [jid for jid in ours if jid in final]
    if left:
        run_client(["scancel", *left], env)
    # give slurmctld a moment to write the cancelled jobs to the jobcomp log
    wait_until = time.time() + 30
    comp: dict[str, dict[str, str]] = {}
    while time.time() < wait_until:
        comp = read_jobcomp(jobcomp)
        if ours <= comp.keys():
            break
        time.sleep(0.5)
    out = jobs.copy()
    out["slurm_id"] = pd.Series({i: ids[i] for i in ids}, dtype="string")
    for col in ("slurm_submit", "slurm_start", "slurm_end"):
        out[col] = np.nan
    out["slurm_state"] = pd.Series(dtype="string")
    out["slurm_nodes"] = pd.Series(dtype="string")  # the nodes Slurm gave it (NodeList)
    for i, jid in ids.items():
        rec = comp.get(jid, {})
        sub = slurm_time(rec.get("SubmitTime", ""))
        st = slurm_time(rec.get("StartTime", ""))
        en = slurm_time(rec.get("EndTime", ""))
        if st is None and jid in final and final[jid].start is not None and final[jid].state != "PENDING":
            st = final[jid].start
        if sub is None and jid in final:
            sub = final[jid].submit
        state = rec.get("JobState", final[jid].state if jid in final else "UNKNOWN")
        # a job cancelled while pending has StartTime = its cancel time in the jobcomp log
        if state == "CANCELLED" and jid in final and final[jid].state == "PENDING":
            st = None
        out.at[i, "slurm_submit"] = sub if sub is not None else np.nan
        out.at[i, "slurm_start"] = st if st is not None else np.nan
        out.at[i, "slurm_end"] = en if en is not None else np.nan
        out.at[i, "slurm_state"] = state
        if st is not None and rec.get("NodeList") not in (None, "", "(null)", "None"):
            out.at[i, "slurm_nodes"] = rec["NodeList"]

    def to_trace(col: str) -> pd.Series:
        return t0 + (out[col] - origin) * factor

    out["submit_t"] = to_trace("slurm_submit")
    out["start_t"] = to_trace("slurm_start")
    out["slurm_wait_trace_s"] = (out["slurm_start"] - out["slurm_submit"]) * factor
    horizon = time.time()
    facts = {
        "origin_epoch": origin,
        "horizon_t": t0 + (horizon - origin) * factor,
        "submissions": len(ids),
        "submit_span_real_s": round(last_sub - origin, 1),
        "wall_s": round(time.time() - origin, 1),
        "cpu_s_client": round(time.process_time() - t_cpu, 2),
        "submit_lateness_max_s": round(max(lateness), 3) if lateness else 0.0,
        "submit_lateness_mean_s": round(float(np.mean(lateness)), 3) if lateness else 0.0,
        "scored": len(scored),
        "scored_started": int(
            sum(1 for j in scored if j in started or slurm_time(comp.get(j, {}).get("StartTime", "")))
        ),
        "cancelled_at_end": len(left),
        "too_big_skipped": int(jobs["too_big"].sum()) if len(jobs) else 0,
        "loadavg_end": open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else None,
    }
    return out, facts
