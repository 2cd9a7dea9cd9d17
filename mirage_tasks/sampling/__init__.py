"""Training samples: the ``sample`` step's episodes run in a pool (``sample``) and the
split of a step's days or samples into pool tasks (``schedule``)."""
