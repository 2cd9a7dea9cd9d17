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
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from stepkit import StepError
from stepkit.safeload import read_document

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
    for system in doc["systems"]:
        if system not in doc["sweep"]:
            raise StepError(f"{origin}: system {system!r} has no sweep")
        if system not in doc["deploy"]:
            raise StepError(f"{origin}: system {system!r} has no deploy entry")


def _dirs(extra: list[str] | None, packaged_only: bool = False) -> list[Path]:
    dirs = [Path(str(resources.files("faasm_tasks").joinpath("experiments")))]
    if packaged_only:
        return dirs
    env = os.environ.get(ENV_DIRS, "")
    for d in [*(p for p in env.split(os.pathsep) if p), *(extra or [])]:
        p = Path(d).expanduser()
        if not p.is_dir():
            raise StepError(f"catalogue directory {p} does not exist")
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


@dataclass
class Plan:
    """An experiment resolved for one system on one target."""

    experiment: dict[str, Any]
    system: str
    target: str
    params: dict[str, Any]
    driver: dict[str, Any]
    axes: list[dict[str, Any]]
    deployment: dict[str, Any]
    repeats: int = 1
    points: list[dict[str, Any]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.experiment["name"]


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
    sweeps = [*exp.get("sweep", {}).values(), *(v for var in (exp.get("sweep_variants") or {}).values()
                                                 for v in var.values())]
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


def resolve(exp: dict[str, Any], system: str, target: str, overrides: dict[str, Any] | None = None,
            variant: str | None = None) -> Plan:
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
            raise StepError(f"--sweep-variant {variant!r}: {exp['name']}/{system} has "
                            f"{', '.join(['default', *sorted(variants)])}")
        axes = copy.deepcopy(variants[variant][system])
    deployment = copy.deepcopy(exp["deploy"][system])
    if target == "local":
        loc = exp.get("local", {})
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
        raise StepError(f"--set {unknown[0]}: {exp['name']} has no parameter {unknown[0]!r}; "
                        f"its parameters: {', '.join(sorted(known))}")
    params.update(overrides)
    plan = Plan(exp, system, target, params, driver, axes, deployment, int(exp.get("repeats", 1)))
    # overrides win over the sweep too (e.g. a shorter duration_s for a smoke run)
    plan.points = [{**params, **p, **overrides} for p in expand(axes)]
    return plan


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
