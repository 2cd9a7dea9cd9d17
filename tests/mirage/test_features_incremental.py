"""Snapshots read from the engine's incremental statistics equal the from-scratch definition.

``features.snapshot`` reads sorted queue/running statistics the simulator keeps while a
history is recorded (``features.QueueStats``); ``features.snapshot_direct`` recomputes the
same 44 values from the queue and the running set. Every snapshot of real ls6 episodes
(several configurations: user limits, capacity drains, a short partition, inferred holds,
the engine's plain path) and of random traces must agree bit for bit, and so must probe
histories taken after forks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_sim_support import T0, random_trace

from mirage_tasks.data.schema import read_trace
from mirage_tasks.sim import PRESETS, Simulator, Workload, episode, features
from mirage_tasks.sim.episode import DecisionEpisode, EpisodeSpec, simulate_sample

CONFIGS = {
    "ls6": PRESETS["ls6"],
    "capacity_short": PRESETS["ls6"].replace(
        capacity_window_s=86400, capacity_quantile=0.9, short_partition_limit_s=3600
    ),
    "holds_capped": PRESETS["reference"].replace(
        tick_s=0, warm_start=True, age_cap=True, nodes=70, max_age_s=86400, max_jobs_per_user=8, holds="inferred"
    ),
}


@pytest.fixture
def checked(monkeypatch):
    """Every snapshot the episodes take is compared with :func:`features.snapshot_direct`."""
    seen = []
    fast = features.snapshot

    def both(sim):
        a = fast(sim)
        b = features.snapshot_direct(sim)
        assert a.dtype == b.dtype == np.float64
        assert a.tobytes() == b.tobytes(), (sim.now, np.flatnonzero(a != b))
        seen.append(sim.now)
        return a

    monkeypatch.setattr(episode.features, "snapshot", both)
    return seen


@pytest.mark.parametrize(
    ("name", "plain"), [("ls6", False), ("ls6", True), ("capacity_short", False), ("holds_capped", False)]
)
def test_ls6_snapshots_equal_the_direct_computation(ls6_parquet, checked, monkeypatch, name, plain):
    df, _ = read_trace(str(ls6_parquet))
    wl = Workload.from_frame(df)
    monkeypatch.setattr(Simulator, "fast", not plain)
    t0 = int(pd.Timestamp("2023-02-06", tz="UTC").timestamp())  # February: the busiest month
    for k, node in ((0, 1), (3, 8)):
        out = simulate_sample(wl, CONFIGS[name], t0 + k * 4 * 3600, node, EpisodeSpec(), probes=3)
        assert len(out) == 3 and all(p.history.shape == (144, features.N_FEATURES) for p in out)
    assert len(checked) > 500


def test_random_trace_snapshots_and_online_forks_equal_the_direct_computation(checked):
    wl = Workload.from_frame(random_trace(7, days=8, nodes=16))
    cfg = PRESETS["ls6"].replace(nodes=16, max_jobs_per_user=3)
    ep = DecisionEpisode(wl, cfg, T0 + 86400, node=4, warmup_days=1, workload_days=5, window=12, step_s=600)
    forks = []
    while not ep.pred_ended:
        ep.advance(3600)
        h = ep.history()
        sim = ep.sim
        direct = np.zeros_like(h)
        snaps = [s for _, s in sim.snaps]
        direct[len(h) - len(snaps) :, :] = np.stack(snaps)
        assert np.array_equal(h[:, : features.PRED_COL], direct[:, : features.PRED_COL])
        if len(forks) < 3:
            forks.append(ep.fork())
    for f in forks:  # a fork keeps its own statistics: its snapshots still agree
        f.advance(7200)
        f.submit_successor()
    assert len(checked) > 50
    # a recorder started again rebuilds its statistics from the state
    sim = ep.sim.fork()
    sim.record_history(features.snapshot, sim.now, 600, 4)
    sim.run_until(sim.now + 3000)
    assert [t for t, _ in sim.snaps] and sim.queue_stats is not None
    sim.stop_history()
    assert sim.queue_stats is None
