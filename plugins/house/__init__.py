"""The house step factory and its configuration (see ``house.steps``, ``house.config``).

DAG files use only::

    from house import default_args, get_config, step, step_partial
"""

from house.config import ConfigError, HouseConfig, get_config
from house.steps import default_args, step, step_partial, step_spec

__all__ = ["ConfigError", "HouseConfig", "default_args", "get_config", "step", "step_partial", "step_spec"]
