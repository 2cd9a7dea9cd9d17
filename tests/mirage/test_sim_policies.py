"""The policy seam (mirage_tasks/sim/policies.py): a policy declared and registered inside a test
runs a sample and reaches the help text, the accepted modes and calibration's search space
with no other edit.

A new policy needs at most three files: its declaration (``mirage_tasks/sim/policies.py``, or a
module of its own plus the import that registers it there) and its test. Here it is one: this
file declares both policies, registers them, and removes them afterwards.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pytest
from test_sim_support import T0, random_trace, run_jobs, starts, tiny_cfg

from lab.slurm import slurmconf as conf
from mirage_tasks.calibration import calibrate as cal
from mirage_tasks.sim import SimConfig, Workload, config, policies
from mirage_tasks.sim.episode import EpisodeSpec, simulate_sample
from stepkit import StepError

#: backfill without reservations: every job that fits now starts, none holds nodes for later
NO_RESERVE = policies.BackfillPolicy(
    "fifo_no_reserve",
    "start whatever fits now; no reservations",
    reserve=0,
    slurm_as="conservative",
    slurm_note="Slurm's backfill always reserves (rendered as conservative)",
)


@dataclass(frozen=True)
class SmallestFirst(policies.PriorityPolicy):
    """The fewest nodes first (a static term far above the age term)."""

    def static(self, cfg, wl, i, default):
        return -1e9 * float(wl.nodes[i])


SMALLEST = SmallestFirst("smallest_first", "the fewest nodes first", slurm_note="not expressible in Slurm")


@pytest.fixture
def registered():
    policies.register(NO_RESERVE)
    policies.register(SMALLEST)
    yield
    policies.unregister(NO_RESERVE.name, "backfill")
    policies.unregister(SMALLEST.name, "priority")


def test_builtin_policies_are_declared_once():
    assert config.BACKFILL_MODES == ("conservative", "easy", "named", "none")
    assert config.PRIORITY_MODES == ("age_size", "trace", "multifactor")
    assert policies.backfill_policy("easy").reservations(tiny_cfg()) == 1
    assert not policies.backfill_policy("none").passes
    facts = cal.TraceFacts(10, 5, 5, 4.0, 2, 2, 2, 0, 0.5, False, None)
    assert cal.search_space(facts)["priority"] == ["age_size"]
    assert cal.search_space(cal.TraceFacts(10, 5, 5, 4.0, 2, 2, 2, 0, 0.5, True, None))["priority"] == [
        "age_size",
        "trace",
    ]


def test_declared_parameters_are_config_fields():
    import dataclasses

    fields = {f.name for f in dataclasses.fields(SimConfig)}
    for p in (*policies.BACKFILL.values(), *policies.PRIORITY.values()):
        assert set(p.params) <= fields, p.name


def test_unknown_policy_is_refused():
    with pytest.raises(StepError, match="backfill must be one of"):
        SimConfig(nodes=4, backfill="fifo_no_reserve")


def test_a_policy_declared_in_a_test_reaches_help_modes_calibration_and_slurm(registered):
    assert "fifo_no_reserve" in config.BACKFILL_MODES and "smallest_first" in config.PRIORITY_MODES
    p = argparse.ArgumentParser()
    config.add_config_arguments(p)
    text = p.format_help().replace("\n", " ")
    assert "fifo_no_reserve" in text and "smallest_first" in text
    facts = cal.TraceFacts(10, 5, 5, 4.0, 2, 2, 2, 0, 0.5, True, None)
    space = cal.search_space(facts)
    assert "fifo_no_reserve" in space["backfill"] and "smallest_first" in space["priority"]
    cfg = config.config_from_args(
        p.parse_args(["--nodes", "8", "--backfill", "fifo_no_reserve", "--priority", "smallest_first"])
    )
    assert (cfg.backfill, cfg.priority) == ("fifo_no_reserve", "smallest_first")
    assert "SchedulerType=sched/backfill" in conf.render(cfg, 60.0, conf.Paths("/x"), 7000, (7001, 7008))
    assert conf.back_to_sim(cfg, 60.0).backfill == "conservative"
    notes = conf.unsupported(cfg)
    assert any(n.startswith("backfill=fifo_no_reserve:") for n in notes)
    assert any(n.startswith("priority=smallest_first:") for n in notes)


def test_no_reservation_backfill_differs_where_it_must(registered):
    jobs = [(0, 2, 100, 100), (0, 1, 50, 50), (1, 4, 100, 100), (2, 2, 50, 50), (10, 1, 60, 60)]
    got = {
        m: starts(run_jobs(tiny_cfg(backfill=m), jobs)[0], list(range(5)))
        for m in ("conservative", "easy", "none", "fifo_no_reserve")
    }
    assert got["easy"] == [0, 0, 100, 200, 10] and got["conservative"] == [0, 0, 100, 50, 200]
    # no reservation for anyone: K starts at 10, J when K ends (70), and the head H only after
    # J (120), later than under either reserving mode
    assert got["fifo_no_reserve"] == [0, 0, 120, 70, 10]
    assert len({tuple(v) for v in got.values()}) == 4


def test_a_sample_runs_with_the_new_policies(registered):
    wl = Workload.from_frame(random_trace(3, days=8.0, nodes=16, rate_per_h=5.0))
    spec = EpisodeSpec(warmup_days=1.0, workload_days=3.0)
    base = SimConfig(nodes=16, bf_interval_s=60, priority="age_size")
    outs = {}
    for bf, pr in (
        ("conservative", "age_size"),
        ("easy", "age_size"),
        ("fifo_no_reserve", "age_size"),
        ("conservative", "smallest_first"),
        ("fifo_no_reserve", "smallest_first"),
    ):
        res = simulate_sample(wl, base.replace(backfill=bf, priority=pr), T0 + 86400, 4, spec, probes=4)
        assert len(res) == 4 and all(np.isfinite(r.history).all() for r in res)
        outs[bf, pr] = (tuple(r.meta["succ_start"] for r in res), np.stack([r.history for r in res]))
    ref = outs["conservative", "age_size"]
    for k, v in outs.items():
        if k != ("conservative", "age_size"):
            assert v[0] != ref[0] or not np.array_equal(v[1], ref[1]), k
