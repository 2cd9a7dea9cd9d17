"""The load driver (moved from faasm_tasks/loadgen.py and its load_* siblings; every name
of the old module is still here)."""

from . import driver as _driver

globals().update({k: v for k, v in vars(_driver).items() if not k.startswith("__")})
