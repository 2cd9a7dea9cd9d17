"""The workload kinds' own code, one module per row of :data:`faasm_tasks.workloads.WORKLOADS`:
its data preparation, what a call sends, the metrics read from its output, its verification
and its time bound. The runners that call these hooks are in :mod:`faasm_tasks.points`."""
