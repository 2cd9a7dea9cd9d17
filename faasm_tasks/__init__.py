"""Faasm (ATC'20) benchmark steps: deploy, load, collect, teardown. Never imports Airflow."""

__version__ = "0.1.0"
