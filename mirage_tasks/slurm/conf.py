"""What a Slurm of a simulator configuration enforces, back in the simulator's terms.

A Slurm cluster rendered from a :class:`~mirage_tasks.sim.config.SimConfig` at a time
compression ``factor`` (trace seconds per real second) gets its intervals rounded to what Slurm
can express (:func:`scaled`), and enforces only some of the simulator's rules:
:func:`sim_config` is the simulator configuration that matches it, which the keeper's live wait
predictor uses. The slurm.conf rendering itself, the mapping table and the accounting tree are
the lab's (``lab.slurm.slurmconf``), which runs such clusters to measure them.
"""

from __future__ import annotations

import math

from ..sim.config import SimConfig
from ..sim.policies import backfill_policy, priority_policy


def scaled(cfg: SimConfig, factor: float) -> dict[str, int]:
    """The scheduler settings Slurm gets for ``cfg`` at compression ``factor``."""
    f = float(factor)
    return {
        "bf_interval_s": max(1, round(cfg.bf_interval_s / f)),
        "bf_window_min": max(1, math.ceil(cfg.bf_window_s / f / 60)),
        "bf_resolution_s": max(1, round(cfg.bf_resolution_s / f)),
        "bf_max_job_test": int(cfg.bf_max_job_test),
        "max_age_min": max(1, math.ceil(cfg.max_age_s / f / 60)),
        "weight_age": int(round(cfg.weight_age)),
        "weight_size": int(round(cfg.weight_size)),
        **_fair_share_scaled(cfg, f),
    }


def _fair_share_scaled(cfg: SimConfig, f: float) -> dict[str, int]:
    """The multifactor settings added for fair share (none without it: the text stays as it was)."""
    if not priority_policy(cfg.priority).fair_share(cfg):
        return {}
    return {
        "weight_fairshare": int(round(cfg.weight_fairshare)),
        "fs_halflife_min": max(1, math.ceil(cfg.fs_halflife_s / f / 60)),
        "fs_calc_period_min": max(1, math.ceil(cfg.fs_calc_period_s / f / 60)),
        "weight_partition": int(round(cfg.weight_partition)),
    }


def back_to_sim(cfg: SimConfig, factor: float, accounting: bool = False) -> SimConfig:
    """The simulator configuration that matches what the rendered Slurm enforces, in trace
    time: Slurm's rounded intervals times ``factor``, and the rules it does not enforce off.
    With ``accounting`` (slurmdbd, :func:`render` with a ``dbd_port``) the age factor, fair share
    (its half-life and re-read period as Slurm rounds them) and the limits stay on; Slurm's usage
    starts from zero, so the simulator's does too (no warm start)."""
    s = scaled(cfg, factor)
    f = float(factor)
    kept: dict = {"weight_age": cfg.weight_age}
    if accounting:
        if "weight_fairshare" in s:
            kept.update(
                fs_halflife_s=int(s["fs_halflife_min"] * 60 * f), fs_calc_period_s=int(s["fs_calc_period_min"] * 60 * f)
            )
    else:
        kept.update(
            weight_age=0.0, weight_fairshare=0.0, max_jobs_per_user=0, max_nodes_per_user=0, grp_jobs=0, grp_nodes=0
        )
    return cfg.replace(
        bf_interval_s=max(1, int(round(s["bf_interval_s"] * f))),
        bf_window_s=int(s["bf_window_min"] * 60 * f),
        bf_resolution_s=max(1, int(round(s["bf_resolution_s"] * f))),
        max_age_s=int(s["max_age_min"] * 60 * f),
        age_cap=True,
        tick_s=0,
        warm_start=False,
        capacity_window_s=0,
        short_partition_limit_s=0,
        holds="none",
        backfill=backfill_policy(cfg.backfill).slurm_equivalent(),
        **kept,
    )


def sim_config(cfg: SimConfig, factor: float, accounting: bool = False, sim_backfill: str | None = None) -> SimConfig:
    """The simulator's settings for a Slurm cluster of ``cfg`` at ``factor`` (the live wait
    predictor's, and the simulator's side of a comparison with Slurm, ``lab.slurm.compare``):
    :func:`back_to_sim` (the backfill Slurm enforces for ``cfg``'s: ``named`` for
    ``conservative``), or ``sim_backfill`` where given (to measure what another model of Slurm's
    backfill, e.g. the free-node count, would score)."""
    out = back_to_sim(cfg, factor, accounting)
    return out.replace(backfill=sim_backfill) if sim_backfill else out
