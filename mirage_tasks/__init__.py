"""Mirage pipeline steps (SC'23): trace ingestion, simulation, sampling, models, validation.

Never imports Airflow. Every step is a CLI: ``python -m mirage_tasks <step> --help``.

Packages, lowest layer first; each imports only itself and the ones above it in this list
(the ``mirage-layers`` contract in ``pyproject.toml``, checked by ``lint-imports``; this table
lists its layers in order: ``tests/test_layers.py``):

| package        | what                                                                      |
|----------------|---------------------------------------------------------------------------|
| ``data``       | traces (``ingest`` readers, ``schema``), ``synth``, ``prefixes``, ``times``, step artifacts, storage ``keys`` |
| ``sim``        | the batch-scheduler simulator alone, its episodes and baseline rules       |
| ``calibration``| simulator calibration: ``fidelity``, ``calibrate``, its page ``tables``   |
| ``sampling``   | the ``sample`` step's episodes in a pool, the day/shard ``schedule``       |
| ``models``     | model families (one ``registry``), training, ``thresholds``, the loader  |
| ``evaluation`` | online ``validate``, ``metrics``, the results ``report``                  |
| ``slurm``      | a real Slurm: its ``conf``, the trace ``replay`` and the service ``keeper`` |
| ``steps``      | one command line per step (and ``__main__``'s step table)                 |
| ``run``        | a pipeline run: ``runconf`` (typed params), ``plan`` (every argv), ``runlog`` |

A library module is named like the step it serves (``data.ingest`` for ``ingest``,
``sampling.sample`` for ``sample``, ``evaluation.validate`` for ``validate``,
``calibration.calibrate`` for ``calibrate``); "calibrate" is the simulator's fit to a trace,
a model's decision threshold is ``models.thresholds``.
"""

__version__ = "0.1.0"
