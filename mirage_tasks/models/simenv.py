"""The simulator as a policy environment: :class:`SimEnv` adapts ``sim.episode.DecisionEpisode``.

Each episode starts at a uniformly random, minute-aligned sample start inside a given
window (for training: the base model's *training* sample window, so policy training
sees no trace time that validation uses), replays the trace from there, submits the
predecessor after the warm-up, and offers a decision every ``decision_s`` (600 s, as in
evaluation). Waiting advances the simulation; submitting (or the predecessor having
ended, which forces submission) runs until the successor starts and ends the episode
with reward ``-|interruption|`` in minutes.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from stepkit import StepError

from .env import DECISION_INTERVAL_S


def _epoch(v: Any) -> int:
    if isinstance(v, (int, np.integer, float)):
        return int(v)
    return int(dt.datetime.fromisoformat(str(v)).timestamp())


class SimEnv:
    def __init__(
        self,
        workload: Any,
        config: Any,
        node: int,
        start_min: int,
        start_max: int,
        *,
        warmup_days: float = 2.0,
        workload_days: float = 5.0,
        window: int = 144,
        step_s: int = 600,
        decision_s: int = DECISION_INTERVAL_S,
    ):
        if start_max < start_min:
            raise StepError(f"empty episode window: {start_min} > {start_max}")
        self.workload, self.config, self.node = workload, config, int(node)
        self.start_min, self.start_max = int(start_min), int(start_max)
        self.warmup_days, self.workload_days = warmup_days, workload_days
        self.window, self.step_s, self.decision_s = window, step_s, decision_s
        self.ep: Any = None
        self._obs: np.ndarray | None = None

    def copy(self) -> SimEnv:
        """An independent environment with the same settings (shares the read-only workload)."""
        return SimEnv(
            self.workload,
            self.config,
            self.node,
            self.start_min,
            self.start_max,
            warmup_days=self.warmup_days,
            workload_days=self.workload_days,
            window=self.window,
            step_s=self.step_s,
            decision_s=self.decision_s,
        )

    def describe(self) -> dict[str, Any]:
        iso = lambda t: dt.datetime.fromtimestamp(t, dt.UTC).isoformat()  # noqa: E731
        return {
            "kind": "sim",
            "start_min": iso(self.start_min),
            "start_max": iso(self.start_max),
            "node": self.node,
            "decision_s": self.decision_s,
            "warmup_days": self.warmup_days,
            "workload_days": self.workload_days,
            "window": self.window,
            "step_s": self.step_s,
        }

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        from ..sim.episode import DecisionEpisode

        t0 = int(rng.integers(self.start_min // 60, self.start_max // 60 + 1)) * 60
        self.ep = DecisionEpisode(
            self.workload, self.config, t0, self.node, self.warmup_days, self.workload_days, self.window, self.step_s
        )
        self._obs = self.ep.history()
        return self._obs

    def step(self, submit: bool) -> tuple[np.ndarray, float, bool, dict[str, Any]]:
        if self.ep is None or self.ep.submitted:
            raise RuntimeError("call reset() first")
        forced = bool(self.ep.pred_ended)
        if forced or submit:
            res = self.ep.submit_successor()
            minutes = float(res["signed_interruption_h"]) * 60.0
            return (
                self._obs,
                -abs(minutes),
                True,
                {"forced": forced, "interruption_min": minutes, "sample_start": res["sample_start"]},
            )
        self.ep.advance(self.decision_s)
        self._obs = self.ep.history()
        return self._obs, 0.0, False, {"forced": False}


def envs_for(trace: str, base_cfg: dict[str, Any]) -> tuple[SimEnv, SimEnv]:
    """Training and validation environments from the trace and the base model's data record.

    Training episodes start inside the base model's training sample window; validation
    episodes inside its validation sample window. The cluster configuration, node count,
    warm-up, workload span, window and snapshot step are the ones the dataset was sampled with.
    """
    from ..data.schema import read_trace
    from ..sim.config import SimConfig
    from ..sim.workload import Workload

    data = base_cfg["data"]
    params = data.get("sample_params")
    if not params or "config" not in params:
        raise StepError(
            "the base model's dataset records no simulator parameters (manifest 'params'); "
            "it was not produced by sample/merge, so the simulator cannot be set up like it"
        )
    df, _meta = read_trace(trace)
    wl = Workload.from_frame(df)
    expected = data.get("trace_fingerprint")
    if getattr(wl, "fingerprint", None) and expected and wl.fingerprint != expected:
        raise StepError(
            f"{trace}: trace fingerprint {wl.fingerprint} differs from the one the base model's "
            f"dataset was sampled from ({data['trace_fingerprint']})"
        )
    cfg = SimConfig.from_dict(params["config"])
    split = data["split"]
    common = {
        "warmup_days": float(params["warmup_days"]),
        "workload_days": float(params["workload_days"]),
        "window": int(data["window"]),
        "step_s": int(data["step_s"]),
    }
    node = int(data["node"])
    train = SimEnv(
        wl, cfg, node, _epoch(split["train_sample_start_min"]), _epoch(split["train_sample_start_max"]), **common
    )
    val = SimEnv(wl, cfg, node, _epoch(split["val_sample_start_min"]), _epoch(split["val_sample_start_max"]), **common)
    return train, val
