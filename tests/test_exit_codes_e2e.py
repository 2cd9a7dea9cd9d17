"""The process exit code of a failing step is deterministic (no pyarrow shutdown crash).

A step that has read Parquet and then fails on bad input must end with exit 2 every
time: pyarrow's thread pools can abort interpreter shutdown (``terminate called without
an active exception``, exit 134), which Airflow would retry as an unknown failure. The
CLI entry flushes stdio and leaves with ``os._exit(rc)`` (``stepkit.cli.exit_now``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(300)

RUNS = 20

STEP = textwrap.dedent('''
    """Reads a Parquet file with pyarrow's threads, then refuses its input."""
    import pyarrow.parquet as pq
    from stepkit import StepError

    def add_arguments(p):
        p.add_argument("--table", required=True)

    def run(args):
        table = pq.read_table(args.table, use_threads=True)
        df = table.to_pandas()
        print(f"read {len(df)} rows", flush=True)
        raise StepError(f"{args.table}: column 'x' has {int(df['x'].isna().sum())} missing values")
''')
# As mirage_tasks/__main__.py and faasm_tasks/__main__.py do.
MAIN = textwrap.dedent("""
    import sys
    from stepkit.cli import main
    sys.exit(main("pqsteps", {"check": ("pqsteps.check", "read parquet and refuse it")}))
""")
#: The crash, made certain: an abort during interpreter shutdown (as pyarrow's can be).
CRASH_AT_SHUTDOWN = textwrap.dedent("""
    import atexit, os, sys
    atexit.register(lambda: (sys.stderr.write("terminate called without an active exception\\n"), os._exit(134)))
""")


@pytest.fixture
def code(tmp_path):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    pkg = tmp_path / "pqsteps"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(MAIN)
    (pkg / "check.py").write_text(STEP)
    x = np.arange(200_000, dtype=float)
    x[::7] = np.nan
    pq.write_table(pa.table({"x": x, "y": np.arange(200_000)}), tmp_path / "t.parquet", row_group_size=10_000)
    return tmp_path


def test_failing_parquet_step_exits_2_every_time(code):
    env = {**os.environ, "PYTHONPATH": str(code)}
    procs = []
    for batch in range(0, RUNS, 4):  # four at a time: 2 CPUs shared, yet shutdown races still happen
        started = [
            subprocess.Popen(
                [sys.executable, "-m", "pqsteps", "check", "--table", str(code / "t.parquet")],
                cwd=code,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(min(4, RUNS - batch))
        ]
        procs += [(p, *p.communicate(timeout=120)) for p in started]
    codes = [p.returncode for p, _, _ in procs]
    assert codes == [2] * RUNS, codes
    for _, out, err in procs:
        assert "read 200000 rows" in out  # stdout was flushed before os._exit
        assert "pqsteps check: error:" in err and "28572 missing values" in err
        assert "terminate called" not in err


def test_exit_code_survives_a_crash_at_interpreter_shutdown(code):
    """With an abort registered for shutdown, the step still exits 2: shutdown never runs."""
    (code / "pqsteps" / "check.py").write_text(CRASH_AT_SHUTDOWN + STEP)
    proc = subprocess.run(
        [sys.executable, "-m", "pqsteps", "check", "--table", str(code / "t.parquet")],
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "terminate called" not in proc.stderr and "read 200000 rows" in proc.stdout
