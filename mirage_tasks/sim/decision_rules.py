"""Every decision rule, declared once, in one row. Stdlib only.

A decision rule decides when a service's successor job is submitted: a trained model's
calibrated test, a baseline (reactive, avg) or a wait predictor's test. The same rule is
scored in three places, and each place names the rules it can run from here:

* ``replay``: the probe replay (``lab/evaluation/probe_replay.py``), every rule scored on stored
  samples, and the simulator's episodes that draw them (``sample --baseline``);
* ``validate``: online validation in the simulator (``python -m mirage_tasks validate --model
  <rule>``);
* ``keeper``: the service keeper on a real Slurm (``keep-service --policy``, the
  ``mirage_service`` DAG's form, whose choices are :func:`names_at` ``("keeper")``).

A :class:`Rule` says what a rule needs (:data:`INPUTS`: a trained model, a calibration of its
threshold, the wait predictor, ...) and where it decides. Code that decides by a rule's name asks
this module (:func:`rule`, :func:`names_at`, :meth:`Rule.needs`) or names the rule by its
constant (:data:`REACTIVE`, ...), never by a string literal: tests/mirage/test_decision_rules.py
scans the code for comparisons with a rule's name outside this file.

One rule has two names: the wait predictor's 90 % bound is ``guarantee`` on Slurm and
``guarantee-10`` in the simulator, where protocol v2 pre-registered it under that name and its
stored outputs (the probe replay's tables, ``validate`` outputs under ``<base>/guarantee-10``)
are keyed by it. :attr:`Rule.sim_name` keeps that spelling where those outputs are written and
read; :func:`rule` takes either name.

This is the lowest layer that decides by a rule's name (the simulator's episodes), so every
package above it (calibration, evaluation, slurm, steps, run, the DAG files at parse time) can
import it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Where a rule can decide.
PLACES: dict[str, str] = {
    "replay": "the probe replay on stored samples (and the simulator's episodes that draw them)",
    "validate": "online validation in the simulator (validate --model)",
    "keeper": "the service keeper on a real Slurm (keep-service --policy, the mirage_service DAG)",
}

#: What a rule can need, beside the queue it decides on.
INPUTS: dict[str, str] = {
    "model": "a trained model (a train output)",
    "avg-calibration": "the recent-mean-wait offset calibrated on training samples "
    "(keeper: --avg-cal-samples; simulator: the probe replay's calibration)",
    "waitpred": "the wait predictor of the cluster's log (a waitpred output), asked at each decision",
    "margin-calibration": "the wait predictor's margin calibrated on samples drawn with it "
    "(keeper: --guarantee-samples; simulator: the probe replay's calibration)",
}


@dataclass(frozen=True)
class Rule:
    """One decision rule: ``name`` (the canonical one, the keeper's), what it ``inputs`` and where
    it decides (``places``); ``sim_name``: its name in the simulator's places where that differs."""

    name: str
    description: str
    inputs: frozenset[str]
    places: frozenset[str]
    sim_name: str | None = None

    def __post_init__(self) -> None:
        if not self.inputs <= INPUTS.keys():
            raise ValueError(f"rule {self.name!r}: unknown inputs {sorted(self.inputs - INPUTS.keys())}")
        if not self.places <= PLACES.keys():
            raise ValueError(f"rule {self.name!r}: unknown places {sorted(self.places - PLACES.keys())}")

    def needs(self, what: str) -> bool:
        if what not in INPUTS:
            raise KeyError(f"unknown rule input {what!r}; known: {', '.join(INPUTS)}")
        return what in self.inputs

    def name_at(self, place: str) -> str:
        """This rule's name at ``place`` (``guarantee``'s is ``guarantee-10`` in the simulator)."""
        return self.sim_name if self.sim_name and place != "keeper" else self.name

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, self.sim_name) if self.sim_name else (self.name,)


_ALL = frozenset(PLACES)
_SIM = frozenset({"replay", "validate"})

# The order is the keeper's --policy help and the mirage_service form's.
RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        # in the simulator a model decides under its own kind's name (xgboost, moe_policy, ...)
        Rule("model", "the trained model's calibrated test", frozenset({"model"}), frozenset({"keeper"})),
        Rule("reactive", "submit when the predecessor ends", frozenset(), _ALL),
        Rule("avg", "submit at the predecessor's end minus the recent mean wait", frozenset(), _ALL),
        Rule(
            "avg-cal",
            "avg with a calibrated offset: submit when the recent mean wait minus the time left reaches it",
            frozenset({"avg-calibration"}),
            _ALL,
        ),
        Rule(
            "wait-pred",
            "submit when the predicted wait reaches the time left",
            frozenset({"waitpred"}),
            _ALL,
        ),
        Rule(
            "wait-pred-cal",
            "wait-pred past a calibrated margin",
            frozenset({"waitpred", "margin-calibration"}),
            _SIM,
        ),
        Rule(
            "guarantee",
            "submit when the predictor's 90 % bound reaches the time left at the next decision",
            frozenset({"waitpred"}),
            _ALL,
            sim_name="guarantee-10",
        ),
        Rule(
            "guarantee-cal",
            "guarantee's test with a conformal margin, asked at the times it was calibrated at",
            frozenset({"waitpred", "margin-calibration"}),
            _ALL,
        ),
    )
}

_BY_NAME: dict[str, Rule] = {n: r for r in RULES.values() for n in r.names}

# Each rule's name, for code that dispatches on one (a constant, not a literal: the scan's test).
MODEL = RULES["model"].name
REACTIVE = RULES["reactive"].name
AVG = RULES["avg"].name
AVG_CAL = RULES["avg-cal"].name
WAIT_PRED = RULES["wait-pred"].name
WAIT_PRED_CAL = RULES["wait-pred-cal"].name
GUARANTEE = RULES["guarantee"].name
GUARANTEE_SIM = RULES["guarantee"].name_at("validate")
GUARANTEE_CAL = RULES["guarantee-cal"].name


def rule(name: str) -> Rule:
    """The rule of ``name`` (either of its names); ``KeyError`` naming the known rules otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown decision rule {name!r}; known: {', '.join(_BY_NAME)}") from None


def is_rule(name: str) -> bool:
    return name in _BY_NAME


def names_at(place: str) -> tuple[str, ...]:
    """The rules that decide at ``place``, by their names there, in :data:`RULES`' order."""
    if place not in PLACES:
        raise KeyError(f"unknown place {place!r}; known: {', '.join(PLACES)}")
    return tuple(r.name_at(place) for r in RULES.values() if place in r.places)


def needing(what: str, place: str) -> tuple[str, ...]:
    """The rules at ``place`` that need input ``what``, by their names there."""
    return tuple(r.name_at(place) for r in RULES.values() if place in r.places and r.needs(what))


def all_names() -> frozenset[str]:
    """Every rule name, both spellings (what the scan's test looks for)."""
    return frozenset(_BY_NAME)


#: The simulator's baselines: rules that need nothing, decided by the episodes (``sample --baseline``).
BASELINES: tuple[str, ...] = tuple(r.name for r in RULES.values() if not r.inputs and "replay" in r.places)
#: The keeper's rules (``keep-service --policy``, the mirage_service form's choices).
KEEPER_RULES: tuple[str, ...] = names_at("keeper")
#: The keeper's rules that ask the wait predictor at each decision.
KEEPER_WAIT_RULES: tuple[str, ...] = needing("waitpred", "keeper")
