"""The Mirage batch-scheduler simulator (event driven; see :mod:`.engine`)."""

from .config import PRESETS, SimConfig, add_config_arguments, config_from_args
from .engine import Simulator
from .episode import DecisionEpisode, EpisodeSpec, ProbeResult, build_episode, probe_times, simulate_sample
from .workload import Workload

__all__ = [
    "PRESETS", "DecisionEpisode", "EpisodeSpec", "ProbeResult", "SimConfig", "Simulator", "Workload",
    "add_config_arguments", "build_episode", "config_from_args", "probe_times", "simulate_sample",
]
