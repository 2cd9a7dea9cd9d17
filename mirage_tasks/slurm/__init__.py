"""Mirage against a real Slurm: a local cluster rendered from the simulator's configuration
(:mod:`.conf`, :mod:`.cluster`), the live queue (:mod:`.queue`) and the service keeper
(:mod:`.keeper`). The time-compressed trace replay the measurements run is the lab's
(``lab.slurm.replay``).

Nothing here imports Airflow; every Slurm interaction goes through the ordinary client
commands (``sbatch``, ``squeue``, ``sinfo``, ``scancel``) named by ``SLURM_CONF``, so the
same code talks to the local cluster and to a real one.
"""
