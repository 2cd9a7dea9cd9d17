"""The typed configurations of the ``mirage_service`` and ``mirage_evaluation`` trigger forms.

Built as :class:`~mirage_tasks.run.runconf.MirageRun` is (``mirage_pipeline``'s): each field of
:class:`ServiceRun` and :class:`EvaluationRun` carries its :class:`~mirage_tasks.run.runconf.Spec`
(JSON type, range or choices, title, description) and its default, and everything else derives
from the class:

* :func:`~mirage_tasks.run.runconf.class_form`: the DAG's ``Param`` keyword arguments, one per
  field in the class's order (a field added here appears in the form);
* ``from_params``: a run conf checked against the same schema and typed, unknown keys refused;
* ``mirage_service``'s command line: one flag per field (``house.param_argv``), a nullable field
  an optional flag left out of the argv when empty; the fields in ``ServiceRun.NOT_FLAGS`` (the
  approval's) are not flags of the step.

Stdlib only at import (the DAG files import it at parse time): the decision-rule registry and
runconf are stdlib-only modules too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ..sim import decision_rules as dr
from .runconf import Spec, _checked, _f, field_specs

T = TypeVar("T")

#: keep-service's numeric ranges (``mirage_tasks.steps.keep_service.BOUNDS``, which imports pandas,
#: too heavy for parse time; tests/dags/test_mirage_service_form.py keeps them equal).
SERVICE_BOUNDS: dict[str, tuple[float, float]] = {
    "node": (1, 100_000),
    "service_hours": (1 / 60, 24 * 366),
    "links": (1, 10_000),
    "factor": (1e-3, 1e6),
}


#: The slurm.conf ``make slurm`` writes, relative to the checkout: the project's local cluster
#: (``mirage_service``'s default with the local runner; runs on it need no approval).
LOCAL_SLURM_CONF = "var/slurm/slurm.conf"


def _range(name: str) -> dict[str, float]:
    lo, hi = SERVICE_BOUNDS[name]
    return {"minimum": lo, "maximum": hi}


def _from_params(cls: type[T], params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> T:
    """``cls`` of a form's (or run conf's) values over its declared defaults (and ``defaults``, the
    deployment's own, as the DAG's form shows them): a ``ValueError`` names the param of a bad
    value, and unknown params are refused."""
    specs = field_specs(cls)
    unknown = sorted(set(params) - set(specs))
    if unknown:
        raise ValueError(f"unknown param(s) {', '.join(unknown)}; known: {', '.join(specs)}")
    values = {f.name: getattr(cls(), f.name) for f in dataclasses.fields(cls)}
    values.update(defaults or {})
    values.update(params)
    return cls(**_checked(cls, values))


@dataclass(frozen=True)
class ServiceRun:
    """Every param of a ``mirage_service`` run (``keep-service``'s flags, each ``--<name>``)."""

    policy: str = _f(
        dr.MODEL,
        Spec(
            "Decision rule",
            "The decision rule: who decides when to submit each successor.",
            "string",
            schema={"enum": list(dr.KEEPER_RULES)},
        ),
    )
    # None, not "": the form must submit untouched; decision rule model without one fails at once (exit 2)
    model: str | None = _f(
        None,
        Spec(
            "Model",
            "A trained model (a train output URI); needed by decision rule model.",
            "string",
            nullable=True,
            empty="none (unused by the rules that need no model)",
        ),
    )
    avg_cal_samples: str | None = _f(
        None,
        Spec(
            "avg-cal's samples",
            "A sample output URI of the training period, on which avg-cal's threshold is calibrated; "
            f"needed by decision rule{'s' if len(dr.needing('avg-calibration', 'keeper')) > 1 else ''} "
            f"{', '.join(dr.needing('avg-calibration', 'keeper'))}.",
            "string",
            nullable=True,
            empty="none",
        ),
    )
    waitpred: str | None = _f(
        None,
        Spec(
            "Wait predictor",
            "A waitpred output URI (the wait predictor of this cluster's log); needed by decision rules "
            f"{', '.join(dr.KEEPER_WAIT_RULES)}.",
            "string",
            nullable=True,
            empty="none",
        ),
    )
    guarantee_samples: str | None = _f(
        None,
        Spec(
            "guarantee-cal's samples",
            "A sample output URI drawn with sample --waitpred (the same predictor) and --probe-spacing end "
            "on the months before; guarantee-cal's margin is calibrated on it; needed by decision rule "
            f"{dr.GUARANTEE_CAL}.",
            "string",
            nullable=True,
            empty="none",
        ),
    )
    node: int = _f(1, Spec("Nodes", "Nodes of each service job.", "integer", schema=_range("node")))
    service_hours: float = _f(
        48.0,
        Spec("Job limit (h)", "Limit of each job (h), at most a year.", "number", schema=_range("service_hours")),
    )
    links: int = _f(1, Spec("Links", "Successions to keep.", "integer", schema=_range("links")))
    factor: float = _f(
        1.0,
        Spec(
            "Time compression", "Time compression of the cluster (1 for a real one).", "number", schema=_range("factor")
        ),
    )
    slurm_conf: str = _f(
        "/etc/slurm/slurm.conf",
        Spec(
            "slurm.conf",
            "The cluster's slurm.conf (SLURM_CONF of the Slurm client); make slurm writes var/slurm/slurm.conf.",
            "string",
        ),
    )
    # None, not "": Param("", type="string") is a required field in the trigger form (its JSON is null)
    partition: str | None = _f(
        None,
        Spec(
            "Partition",
            "Slurm partition of the service jobs.",
            "string",
            nullable=True,
            empty="the cluster's default partition",
        ),
    )
    account: str | None = _f(
        None,
        Spec(
            "Account",
            "Slurm account charged for the service jobs.",
            "string",
            nullable=True,
            empty="the submitting user's default account",
        ),
    )

    # not a flag of keep-service: how long a run on a site's Slurm waits for its approval
    approval_hours: float = _f(
        24.0,
        Spec(
            "Approval within (h)",
            "On a site's Slurm (not make slurm's local one), how long the run waits for someone to approve "
            "its plan (Browse -> Required Actions) before it counts as rejected.",
            "number",
            schema={"minimum": 0.001, "maximum": 24 * 30},
        ),
    )

    #: The fields that are not ``keep-service`` flags (the DAG's approval step reads them).
    NOT_FLAGS: ClassVar[tuple[str, ...]] = ("approval_hours",)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> ServiceRun:
        return _from_params(cls, params, defaults)


_MONTH = "^[0-9]{4}-(0[1-9]|1[0-2])$"


@dataclass(frozen=True)
class EvaluationRun:
    """Every param of a ``mirage_evaluation`` run: a log described field by field, and the budget."""

    name: str = _f(
        "KTH-SP2",
        Spec(
            "Log name",
            "A short name for the log (its output folder).",
            "string",
            schema={"pattern": "^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"},
        ),
    )
    trace: str | None = _f(
        None,
        Spec(
            "Raw log",
            "The raw log: a Slurm sacct export or an SWF file (path or URI under the house storage root or the "
            "shipped traces, HOUSE_INPUT_ROOTS); required.",
            "string",
            nullable=True,
            empty="none: the run fails at plan, naming it",
        ),
    )
    timezone: str | None = _f(
        None,
        Spec(
            "Time zone",
            "The log's time zone (sacct).",
            "string",
            nullable=True,
            empty="an SWF header's, else UTC",
        ),
    )
    procs_per_node: int | None = _f(
        1,
        Spec(
            "Processors per node",
            "Processors per node, for logs that record processors only (SWF).",
            "integer",
            nullable=True,
            schema={"minimum": 1, "maximum": 4096},
            empty="calibrate's own --procs-per-node",
        ),
    )
    machine_nodes: int | None = _f(
        None,
        Spec(
            "Machine size (nodes)",
            "The machine's size in nodes where the log does not say (SWF headers do).",
            "integer",
            nullable=True,
            schema={"minimum": 1},
            empty="the log's stated size",
        ),
    )
    calibrate_from: str = _f(
        "1996-10-08", Spec("Calibration start", "Calibration period start.", "string", schema={"format": "date"})
    )
    calibrate_to: str = _f(
        "1997-01-01",
        Spec("Calibration end", "Calibration period end (exclusive).", "string", schema={"format": "date"}),
    )
    months: list[str] = _f(
        ["1997-01", "1997-02", "1997-03"],
        Spec(
            "Scored months",
            "Scored months YYYY-MM, after the calibration period.",
            "array",
            schema={"minItems": 1, "maxItems": 24, "items": {"type": "string", "pattern": _MONTH}},
        ),
    )
    trials: int = _f(
        40, Spec("Calibration trials", "Calibration trials (40).", "integer", schema={"minimum": 1, "maximum": 400})
    )
    timeout_s: int = _f(
        0,
        Spec(
            "Calibration wall limit (s)",
            "Opt-in wall limit of the calibration, seconds (0: none; the budget is the trials). Reaching it "
            "fails the calibration, naming it and the trials run.",
            "integer",
            schema={"minimum": 0, "maximum": 86400},
        ),
    )

    @classmethod
    def from_params(cls, params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> EvaluationRun:
        return _from_params(cls, params, defaults)
