"""Every storage key of a Mirage run, built in one place. Stdlib only.

The planner (:mod:`mirage_tasks.run.plan`) names each step's output with these functions,
and a step that derives a key itself (``sample``: a day's partition under its family root,
the grid and probe spacing recorded in its marker) calls the same one, so the location a
plan expects is the one the step writes. Under the house storage root:

* ``mirage/traces/<kind>-<key>``: an ingested or generated trace (:func:`trace_location`);
* ``mirage/samples/node<N>-<key>/day=YYYY-MM-DD``: one day of a sample family
  (:func:`sample_family`, :func:`partition`);
* ``mirage_pipeline/<logical date>-<key>/``: one run's own outputs (:func:`run_prefix`):
  ``datasets/node<N>``, ``models/<kind>/node<N>``, ``validation/<name>/node<N>/shard<i>``,
  ``fidelity``, ``metrics``, ``report`` (:func:`dataset` ... :func:`report`).

A key hashes what its artefact depends on (:func:`digest`), so a change of any input gives
a new location and an unchanged one finds its committed output.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .times import hours_to_s

#: The probe spacing whose outputs do not record it (every output written before the option).
DEFAULT_SPACING = "uniform"


def digest(obj: Any, n: int = 16) -> str:
    """A short stable hash of a JSON-able value (the key of a storage location)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:n]


def _join(*parts: str) -> str:
    return "/".join([parts[0].rstrip("/"), *parts[1:]])


# ----------------------------------------------------------------------------- shared: traces and samples


def trace_location(shared: str, identity: dict[str, Any]) -> str:
    """``<shared>/traces/<kind>-<key>``: one ingested (or generated) trace per identity
    (what it depends on: its content or profile and seed, time zone, window)."""
    return _join(shared, f"traces/{identity['kind']}-{digest(identity)}")


def grid(anchor: int, interval_hours: float) -> tuple[int, int]:
    """``(interval seconds, phase)`` of the sample grid through ``anchor`` (epoch seconds):
    sample starts are the times ``t`` with ``t % interval == phase``. A ``ValueError`` for an
    interval under one second."""
    interval_s = hours_to_s(interval_hours)
    if interval_s < 1:
        raise ValueError("--interval-hours must be at least one second")
    return interval_s, int(anchor) % interval_s


def spacing_params(baseline: str, spacing: str) -> dict[str, str]:
    """The probe spacing as it enters a sample output's parameters (so its marker, its skip
    check and :func:`sample_family`'s key): absent for the reference's uniform spacing (the
    spacing of every output written before the option existed, which stay valid) and for the
    baseline modes (one probe, no spacing)."""
    return {"probe_spacing": spacing} if baseline == "default" and spacing != DEFAULT_SPACING else {}


def sample_family(
    shared: str,
    source: dict[str, Any],
    *,
    cluster_config: str,
    interval_hours: float,
    anchor: int,
    warmup_days: float,
    workload_days: float,
    probes: int,
    node: int,
    probe_spacing: str,
    baseline: str = "default",
) -> str:
    """``<shared>/samples/node<N>-<key>``: the root of one sample family, whose day partitions
    share every input but the day: the trace ``source``, the simulator configuration, the
    episode and probe parameters, the grid through ``anchor`` and the mode."""
    _, phase = grid(anchor, interval_hours)
    # floats as the keys have always been written (4.0, not 4), so committed families stay valid; a run
    # key hashes them as ints (see mirage_tasks.run.runconf.canonical_number)
    key = {
        "trace": source,
        "cluster_config": cluster_config,
        "interval_hours": float(interval_hours),
        "phase_s": phase,
        "warmup_days": float(warmup_days),
        "workload_days": float(workload_days),
        "probes": probes,
        "node": int(node),
        "baseline": baseline,
        **spacing_params(baseline, probe_spacing),
    }
    return _join(shared, f"samples/node{int(node)}-{digest(key)}")


def partition(family: str, day: str) -> str:
    """The partition of ``day`` (YYYY-MM-DD) under a sample family's root."""
    return _join(family, f"day={day}")


# ----------------------------------------------------------------------------- one run's outputs


def run_prefix(runs: str, key: str) -> str:
    """``<runs>/<key>``: a run's own outputs (``key``: :func:`mirage_tasks.run.plan.run_key`)."""
    return _join(runs, key)


def dataset(prefix: str, node: int) -> str:
    return _join(prefix, f"datasets/node{int(node)}")


def model(prefix: str, kind: str, node: int) -> str:
    return _join(prefix, f"models/{kind}/node{int(node)}")


def validation(prefix: str, name: str, node: int, shard: int) -> str:
    return _join(prefix, f"validation/{name}/node{int(node)}/shard{int(shard)}")


def fidelity(prefix: str) -> str:
    return _join(prefix, "fidelity")


def metrics(prefix: str) -> str:
    return _join(prefix, "metrics")


def report(prefix: str) -> str:
    return _join(prefix, "report")
