"""What the tests of the steps' flags share: a small committed trace (its submits span about
``T0 .. T0 + SPAN_DAYS`` days) and a step run in process whose refusal is checked: exit 2, a
message naming the flag, no output folder, no traceback."""

from __future__ import annotations

import pytest
from test_sim_support import random_trace, write_committed_trace

from mirage_tasks.__main__ import STEPS
from stepkit.cli import main

DAY = 86400
#: the random trace's submits span about T0 .. T0 + 6 days
SPAN_DAYS = 6


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(3, days=SPAN_DAYS, nodes=8))


def run_step(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and stderr of ``python -m mirage_tasks <argv>``, in process."""
    rc = main("mirage_tasks", STEPS, [str(a) for a in argv])
    return rc, capsys.readouterr().err


def refused(capsys, out, *argv, names: str) -> str:
    """Run a step that must refuse its input; returns its message."""
    rc, err = run_step(capsys, *argv)
    assert rc == 2, err[-2000:]
    assert names in err and "Traceback" not in err, err[-2000:]
    assert not out.exists(), "a refused run left its output folder"
    return err
