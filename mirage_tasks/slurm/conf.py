"""``slurm.conf`` from the simulator's :class:`~mirage_tasks.sim.config.SimConfig`, time-compressed.

One cluster config drives both the simulator and the real local Slurm. Time settings are
divided by the compression ``factor`` (trace seconds per real second) and rounded to what
Slurm can express; :func:`scaled` reports each value Slurm gets, and :func:`unsupported`
names every simulator setting the rendered Slurm does not enforce, so a comparison can say
which rules were left out instead of hiding them.

Mapping (SimConfig -> slurm.conf):

| SimConfig | Slurm | scaled |
|---|---|---|
| nodes | ``NodeName=n[1-N]`` (one ``slurmd -N nX`` each), ``select/linear`` (whole nodes) | - |
| backfill (a policy of :mod:`mirage_tasks.sim.policies`) | its ``slurm_scheduler``: conservative ``SchedulerType=sched/backfill`` (Slurm reserves for every job it tests), none ``sched/builtin``; easy is not expressible (Slurm has no one-reservation mode): rendered as sched/backfill, its ``slurm_note`` reported | - |
| bf_interval_s | ``bf_interval`` (s, >= 1) | / factor |
| bf_window_s | ``bf_window`` (min, >= 1) | / factor |
| bf_resolution_s | ``bf_resolution`` (s, >= 1) | / factor |
| bf_max_job_test | ``bf_max_job_test`` | - |
| weight_age, max_age_s | ``PriorityWeightAge``, ``PriorityMaxAge`` (min), rendered but **ignored by Slurm without slurmdbd** | max age / factor |
| weight_size | ``PriorityWeightJobSize`` (PriorityFavorSmall=NO) | - |
| weight_fairshare, fs_halflife_s, fs_calc_period_s, weight_partition (multifactor with fair share) | ``PriorityWeightFairshare``, ``PriorityDecayHalfLife`` (min), ``PriorityCalcPeriod`` (min, >= 1), ``PriorityWeightPartition``, ``PriorityFlags=NO_FAIR_TREE`` (the classic factor the simulator computes); rendered but **without slurmdbd Slurm keeps no usage** | half-life, period / factor |
| priority (a policy) | its ``slurm_priority_type``; with ``slurm_per_job`` (trace) per job at submission: ``--nice=-<its slurm_priority>`` (replay) | - |
| age_cap false | not expressible (Slurm always caps at PriorityMaxAge) | - |
| max_jobs_per_user / max_nodes_per_user, grp_jobs / grp_nodes | need QOS limits, i.e. slurmdbd: not enforced here | - |
| capacity_*, short_partition_limit_s, holds | not rendered (one partition, every node in service, no holds) | - |

``PriorityCalcPeriod`` is Slurm's minimum, 1 minute (``factor`` trace minutes): ages between
recalculations are stale by up to that much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..sim.config import SimConfig
from ..sim.policies import backfill_policy, priority_policy


@dataclass(frozen=True)
class Paths:
    root: str  # var/slurm (absolute)

    @property
    def conf(self) -> str:
        return f"{self.root}/slurm.conf"

    @property
    def munge_dir(self) -> str:
        return f"{self.root}/munge"

    @property
    def munge_socket(self) -> str:
        return f"{self.root}/munge-run/munge.socket"

    @property
    def munge_key(self) -> str:
        return f"{self.root}/munge/munge.key"

    @property
    def state(self) -> str:
        return f"{self.root}/state"

    @property
    def spool(self) -> str:
        return f"{self.root}/spool"

    @property
    def logs(self) -> str:
        return f"{self.root}/log"

    @property
    def jobcomp(self) -> str:
        return f"{self.root}/log/jobcomp.txt"

    @property
    def pids(self) -> str:
        return f"{self.root}/pids"


def scaled(cfg: SimConfig, factor: float) -> dict[str, int]:
    """The scheduler settings Slurm gets for ``cfg`` at compression ``factor``."""
    f = float(factor)
    return {
        "bf_interval_s": max(1, round(cfg.bf_interval_s / f)),
        "bf_window_min": max(1, math.ceil(cfg.bf_window_s / f / 60)),
        "bf_resolution_s": max(1, round(cfg.bf_resolution_s / f)),
        "bf_max_job_test": int(cfg.bf_max_job_test),
        "max_age_min": max(1, math.ceil(cfg.max_age_s / f / 60)),
        "weight_age": int(round(cfg.weight_age)),
        "weight_size": int(round(cfg.weight_size)),
        **_fair_share_scaled(cfg, f),
    }


def _fair_share_scaled(cfg: SimConfig, f: float) -> dict[str, int]:
    """The multifactor settings added for fair share (none without it: the text stays as it was)."""
    if not priority_policy(cfg.priority).fair_share(cfg):
        return {}
    return {
        "weight_fairshare": int(round(cfg.weight_fairshare)),
        "fs_halflife_min": max(1, math.ceil(cfg.fs_halflife_s / f / 60)),
        "fs_calc_period_min": max(1, math.ceil(cfg.fs_calc_period_s / f / 60)),
        "weight_partition": int(round(cfg.weight_partition)),
    }


def back_to_sim(cfg: SimConfig, factor: float) -> SimConfig:
    """The simulator configuration that matches what the rendered Slurm enforces, in trace
    time: Slurm's rounded intervals times ``factor``, and the rules it does not enforce off."""
    s = scaled(cfg, factor)
    f = float(factor)
    return cfg.replace(
        bf_interval_s=max(1, int(round(s["bf_interval_s"] * f))),
        bf_window_s=int(s["bf_window_min"] * 60 * f),
        bf_resolution_s=max(1, int(round(s["bf_resolution_s"] * f))),
        max_age_s=int(s["max_age_min"] * 60 * f),
        age_cap=True, max_jobs_per_user=0, max_nodes_per_user=0, tick_s=0, warm_start=False, weight_fairshare=0.0,
        grp_jobs=0, grp_nodes=0,
        capacity_window_s=0, short_partition_limit_s=0, holds="none",
        backfill=backfill_policy(cfg.backfill).slurm_equivalent(),
    )


def unsupported(cfg: SimConfig) -> list[str]:
    """Simulator settings of ``cfg`` that the rendered Slurm does not enforce."""
    out = []
    if cfg.weight_age > 0:
        out.append("PriorityWeightAge: Slurm ignores the age factor without slurmdbd (the comparison's simulator "
                   "uses weight_age 0)")
    bp, pp = backfill_policy(cfg.backfill), priority_policy(cfg.priority)
    if bp.slurm_note:
        out.append(f"backfill={bp.name}: {bp.slurm_note}")
    if pp.slurm_note:
        out.append(f"priority={pp.name}: {pp.slurm_note}")
    if not cfg.age_cap:
        out.append("age_cap=false: Slurm always caps the age factor at PriorityMaxAge")
    if priority_policy(cfg.priority).fair_share(cfg):
        out.append(f"fair share (weight_fairshare={cfg.weight_fairshare:g}, fs_halflife_s={cfg.fs_halflife_s}): "
                   "rendered, but Slurm keeps no usage without slurmdbd (the comparison's simulator uses "
                   "weight_fairshare 0)")
    if cfg.max_jobs_per_user or cfg.max_nodes_per_user:
        out.append(f"per-user limits (max_jobs_per_user={cfg.max_jobs_per_user}, max_nodes_per_user="
                   f"{cfg.max_nodes_per_user}): QOS limits need slurmdbd, which this cluster does not run")
    if cfg.grp_jobs or cfg.grp_nodes:
        out.append(f"QOS group limits (grp_jobs={cfg.grp_jobs}, grp_nodes={cfg.grp_nodes}): QOS limits need "
                   "slurmdbd, which this cluster does not run")
    if cfg.capacity_window_s:
        out.append("capacity_window_s: every node stays in service")
    if cfg.short_partition_limit_s:
        out.append("short_partition_limit_s: one partition")
    if cfg.holds != "none":
        out.append("holds=inferred: no dependencies are submitted")
    if cfg.tick_s:
        out.append(f"tick_s={cfg.tick_s}: Slurm is event driven")
    return out


def _priority_lines(s: dict[str, int]) -> list[str]:
    if "weight_fairshare" not in s:
        return ["PriorityWeightFairshare=0", "PriorityWeightPartition=0", "PriorityWeightQOS=0",
                "PriorityWeightAssoc=0", "PriorityCalcPeriod=1"]
    return [f"PriorityWeightFairshare={s['weight_fairshare']}", f"PriorityWeightPartition={s['weight_partition']}",
            "PriorityWeightQOS=0", "PriorityWeightAssoc=0", f"PriorityCalcPeriod={s['fs_calc_period_min']}",
            f"PriorityDecayHalfLife={_age(s['fs_halflife_min'])}", "PriorityFlags=NO_FAIR_TREE",
            "PriorityUsageResetPeriod=NONE"]


def _age(minutes: int) -> str:
    d, rem = divmod(int(minutes), 1440)
    return f"{d}-{rem // 60:02d}:{rem % 60:02d}"


def render(cfg: SimConfig, factor: float, paths: Paths, ctld_port: int, node_ports: tuple[int, int],
           cluster_name: str = "mirage") -> str:
    """The whole ``slurm.conf`` text. ``node_ports`` = (first, last) slurmd port, one per node."""
    s = scaled(cfg, factor)
    n = int(cfg.nodes)
    if node_ports[1] - node_ports[0] + 1 != n:
        raise ValueError(f"{n} nodes need {n} slurmd ports, got {node_ports}")
    sched = backfill_policy(cfg.backfill).slurm_scheduler
    params = (f"bf_interval={s['bf_interval_s']},bf_window={s['bf_window_min']},bf_resolution={s['bf_resolution_s']},"
              f"bf_max_job_test={s['bf_max_job_test']},default_queue_depth={max(100, s['bf_max_job_test'])},"
              "bf_continue,sched_interval=1")
    names = f"n[1-{n}]" if n > 1 else "n1"
    ports = f"[{node_ports[0]}-{node_ports[1]}]" if n > 1 else str(node_ports[0])
    lines = [
        "# written by mirage_tasks.slurm.conf from a mirage SimConfig; see that module for the mapping",
        f"# compression factor {factor:g} (trace seconds per real second)",
        f"ClusterName={cluster_name}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        f"StateSaveLocation={paths.state}",
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmctldPidFile={paths.pids}/slurmctld.pid",
        f"SlurmdPidFile={paths.pids}/slurmd-%n.pid",
        f"SlurmctldLogFile={paths.logs}/slurmctld.log",
        f"SlurmdLogFile={paths.logs}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdTimeout=300",
        "SlurmctldTimeout=300",
        "InactiveLimit=0",
        "KillWait=2",
        "MinJobAge=300",
        "MaxJobCount=100000",
        "OverTimeLimit=0",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={paths.jobcomp}",
        "SelectType=select/linear",
        f"SchedulerType={sched}",
        f"SchedulerParameters={params}",
        f"PriorityType={priority_policy(cfg.priority).slurm_priority_type}",
        f"PriorityWeightAge={s['weight_age']}",
        f"PriorityMaxAge={_age(s['max_age_min'])}",
        f"PriorityWeightJobSize={s['weight_size']}",
        "PriorityFavorSmall=NO",
        *_priority_lines(s),
        f"NodeName={names} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports} CPUs=1 RealMemory=100 State=UNKNOWN",
        "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=EXCLUSIVE",
    ]
    return "\n".join(lines) + "\n"
