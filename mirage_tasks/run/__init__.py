"""A Mirage run: its typed configuration (``runconf``), the plan of its steps (``plan``)
and its record (``runlog``). Stdlib only at import: the DAG files import ``runconf`` at
parse time."""
