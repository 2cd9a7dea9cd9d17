"""REINFORCE wait/submit policies on top of a frozen regressor.

The policy sees ``features(history)``: the frozen base model's outputs in scaled
units (the transformer's single output, or each MoE expert's output plus the mixture's),
and maps them to two logits (0 = wait, 1 = submit) with a linear layer (or a small MLP).

Training: per epoch ``episodes_per_epoch`` episodes are sampled from the environment;
the loss is ``-mean_i A_i * sum_t log pi(a_t | s_t) - entropy * mean_t H(pi(. | s_t))``
over non-forced steps only, with advantage ``A_i = (R_i - b_i) / std(R)`` and the
leave-one-out batch mean ``b_i`` of the other episodes' returns as baseline (rewards
are terminal only, undiscounted). With ``ppo_epochs`` > 1 each batch is used for that
many gradient steps on PPO's clipped surrogate (``clip``) instead of one REINFORCE step,
and the entropy coefficient decays linearly to ``entropy_final``.

Why: with one REINFORCE step per batch (the reference's method) and a decision every 10
minutes, the policy stays a low per-step hazard (P(submit) well below 0.5 everywhere, as
initialised): sampled it submits, greedily it never does (measured on ls6 and on the toy
environment, see ``tests/mirage/test_models.py``). Several clipped steps per batch move
P(submit) to near 0 / near 1 on either side of the learned rule, so the greedy policy
submits. After each epoch the greedy policy is evaluated on a
fixed set of validation episodes (actions sampled with a fixed seed, see :func:`evaluate`);
the best epoch by validation return is kept.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from stepkit import StepError

from . import StopRequested, torchutil
from .env import Env

log = logging.getLogger(__name__)

MAX_STEPS = 100_000  # guard against an environment that never ends an episode
Features = Callable[[np.ndarray], np.ndarray]


class PolicyHead(nn.Module):
    """Logits (wait, submit) from the base features.

    ``init_submit_prob`` sets the output bias so that an untrained policy submits with
    about this probability at each decision: with a decision every 10 minutes, 0.5 would
    end nearly every exploratory episode within the first hour, and waiting would never
    be explored; about 1/288 (one submission per 48 h of decisions) spreads the first
    submissions over the predecessor's whole run.
    """

    def __init__(self, n_inputs: int, hidden: int = 0, init_submit_prob: float | None = None):
        super().__init__()
        if hidden:
            self.net = nn.Sequential(nn.Linear(n_inputs, hidden), nn.Tanh(), nn.Linear(hidden, 2))
        else:
            self.net = nn.Sequential(nn.Linear(n_inputs, 2))
        if init_submit_prob is not None:
            last = self.net[-1]
            with torch.no_grad():
                last.weight.mul_(0.1)
                last.bias.copy_(torch.tensor([0.0, math.log(init_submit_prob / (1 - init_submit_prob))]))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)


def rollouts(
    envs: Sequence[Env],
    features: Features,
    head: PolicyHead,
    rngs: list[np.random.Generator],
    gen: torch.Generator | None,
) -> list[dict[str, Any]]:
    """One episode per generator in ``rngs``, run ``len(envs)`` at a time in lockstep.

    The base features of the environments that are still running are computed in one
    batch per decision. Actions are sampled with ``gen``, or greedy when ``gen`` is None.
    """
    out: list[dict[str, Any]] = []
    width = max(1, len(envs))
    for lo in range(0, len(rngs), width):
        chunk = rngs[lo : lo + width]
        obs = [envs[i].reset(r) for i, r in enumerate(chunk)]
        traj = [{"features": [], "actions": [], "forced": [], "return": 0.0, "interruption_min": None} for _ in chunk]
        active = list(range(len(chunk)))
        steps = 0
        with torch.no_grad():
            while active:
                z = np.asarray(features(np.stack([np.asarray(obs[i], np.float32) for i in active])), np.float32)
                logits = head(torch.from_numpy(z))
                if gen is None:
                    acts = torch.argmax(logits, -1)
                else:
                    acts = torch.multinomial(torch.softmax(logits, -1), 1, generator=gen)[:, 0]
                still = []
                for j, i in enumerate(active):
                    a = int(acts[j])
                    obs[i], r, done, info = envs[i].step(bool(a))
                    t = traj[i]
                    t["features"].append(z[j])
                    t["actions"].append(a)
                    t["forced"].append(bool(info.get("forced", False)))
                    t["return"] += float(r)
                    if done:
                        t["interruption_min"] = info.get("interruption_min")
                    else:
                        still.append(i)
                active = still
                steps += 1
                if steps > MAX_STEPS:
                    raise StepError(f"environment episode did not end within {MAX_STEPS} decisions")
        for t in traj:
            out.append(
                {
                    "features": np.stack(t["features"]),
                    "actions": np.asarray(t["actions"]),
                    "forced": np.asarray(t["forced"]),
                    "return": t["return"],
                    "interruption_min": t["interruption_min"],
                }
            )
    return out


def evaluate(
    envs: Sequence[Env], features: Features, head: PolicyHead, seed: int, episodes: int, mode: str = "sample"
) -> dict[str, float]:
    """The policy on ``episodes`` fixed episodes (seeded by ``seed``): mean return and forced share.

    ``mode="sample"`` draws actions from the policy with a generator re-seeded identically
    at every evaluation (common random numbers, so epochs are compared on equal terms);
    ``"greedy"`` takes the likelier action. A policy trained from a small initial submit
    probability acts as a hazard: its per-decision P(submit) can stay below 0.5 while it
    reliably submits within the right hour, which greedy evaluation would never show.
    """
    if mode not in ("sample", "greedy"):
        raise StepError(f"eval_mode must be sample or greedy, got {mode!r}")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 17) if mode == "sample" else None
    eps = rollouts(envs, features, head, [np.random.default_rng([seed, 7_000_003, i]) for i in range(episodes)], gen)
    rets = np.array([e["return"] for e in eps])
    return {"return_mean": float(rets.mean()), "forced_share": float(np.mean([e["forced"].any() for e in eps]))}


def _always_wait(n_inputs: int) -> PolicyHead:
    """The reactive baseline as a policy: never submits (the environment forces it at the predecessor's end)."""
    head = PolicyHead(n_inputs, 0)
    with torch.no_grad():
        head.net[-1].weight.zero_()
        head.net[-1].bias.copy_(torch.tensor([1.0, 0.0]))
    return head


def batch_tensors(episodes: list[dict[str, Any]]) -> dict[str, Any]:
    """Features, actions, non-forced mask and per-step advantages of a batch of episodes.

    Advantage of episode i: ``(R_i - b_i) / std(R)`` with ``b_i`` the leave-one-out mean of
    the other episodes' returns (rewards are terminal only), copied to each of its steps."""
    returns = np.array([e["return"] for e in episodes], dtype=np.float64)
    n = len(returns)
    baseline = (returns.sum() - returns) / max(n - 1, 1) if n > 1 else np.zeros(1)
    adv = (returns - baseline) / (returns.std() + 1e-8)
    return {
        "n": n,
        "z": torch.from_numpy(np.concatenate([e["features"] for e in episodes])),
        "a": torch.from_numpy(np.concatenate([e["actions"] for e in episodes])).long(),
        "keep": torch.from_numpy(~np.concatenate([e["forced"] for e in episodes])),
        "adv": torch.from_numpy(
            np.concatenate([np.full(len(e["actions"]), adv[i]) for i, e in enumerate(episodes)])
        ).float(),
    }


def reinforce_loss(
    head: PolicyHead,
    episodes: list[dict[str, Any]] | dict[str, Any],
    entropy_coef: float,
    old_logp: torch.Tensor | None = None,
    clip: float = 0.2,
) -> tuple[torch.Tensor, dict]:
    """REINFORCE loss (``old_logp`` None), or PPO's clipped surrogate against the log-probabilities
    ``old_logp`` of the policy that collected the episodes: ``-min(r A, clip(r, 1-e, 1+e) A)``
    with ``r = pi(a|s) / pi_old(a|s)``; summed over non-forced steps, averaged over episodes."""
    b = episodes if isinstance(episodes, dict) else batch_tensors(episodes)
    keep = b["keep"]
    logp_all = torch.log_softmax(head(b["z"]), -1)
    logp = logp_all.gather(1, b["a"][:, None])[:, 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    if not bool(keep.any()):
        return torch.zeros((), requires_grad=True), {"entropy": float("nan"), "free_steps": 0}
    if old_logp is None:
        pg = -(b["adv"] * logp * keep).sum() / b["n"]
    else:
        ratio = torch.exp(logp - old_logp)
        surr = torch.minimum(ratio * b["adv"], torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * b["adv"])
        pg = -(surr * keep).sum() / b["n"]
    ent_mean = ent[keep].mean()
    return pg - entropy_coef * ent_mean, {"entropy": float(ent_mean.detach()), "free_steps": int(keep.sum())}


def entropy_at(hp: dict[str, Any], epoch: int) -> float:
    """Entropy coefficient of ``epoch`` (1-based): ``entropy`` decayed linearly to ``entropy_final``
    (default: no decay) over the training epochs."""
    start = float(hp["entropy"])
    end = float(hp.get("entropy_final", start))
    epochs = max(int(hp["epochs"]), 1)
    return start + (end - start) * min(max(epoch - 1, 0) / max(epochs - 1, 1), 1.0)


def train_reinforce(
    features: Features,
    n_inputs: int,
    env: Env | Sequence[Env],
    val_env: Env | Sequence[Env],
    hp: dict[str, Any],
    *,
    seed: int,
    ckpt_uri: str | None,
    fingerprint: str,
    stop_after: int | None = None,
) -> tuple[PolicyHead, list[dict[str, Any]], dict[str, Any]]:
    """Train a policy head; returns the best head by validation return, the curves and a summary.

    ``env``/``val_env`` may be lists of independent environments of one kind: episodes
    then run that many at a time in lockstep (batched base features).
    """
    envs = list(env) if isinstance(env, (list, tuple)) else [env]
    val_envs = list(val_env) if isinstance(val_env, (list, tuple)) else [val_env]
    torch.manual_seed(seed)
    head = PolicyHead(n_inputs, int(hp["hidden"]), float(hp["init_submit_prob"]))
    opt = torch.optim.Adam(head.parameters(), lr=float(hp["lr"]))
    gen = torch.Generator().manual_seed(seed)
    curves: list[dict[str, Any]] = []
    first = 1
    best = {"epoch": 0, "val_return": -math.inf, "state": None}
    ck = torchutil.load_checkpoint(ckpt_uri, fingerprint) if ckpt_uri else None
    if ck is not None:
        torchutil.load_state(head, ck["head"], ckpt_uri)
        opt.load_state_dict(ck["optimizer"])
        gen.set_state(ck["generator"])
        torchutil.set_rng_state(ck["rng"])
        curves = list(ck["curves"])
        best = {"epoch": int(ck["best_epoch"]), "val_return": float(ck["best_val_return"]), "state": ck["best_state"]}
        first = int(ck["epoch"]) + 1
        log.info("resuming policy training from %s after epoch %d", ckpt_uri, first - 1)
    else:
        reactive = evaluate(val_envs, features, _always_wait(n_inputs), seed, int(hp["eval_episodes"]), "greedy")
        ev = evaluate(val_envs, features, head, seed, int(hp["eval_episodes"]), hp["eval_mode"])
        curves.append(
            {
                "epoch": 0,
                "val_return": ev["return_mean"],
                "val_forced_share": ev["forced_share"],
                "val_return_reactive": reactive["return_mean"],
            }
        )
        log.info(
            "policy: reactive baseline (always wait) on the validation episodes: return %.2f", reactive["return_mean"]
        )
        best = {
            "epoch": 0,
            "val_return": ev["return_mean"],
            "state": {k: v.clone() for k, v in head.state_dict().items()},
        }
        log.info("policy epoch 0 (untrained) val_return %.2f", ev["return_mean"])
    epochs = int(hp["epochs"])
    prog = torchutil.Progress("policy", epochs, first - 1)
    run = 0
    for epoch in range(first, epochs + 1):
        head.train()
        eps = rollouts(
            envs,
            features,
            head,
            [np.random.default_rng([seed, epoch, i]) for i in range(int(hp["episodes_per_epoch"]))],
            gen,
        )
        batch = batch_tensors(eps)
        coef = entropy_at(hp, epoch)
        k_updates = max(1, int(hp.get("ppo_epochs", 1)))
        if k_updates == 1:  # plain REINFORCE: one gradient step per batch
            loss, stats = reinforce_loss(head, batch, coef)
            if stats["free_steps"]:
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        else:  # PPO: several clipped steps on the same batch
            with torch.no_grad():
                old = torch.log_softmax(head(batch["z"]), -1).gather(1, batch["a"][:, None])[:, 0]
            for _ in range(k_updates):
                loss, stats = reinforce_loss(head, batch, coef, old_logp=old, clip=float(hp.get("clip", 0.2)))
                if not stats["free_steps"]:
                    break
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
        head.eval()
        ev = evaluate(val_envs, features, head, seed, int(hp["eval_episodes"]), hp["eval_mode"])
        rets = np.array([e["return"] for e in eps])
        rec = {
            "epoch": epoch,
            "train_return_mean": float(rets.mean()),
            "train_return_std": float(rets.std()),
            "loss": float(loss.detach()),
            "entropy": stats["entropy"],
            "free_steps": stats["free_steps"],
            "entropy_coef": coef,
            "train_forced_share": float(np.mean([e["forced"].any() for e in eps])),
            "val_return": ev["return_mean"],
            "val_forced_share": ev["forced_share"],
        }
        curves.append(rec)
        if ev["return_mean"] > best["val_return"]:
            best = {
                "epoch": epoch,
                "val_return": ev["return_mean"],
                "state": {k: v.clone() for k, v in head.state_dict().items()},
            }
        prog.line(
            epoch,
            train_return=rec["train_return_mean"],
            val_return=rec["val_return"],
            entropy=rec["entropy"] if stats["free_steps"] else 0.0,
        )
        run += 1
        if ckpt_uri and (epoch % max(int(hp["checkpoint_every"]), 1) == 0 or epoch == epochs or run == stop_after):
            torchutil.save_checkpoint(
                ckpt_uri,
                {
                    "fingerprint": fingerprint,
                    "epoch": epoch,
                    "head": head.state_dict(),
                    "optimizer": opt.state_dict(),
                    "generator": gen.get_state(),
                    "rng": torchutil.rng_state(),
                    "curves": curves,
                    "best_epoch": best["epoch"],
                    "best_val_return": best["val_return"],
                    "best_state": best["state"],
                },
            )
        if stop_after is not None and run >= stop_after and epoch < epochs:
            raise StopRequested(f"stopped after {run} epoch(s) as requested; rerun to resume")
    head.load_state_dict(best["state"])
    head.eval()
    # the kept policy run greedily (argmax) on the validation episodes: forced share 1.0 = it never
    # submits, i.e. greedy evaluation would replay the reactive baseline
    greedy = evaluate(val_envs, features, head, seed, int(hp["eval_episodes"]), "greedy")
    summary = {
        "best_epoch": best["epoch"],
        "best_val_return": best["val_return"],
        "initial_val_return": curves[0]["val_return"],
        "final_val_return": curves[-1]["val_return"],
        "reactive_val_return": curves[0]["val_return_reactive"],
        "greedy_val_return": greedy["return_mean"],
        "greedy_val_forced_share": greedy["forced_share"],
        "greedy_never_submits": greedy["forced_share"] >= 1.0,
        "method": f"PPO (clipped, {int(hp.get('ppo_epochs', 1))} updates per batch)"
        if int(hp.get("ppo_epochs", 1)) > 1
        else "REINFORCE",
    }
    return head, curves, summary
