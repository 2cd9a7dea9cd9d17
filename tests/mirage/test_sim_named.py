"""Named nodes (mirage_tasks/sim/named.py): Slurm's select/linear best-fit placement, and
backfill reservations that hold the nodes chosen (the cause of the remaining disagreement
with slurmctld in docs/results/slurm-replay.md)."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim_support import T0, random_trace, run_jobs, starts, tiny_cfg

from mirage_tasks.sim import SimConfig, Workload
from mirage_tasks.sim.engine import NamedFairShareSimulator, NamedSimulator, Simulator
from mirage_tasks.sim.named import best_fit, node_names, runs
from stepkit import StepError


def bits(*idx: int) -> int:
    return sum(1 << i for i in idx)


def test_runs_split_the_free_nodes_into_consecutive_blocks():
    assert runs(0) == []
    assert runs(bits(0, 1, 3, 4, 5, 9)) == [(0, 2), (3, 3), (9, 1)]
    assert runs((1 << 200) - 1) == [(0, 200)]


def test_best_fit_takes_the_first_smallest_block_that_holds_the_job():
    free = bits(0, 1, 2, 4, 5)  # n1-n3 and n5-n6
    assert node_names(best_fit(free, 2)) == ["n5", "n6"]  # not the lowest-numbered nodes
    assert node_names(best_fit(free, 3)) == ["n1", "n2", "n3"]
    assert node_names(best_fit(free, 1)) == ["n5"]  # the smaller block, from its start
    assert best_fit(bits(0, 3), 1) == bits(0)  # a tie: the first block
    assert best_fit(free, 6) == 0 and best_fit(free, 0) == 0


def test_best_fit_without_a_block_large_enough_takes_the_largest_then_fits_the_rest():
    free = bits(0, 1, 3, 4, 5, 7)  # n1-n2, n4-n6, n8
    # no block of 5: the largest (n4-n6) whole, then 2 more: n1-n2 holds them exactly
    assert node_names(best_fit(free, 5)) == ["n1", "n2", "n4", "n5", "n6"]
    # 4: n4-n6, then 1 more: the first smallest block that holds one is n8
    assert node_names(best_fit(free, 4)) == ["n4", "n5", "n6", "n8"]


def test_the_simulator_places_jobs_as_select_linear_does():
    sim = Simulator(tiny_cfg(nodes=6, backfill="named"), 0)
    assert type(sim) is NamedSimulator
    ids = []
    for n, dur in ((1, 50), (2, 1000), (1, 1000), (2, 1000)):  # n1 | n2-n3 | n4 | n5-n6
        j = sim.add_job(0, dur, dur, n)
        sim.schedule_submit(j)
        ids.append(j)
    sim.run_until(0)
    assert [node_names(sim.j_mask[j]) for j in ids] == [["n1"], ["n2", "n3"], ["n4"], ["n5", "n6"]]
    sim.run_until(50)  # n1 frees
    j = sim.add_job(60, 100, 100, 1)
    sim.schedule_submit(j)
    sim.run_until(60)
    assert node_names(sim.j_mask[j]) == ["n1"]
    assert sim.idle == 0 and sim.free == 0


# The case found in slurmctld's backfill log, made small. Six nodes: F (3 nodes, until 50),
# A (2, until 100), C (1, until 1000) start at once on n1-n3, n4-n5, n6. At 60 the top job T
# (4 nodes) cannot start; it gets a reservation at 100, when A ends. B (1 node, planned 500 s)
# arrives behind it. On a free-node count 5 nodes are free from 100 and T needs 4, so one is
# left over and B starts now. On named nodes T's reservation is n1-n4 (the best fit among the
# free n1-n5), which holds every node idle now: B may only use n5, free from 100.
JOBS = [(0, 3, 50, 50), (0, 2, 100, 100), (0, 1, 1000, 1000), (60, 4, 200, 200), (61, 1, 500, 500)]


def test_a_reservation_holds_named_nodes_that_a_count_leaves_free():
    got = {
        m: starts(run_jobs(tiny_cfg(nodes=6, backfill=m), JOBS)[0], list(range(5))) for m in ("conservative", "named")
    }
    assert got["conservative"] == [0, 0, 0, 100, 61]
    assert got["named"] == [0, 0, 0, 100, 100]
    sim, ids = run_jobs(tiny_cfg(nodes=6, backfill="named"), JOBS)
    assert node_names(sim.j_mask[ids[3]]) == ["n1", "n2", "n3", "n4"] and node_names(sim.j_mask[ids[4]]) == ["n5"]
    sim.run_until(float("inf"))
    assert not sim.j_mask and sim.idle == (1 << 6) - 1  # every node back once all have ended


def test_a_job_that_ends_before_the_reservation_may_use_its_nodes():
    # as above, but B is planned for 30 s: it ends at 91, before T's reservation, so it starts
    # now on one of the reserved nodes (the first of the idle block n1-n3)
    sim = Simulator(tiny_cfg(nodes=6, backfill="named"), 0)
    ids = []
    for sub, n, dur, lim in JOBS[:4] + [(61, 1, 30, 30)]:
        ids.append(sim.add_job(sub, dur, lim, n))
        sim.schedule_submit(ids[-1])
    sim.run_until(61)
    assert node_names(sim.j_mask[ids[4]]) == ["n1"]
    sim.drain()
    assert starts(sim, ids) == [0, 0, 0, 100, 61]


class Logged(NamedSimulator):
    """Records every placement (the simulator forgets a job's nodes at its end)."""

    def __init__(self, cfg, t0):
        super().__init__(cfg, t0)
        self.log = []

    def _start(self, j, backfilled, when=None, record_wait=True):
        super()._start(j, backfilled, when, record_wait)
        self.log.append((self.j_start[j], self.j_start[j] + self.j_dur[j], self.j_mask[j], self.j_nodes[j]))


def test_a_random_trace_never_puts_two_jobs_on_one_node():
    wl = Workload.from_frame(random_trace(5, days=3.0, nodes=16, rate_per_h=8.0))
    cfg = SimConfig(nodes=16, backfill="named", bf_interval_s=60, priority="age_size", warm_start=False)
    sim = Logged.from_workload(wl, cfg, T0, T0 + 2 * 86400)
    sim.drain()
    sim.run_until(float("inf"))
    assert len(sim.log) > 50
    per_node: dict[int, list[tuple[int, int]]] = {}
    for s, e, mask, n in sim.log:
        assert mask.bit_count() == n
        for i in range(16):
            if mask >> i & 1:
                per_node.setdefault(i, []).append((s, e))
    for spans in per_node.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


def test_fair_share_and_forks_keep_the_nodes():
    wl = Workload.from_frame(random_trace(7, days=3.0, nodes=16, rate_per_h=8.0))
    cfg = SimConfig(
        nodes=16,
        backfill="named",
        bf_interval_s=60,
        priority="multifactor",
        weight_fairshare=1000.0,
        fs_calc_period_s=300,
        warm_start=False,
    )
    sim = Simulator.from_workload(wl, cfg, T0, T0 + 2 * 86400)
    assert type(sim) is NamedFairShareSimulator
    sim.run_until(T0 + 86400)
    fork = sim.fork()
    assert fork.j_mask == sim.j_mask and fork.j_mask is not sim.j_mask and fork.idle == sim.idle
    sim.drain()
    fork.drain()
    assert sim.j_start == fork.j_start  # deterministic from the same state
    assert bin(sim.idle).count("1") == sim.free


def test_named_nodes_refuse_nodes_leaving_service():
    wl = Workload.from_frame(random_trace(3, days=8.0, nodes=16, rate_per_h=5.0))
    cfg = SimConfig(nodes=16, backfill="named", capacity_window_s=86400, warm_start=False)
    with pytest.raises(StepError, match="capacity_window_s"):
        sim = Simulator.from_workload(wl, cfg, T0 + 2 * 86400, T0 + 3 * 86400)
        sim.drain()


def test_named_nodes_change_some_starts_of_a_mixed_trace():
    """On a random trace with mixed sizes, named reservations change some starts (the pass is not
    conservative renamed), and every job still starts."""
    wl = Workload.from_frame(random_trace(11, days=3.0, nodes=16, rate_per_h=10.0))
    base = SimConfig(nodes=16, bf_interval_s=60, priority="age_size", warm_start=False)
    out = {}
    for m in ("conservative", "named"):
        sim = Simulator.from_workload(wl, base.replace(backfill=m), T0, T0 + 2 * 86400)
        sim.drain()
        out[m] = np.array(sim.j_start)
    assert (out["named"] >= 0).all()
    assert (out["named"] != out["conservative"]).any()


def test_hostlists_round_trip_in_slurms_notation():
    from mirage_tasks.sim.named import hostlist, parse_hostlist

    for text, mask in (("n6", bits(5)), ("n[1-3]", bits(0, 1, 2)), ("n[1-3,5,7-8]", bits(0, 1, 2, 4, 6, 7))):
        assert parse_hostlist(text) == mask and hostlist(mask) == text
    for bad in ("x[1-3]", "n[3-1]", "n0", "n[1-]"):
        with pytest.raises(ValueError, match="NodeList|node range"):
            parse_hostlist(bad)
