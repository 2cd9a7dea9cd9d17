"""The Mirage steps, one module each: ``add_arguments(parser)`` and ``run(args)``.

A step module is the command line of one step (``python -m mirage_tasks <step>``): its
flags, their checks, the :class:`stepkit.Step` that commits its outputs. The work is done
by library modules named for what they are (:mod:`mirage_tasks.sampling.sample`,
:mod:`mirage_tasks.evaluation.validate`, :mod:`mirage_tasks.models.fit`, :mod:`mirage_tasks.evaluation.metrics`,
...; :mod:`mirage_tasks.calibration.summary` for ``calibrate``'s report, :mod:`mirage_tasks.slurm.session`
for ``keep_service``'s chains). Not yet everywhere: ``sample`` still assembles and commits its
shard info beside its flags. No step module imports another. Heavy libraries (numpy, pandas, torch) are
imported inside ``run``, so building a step's parser is cheap (the plan does it).
"""
