"""Probe spacings of the training samples (``sample --probe-spacing``) and the baseline
decision rules, without numpy, so a step's ``add_arguments`` can offer them;
:func:`mirage_tasks.sim.episode.probe_times` places the probes and the baselines' decisions.

* ``uniform``: the reference's, ``--probes`` equally spaced from the predecessor's
  submission + 60 s to its end: 48 h / 6 = 8 h apart with 7 probes.
* ``end``: concentrated near the predecessor's (pre-simulated) end, at its end minus
  :data:`END_OFFSETS_MIN`, where a submission decides between a short overlap and a gap.
"""

from __future__ import annotations

from typing import Any

from . import decision_rules

PROBE_SPACINGS = ("uniform", "end")
#: Minutes before the predecessor's end of the ``end`` spacing's probes; 0 is the end itself
#: (the reactive probe, always last).
END_OFFSETS_MIN = (1440, 960, 480, 240, 120, 60, 30, 10, 0)


def trained_offsets_s(sample_params: dict | None) -> tuple[int, ...] | None:
    """The times before the predecessor's end (s, latest first excluded: the end itself is the
    forced submission) at which a model's training probes were placed, where they sit at fixed
    offsets from the end (the ``end`` spacing); None otherwise."""
    sp = sample_params or {}
    if sp.get("baseline", "default") == "default" and sp.get("probe_spacing") == "end":
        return tuple(m * 60 for m in END_OFFSETS_MIN if m > 0)
    return None


def trained_span_s(sample_params: dict | None) -> int | None:
    """How long before the predecessor's end the training probes of a model reach (s), from the
    sample parameters its dataset records (``config.json`` ``data.sample_params``): the ``end``
    spacing's first probe, 24 h; None where the probes span the whole predecessor (``uniform``,
    the baselines' samples) or the parameters are unknown (a policy trained in its environment).

    A model asked earlier than that is asked about states it never saw: an ``end``-spaced
    xgboost on KTH node 8 submitted more than 24 h early in 64 % of the online samples, where
    the probe replay (whose first decision is 24 h before the end) never can. The online decider
    and the keeper ask it only inside this span."""
    offsets = trained_offsets_s(sample_params)
    return max(offsets) if offsets else None


def add_ask_arguments(p: Any, grid: str) -> None:
    """``--decide-within`` and ``--decide-at``: where a trained model is asked (``validate``,
    ``keep-service``); ``grid`` says what the default asks on (every decision, every reading)."""
    p.add_argument(
        "--decide-within",
        choices=("trained", "all"),
        default="trained",
        help="models: ask only as long before the predecessor's end as the training probes reach "
        "(trained, the default: the last 24 h for --probe-spacing end samples, the whole "
        f"predecessor for uniform ones) or at {grid} (all, as before)",
    )
    p.add_argument(
        "--decide-at",
        choices=DECIDE_AT,
        default="auto",
        help=f"models: ask only at the first one at or past each time before the predecessor's end where "
        "its training probes were placed (probes: 24 h, 16 h, ..., 10 min for --probe-spacing end "
        f"samples, the times its threshold was calibrated at), or at {grid} (grid); auto, the "
        "default: probes where the model's training probes sit at fixed times before the end, grid "
        "otherwise (a uniform model's probes move with the predecessor's wait)",
    )


#: ``--decide-at`` choices; ``auto`` resolves per model (:func:`resolve_decide_at`)
DECIDE_AT = ("auto", "grid", "probes")


def resolve_decide_at(choice: str, offsets: tuple[int, ...] | None, model: str) -> str:
    """``grid`` or ``probes`` for ``--decide-at choice`` and a model whose training probes sit at
    ``offsets`` before the end (:func:`trained_offsets_s`; None: not at fixed times).

    ``auto`` asks a model where its threshold was calibrated: at its probes' times where they are
    fixed. Asked every 10 minutes instead, a threshold calibrated at 8 probes is crossed earlier by
    a noisy answer (KTH-SP2 node 8: the online xgboost submitted 11.7 h before the end on average,
    objective 8.82 against 6.95 at the probes' times, which equal the probe replay sample by sample).
    ``probes`` for a model without fixed probe times is refused (ValueError, :func:`no_probe_times`)."""
    if choice == "probes" and not offsets:
        raise ValueError(no_probe_times(model))
    if choice == "auto":
        return "probes" if offsets else "grid"
    return choice


def no_probe_times(model: str) -> str:
    """The refusal of ``--decide-at probes`` for a model without probes at fixed times before the end."""
    return (
        f"--decide-at probes: {model} has no probes at fixed times before the end (only a model trained "
        "on sample --probe-spacing end data has)"
    )


# Decision rules without a model, validated beside the models: submit when the predecessor
# ends (reactive) or at its end minus the recent mean wait (avg). The simulator's episodes
# implement them (probe_times); the model registry re-exports them.
BASELINES: tuple[str, ...] = decision_rules.BASELINES  # declared in the decision-rule registry
