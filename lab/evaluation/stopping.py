"""A submit policy that learns (protocol v2): a stopping policy over a sample's
decision times, trained by gradient on the evaluation objective itself.

At each probe ``k`` of a sample the policy submits with probability ``p_k = sigmoid(w . x_k + b)``
(the last probe, the predecessor's end, always submits). The episode's return is minus the
objective of the probe where it submits, ``J_k = max(y_k, 0) + waste_weight x node x max(-y_k, 0)``
(the probe's simulated signed interruption ``y_k``: interruption hours plus the waste-weighted
overlap, the measure every rule is scored by). Because every probe of a sample was simulated, the
outcome of every action is known, and the policy-gradient objective, the expected return
``E[-J] = -sum_k S_k p_k J_k`` with ``S_k = prod_{i<k} (1 - p_i)``, is computed exactly instead of
sampled (REINFORCE's estimate of the same gradient has the variance that made the terminal-reward
policies of protocol v1 collapse to reactive). Each step's signal is the difference its decision makes
to the return (the gradient of ``p_k`` carries ``J_k`` minus the expected objective of waiting),
and decisions exist only at the probes, i.e. in the last 24 hours, where they matter.

Inputs per probe, all known at the probe: the queue snapshot at the decision
(:mod:`mirage_tasks.sim.features`, standardised on the training rows), the time left to the
predecessor's (pre-simulated) end and, where the samples carry it (``sample --waitpred``), the wait
predictor's answer and bound minus the time left. Fitted on the training split's training rows, the
epoch kept by the validation split's objective (deterministic rule: submit at the first probe with
``p_k >= 0.5``), full-batch Adam, seed fixed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mirage_tasks.evaluation.rules import per_sample_objective
from mirage_tasks.models.thresholds import outcomes

EPOCHS = 400
LR = 0.05
L2 = 1e-3
EVAL_EVERY = 10


def _inputs(probes: Any) -> np.ndarray:
    left = probes.time_left_h()
    cols = [probes.X_last[:, -1, :].astype(np.float64), left[:, None], np.log1p(np.maximum(left, 0))[:, None]]
    if probes.has_waitpred():
        m = probes.meta
        cols += [
            (m["wp_wait_s"].to_numpy(np.float64) / 3600.0 - left)[:, None],
            (m["wp_bound_s"].to_numpy(np.float64) / 3600.0 - left)[:, None],
        ]
    return np.concatenate(cols, axis=1)


def _groups(sample: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.flatnonzero(np.r_[True, sample[1:] != sample[:-1]])
    return starts, np.r_[starts[1:], len(sample)] - 1


class StoppingPolicy:
    """The fitted policy: :meth:`prob` gives each probe's submit probability."""

    def __init__(self, mean: np.ndarray, scale: np.ndarray, w: np.ndarray, b: float, info: dict[str, Any]):
        self.mean, self.scale, self.w, self.b, self.info = mean, scale, w, float(b), info

    def prob(self, probes: Any) -> np.ndarray:
        z = (_inputs(probes) - self.mean) / self.scale
        p = 1.0 / (1.0 + np.exp(-(z @ self.w + self.b)))
        _, ends = _groups(probes.sample)
        p[ends] = 1.0  # the predecessor's end: the service must be resubmitted
        return p


def expected_objective(p: np.ndarray, J: np.ndarray, sample: np.ndarray) -> float:
    """``mean over samples of sum_k S_k p_k J_k``: the policy's expected objective when it submits at
    probe ``k`` with probability ``p_k`` (rows grouped by sample; a sample's last p must be 1)."""
    starts, ends = _groups(sample)
    return float(
        np.mean(
            [(np.cumprod(np.r_[1.0, 1 - p[a:e]]) * p[a : e + 1] * J[a : e + 1]).sum() for a, e in zip(starts, ends)]
        )
    )


def fit(train: Any, val: Any, node: int, waste_weight: float, seed: int = 0) -> StoppingPolicy:
    """Fit on ``train`` (the training split's training rows), keep the epoch whose deterministic rule
    has the least objective on ``val`` (the validation split)."""
    import torch

    torch.manual_seed(seed)
    Xtr = _inputs(train)
    mean = Xtr.mean(0)
    scale = np.where(Xtr.std(0) > 1e-9, Xtr.std(0), 1.0)
    Z = torch.tensor((Xtr - mean) / scale, dtype=torch.float64)
    J = torch.tensor(per_sample_objective(train.y, node, waste_weight), dtype=torch.float64)
    starts, ends = _groups(train.sample)
    # one padded [samples, probes] layout, so the expectation is a few tensor ops, not a Python loop
    P = int((ends - starts).max()) + 1
    idx = np.full((len(starts), P), -1)
    for i, (a, e) in enumerate(zip(starts, ends)):
        idx[i, : e - a + 1] = np.arange(a, e + 1)
    valid = torch.tensor(idx >= 0)
    last = torch.zeros(len(starts), P, dtype=torch.bool)
    last[torch.arange(len(starts)), torch.tensor(ends - starts)] = True
    gi = torch.tensor(np.maximum(idx, 0))
    w = torch.zeros(Z.shape[1], dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-2.0, dtype=torch.float64, requires_grad=True)  # start near "wait" (p ~ 0.12)
    opt = torch.optim.Adam([w, b], lr=LR)
    best = (np.inf, w.detach().numpy().copy(), float(b.detach()), 0)
    history = []
    for epoch in range(EPOCHS + 1):
        if epoch % EVAL_EVERY == 0:
            pol = StoppingPolicy(mean, scale, w.detach().numpy().copy(), float(b.detach()), {})
            vo = float(per_sample_objective(outcomes(pol.prob(val), val.y, val.sample, 0.5), node, waste_weight).mean())
            history.append((epoch, vo))
            if vo < best[0] - 1e-9:
                best = (vo, pol.w, pol.b, epoch)
        if epoch == EPOCHS:
            break
        p = torch.sigmoid(Z @ w + b)[gi]
        p = torch.where(last, torch.ones_like(p), p)
        p = torch.where(valid, p, torch.zeros_like(p))
        surv = torch.cumprod(torch.cat([torch.ones(len(starts), 1, dtype=p.dtype), 1 - p[:, :-1]], 1), 1)
        loss = (surv * p * J[gi] * valid).sum(1).mean() + L2 * (w * w).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    info = {
        "epochs": EPOCHS,
        "lr": LR,
        "l2": L2,
        "kept_epoch": best[3],
        "validation_objective": best[0],
        "inputs": int(Z.shape[1]),
        "uses_waitpred": bool(train.has_waitpred()),
        "seed": seed,
        "validation_curve": history,
    }
    return StoppingPolicy(mean, scale, best[1], best[2], info)
