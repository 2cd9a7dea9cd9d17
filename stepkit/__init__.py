"""Shared step contract for the task packages (no Airflow here).

``storage``: fsspec URIs and atomic writes. ``step``: fingerprints, success markers and inputs
checked against them. ``lease``: one writer per output prefix.
``cli``: the lazy sub-command dispatcher behind ``python -m <package> <step>``.
"""

from .errors import StepError
from .step import MARKER, Step, read_marker, require_committed

__all__ = ["MARKER", "Step", "StepError", "read_marker", "require_committed"]
