"""Scheduler configuration of one simulated partition (per trace, never hard-coded).

A :class:`SimConfig` holds everything the simulator needs to know about the cluster:
its size, the priority model and the backfill knobs. Presets live in :data:`PRESETS`;
``--cluster-config`` accepts a preset name or a JSON file of :class:`SimConfig` fields,
and the individual ``--nodes``/``--backfill``/... flags override it.

Priority (Slurm multifactor, simplified)::

    priority(job, t) = static(job)
                     + weight_age * age_factor          age_factor = min(age, max_age) / max_age
                                                        (no cap when age_cap is false)
                     + weight_size * nodes / cluster_nodes
                     + weight_fairshare * fairshare_factor(user, t)    multifactor only

``static`` is 0 in ``priority="age_size"`` mode. In ``priority="trace"`` mode it is the
priority the trace recorded for the job (Slurm's multifactor value with fair-share, QOS,
partition and size as the real scheduler computed it). ``trace_age_backout`` would also
subtract the age term that value may contain (``weight_age * min(real wait, max_age) /
max_age``); that uses the job's real wait, i.e. the outcome being simulated, so it is off
by default and only kept to show the effect in the fidelity report. In
``priority="multifactor"`` (Slurm's multifactor plugin with the classic fair share, see
:mod:`.fairshare`) it is ``weight_partition`` times the partition's normalised job factor,
and the fair-share term, re-read every ``fs_calc_period_s``, is added.

The priority and backfill modes are the policies declared in :mod:`.policies` (``static`` is
the priority policy's); :data:`BACKFILL_MODES` and :data:`PRIORITY_MODES` list the registered ones.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import os
from dataclasses import dataclass
from typing import Any

from stepkit import StepError

from . import policies

HOLDS_MODES = ("none", "inferred")


def __getattr__(name: str) -> Any:
    """``BACKFILL_MODES`` and ``PRIORITY_MODES``: the registered policies' names (read
    anew each time, so a policy registered later counts; see :mod:`.policies`)."""
    if name == "BACKFILL_MODES":
        return policies.backfill_names()
    if name == "PRIORITY_MODES":
        return policies.priority_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The largest cluster a configuration may describe (the largest machines have ~10^5 nodes).
MAX_NODES = 10_000_000


@dataclass(frozen=True)
class SimConfig:
    """One partition's scheduler model. Times in seconds."""

    nodes: int
    backfill: str = "conservative"  # a registered backfill policy (.policies): conservative | easy | none
    bf_interval_s: int = 30  # Slurm bf_interval: a backfill pass at most this often
    bf_window_s: int = 2 * 86400  # Slurm bf_window: no reservation starts later than now + window
    bf_resolution_s: int = 600  # Slurm bf_resolution: planned run times rounded up to this
    bf_max_job_test: int = 3000  # Slurm bf_max_job_test: jobs examined per pass
    priority: str = "age_size"  # a registered priority policy (.policies): age_size | trace
    weight_age: float = 7000.0  # PriorityWeightAge
    max_age_s: int = 7 * 86400  # PriorityMaxAge
    age_cap: bool = True  # Slurm caps the age factor at 1; the reference did not
    weight_size: float = 100.0  # PriorityWeightJobSize (favours larger jobs)
    trace_age_backout: bool = False  # trace mode: subtract the age term of the real wait (uses the outcome!)
    max_jobs_per_user: int = 0  # MaxJobsPerUser on the partition's QOS (0 = no limit)
    max_nodes_per_user: int = 0  # MaxTRESPerUser=node=... (0 = no limit)
    tick_s: int = 0  # 0 = event driven; 60 = the reference's per-minute clock
    warm_start: bool = True  # start episodes from the trace's running/pending set
    procs_per_node: int = 0  # converts processor counts to nodes where a trace has no node count
    dispatch_latency_s: int = 0  # decision -> recorded start; added to simulated waits in fidelity/calibrate
    # Effective capacity (nodes in service) read from the trace's past: every capacity_step_s the
    # partition holds min(nodes, the capacity_quantile of the trace's busy nodes over the preceding
    # capacity_window_s). Drains, maintenance and reservations show as nodes the real scheduler did
    # not use. 0 = off (a fixed ``nodes``). See mirage_tasks/sim/workload.py (capacity_schedule).
    capacity_window_s: int = 0
    capacity_quantile: float = 1.0
    capacity_step_s: int = 3600
    # Jobs with a time limit of at most this many seconds form a second partition on the same
    # nodes (ls6: gpu-a100-dev / -small beside gpu-a100): the main scheduler keeps strict
    # priority order within each partition, so a blocked long job does not hold back a short
    # one that fits now (and vice versa). 0 = one partition.
    short_partition_limit_s: int = 0
    # Job holds the export does not record (dependencies, array throttles). "inferred": a job
    # is held until the predecessor that :func:`~mirage_tasks.sim.workload.infer_holds` names
    # for it has ended *in the simulation* (same user, submitted before the predecessor ended,
    # real start within holds_tolerance_s after its real end). The pairing is read from real
    # start times, i.e. part of the outcome: a reconstruction of missing input, not a
    # prediction. "none" (default): every job is eligible at its submission.
    holds: str = "none"
    holds_tolerance_s: int = 60
    # Slurm's fair share (priority="multifactor", see .fairshare): the classic factor
    # 2^(-effective usage / normalized shares) of each trace user (one share each, all users
    # under one account), usage in node-seconds decayed with PriorityDecayHalfLife and
    # re-read every PriorityCalcPeriod. The partition factor: PriorityWeightPartition times
    # the job's partition's PriorityJobFactor normalised (main partition 1, the short one
    # short_partition_factor). Fields added after stored outputs existed: at their defaults
    # to_dict() leaves them out, so stored configurations and run keys stay as they were.
    weight_fairshare: float = 0.0  # PriorityWeightFairshare
    fs_halflife_s: int = 7 * 86400  # PriorityDecayHalfLife
    fs_calc_period_s: int = 300  # PriorityCalcPeriod
    weight_partition: float = 0.0  # PriorityWeightPartition
    short_partition_factor: float = 1.0  # the short partition's normalised PriorityJobFactor (main: 1)
    # The partition QOS's group limits on the trace's jobs together (the service keeps its own
    # QOS, as it is exempt from the per-user limits): GrpJobs and GrpTRES=node. A job larger
    # than grp_nodes may run alone (as with max_nodes_per_user). 0 = no limit.
    grp_jobs: int = 0
    grp_nodes: int = 0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        if not 1 <= self.nodes <= MAX_NODES:
            raise StepError(
                f"nodes must be a positive number of nodes (the cluster size) up to {MAX_NODES}, got {self.nodes}"
            )
        if self.backfill not in policies.BACKFILL:
            raise StepError(f"backfill must be one of {policies.backfill_names()}, got {self.backfill!r}")
        if self.priority not in policies.PRIORITY:
            raise StepError(f"priority must be one of {policies.priority_names()}, got {self.priority!r}")
        for name in ("bf_interval_s", "bf_resolution_s", "max_age_s"):
            if int(getattr(self, name)) < 1:
                raise StepError(f"{name} must be >= 1")
        if self.holds not in HOLDS_MODES:
            raise StepError(f"holds must be one of {HOLDS_MODES}, got {self.holds!r}")
        if self.holds_tolerance_s < 0:
            raise StepError("holds_tolerance_s must be >= 0")
        if self.capacity_window_s < 0 or self.capacity_step_s < 1:
            raise StepError("capacity_window_s must be >= 0 (0 = off) and capacity_step_s >= 1")
        if self.short_partition_limit_s < 0:
            raise StepError("short_partition_limit_s must be >= 0 (0 = one partition)")
        if not 0.0 <= self.capacity_quantile <= 1.0:
            raise StepError(f"capacity_quantile must lie in [0, 1], got {self.capacity_quantile}")
        if self.dispatch_latency_s < 0:
            raise StepError("dispatch_latency_s must be >= 0")
        for name in ("fs_halflife_s", "fs_calc_period_s"):
            if int(getattr(self, name)) < 1:
                raise StepError(f"{name} must be >= 1 second, got {getattr(self, name)}")
        if not 0.0 <= self.short_partition_factor <= 1.0:
            raise StepError(
                f"short_partition_factor must lie in [0, 1] (a PriorityJobFactor normalised by the "
                f"largest), got {self.short_partition_factor}"
            )
        if self.tick_s < 0 or self.bf_window_s < 0 or self.bf_max_job_test < 1:
            raise StepError("tick_s and bf_window_s must be >= 0, bf_max_job_test >= 1")
        for name in NONNEGATIVE:
            if getattr(self, name) < 0:
                raise StepError(f"{name} must be >= 0, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        """The fields as a mapping; fields added later (:data:`ADDED_LATER`) only when they
        differ from their default, so a configuration that does not use them has the
        mapping (and the run keys built from it) it had before they existed."""
        d = dataclasses.asdict(self)
        for name, default in ADDED_LATER.items():
            if d[name] == default:
                del d[name]
        return d

    def replace(self, **changes: Any) -> SimConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, doc: dict[str, Any], sources: dict[str, str] | None = None) -> SimConfig:
        """A config from a mapping of fields; ``sources[field]`` names where each value came
        from (a file, a flag) and prefixes any error about it."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(doc) - names)
        if unknown:
            where = {(sources or {}).get(k) for k in unknown} - {None}
            prefix = f"{', '.join(sorted(where))}: " if where else ""
            raise StepError(f"{prefix}unknown cluster-config keys {unknown}; known: {sorted(names)}")
        if "nodes" not in doc:
            raise StepError("cluster config needs 'nodes' (the partition size)")
        types = {f.name: f.type for f in dataclasses.fields(cls)}
        for name, value in doc.items():  # check each field with its source before building
            try:
                _check_type(name, value, types[name])
                if name == "nodes" and not 1 <= value <= MAX_NODES:
                    raise StepError(
                        f"nodes must be a positive number of nodes (the cluster size) up to {MAX_NODES}, got {value}"
                    )
                if name in NONNEGATIVE and value < 0:
                    raise StepError(f"{name} must be >= 0, got {value}")
            except StepError as exc:
                source = (sources or {}).get(name)
                raise StepError(f"{source}: {exc}" if source else str(exc)) from None
        return cls(**doc)


#: Fields below zero mean nothing: a negative weight inverts the priority, a negative limit is no limit.
NONNEGATIVE = (
    "weight_age",
    "weight_size",
    "max_jobs_per_user",
    "max_nodes_per_user",
    "weight_fairshare",
    "weight_partition",
    "grp_jobs",
    "grp_nodes",
)

#: Fields added after stored configurations existed, with the default that means "as before":
#: :meth:`SimConfig.to_dict` leaves them out at that default.
ADDED_LATER: dict[str, Any] = {
    f.name: f.default
    for f in dataclasses.fields(SimConfig)
    if f.name
    in (
        "weight_fairshare",
        "fs_halflife_s",
        "fs_calc_period_s",
        "weight_partition",
        "short_partition_factor",
        "grp_jobs",
        "grp_nodes",
    )
}

_TYPES = {"int": (numbers.Integral,), "float": (numbers.Real,), "bool": (bool,), "str": (str,)}
_TYPE_NAMES = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}


def _check_type(name: str, value: Any, annotation: Any) -> None:
    """A :class:`StepError` naming the field unless ``value`` has the field's JSON type."""
    kind = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    expected = _TYPES.get(kind)
    if expected is None:
        return
    ok = isinstance(value, expected) and (kind == "bool" or not isinstance(value, bool))
    if ok and kind == "float" and not math.isfinite(value):
        ok = False
    if not ok:
        raise StepError(f"field {name!r} must be {_TYPE_NAMES[kind]}, got {value!r} ({type(value).__name__})")


# Presets. "ls6" is the shipped Lonestar6 gpu-a100 model, chosen with the fidelity report
# (mirage_tasks/calibration/fidelity.py) on jobs submitted Dec 2022 - Mar 2023, replayed in warm-started
# 5-day windows as Mirage's episodes are. The trace never shows more than 8 running jobs of
# one user, and 73-80 busy nodes at its peaks. 78 nodes, the 8-job user limit, the recorded
# priorities (no age back-out) with a 3000-point age term, conservative backfill every 60 s
# and a warm start gave the best per-job fit that does not use the real waits. "reference" mimics the
# Mirage SC'23 simulator: 88 nodes, empty start, per-minute ticks, conservative backfill
# every 10 minutes, uncapped age priority.
PRESETS: dict[str, SimConfig] = {
    "ls6": SimConfig(
        nodes=78,
        backfill="conservative",
        bf_interval_s=60,
        bf_window_s=2 * 86400,
        bf_resolution_s=600,
        bf_max_job_test=3000,
        priority="trace",
        weight_age=3000.0,
        max_age_s=7 * 86400,
        age_cap=True,
        weight_size=0.0,
        max_jobs_per_user=8,
        max_nodes_per_user=0,
        tick_s=0,
        warm_start=True,
        trace_age_backout=False,
    ),
    "reference": SimConfig(
        nodes=88,
        backfill="conservative",
        bf_interval_s=600,
        bf_window_s=2 * 86400,
        bf_resolution_s=600,
        bf_max_job_test=3000,
        priority="age_size",
        weight_age=7000.0,
        max_age_s=7 * 86400,
        age_cap=False,
        weight_size=100.0,
        max_jobs_per_user=0,
        max_nodes_per_user=0,
        tick_s=60,
        warm_start=False,
    ),
}

#: (field, flag, type, help); a callable help is read when the parser is built (the policies' help).
_FLAGS: list[tuple[str, str, type, Any]] = [
    ("nodes", "--nodes", int, "cluster size in nodes (required unless the preset/trace gives it)"),
    ("backfill", "--backfill", str, lambda: policies.help_text("backfill")),
    ("bf_interval_s", "--bf-interval", int, "seconds between backfill passes"),
    ("bf_window_s", "--bf-window", int, "backfill window in seconds"),
    ("bf_resolution_s", "--bf-resolution", int, "backfill time resolution in seconds"),
    ("bf_max_job_test", "--bf-max-job-test", int, "jobs examined per backfill pass"),
    ("priority", "--priority", str, lambda: policies.help_text("priority")),
    ("weight_age", "--weight-age", float, "PriorityWeightAge"),
    ("max_age_s", "--max-age", int, "PriorityMaxAge in seconds"),
    ("weight_size", "--weight-size", float, "PriorityWeightJobSize"),
    (
        "weight_fairshare",
        "--weight-fairshare",
        float,
        "PriorityWeightFairshare (priority multifactor; 0 = no fair share)",
    ),
    ("fs_halflife_s", "--fs-halflife", int, "PriorityDecayHalfLife in seconds (7 days)"),
    ("fs_calc_period_s", "--fs-calc-period", int, "PriorityCalcPeriod in seconds: usage and fair share re-read (300)"),
    ("weight_partition", "--weight-partition", float, "PriorityWeightPartition (priority multifactor)"),
    (
        "short_partition_factor",
        "--short-partition-factor",
        float,
        "the short partition's PriorityJobFactor over the main partition's (1)",
    ),
    ("max_jobs_per_user", "--max-jobs-per-user", int, "running jobs per user (0 = unlimited)"),
    ("max_nodes_per_user", "--max-nodes-per-user", int, "running nodes per user (0 = unlimited)"),
    ("grp_jobs", "--grp-jobs", int, "GrpJobs: running trace jobs together (0 = unlimited)"),
    ("grp_nodes", "--grp-nodes", int, "GrpTRES=node: nodes of running trace jobs together (0 = unlimited)"),
    ("tick_s", "--tick", int, "scheduler clock in seconds (0 = event driven)"),
    (
        "capacity_window_s",
        "--capacity-window",
        int,
        "seconds of the trace's past busy nodes that set the nodes in service (0 = fixed --nodes)",
    ),
    ("capacity_quantile", "--capacity-quantile", float, "quantile of those busy nodes (1 = their maximum)"),
    ("capacity_step_s", "--capacity-step", int, "seconds between re-reads of the nodes in service"),
    (
        "short_partition_limit_s",
        "--short-partition-limit",
        int,
        "jobs with a limit up to this many seconds form a short partition on the same nodes (0 = off)",
    ),
    (
        "holds",
        "--holds",
        str,
        "none | inferred: hold a job until the predecessor inferred from the trace has ended in the simulation "
        "(reads real start times: a reconstruction, not a prediction)",
    ),
    (
        "holds_tolerance_s",
        "--holds-tolerance",
        int,
        "seconds between a predecessor's real end and its dependent's real start for inferred holds (60)",
    ),
    ("procs_per_node", "--procs-per-node", int, "processors per node, for traces with processor counts only"),
]


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster-configuration flags shared by sample, fidelity and the benchmark."""
    g = parser.add_argument_group("cluster configuration")
    g.add_argument(
        "--cluster-config", default=None, help=f"preset ({', '.join(PRESETS)}) or a JSON file/URI of SimConfig fields"
    )
    for name, flag, typ, helptext in _FLAGS:
        g.add_argument(
            flag, dest=f"cfg_{name}", type=typ, default=None, help=helptext() if callable(helptext) else helptext
        )
    g.add_argument(
        "--age-cap",
        dest="cfg_age_cap",
        default=None,
        choices=("true", "false"),
        help="cap the age factor at PriorityMaxAge (Slurm) or not (reference)",
    )
    g.add_argument(
        "--warm-start",
        dest="cfg_warm_start",
        default=None,
        choices=("true", "false"),
        help="start from the trace's running and pending jobs (true) or empty (false)",
    )


def load_config(spec: str | None, machine_nodes: int | None = None) -> dict[str, Any]:
    if spec is None:
        return {"nodes": machine_nodes} if machine_nodes else {}
    if spec in PRESETS:
        return PRESETS[spec].to_dict()
    if not (os.path.exists(spec) or "://" in spec):
        raise StepError(f"--cluster-config {spec!r}: neither a preset ({', '.join(PRESETS)}) nor a file")
    from stepkit.safeload import read_document

    try:  # bounded: size, nesting (stepkit.safeload); the error names the file
        doc = read_document(spec, "json")
    except StepError as exc:
        raise StepError(f"--cluster-config {exc}") from None
    if not isinstance(doc, dict):
        raise StepError(f"--cluster-config {spec}: expected a JSON object")
    return doc


def config_from_args(args: argparse.Namespace, machine_nodes: int | None = None) -> SimConfig:
    """Preset/file first, then flag overrides; the trace's machine size as the last resort."""
    spec = getattr(args, "cluster_config", None)
    doc = load_config(spec, machine_nodes)
    origin = (
        (f"--cluster-config {spec}" if spec not in PRESETS else f"--cluster-config preset {spec}")
        if spec
        else ("the trace's machine size")
    )
    sources = dict.fromkeys(doc, origin)
    for name, flag, _typ, _h in _FLAGS:
        v = getattr(args, f"cfg_{name}", None)
        if v is not None:
            doc[name] = v
            sources[name] = flag
    for name in ("age_cap", "warm_start"):
        v = getattr(args, f"cfg_{name}", None)
        if v is not None:
            doc[name] = v == "true"
            sources[name] = "--" + name.replace("_", "-")
    if doc.get("nodes") is None:
        raise StepError(
            "the cluster size is unknown: pass --nodes N or --cluster-config PRESET|FILE "
            "(the trace does not record its machine size)"
        )
    return SimConfig.from_dict(doc, sources)
