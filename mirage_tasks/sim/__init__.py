"""The Mirage batch-scheduler simulator (event driven; see :mod:`.engine`), and only it:
its calibration against a trace is :mod:`mirage_tasks.calibration`.

| module       | what                                                               |
|--------------|--------------------------------------------------------------------|
| ``config``   | cluster and scheduler settings (presets, JSON, command-line flags) |
| ``workload`` | a trace as the simulator's job arrays                              |
| ``policies`` | the scheduling policies, each declared once: queue order (age/size, the trace's recorded priority, Slurm's multifactor with fair share) and backfill (conservative, EASY, none) |
| ``fairshare`` | Slurm's classic fair-share factor with usage decay (the multifactor policy's ledger) |
| ``engine``   | the event-driven scheduler: strict priority order, backfill passes, both through the policy objects of ``policies`` |
| ``features`` | the queue/cluster snapshot features of a decision history          |
| ``episode``  | samples, probes and online decision episodes                       |
| ``probes``   | probe spacings and the baseline rules (reactive, avg), stdlib only |

Importing this package is cheap: the names below load their module on first use, so a
step's ``add_arguments`` can use :mod:`.config` without importing numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "PRESETS": "config",
    "SimConfig": "config",
    "add_config_arguments": "config",
    "config_from_args": "config",
    "Simulator": "engine",
    "Workload": "workload",
    "DecisionEpisode": "episode",
    "EpisodeSpec": "episode",
    "ProbeResult": "episode",
    "build_episode": "episode",
    "probe_times": "episode",
    "simulate_sample": "episode",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(name)


__all__ = sorted(_WHERE)
