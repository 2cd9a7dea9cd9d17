"""The user-facing error of the step contract (its own module so every stepkit module can raise it)."""


class StepError(Exception):
    """A user-facing error: bad input or parameters. The CLI prints it and exits 2."""
