"""The measurement order of a run step: randomized, interleaved trials. Stdlib only.

A *trial* is one (point, arm, repeat). The run step measures its trials in one shuffled order
instead of a point's repeats one after another, so that drift over the step (a warming
machine, a neighbour's load, a slowly filling cache) spreads over every point and arm
instead of landing on the last ones, and cannot make a difference between them. The order is
drawn from a seed (``--seed``; by default derived from the run id, the experiment and the
system, so a retried step measures in the same order and skips what succeeded); the run's
report records the seed and the order.

*Arms* are measurements of the same deployment under different names: the A/A control
measures one system as ``A`` and ``A'`` (:data:`AA_ARMS`), interleaved, and their ratio must
contain 1 (:func:`faasm_tasks.stats.aa_verdict`). A run without arms has the single arm
``None`` and keeps its storage layout (``repeat-<r>``); an arm's trials go to
``repeat-<r>.<arm slug>`` (:func:`repeat_dir`).

*Blocks*: trials whose points need different deployments (the knative target's per-point
replicas) are shuffled within their block and the blocks' order is shuffled, so the step
redeploys once per block, not once per trial.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

#: The A/A control's two arms: the same system and deployment, measured under two names.
AA_ARMS: tuple[str, str] = ("A", "A'")
#: The storage-safe name of each arm (a path component): the one place arm names are spelled.
_ARM_SLUGS = {"A": "A", "A'": "A-prime"}


def arm_slug(arm: str) -> str:
    try:
        return _ARM_SLUGS[arm]
    except KeyError:
        raise ValueError(f"unknown arm {arm!r}; known: {', '.join(_ARM_SLUGS)}") from None


def arm_from_slug(slug: str) -> str:
    for arm, s in _ARM_SLUGS.items():
        if s == slug:
            return arm
    raise ValueError(f"unknown arm folder {slug!r}; known: {', '.join(_ARM_SLUGS.values())}")


def repeat_dir(repeat: int, arm: str | None) -> str:
    """The folder of one trial under its point: ``repeat-3`` or ``repeat-3.A-prime``."""
    return f"repeat-{repeat}" if arm is None else f"repeat-{repeat}.{arm_slug(arm)}"


def default_seed(run_id: str, experiment: str, system: str) -> int:
    """The seed a step uses unless given one: a hash of the run id and the group (stable
    across processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256(f"{run_id}\0{experiment}\0{system}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass(frozen=True)
class Trial:
    point: int  # index into the step's points
    arm: str | None
    repeat: int

    def to_dict(self) -> dict[str, object]:
        return {"point": self.point, "arm": self.arm, "repeat": self.repeat}


def trials(
    n_points: int,
    repeats: int,
    seed: int,
    arms: Sequence[str | None] = (None,),
    blocks: Sequence[Hashable] | None = None,
) -> list[Trial]:
    """Every (point, arm, repeat) exactly once, in an order shuffled with ``seed``.

    ``blocks[i]``: the block of point ``i`` (None: one block). The blocks keep their points
    together, in a shuffled order of the blocks; within a block the trials are shuffled."""
    if n_points < 0 or repeats < 0:
        raise ValueError("n_points and repeats must not be negative")
    if not arms:
        raise ValueError("at least one arm")
    if blocks is not None and len(blocks) != n_points:
        raise ValueError(f"{len(blocks)} blocks for {n_points} points")
    rng = random.Random(seed)
    keys = list(blocks) if blocks is not None else [None] * n_points
    order = list(dict.fromkeys(keys))  # first-seen order, then shuffled
    rng.shuffle(order)
    out: list[Trial] = []
    for block in order:
        inside = [Trial(p, a, r) for p in range(n_points) if keys[p] == block for a in arms for r in range(repeats)]
        rng.shuffle(inside)
        out += inside
    return out
