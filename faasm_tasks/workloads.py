"""Every workload kind, declared once, in one row. Stdlib only.

This module imports nothing of the package at load time (its hooks are ``"module:function"``
strings imported when called), so ``dags/faasm_benchmarks.py`` loads it by path without
importing ``faasm_tasks`` (its time budgets), and the runtimes, the catalogue and the steps
read it without cycles. A :class:`Workload` says everything the rest of the code knows about
a kind:

* ``name``: the one name of the kind, everywhere: the experiment YAML's ``workload``, its
  data preparation, the runtime module and the C source ``faasm_tasks/functions/<name>.c``
  (``modules`` maps the Faasm function names of the 2020 protocol to it);
* ``runner``: ``call`` (one invocation per point, polled: :mod:`faasm_tasks.points`) or
  ``load`` (a load driver against the function for the point's duration);
* ``prepare``: ``prepare(plan, client, source, s3, synthetic, force) -> [report]``, the
  state and shared files ``upload-data`` puts in place (the function itself is uploaded by
  :func:`faasm_tasks.data.prepare` for every kind);
* ``request``: ``request(ctx, point) -> Request``: call runners: what one call sends (and
  what it does before, e.g. the matrices of the point's size); load runners: the body;
* ``result``: ``result(ctx, point, res) -> metrics`` read from a call's output (None: none);
* ``verify``: ``verify(ctx, point, res, metrics) -> Check``: whether the result is right
  (a failed check fails the point: :mod:`faasm_tasks.points`);
* ``budget``: ``budget(point, driver) -> seconds`` a point may take (its hard bound);
* ``time_budget_h``: the run step's budget of one experiment of this kind (the DAG's run
  timeout, and the bound on its repeats); an experiment may state its own ``time_budget_h``;
* ``modules``: ``{(user, function): runtime module}``; ``functions``: its C sources.

Kinds outside the package (a plug-in's, a test's) are rows too: :func:`register` adds one in
this process, and ``FAASM_WORKLOADS`` (comma-separated ``module:NAME`` entries)
adds rows wherever the registry is loaded, the local target's workers included; their C
builds are looked up in ``FAASM_FUNCTIONS_BUILD_DIRS`` before the package's own.

``aliases`` are the names the kind had before it had one (``matrix`` and ``tf`` as data
kinds, ``image`` as the module and C source of ``inference``): a catalogue entry written
with them still loads.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Workload:
    name: str
    runner: str  # "call" or "load"
    prepare: str  # "module:function": the state and files upload-data puts in place
    request: str  # "module:function": what one call (or the load driver) sends
    budget: str  # "module:function": seconds one point may take
    verify: str | None = None  # "module:function": the check of a point's result
    result: str | None = None  # "module:function": metrics read from a call's output
    time_budget_h: float = 2.0  # one experiment's run step (the DAG's run timeout)
    modules: dict[tuple[str, str], str] = field(default_factory=dict)  # (user, function) -> module
    functions: tuple[str, ...] = ()  # C sources in faasm_tasks/functions (without .c)
    aliases: tuple[str, ...] = ()

    def __post_init__(self):
        if self.runner not in ("call", "load"):
            raise ValueError(f"workload {self.name}: runner must be call or load, not {self.runner!r}")

    def hook(self, which: str) -> Callable[..., Any] | None:
        spec = getattr(self, which)
        return _resolve(spec) if spec else None


def _resolve(spec: str) -> Callable[..., Any]:
    mod, _, fn = spec.partition(":")
    return getattr(importlib.import_module(mod), fn)


_K = "faasm_tasks.kinds"
WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        # Hogwild SVM (ATC'20 6.2): one async call chaining n_workers steps per epoch
        Workload(
            "sgd",
            "call",
            f"{_K}.sgd:prepare",
            f"{_K}.sgd:request",
            f"{_K}.sgd:budget",
            verify=f"{_K}.sgd:verify",
            result=f"{_K}.sgd:result",
            time_budget_h=2.0,
            modules={("sgd", "reuters_svm"): "sgd"},
            functions=("sgd",),
        ),
        # divide-and-conquer matrix multiplication (6.4): 73 chained calls with 2 splits
        Workload(
            "matmul",
            "call",
            f"{_K}.matmul:prepare",
            f"{_K}.matmul:request",
            f"{_K}.matmul:budget",
            verify=f"{_K}.matmul:verify",
            time_budget_h=2.0,
            modules={("python", "mat_mul"): "matmul"},
            functions=("matmul",),
            aliases=("matrix",),
        ),
        # image inference under load (6.3); the 2020 function name is tf/image
        Workload(
            "inference",
            "load",
            f"{_K}.inference:prepare",
            f"{_K}.inference:request",
            f"{_K}.inference:budget",
            verify=f"{_K}.inference:verify",
            time_budget_h=6.0,
            modules={("tf", "image"): "inference"},
            functions=("inference",),
            aliases=("tf", "image"),
        ),
    )
}
_ALIASES: dict[str, str] = {}


def _index() -> None:
    _ALIASES.clear()
    for w in WORKLOADS.values():
        for a in w.aliases:
            _ALIASES[a] = w.name


_index()


ENV_PLUGINS = "FAASM_WORKLOADS"


def _load_plugins() -> None:
    for entry in filter(None, (e.strip() for e in os.environ.get(ENV_PLUGINS, "").split(","))):
        mod, _, attr = entry.partition(":")
        row = getattr(importlib.import_module(mod), attr or "ROW")
        if not isinstance(row, Workload):
            raise TypeError(f"{ENV_PLUGINS} entry {entry!r} is not a Workload row")
        if row.name not in WORKLOADS:
            register(row)


def workload(name: str) -> Workload:
    """The row of ``name`` (or of an old name of it); ``KeyError`` naming the known kinds."""
    key = _ALIASES.get(name, name)
    try:
        return WORKLOADS[key]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


def canonical(name: str) -> str:
    return workload(name).name


def names() -> tuple[str, ...]:
    """Every name a catalogue may use: the kinds and their aliases."""
    return (*WORKLOADS, *_ALIASES)


def register(row: Workload) -> None:
    """Add a kind (a plug-in's or a test's); the name must be new."""
    if row.name in WORKLOADS or row.name in _ALIASES:
        raise ValueError(f"workload {row.name!r} is already registered")
    WORKLOADS[row.name] = row
    _index()


def unregister(name: str) -> None:
    WORKLOADS.pop(name, None)
    _index()


def modules() -> dict[tuple[str, str], str]:
    """``{(user, function): module}`` of every kind (the runtimes' call dispatch)."""
    return {k: m for w in WORKLOADS.values() for k, m in w.modules.items()}


def time_budget_s(exp: dict[str, Any]) -> float:
    """The run step's budget of experiment ``exp`` (a catalogue mapping): its own
    ``time_budget_h`` or its kind's, in seconds."""
    hours = exp.get("time_budget_h")
    if hours is None:
        hours = workload(str(exp["workload"])).time_budget_h
    return float(hours) * 3600.0


def run_timeout_s(exp: dict[str, Any]) -> float:
    """The DAG's timeout of the run step: the time budget plus 10 % (at least 15 min) for the
    point in flight when the budget ends, rounded up to a minute."""
    budget = time_budget_s(exp)
    return 60.0 * math.ceil((budget + max(900.0, 0.1 * budget)) / 60.0)


_load_plugins()
