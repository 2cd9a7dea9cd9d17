"""Mirage against a real Slurm: a local cluster rendered from the simulator's configuration
(:mod:`.conf`, :mod:`.cluster`), a time-compressed trace replay (:mod:`.replay`), the live
queue (:mod:`.queue`) and the service keeper (:mod:`.keeper`).

Nothing here imports Airflow; every Slurm interaction goes through the ordinary client
commands (``sbatch``, ``squeue``, ``sinfo``, ``scancel``) named by ``SLURM_CONF``, so the
same code talks to the local cluster and to a real one.
"""
