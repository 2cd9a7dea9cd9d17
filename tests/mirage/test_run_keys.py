"""Run keys (mirage_tasks.run.plan.run_key) of stored configurations never move: the hashes
below were computed before a field at its default stopped entering the key (issue 30), and
every run prefix written before must still be found."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from mirage_tasks.run.plan import run_key, trace_identity
from mirage_tasks.run.runconf import MirageRun

APRIL = datetime(2023, 4, 1, tzinfo=timezone.utc)
REAL = {"trace": "/data/ls6.log", "trace_timezone": "America/Chicago"}

#: ``name: (params, from_params keywords)``: every size, on the synthetic trace and on a real one,
#: scheduled and backfill runs, and non-default confs (models, an integer, a float, a whole float,
#: train_params, several at once).
CONFS = {
    "demo": ({"size": "demo"}, {}),
    "demo_real": ({"size": "demo", **REAL}, {}),
    "demo_backfill": ({"size": "demo"}, {"backfill": True}),
    "month": ({"size": "month"}, {}),
    "paper": ({"size": "paper"}, {}),
    "paper_real": ({"size": "paper", **REAL}, {}),
    "scheduled": ({}, {"scheduled": True}),
    "models": ({"size": "paper", "models": ["xgboost", "transformer", "transformer_policy"]}, {}),
    "train_count": ({"size": "paper", "train_count": 100}, {}),
    "warmup_float": ({"size": "paper", "warmup_days": 1.5}, {}),
    "interval_whole_float": ({"size": "paper", "interval_hours": 6.0}, {}),
    "interval_frac": ({"size": "month", "interval_hours": 2.5}, {}),
    "train_params": ({"size": "demo", "train_params": {"xgboost": ["n_estimators=50"]}}, {}),
    "mixed": ({"size": "scheduled", "seed": 7, "preset": "paper", "device": "cuda", "policy_eval": "greedy",
               "probe_spacing": "end", "node_sizes": [4], "val_start": "2023-03-05T00:00:00+00:00"}, {}),
}

#: The run keys of CONFS for the logical date APRIL, computed on the code before the change
#: (paper, paper_real and scheduled are also pinned in tests/dags/test_mirage_plan.py).
PINNED = {
    "demo": "2023-04-01T000000Z-3ce040816b54",
    "demo_real": "2023-04-01T000000Z-a1f4885de3c1",
    "demo_backfill": "2023-04-01T000000Z-cdd3ff4e0d2e",
    "month": "2023-04-01T000000Z-25248c5b24e4",
    "paper": "2023-04-01T000000Z-85d52a42ea4b",
    "paper_real": "2023-04-01T000000Z-6364ef39a127",
    "scheduled": "2023-04-01T000000Z-943569fab9f8",
    "models": "2023-04-01T000000Z-89875ccfd959",
    "train_count": "2023-04-01T000000Z-e54a573d458e",
    "warmup_float": "2023-04-01T000000Z-5c1e0b74b87d",
    "interval_whole_float": "2023-04-01T000000Z-bab5a110fb27",
    "interval_frac": "2023-04-01T000000Z-cf95ad07844c",
    "train_params": "2023-04-01T000000Z-91605425eab5",
    "mixed": "2023-04-01T000000Z-e6e3e36185f0",
}


def key_of(cls, name: str, logical_date=APRIL, **extra) -> str:
    params, kw = CONFS[name]
    run = cls.from_params({**params, **extra}, **kw)
    return run_key(run, logical_date, trace_identity(run, "sha256:aa" if run.trace else None))


@pytest.mark.parametrize("name", sorted(CONFS))
def test_run_keys_of_stored_configurations_are_pinned(name):
    assert key_of(MirageRun, name) == PINNED[name]


def test_a_manual_run_key_is_pinned():
    assert key_of(MirageRun, "demo", None) == "manual-3ce040816b54"
