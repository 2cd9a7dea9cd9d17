"""Every bench's flags are checked before it starts anything: a value out of
range, ``nan``, an existing file as ``--root``, an ``--out`` in a folder that does not exist:
exit 2 with a message naming the flag (``stepkit.cli.check_command_args``), never a traceback.
The lab's campaign drivers: tests/lab/test_campaign_commands_e2e.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

CASES = [
    ("sampling.py", ["--workers", "0"], "--workers"),
    ("sampling.py", ["--json", "{missing}/x.json"], "--json"),
    ("simulator.py", ["--serial-samples", "-1"], "--serial-samples"),
    ("train.py", ["--threads", "0"], "--threads"),
    ("train.py", ["--workdir", "{file}"], "--workdir"),
    ("backfill.py", ["--trace", "x", "--nodes", "-8"], "--nodes"),
    ("ingest.py", ["--repeat", "0"], "--repeat"),
    ("load.py", ["--rates", "4000,x"], "--rates"),
    ("load.py", ["--duration", "0"], "--duration"),
    ("load.py", ["--clients", "0"], "--clients"),
    ("load.py", ["--clients", "8", "--connections", "4"], "--clients"),
    ("faasm_local.py", ["--out", "{missing}/page.md"], "--out"),
]


@pytest.mark.parametrize("bench,argv,flag", CASES, ids=[f"{b}:{f}:{a[-1]}" for b, a, f in CASES])
def test_a_bad_flag_exits_2_naming_it(tmp_path, bench, argv, flag):
    f = tmp_path / "a-file"
    f.write_text("x")
    argv = [a.format(file=f, missing=tmp_path / "no" / "such") for a in argv]
    p = subprocess.run([sys.executable, f"bench/{bench}", *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert flag in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
