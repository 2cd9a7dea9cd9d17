"""Shared step contract for the task packages (no Airflow here).

``storage``: fsspec URIs and atomic writes. ``step``: fingerprints and success markers.
``cli``: the lazy sub-command dispatcher behind ``python -m <package> <step>``.
"""

from .step import MARKER, Step, StepError, read_marker, require_committed

__all__ = ["MARKER", "Step", "StepError", "read_marker", "require_committed"]
