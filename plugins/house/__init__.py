"""The house step factory and its configuration (see ``house.steps``, ``house.config``).

DAG files use only::

    from house import MACROS, default_args, steps_for, storage_prefix

    step, step_partial = steps_for("mirage_tasks")
"""

from house.argv import OMIT, optional_flag, param_argv
from house.config import MACROS, ConfigError, HouseConfig, get_config, input_roots, storage_prefix
from house.steps import (
    MAP_LABEL,
    PackageSteps,
    cron_schedule,
    default_args,
    mapped_items,
    step,
    step_partial,
    step_spec,
    steps_for,
)

__all__ = [
    "MACROS",
    "MAP_LABEL",
    "OMIT",
    "ConfigError",
    "HouseConfig",
    "PackageSteps",
    "cron_schedule",
    "default_args",
    "get_config",
    "input_roots",
    "mapped_items",
    "optional_flag",
    "param_argv",
    "step",
    "step_partial",
    "step_spec",
    "steps_for",
    "storage_prefix",
]
