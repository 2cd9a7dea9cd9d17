"""The environment a wait/submit policy is trained in (no torch, no simulator import).

An episode is one predecessor/successor pair. At every decision moment (every 10
simulated minutes) the agent sees the queue history and chooses to wait or to submit
the successor now. Waiting yields reward 0; the episode ends when the successor is
submitted (by choice, or forced once the predecessor has ended) and its outcome is
known, with terminal reward ``-|signed interruption|`` in minutes.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

DECISION_INTERVAL_S = 600


@runtime_checkable
class Env(Protocol):
    def reset(self, rng: np.random.Generator) -> np.ndarray:
        """Start a new episode (its randomness drawn from ``rng``); returns the history float32 [W, F]."""
        ...

    def step(self, submit: bool) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        """Act at the current decision moment.

        Returns ``(obs, reward, done, info)``: the next history (the last one when done),
        the reward (0 unless done; then minus the absolute interruption in minutes),
        whether the episode ended, and ``info`` with at least ``forced`` (True when the
        predecessor had ended and submission was forced regardless of ``submit``; such
        steps are excluded from the policy gradient) and, when done,
        ``interruption_min`` (signed: positive gap, negative overlap).
        """
        ...
