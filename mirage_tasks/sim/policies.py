"""The simulator's scheduling policies, each declared once: queue order (priority) and backfill.

A policy is a small frozen object: its name (the value of ``SimConfig.priority`` or
``SimConfig.backfill``), a one-line help text, the :class:`~mirage_tasks.sim.config.SimConfig`
fields it reads, whether calibration searches it, what ``slurm.conf`` renders for it, and the
few methods the engine calls. Everything else derives from the registry below: the modes a
configuration accepts (``config.BACKFILL_MODES``, ``config.PRIORITY_MODES``), the ``--backfill``
and ``--priority`` help, calibration's search space (:func:`searched_backfill`,
:func:`searched_priority`) and the Slurm rendering (``lab.slurm.slurmconf``,
:mod:`lab.slurm.replay`).

The engine resolves both policies once per :class:`~mirage_tasks.sim.engine.Simulator`:

* backfill: :attr:`BackfillPolicy.passes` (whether backfill passes run at all),
  :meth:`BackfillPolicy.reservations` (how many jobs that cannot start now a pass may reserve
  nodes for: every one for ``conservative``, the first for ``easy``) and
  :attr:`BackfillPolicy.named_nodes` (jobs are placed on named nodes and reservations hold
  specific ones, :mod:`.named`; ``named``);
* priority: :meth:`PriorityPolicy.static` (the static part of a trace job's priority, to which
  the engine adds the age and job-size terms), :meth:`PriorityPolicy.default_static` (jobs
  without one, and probe jobs) and :meth:`PriorityPolicy.fair_share` (whether the engine keeps
  the fair-share ledger of :mod:`.fairshare` and adds its term).

A new policy: declare a :class:`BackfillPolicy` or :class:`PriorityPolicy` (subclass it to
override a method) and :func:`register` it, in this file or in a module this file imports, plus
its test: at most three files (``tests/mirage/test_sim_policies.py`` does it inside the test).
No numpy at import: :mod:`.config` reads this module and must stay cheap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ``reservations`` of a policy that reserves for every job it examines.
ALL = 1 << 60


@dataclass(frozen=True)
class BackfillPolicy:
    """A backfill policy (``SimConfig.backfill``)."""

    name: str
    help: str
    params: tuple[str, ...] = ("bf_interval_s", "bf_window_s", "bf_resolution_s", "bf_max_job_test")
    passes: bool = True  # False: no backfill pass runs (the main scheduler only)
    reserve: int = ALL  # jobs a pass may reserve nodes for (see reservations)
    searched: bool = True  # offered to the calibration search
    slurm_scheduler: str = "sched/backfill"  # SchedulerType it renders as
    slurm_as: str | None = None  # the policy the rendered Slurm enforces, when not this one
    slurm_note: str = ""  # why the rendered Slurm differs (listed as unsupported)
    named_nodes: bool = False  # jobs get named nodes and reservations hold them (.named)

    def reservations(self, cfg: Any) -> int:
        """How many jobs that cannot start now one pass may reserve nodes for."""
        return self.reserve

    def slurm_equivalent(self) -> str:
        return self.slurm_as or self.name


@dataclass(frozen=True)
class PriorityPolicy:
    """A queue-order policy (``SimConfig.priority``). The priority of job ``j`` at time ``t``
    is ``static(j) + weight_age * age_factor + weight_size * nodes / cluster_nodes`` (see
    :mod:`.config`); the policy supplies ``static``."""

    name: str
    help: str
    params: tuple[str, ...] = ("weight_age", "max_age_s", "age_cap", "weight_size")
    needs_recorded: bool = False  # reads the trace's recorded priorities (calibration offers it only then)
    searched: bool = True  # offered to the calibration search
    slurm_priority_type: str = "priority/multifactor"
    slurm_per_job: bool = False  # the replay passes each job's static priority as --nice
    slurm_note: str = ""  # why the rendered Slurm differs (listed as unsupported)

    def static(self, cfg: Any, wl: Any, i: int, default: float) -> float:
        """The static priority of trace job ``i`` (``default``: :meth:`default_static`)."""
        return 0.0

    def default_static(self, wl: Any, cfg: Any) -> float:
        """The static priority of jobs without one of their own, and of probe jobs."""
        return 0.0

    def slurm_priority(self, wl: Any, i: int, default: float) -> float:
        """The priority the replay submits job ``i`` with (``--nice=-value``)."""
        return 0.0

    def slurm_default(self, wl: Any) -> float:
        return 0.0

    def fair_share(self, cfg: Any) -> bool:
        """Whether the engine keeps fair-share usage (:mod:`.fairshare`) for this policy."""
        return False


@dataclass(frozen=True)
class MultifactorPriority(PriorityPolicy):
    """Slurm's priority/multifactor: age, job size, partition and the classic fair share with
    usage decay (:mod:`.fairshare`). The static part is the partition term."""

    def static(self, cfg: Any, wl: Any, i: int, default: float) -> float:
        short = cfg.short_partition_limit_s
        factor = cfg.short_partition_factor if short and wl.limit[i] <= short else 1.0
        return cfg.weight_partition * factor

    def default_static(self, wl: Any, cfg: Any) -> float:
        """Probe jobs run in the main partition (factor 1)."""
        return float(cfg.weight_partition)

    def fair_share(self, cfg: Any) -> bool:
        return cfg.weight_fairshare > 0


@dataclass(frozen=True)
class TracePriority(PriorityPolicy):
    """The priority the trace recorded (``trace_age_backout`` subtracts its age term)."""

    def static(self, cfg: Any, wl: Any, i: int, default: float) -> float:
        p = wl.priority[i]
        if p != p:  # NaN
            return default
        if cfg.trace_age_backout:
            wait = max(0, int(wl.real_start[i] - wl.submit[i]))
            age = min(wait, cfg.max_age_s) if cfg.age_cap else wait
            return float(p) - cfg.weight_age * age / cfg.max_age_s
        return float(p)

    def default_static(self, wl: Any, cfg: Any) -> float:
        """The median static part over the trace."""
        import numpy as np

        p = wl.priority
        ok = ~np.isnan(p)
        if not ok.any():
            return 0.0
        if not cfg.trace_age_backout:
            return float(np.median(p[ok]))
        wait = np.maximum(wl.real_start[ok] - wl.submit[ok], 0)
        age = np.minimum(wait, cfg.max_age_s) if cfg.age_cap else wait
        return float(np.median(p[ok] - cfg.weight_age * age / cfg.max_age_s))

    def slurm_priority(self, wl: Any, i: int, default: float) -> float:
        p = wl.priority[i]
        return default if p != p else float(p)

    def slurm_default(self, wl: Any) -> float:
        import numpy as np

        return float(np.nanmedian(wl.priority)) if (~np.isnan(wl.priority)).any() else 0.0


BACKFILL: dict[str, BackfillPolicy] = {}
PRIORITY: dict[str, PriorityPolicy] = {}


def register(policy: BackfillPolicy | PriorityPolicy, replace: bool = False) -> None:
    """Make ``policy`` a value of ``SimConfig.backfill`` or ``SimConfig.priority``."""
    table = BACKFILL if isinstance(policy, BackfillPolicy) else PRIORITY
    if not isinstance(policy, (BackfillPolicy, PriorityPolicy)):
        raise TypeError(f"not a policy: {policy!r}")
    if policy.name in table and not replace:
        raise ValueError(f"policy {policy.name!r} is already registered")
    table[policy.name] = policy


def unregister(name: str, kind: str) -> None:
    """Remove a registered policy (``kind``: "backfill" or "priority"); tests use it."""
    (BACKFILL if kind == "backfill" else PRIORITY).pop(name, None)


def backfill_policy(name: str) -> BackfillPolicy:
    return BACKFILL[name]


def priority_policy(name: str) -> PriorityPolicy:
    return PRIORITY[name]


def backfill_names() -> tuple[str, ...]:
    return tuple(BACKFILL)


def priority_names() -> tuple[str, ...]:
    return tuple(PRIORITY)


def searched_backfill() -> list[str]:
    """The backfill policies calibration searches."""
    return [p.name for p in BACKFILL.values() if p.searched]


def searched_priority(has_recorded: bool) -> list[str]:
    """The priority policies calibration searches (those reading recorded priorities only
    when the trace has them)."""
    return [p.name for p in PRIORITY.values() if p.searched and (has_recorded or not p.needs_recorded)]


def help_text(kind: str) -> str:
    """``name: help | ...`` for the command-line flag."""
    table = BACKFILL if kind == "backfill" else PRIORITY
    return " | ".join(f"{p.name} ({p.help})" for p in table.values())


register(
    BackfillPolicy("conservative", "a reservation for every job examined that cannot start now", slurm_as="named")
)  # Slurm reserves named nodes (.named): its comparison's simulator uses those
register(
    BackfillPolicy(
        "easy",
        "a reservation only for the first job that cannot start now",
        reserve=1,
        slurm_as="named",
        slurm_note="Slurm's backfill reserves for every job it tests (rendered as conservative)",
    )
)
register(
    BackfillPolicy(
        "named",
        "conservative on named nodes: Slurm's select/linear best-fit placement, reservations on "
        "the nodes chosen (what Slurm's sched/backfill with select/linear does)",
        named_nodes=True,
        searched=False,
    )
)  # offered to calibration only once a log's fit is checked with it
register(
    BackfillPolicy(
        "none",
        "no backfill: the main scheduler's strict priority order only",
        params=(),
        passes=False,
        slurm_scheduler="sched/builtin",
    )
)
register(PriorityPolicy("age_size", "age and job size only"))
register(
    TracePriority(
        "trace",
        "the trace's recorded priority plus age and size",
        needs_recorded=True,
        slurm_per_job=True,
        params=("weight_age", "max_age_s", "age_cap", "weight_size", "trace_age_backout"),
    )
)
register(
    MultifactorPriority(
        "multifactor",
        "Slurm's multifactor: age, size, partition and classic fair share with usage decay",
        searched=False,  # calibration searches it only when asked (calibrate --search-fairshare)
        params=(
            "weight_age",
            "max_age_s",
            "age_cap",
            "weight_size",
            "weight_fairshare",
            "fs_halflife_s",
            "fs_calc_period_s",
            "weight_partition",
            "short_partition_factor",
        ),
    )
)
