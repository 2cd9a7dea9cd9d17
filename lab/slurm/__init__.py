"""The Slurm measurement commands: a trace window replayed on slurmctld against the simulator (``python -m lab replay-slurm``, ``fidelity-slurm``)."""
