"""Mirage pipeline steps (SC'23): trace ingestion, simulation, sampling, models, validation.

Never imports Airflow. Every step is a CLI: ``python -m mirage_tasks <step> --help``.
"""

__version__ = "0.1.0"
