"""``python -m lab <command> [flags]``: the lab's measurement commands, run from the repository root.

Steps of the same contract as the product's (``add_arguments``/``run``, outputs committed by
:class:`stepkit.Step`, exit 2 naming a bad flag, SIGTERM stops what they started), but no DAG
runs them: they measure the simulator against a real slurmctld for docs/results/slurm-replay.md,
measure keep-service on a local Slurm over a replayed background (``keeper-slurm``,
docs/results/service-keeper.md) and list what a pipeline run produced (``summary``, which
``make demo`` ends with).
"""

import argparse
import importlib
import sys

from stepkit.cli import main

# command -> (module with add_arguments/run, one-line help). Modules import lazily.
STEPS: dict[str, tuple[str, str]] = {
    "replay-slurm": (
        "lab.slurm.replay_slurm",
        "replay a trace window on a real Slurm (time-compressed) and compare the simulator",
    ),
    "fidelity-slurm": (
        "lab.slurm.fidelity_slurm",
        "score the simulator again on a recorded Slurm replay (other settings, no Slurm run)",
    ),
    "keeper-slurm": (
        "lab.slurm.keeper_slurm",
        "keep-service measured on a local Slurm of its own, over a replayed background, beside the simulator",
    ),
    "summary": ("lab.summary", "list what a pipeline run produced and where (read-only)"),
}


def step_parser(step: str) -> argparse.ArgumentParser:
    """The parser of ``python -m lab <step>`` (its module's ``add_arguments``): a campaign that
    builds such a command line checks it with this, as the product's plan does its steps'."""
    if step not in STEPS:
        raise ValueError(f"unknown lab step {step!r}; known: {', '.join(STEPS)}")
    module, helptext = STEPS[step]
    parser = argparse.ArgumentParser(prog=f"python -m lab {step}", description=helptext)
    importlib.import_module(module).add_arguments(parser)
    return parser


if __name__ == "__main__":
    sys.exit(main("lab", STEPS))
