"""Mirage against a real Slurm: the live queue (:mod:`.queue`), the service keeper
(:mod:`.keeper`) and its session (:mod:`.session`), the Slurm settings rendered from the
simulator's configuration (:mod:`.conf`). The local cluster (``make slurm``) and the
time-compressed trace replay the measurements run are the lab's (``lab.slurm.cluster``,
``lab.slurm.replay``).

Nothing here imports Airflow; every Slurm interaction goes through the ordinary client
commands (``sbatch``, ``squeue``, ``sinfo``, ``scancel``) named by ``SLURM_CONF``, so the
same code talks to the local cluster and to a real one.
"""
