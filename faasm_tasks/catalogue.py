"""The experiment catalogue: one YAML/JSON file per experiment, checked against a JSON schema.

The package ships the ATC'20 experiments in ``faasm_tasks/experiments``. Users add their
own with ``--catalogue-dir DIR`` or ``FAASM_CATALOGUE_DIR`` (``os.pathsep``-separated);
a user file whose ``name`` matches a packaged experiment replaces it.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from stepkit import StepError, reach
from stepkit.safeload import read_document

from . import workloads

log = logging.getLogger(__name__)
ENV_DIRS = "FAASM_CATALOGUE_DIR"
_SUFFIXES = (".yaml", ".yml", ".json")


def _schema() -> dict[str, Any]:
    return json.loads(resources.files("faasm_tasks").joinpath("experiments/schema.json").read_text())


def _parse(path: Path) -> dict[str, Any]:
    """One catalogue file, bounded (size, no YAML aliases, depth: :mod:`stepkit.safeload`)."""
    doc = read_document(str(path), "json" if path.suffix == ".json" else "yaml")
    if not isinstance(doc, dict):
        raise StepError(f"{path}: an experiment must be a mapping")
    return doc


def validate(doc: dict[str, Any], origin: str = "<experiment>") -> None:
    """Raise StepError listing every schema violation (and cross-field problems)."""
    validator = jsonschema.Draft7Validator(_schema())
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
    if errors:
        msgs = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}" for e in errors[:10])
        raise StepError(f"{origin}: invalid experiment: {msgs}")
    try:
        row = workloads.workload(str(doc["workload"]))
    except KeyError as exc:
        raise StepError(f"{origin}: workload: {exc.args[0]}") from None
    kind = doc["data"].get("kind")
    if kind not in (None, "none") and (kind not in workloads.names() or workloads.canonical(kind) != row.name):
        raise StepError(
            f"{origin}: data/kind {kind!r} is not workload {row.name!r} (the data kind is the "
            "workload's; drop data/kind)"
        )
    if doc["driver"].get("kind", row.runner) != row.runner:
        raise StepError(
            f"{origin}: driver/kind {doc['driver']['kind']!r}: workload {row.name} is a {row.runner} workload"
        )
    if row.runner == "load" and not {"connections", "timeout_s"} <= set(doc["driver"]):
        raise StepError(f"{origin}: workload {row.name} runs a load driver: driver needs connections and timeout_s")
    for system in doc["systems"]:
        if system not in doc["sweep"]:
            raise StepError(f"{origin}: system {system!r} has no sweep")
        if system not in doc["deploy"]:
            raise StepError(f"{origin}: system {system!r} has no deploy entry")


def _dirs(extra: list[str] | None, packaged_only: bool = False) -> list[Path]:
    dirs = [Path(str(resources.files("faasm_tasks").joinpath("experiments")))]
    if packaged_only:
        return dirs
    env = [p for p in os.environ.get(ENV_DIRS, "").split(os.pathsep) if p]
    for d in [*env, *(extra or [])]:
        p = Path(d).expanduser()
        if not p.is_dir():
            raise StepError(f"catalogue directory {p} does not exist")
        if d in env:  # the deployment's own catalogue (its environment, never a form): readable in a DAG step
            reach.allow_folder(str(p))
        dirs.append(p)
    return dirs


def load_catalogue(extra_dirs: list[str] | None = None, packaged_only: bool = False) -> dict[str, dict[str, Any]]:
    """Every experiment by name, validated. Later directories override earlier ones.
    ``packaged_only`` ignores user directories (teardown's fallback after a user error)."""
    out: dict[str, dict[str, Any]] = {}
    for d in _dirs(extra_dirs, packaged_only):
        for path in sorted(d.iterdir()):
            if path.suffix not in _SUFFIXES or path.name.startswith(("schema", ".")):
                continue
            doc = _parse(path)
            validate(doc, str(path))
            if doc["name"] in out:
                log.warning("experiment %s from %s replaces an earlier definition", doc["name"], path)
            doc["_source"] = str(path)
            out[doc["name"]] = doc
    return out


def get_experiment(name: str, extra_dirs: list[str] | None = None) -> dict[str, Any]:
    cat = load_catalogue(extra_dirs)
    if name not in cat:
        raise StepError(f"unknown experiment {name!r}; the catalogue has {', '.join(sorted(cat))}")
    return cat[name]


@dataclass(frozen=True)
class DriverSettings:
    """An experiment's driver section with every default applied, once, in :func:`resolve`."""

    kind: str = "call"
    poll_interval_ms: int = 1000
    call_timeout_s: float = 3600.0
    mode: str = "closed"
    threads: int = 1  # "auto" in the catalogue: this host's cores, resolved here
    connections: int = 1
    timeout_s: float = 5.0
    warmup_s: float = 10.0
    rate: float = 0.0  # open loop: offered requests/s (0: none given)
    ready_timeout_s: float = 120.0  # load points: the first 2xx reply (a cold target imports first)
    send_lag_p99_ms: float = 5.0  # a load point whose driver send lag p99 exceeds this is marked
    # load clients, each driving 1/clients of the rate (loadgen.controller); 1: one driver
    clients: int = 1
    client_isolation: str = "netns"  # clients on this host: a key of loadgen CLIENT_ISOLATION

    @classmethod
    def from_catalogue(cls, doc: dict[str, Any]) -> DriverSettings:
        doc = dict(doc)
        if doc.get("threads") == "auto":
            doc["threads"] = os.cpu_count() or 1
        names = {f.name for f in fields(cls)}
        typed = {f.name: f.type for f in fields(cls)}
        out = {}
        for k, v in doc.items():
            if k not in names:
                raise StepError(f"driver: unknown setting {k!r}; known: {', '.join(sorted(names))}")
            out[k] = {"int": int, "float": float, "str": str}[typed[k]](v)
        if "client_isolation" in out:
            from .loadgen import CLIENT_ISOLATION

            if out["client_isolation"] not in CLIENT_ISOLATION:
                raise StepError(
                    f"driver: client_isolation {out['client_isolation']!r}; known: {', '.join(CLIENT_ISOLATION)}"
                )
        return cls(**out)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    """An experiment resolved for one system on one target."""

    experiment: dict[str, Any]
    system: str
    target: str
    params: dict[str, Any]
    driver: DriverSettings
    axes: list[dict[str, Any]]
    deployment: dict[str, Any]
    repeats: int = 1
    points: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.experiment["name"]

    @property
    def workload(self) -> workloads.Workload:
        return workloads.workload(str(self.experiment["workload"]))


def expand(axes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cartesian product over axes; a ``points`` axis contributes whole parameter sets."""
    choices = []
    for axis in axes:
        if "points" in axis:
            choices.append([dict(p) for p in axis["points"]])
        else:
            choices.append([{axis["param"]: v} for v in axis["values"]])
    out = []
    for combo in itertools.product(*choices):
        point: dict[str, Any] = {}
        for part in combo:
            overlap = set(point) & set(part)
            if overlap:
                raise StepError(f"sweep axes set {sorted(overlap)} twice")
            point.update(part)
        out.append(point)
    return out


def parameter_names(exp: dict[str, Any]) -> set[str]:
    """Every parameter an experiment knows: its ``params`` (and the ``local`` section's) and
    every parameter of any of its sweeps (default, variants, local)."""
    names = set(exp.get("params", {})) | set(exp.get("local", {}).get("params", {}))
    sweeps = [
        *exp.get("sweep", {}).values(),
        *(v for var in (exp.get("sweep_variants") or {}).values() for v in var.values()),
    ]
    if "sweep" in exp.get("local", {}):
        sweeps.append(exp["local"]["sweep"])
    for axes in sweeps:
        for axis in axes:
            if "points" in axis:
                for point in axis["points"]:
                    names |= set(point)
            else:
                names.add(axis["param"])
    return names


def resolve(
    exp: dict[str, Any], system: str, target: str, overrides: dict[str, Any] | None = None, variant: str | None = None
) -> Plan:
    """Merge the catalogue entry (plus the ``local`` section on the local target) into a Plan.

    ``variant`` picks one of the entry's ``sweep_variants`` instead of its ``sweep`` (the
    default, the experiments manual's); ``None`` or ``"default"`` keeps the default."""
    if system not in exp["systems"]:
        raise StepError(f"{exp['name']}: system {system!r} not in {exp['systems']}")
    params = copy.deepcopy(exp.get("params", {}))
    driver = copy.deepcopy(exp["driver"])
    axes = copy.deepcopy(exp["sweep"][system])
    if variant and variant != "default":
        variants = exp.get("sweep_variants") or {}
        if variant not in variants or system not in variants[variant]:
            raise StepError(
                f"--sweep-variant {variant!r}: {exp['name']}/{system} has {', '.join(['default', *sorted(variants)])}"
            )
        axes = copy.deepcopy(variants[variant][system])
    deployment = copy.deepcopy(exp["deploy"][system])
    if target == "local":
        loc = exp.get("local", {})
        if variant and variant != "default" and "sweep" in loc:
            # the local section's sweep replaces every sweep: the variant would do nothing
            raise StepError(
                f"--sweep-variant {variant} (the DAG's tf_sweep) does nothing on the local target: "
                f"{exp['name']} runs its local sweep there; use the default"
            )
        params.update(loc.get("params", {}))
        driver.update(loc.get("driver", {}))
        if "sweep" in loc:
            axes = copy.deepcopy(loc["sweep"])
        if "workers" in loc:
            deployment["worker_replicas"] = loc["workers"]
    overrides = dict(overrides or {})
    known = parameter_names(exp)
    unknown = sorted(k for k in overrides if k not in known)
    if unknown:
        raise StepError(
            f"--set {unknown[0]}: {exp['name']} has no parameter {unknown[0]!r}; "
            f"its parameters: {', '.join(sorted(known))}"
        )
    _check_overrides(exp, overrides)
    params.update(overrides)
    driver["kind"] = workloads.workload(str(exp["workload"])).runner
    repeats = exp.get("local", {}).get("repeats", exp.get("repeats", 1)) if target == "local" else exp.get("repeats", 1)
    plan = Plan(exp, system, target, params, DriverSettings.from_catalogue(driver), axes, deployment, int(repeats))
    # overrides win over the sweep too (e.g. a shorter duration_s for a smoke run)
    plan.points = [{**params, **p, **overrides} for p in expand(axes)]
    return plan


def _catalogue_values(exp: dict[str, Any], name: str) -> list[Any]:
    """Every value the catalogue gives parameter ``name`` (params, local params, sweeps)."""
    vals = [d[name] for d in (exp.get("params", {}), exp.get("local", {}).get("params", {})) if name in d]
    sweeps = [
        *exp.get("sweep", {}).values(),
        *(v for var in (exp.get("sweep_variants") or {}).values() for v in var.values()),
    ]
    if "sweep" in exp.get("local", {}):
        sweeps.append(exp["local"]["sweep"])
    for axes in sweeps:
        for axis in axes:
            if "points" in axis:
                vals += [p[name] for p in axis["points"] if name in p]
            elif axis["param"] == name:
                vals += list(axis["values"])
    return vals


def _check_overrides(exp: dict[str, Any], overrides: dict[str, Any]) -> None:
    """A ``--set`` value has the type of the catalogue's values of that parameter and, when
    those are numbers, is not negative (before anything is deployed or run)."""
    for k, v in overrides.items():
        vals = _catalogue_values(exp, k)
        numeric = [x for x in vals if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if not vals or len(numeric) < len(vals):
            continue
        integral = all(isinstance(x, int) for x in numeric)
        if integral and not (isinstance(v, int) and not isinstance(v, bool)):
            raise StepError(f"--set {k}={v}: {exp['name']}'s {k} is an integer (catalogue: {numeric[0]})")
        if not integral and not (
            isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
        ):
            raise StepError(f"--set {k}={v}: {exp['name']}'s {k} is a number (catalogue: {numeric[0]})")
        if v < 0:
            raise StepError(f"--set {k}={v}: {exp['name']}'s {k} cannot be negative")


def replicas_for(plan: Plan, point: dict[str, Any]) -> dict[str, Any]:
    """The deployment for one point. With ``replicas_from: n_workers`` (the manual's SGD and
    matrix runs: deploy N replicas, run with N workers) the wasm worker Service, or each
    native Service, gets the point's N replicas; otherwise the plan's fixed deployment."""
    dep = copy.deepcopy(plan.deployment)
    key = plan.experiment.get("replicas_from")
    if not key or key not in point or plan.target == "local":
        return dep
    n = int(point[key])
    if n < 1:
        raise StepError(f"{plan.name}: {key}={n} cannot be a replica count")
    if dep.get("native_services"):
        for svc in dep["native_services"]:
            svc["replicas"] = n
    else:
        dep["worker_replicas"] = n
    return dep


def slug(params: dict[str, Any]) -> str:
    """A stable folder name for a parameter set: ``k1-v1_k2-v2`` sorted by key."""
    parts = []
    for k in sorted(params):
        v = re.sub(r"[^A-Za-z0-9.]+", "-", str(params[k])).strip("-")
        parts.append(f"{k}-{v}")
    return "_".join(parts) or "default"
