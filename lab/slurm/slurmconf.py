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
| backfill (a policy of :mod:`mirage_tasks.sim.policies`) | its ``slurm_scheduler``: conservative and named ``SchedulerType=sched/backfill`` (Slurm reserves for every job it tests, on named nodes: the comparison's simulator runs ``named``), none ``sched/builtin``; easy is not expressible (Slurm has no one-reservation mode): rendered as sched/backfill, its ``slurm_note`` reported | - |
| bf_interval_s | ``bf_interval`` (s, >= 1) | / factor |
| bf_window_s | ``bf_window`` (min, >= 1) | / factor |
| bf_resolution_s | ``bf_resolution`` (s, >= 1) | / factor |
| bf_max_job_test | ``bf_max_job_test`` | - |
| weight_age, max_age_s | ``PriorityWeightAge``, ``PriorityMaxAge`` (min); **ignored by Slurm without slurmdbd**, enforced with accounting | max age / factor |
| weight_size | ``PriorityWeightJobSize`` (PriorityFavorSmall=NO) | - |
| weight_fairshare, fs_halflife_s, fs_calc_period_s, weight_partition (multifactor with fair share) | ``PriorityWeightFairshare``, ``PriorityDecayHalfLife`` (min), ``PriorityCalcPeriod`` (min, >= 1), ``PriorityWeightPartition``, ``PriorityFlags=NO_FAIR_TREE`` (the classic factor the simulator computes); **without slurmdbd Slurm keeps no usage**; with accounting the association tree of :func:`associations` gives the simulator's factor | half-life, period / factor |
| priority (a policy) | its ``slurm_priority_type``; with ``slurm_per_job`` (trace) per job at submission: ``--nice=-<its slurm_priority>`` (replay) | - |
| age_cap false | not expressible (Slurm always caps at PriorityMaxAge) | - |
| max_jobs_per_user / max_nodes_per_user, grp_jobs / grp_nodes | need slurmdbd: not enforced without accounting; with it each trace user's association ``MaxJobs`` / ``GrpTRES=node``, the ``normal`` QOS's ``GrpJobs`` / ``GrpTRES=node`` (:func:`associations`) | - |
| capacity_*, short_partition_limit_s, holds | not rendered (one partition, every node in service, no holds) | - |
| (accounting) | ``AccountingStorageType=accounting_storage/slurmdbd``, ``AccountingStorageEnforce=associations,limits,qos`` and :func:`render_dbd`'s ``slurmdbd.conf``, when :func:`render` is given the slurmdbd port | - |

``PriorityCalcPeriod`` is Slurm's minimum, 1 minute (``factor`` trace minutes): ages between
recalculations are stale by up to that much.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirage_tasks.sim.config import SimConfig
from mirage_tasks.sim.policies import backfill_policy, priority_policy

# the product's half (what such a Slurm enforces, in the simulator's terms), named here too so
# that the lab reads one module for a local Slurm's configuration
from mirage_tasks.slurm.conf import back_to_sim as back_to_sim, scaled as scaled, sim_config as sim_config


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
    def ctld_log(self) -> str:
        return f"{self.root}/log/slurmctld.log"

    @property
    def pids(self) -> str:
        return f"{self.root}/pids"

    @property
    def db_dir(self) -> str:  # MariaDB's data directory (accounting only)
        return f"{self.root}/mysql"

    @property
    def db_socket(self) -> str:
        return f"{self.root}/munge-run/mysql.sock"

    @property
    def dbd_conf(self) -> str:  # slurmdbd reads it beside SLURM_CONF
        return f"{self.root}/slurmdbd.conf"


def unsupported(cfg: SimConfig, accounting: bool = False) -> list[str]:
    """Simulator settings of ``cfg`` that the rendered Slurm does not enforce (``accounting``: the
    cluster runs slurmdbd with the associations of :func:`associations`)."""
    out = []
    if cfg.weight_age > 0 and not accounting:
        out.append(
            "PriorityWeightAge: Slurm ignores the age factor without slurmdbd (the comparison's simulator "
            "uses weight_age 0)"
        )
    bp, pp = backfill_policy(cfg.backfill), priority_policy(cfg.priority)
    if bp.slurm_note:
        out.append(f"backfill={bp.name}: {bp.slurm_note}")
    if pp.slurm_note:
        out.append(f"priority={pp.name}: {pp.slurm_note}")
    if not cfg.age_cap:
        out.append("age_cap=false: Slurm always caps the age factor at PriorityMaxAge")
    fair = priority_policy(cfg.priority).fair_share(cfg)
    if fair and not accounting:
        out.append(
            f"fair share (weight_fairshare={cfg.weight_fairshare:g}, fs_halflife_s={cfg.fs_halflife_s}): "
            "rendered, but Slurm keeps no usage without slurmdbd (the comparison's simulator uses "
            "weight_fairshare 0)"
        )
    if fair and accounting and cfg.warm_start:
        out.append(
            "warm_start: Slurm's usage starts from zero (it cannot be given the trace's past); the "
            "comparison's simulator starts from zero too"
        )
    if (cfg.max_jobs_per_user or cfg.max_nodes_per_user) and not accounting:
        out.append(
            f"per-user limits (max_jobs_per_user={cfg.max_jobs_per_user}, max_nodes_per_user="
            f"{cfg.max_nodes_per_user}): QOS limits need slurmdbd, which this cluster does not run"
        )
    if (cfg.grp_jobs or cfg.grp_nodes) and not accounting:
        out.append(
            f"QOS group limits (grp_jobs={cfg.grp_jobs}, grp_nodes={cfg.grp_nodes}): QOS limits need "
            "slurmdbd, which this cluster does not run"
        )
    if accounting and (cfg.max_nodes_per_user or cfg.grp_nodes):
        out.append(
            "a job larger than max_nodes_per_user or grp_nodes: the simulator lets it run alone, Slurm "
            "holds it (GrpTRES=node)"
        )
    if cfg.capacity_window_s:
        out.append("capacity_window_s: every node stays in service")
    if cfg.short_partition_limit_s:
        out.append("short_partition_limit_s: one partition")
    if cfg.holds != "none":
        out.append("holds=inferred: no dependencies are submitted")
    if cfg.tick_s:
        out.append(f"tick_s={cfg.tick_s}: Slurm is event driven")
    return out


#: The association tree of a cluster with accounting (:func:`associations`): under the root one
#: account, ``trace``, holding one sub-account per trace user (``u<code>``, the simulator's dense
#: user id), one for the service whose chain is kept and one for jobs without a user. Every job is
#: submitted by root, with ``--account`` naming its trace user (:func:`account_of`); each sub-account holds one
#: association (user root), so Slurm's classic factor for it is the simulator's: the sub-accounts
#: are siblings with one share each (S = 1 / (users + 1) with the service), ``trace`` holds all
#: the usage, and its raw share (:data:`TRACE_SHARES`) against root's own association (which holds
#: no jobs) makes its normalised share 1 to within 1e-6.
TRACE_ACCOUNT, SERVICE_ACCOUNT, UNKNOWN_ACCOUNT = "trace", "service", "nouser"
#: The QOS of the service's and the unknown users' jobs: the simulator exempts both from the limits.
SERVICE_QOS = "service"
TRACE_SHARES = 1_000_000


def account_of(user: int) -> str:
    """The Slurm account of a job of trace user ``user`` (dense id, -1 unknown)."""
    return f"u{int(user)}" if int(user) >= 0 else UNKNOWN_ACCOUNT


def associations(cfg: SimConfig, users: int, unknown: bool = False, cluster_name: str = "mirage") -> list[list[str]]:
    """The ``sacctmgr -i`` argument lists that build the association tree for ``users`` trace users
    (ids 0..users-1; ``unknown``: also an account for jobs without a user, which is one more
    sibling than the simulator counts, so it is created only when such jobs are submitted) and
    ``cfg``'s limits: per-user ``max_jobs_per_user`` as each trace user's
    ``MaxJobs``, ``max_nodes_per_user`` as its ``GrpTRES=node``; ``grp_jobs``/``grp_nodes`` as the
    ``normal`` QOS's ``GrpJobs``/``GrpTRES=node`` (the trace's jobs together); the service and
    unknown users in QOS ``service``, without limits, as in the simulator."""
    c = f"cluster={cluster_name}"
    out = [["add", "cluster", cluster_name], ["add", "qos", SERVICE_QOS]]
    grp = [
        f"GrpJobs={int(cfg.grp_jobs) if cfg.grp_jobs else -1}",
        f"GrpTRES=node={int(cfg.grp_nodes) if cfg.grp_nodes else -1}",
    ]
    out.append(["modify", "qos", "where", "name=normal", "set", *grp])
    out.append(["add", "account", TRACE_ACCOUNT, "parent=root", c, f"Fairshare={TRACE_SHARES}"])
    names = [account_of(u) for u in range(int(users))]
    exempt = [SERVICE_ACCOUNT] + ([UNKNOWN_ACCOUNT] if unknown else [])
    limits = []
    if cfg.max_jobs_per_user:
        limits.append(f"MaxJobs={int(cfg.max_jobs_per_user)}")
    if cfg.max_nodes_per_user:
        limits.append(f"GrpTRES=node={int(cfg.max_nodes_per_user)}")
    for i in range(0, len(names + exempt), ACCOUNTS_PER_CALL):
        out.append(
            [
                "add",
                "account",
                ",".join((names + exempt)[i : i + ACCOUNTS_PER_CALL]),
                f"parent={TRACE_ACCOUNT}",
                c,
                "Fairshare=1",
            ]
        )
    for i in range(0, len(names), ACCOUNTS_PER_CALL):
        out.append(
            [
                "add",
                "user",
                "root",
                f"account={','.join(names[i : i + ACCOUNTS_PER_CALL])}",
                c,
                "qos=normal",
                "defaultqos=normal",
                *limits,
            ]
        )
    out.append(
        [
            "add",
            "user",
            "root",
            f"account={','.join(exempt)}",
            c,
            f"qos=normal,{SERVICE_QOS}",
            f"defaultqos={SERVICE_QOS}",
        ]
    )
    return out


#: Accounts named per ``sacctmgr`` call (its command line stays short).
ACCOUNTS_PER_CALL = 200


def render_dbd(paths: Paths, dbd_port: int, db_port: int, password: str) -> str:
    """``slurmdbd.conf`` for the local MariaDB on ``db_port`` (user ``slurm``, ``password``)."""
    return (
        "\n".join(
            [
                "# written by lab.slurm.cluster (make slurm SLURM_ACCOUNTING=1); mode 600",
                "AuthType=auth/munge",
                f"AuthInfo=socket={paths.munge_socket}",
                "DbdHost=localhost",
                "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}",
                "SlurmUser=root",
                "CommunicationParameters=NoInAddrAny",  # 127.0.0.1 only, as slurm.conf's daemons
                f"LogFile={paths.logs}/slurmdbd.log",
                f"PidFile={paths.pids}/slurmdbd.pid",
                "DebugLevel=info",
                "StorageType=accounting_storage/mysql",
                "StorageHost=127.0.0.1",
                f"StoragePort={db_port}",
                "StorageUser=slurm",
                f"StoragePass={password}",
                "StorageLoc=slurm_acct_db",
            ]
        )
        + "\n"
    )


def _accounting_lines(paths: Paths, dbd_port: int | None) -> list[str]:
    if dbd_port is None:
        return ["AccountingStorageType=accounting_storage/none"]
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={dbd_port}",
        f"AccountingStoragePass={paths.munge_socket}",
        "AccountingStorageEnforce=associations,limits,qos",
    ]


def _priority_lines(s: dict[str, int]) -> list[str]:
    if "weight_fairshare" not in s:
        return [
            "PriorityWeightFairshare=0",
            "PriorityWeightPartition=0",
            "PriorityWeightQOS=0",
            "PriorityWeightAssoc=0",
            "PriorityCalcPeriod=1",
        ]
    return [
        f"PriorityWeightFairshare={s['weight_fairshare']}",
        f"PriorityWeightPartition={s['weight_partition']}",
        "PriorityWeightQOS=0",
        "PriorityWeightAssoc=0",
        f"PriorityCalcPeriod={s['fs_calc_period_min']}",
        f"PriorityDecayHalfLife={_age(s['fs_halflife_min'])}",
        "PriorityFlags=NO_FAIR_TREE",
        "PriorityUsageResetPeriod=NONE",
    ]


def _age(minutes: int) -> str:
    d, rem = divmod(int(minutes), 1440)
    return f"{d}-{rem // 60:02d}:{rem % 60:02d}"


def render(
    cfg: SimConfig,
    factor: float,
    paths: Paths,
    ctld_port: int,
    node_ports: tuple[int, int],
    cluster_name: str = "mirage",
    dbd_port: int | None = None,
    debug_flags: str = "",
) -> str:
    """The whole ``slurm.conf`` text. ``node_ports`` = (first, last) slurmd port, one per node;
    ``dbd_port``: accounting through the slurmdbd listening there (else none); ``debug_flags``:
    slurmctld's ``DebugFlags`` (e.g. ``Backfill``: why each job was or was not backfilled)."""
    s = scaled(cfg, factor)
    n = int(cfg.nodes)
    if node_ports[1] - node_ports[0] + 1 != n:
        raise ValueError(f"{n} nodes need {n} slurmd ports, got {node_ports}")
    sched = backfill_policy(cfg.backfill).slurm_scheduler
    params = (
        f"bf_interval={s['bf_interval_s']},bf_window={s['bf_window_min']},bf_resolution={s['bf_resolution_s']},"
        f"bf_max_job_test={s['bf_max_job_test']},default_queue_depth={max(100, s['bf_max_job_test'])},"
        "bf_continue,sched_interval=1"
    )
    names = f"n[1-{n}]" if n > 1 else "n1"
    ports = f"[{node_ports[0]}-{node_ports[1]}]" if n > 1 else str(node_ports[0])
    lines = [
        "# written by lab.slurm.slurmconf from a mirage SimConfig; see that module for the mapping",
        f"# compression factor {factor:g} (trace seconds per real second)",
        f"ClusterName={cluster_name}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        # bind to the host name's address, not to any: the daemons run with the host name localhost
        # (lab.slurm.cluster), so every listening socket is on 127.0.0.1 only
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={paths.munge_socket}",
        f"StateSaveLocation={paths.state}",
        f"SlurmdSpoolDir={paths.spool}/%n",
        f"SlurmctldPidFile={paths.pids}/slurmctld.pid",
        f"SlurmdPidFile={paths.pids}/slurmd-%n.pid",
        f"SlurmctldLogFile={paths.ctld_log}",
        f"SlurmdLogFile={paths.logs}/slurmd-%n.log",
        "SlurmctldDebug=info",
        *([f"DebugFlags={debug_flags}"] if debug_flags else []),
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
        *_accounting_lines(paths, dbd_port),
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
