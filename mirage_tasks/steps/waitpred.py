"""``python -m mirage_tasks waitpred``: queue-wait prediction at submission time, with bounds.

The command line of :mod:`mirage_tasks.calibration.waitpred` (what each candidate reads, the
bounds, the guard and the outputs are described there).
"""

from ..calibration.waitpred import add_arguments, run

__all__ = ["add_arguments", "run"]
