"""When a decision rule is asked during a link: the one schedule the keeper (:mod:`.keeper`),
the live wait predictor's ``guarantee-cal`` (:mod:`.livewait`) and the simulator's prediction
of the keeper (the lab's ``lab.slurm.keeper_sim``) all follow, so that each asks at the same
readings.

It is a module of its own, below all three, because the keeper uses the wait predictor and the
wait predictor uses this schedule: kept in the keeper, the two would import each other.
"""

from __future__ import annotations


def asks(left_s: float, within_s: float | None, at_s: tuple[float, ...] | None, asked: set) -> bool:
    """Whether the model is asked at a reading with ``left_s`` trace seconds to the predecessor's
    end: within ``within_s``, and with ``at_s`` at the first reading at or past each of those
    times (one ask per time; times passed while reading count once; ``asked`` keeps the times
    already asked for this link). The keeper and the simulator's prediction of it both ask so."""
    if within_s is not None and left_s > within_s:
        return False
    if at_s is None:
        return True
    due = [t for t in at_s if left_s <= t and t not in asked]
    asked.update(due)
    return bool(due)
