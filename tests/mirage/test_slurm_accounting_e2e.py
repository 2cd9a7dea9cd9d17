"""E2E tier: a real local Slurm with accounting (slurmdbd on a local MariaDB, started by
LocalSlurm in a temporary root and stopped after) enforces what the simulator models: Slurm's
classic fair-share factor equals the simulator's for the same usage, a light user's job goes
before a heavy user's, and a per-user running-jobs limit holds a job while a node is free.
Skips only where Slurm, slurmdbd or MariaDB is not installed (make system-deps installs them)
or the tests do not run as root."""

from __future__ import annotations

import os
import time

import pytest
from proctree import wait_for

from lab.slurm import slurmconf as conf
from lab.slurm.cluster import LocalSlurm, _alive, missing_accounting, missing_binaries
from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.fairshare import FairShare
from mirage_tasks.slurm.queue import read_jobcomp, run_client, slurm_time, squeue

_missing = missing_binaries() + missing_accounting()
pytestmark = pytest.mark.skipif(
    bool(_missing) or os.geteuid() != 0,
    reason=(
        f"not installed: {', '.join(_missing)} (make system-deps installs Debian's slurmctld, slurmd, "
        "slurm-client, munge, slurmdbd and mariadb-server)"
        if _missing
        else "the local Slurm's daemons run as root"
    ),
)

FACTOR = 60


def _sbatch(env, account: str, nodes: int, sleep_s: float, name: str) -> str:
    return (
        run_client(
            [
                "sbatch",
                "--parsable",
                f"--account={account}",
                f"--job-name={name}",
                "-N",
                str(nodes),
                "--exclusive",
                "-t",
                "5",
                "--output=/dev/null",
                "--chdir=/tmp",
                f"--wrap=exec sleep {sleep_s}",
            ],
            env,
        )
        .strip()
        .split(";")[0]
    )


def _shares(env) -> dict[str, tuple[float, float]]:
    """(raw usage, fair-share factor) of root's association under each account (sshare)."""
    out = run_client(["sshare", "-a", "-n", "-P", "-o", "Account,User,RawUsage,FairShare"], env)
    res = {}
    for ln in out.splitlines():
        acct, user, raw, f = (ln.split("|") + ["", "", "", ""])[:4]
        if user.strip() == "root" and f.strip():
            res[acct.strip()] = (float(raw or 0), float(f))
    return res


def test_accounting_enforces_fair_share_and_limits_as_the_simulator_models(tmp_path):
    cfg = SimConfig(
        nodes=2,
        priority="multifactor",
        weight_age=0.0,
        weight_size=0.0,
        weight_fairshare=100000.0,
        fs_halflife_s=7 * 86400,
        fs_calc_period_s=300,
        max_jobs_per_user=1,
        bf_interval_s=60,
        bf_resolution_s=60,
    )
    c = LocalSlurm(tmp_path / "slurm")
    info = c.start(cfg, FACTOR, accounting=True, users=2)
    pids = c.running()
    try:
        assert set(pids) >= {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"}
        # nothing the simulator models is listed as unenforced any more
        notes = " ".join(info["unsupported"])
        assert not any(k in notes for k in ("PriorityWeightAge", "fair share (", "per-user limits", "group limits"))
        assert any(
            k in notes
            for k in ("PriorityWeightAge", "fair share (", "per-user limits")
            for notes in [" ".join(conf.unsupported(cfg.replace(weight_age=1.0)))]
        )
        text = (c.root / "slurm.conf").read_text()
        assert "AccountingStorageType=accounting_storage/slurmdbd" in text and "PriorityFlags=NO_FAIR_TREE" in text
        assert os.stat(c.paths.dbd_conf).st_mode & 0o777 == 0o600  # it holds the database password
        env = c.env()
        assocs = run_client(["sacctmgr", "-n", "-P", "list", "assoc", "format=Account,User,MaxJobs"], env)
        rows = {tuple(r.split("|")) for r in assocs.splitlines()}
        assert {("u0", "root", "1"), ("u1", "root", "1"), ("service", "root", "")} <= rows

        # u0 uses the whole cluster; at Slurm's next re-read (PriorityCalcPeriod: 1 real minute) each
        # account's factor must be the simulator's for the same usage (the classic formula over the
        # siblings u0, u1 and the service)
        big = _sbatch(env, "u0", 2, 600, "heavy")
        wait_for(
            lambda: [j for j in squeue(env) if j.job_id == big and j.state == "RUNNING"],
            "u0's job running",
            deadline_s=180,
        )
        late_heavy = _sbatch(env, "u0", 2, 2, "heavy2")  # submitted first ...
        time.sleep(1.5)
        light = _sbatch(env, "u1", 2, 2, "light")  # ... but u1 has used nothing
        t_wait = time.monotonic()
        got = wait_for(
            lambda: (f := _shares(env)) and f["u0"][1] < 0.9 and f, "Slurm's fair-share re-read", deadline_s=200
        )
        print(f"fair-share factors re-read after {time.monotonic() - t_wait:.0f} s: {got}")
        fs = FairShare(users=2, halflife_s=cfg.fs_halflife_s, period_s=cfg.fs_calc_period_s, weight=1.0, t0=0)
        fs.usage = {0: got["u0"][0], 1: got["u1"][0]}
        fs.refresh()
        assert got["u1"][0] == 0.0 and fs.factor[0] == pytest.approx(2.0**-3)
        for acct, f in {"u0": fs.factor[0], "u1": fs.default, "service": fs.default}.items():
            assert got[acct][1] == pytest.approx(f, abs=1e-4), (acct, got)
        run_client(["scancel", big], env)  # the two waiting jobs now go in fair-share order
        wait_for(
            lambda: {big, late_heavy, light} <= read_jobcomp(c.paths.jobcomp).keys(),
            "the three jobs ending",
            deadline_s=180,
        )
        comp = read_jobcomp(c.paths.jobcomp)
        start = {j: slurm_time(comp[j]["StartTime"]) for j in (late_heavy, light)}
        assert start[light] < start[late_heavy], (start, got)  # the light user's job went first

        # MaxJobs=1 per trace user: u1's second job waits although a node is free
        d1, d2 = _sbatch(env, "u1", 1, 6, "lim1"), _sbatch(env, "u1", 1, 1, "lim2")
        wait_for(
            lambda: (q := {j.job_id: j for j in squeue(env)}) and q.get(d1) and q[d1].state == "RUNNING" and q,
            "u1's first job running",
            deadline_s=180,
        )
        r = run_client(["squeue", "-h", "-j", d2, "-o", "%T %r"], env).split()
        assert r[:2] == ["PENDING", "AssocMaxJobsLimit"], r
        wait_for(lambda: {d1, d2} <= read_jobcomp(c.paths.jobcomp).keys(), "both limited jobs ending", deadline_s=180)
        comp = read_jobcomp(c.paths.jobcomp)
        assert slurm_time(comp[d2]["StartTime"]) >= slurm_time(comp[d1]["EndTime"])
    finally:
        said = c.stop()
    assert any("mariadbd" in s for s in said) and any("slurmdbd" in s for s in said)
    assert not any(_alive(p) for p in pids.values())
    assert c.leftovers() == []


def test_a_reread_counts_running_jobs_only_through_the_reread_before(tmp_path):
    """What the comparison's simulator models (``FairShare.running_lag``, set by
    ``compare.align_recalc``): slurmctld charges a running job's use to its user at each usage
    re-read, but the fair-share factor follows at the next one. u0 runs a job on the whole cluster
    from the start: after the first re-read u0's raw usage is already above 0 while its factor is
    still u1's (no usage); after the second it is 2^-3, as the simulator's ledger with the same
    timing gives at each of the two re-reads."""
    from lab.slurm.compare import last_recalc_epoch

    cfg = SimConfig(
        nodes=2,
        priority="multifactor",
        weight_age=0.0,
        weight_size=0.0,
        weight_fairshare=1000.0,
        fs_halflife_s=7 * 86400,
        fs_calc_period_s=60 * FACTOR,
    )
    c = LocalSlurm(tmp_path / "slurm")
    c.start(cfg, FACTOR, accounting=True, users=2)
    try:
        env = c.env()
        job = _sbatch(env, "u0", 2, 400, "from-the-start")
        wait_for(
            lambda: [j for j in squeue(env) if j.job_id == job and j.state == "RUNNING"],
            "the job running",
            deadline_s=180,
        )
        t_run = time.time()
        seen: list[tuple[float, dict]] = []  # (re-read epoch, sshare after it)

        def next_reread():
            last = seen[-1][0] if seen else t_run
            e = last_recalc_epoch(c.paths.state)
            if e is None or e <= last:
                return False
            time.sleep(1.0)  # the re-read has written its time; its factors are in slurmctld now
            seen.append((e, _shares(env)))
            return True

        for _ in range(2):
            wait_for(next_reread, "Slurm's next usage re-read", deadline_s=150)
        print(f"the job ran from {t_run:.1f}; re-reads and (raw usage, factor): {seen}")
        (t1, s1), (t2, s2) = seen
        assert 50 < t2 - t1 < 70  # PriorityCalcPeriod=1 (minute)
        assert s1["u0"][0] > 0.0 and s1["u1"][0] == 0.0, seen  # u0's use is charged at the first re-read ...
        assert s1["u0"][1] == pytest.approx(s1["u1"][1], abs=1e-6), seen  # ... but its factor has not moved
        assert s2["u0"][1] == pytest.approx(2.0**-3, abs=1e-3), seen  # and at the next re-read it has
    finally:
        c.stop()
    assert c.leftovers() == []

    # the simulator's ledger with Slurm's timing, fed the same: u0's job on both nodes from the start
    fs = FairShare(users=2, halflife_s=cfg.fs_halflife_s, period_s=cfg.fs_calc_period_s, weight=1.0, t0=0)
    fs.running_lag = True
    fs.start(0, user=0, nodes=2, t=10)
    fs.recalc(cfg.fs_calc_period_s)
    assert fs.usage[0] > 0.0 and fs.term(0) == fs.term(1)
    fs.recalc(2 * cfg.fs_calc_period_s)
    assert fs.term(0) == pytest.approx(2.0**-3) and fs.term(1) == pytest.approx(0.5)
    plain = FairShare(users=2, halflife_s=cfg.fs_halflife_s, period_s=cfg.fs_calc_period_s, weight=1.0, t0=0)
    plain.start(0, user=0, nodes=2, t=10)
    plain.recalc(cfg.fs_calc_period_s)
    assert plain.term(0) == pytest.approx(2.0**-3)  # without it the factor moves one re-read early
