"""stepkit.procs: SIGTERM raises Terminated once while a step runs; a guard cleans up after a
killed step and does nothing after one that disarmed it (the probe replay's entry exiting 143:
tests/lab/test_probe_replay.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from stepkit.pool import Terminated
from stepkit.procs import trap_sigterm


def test_first_sigterm_raises_later_ones_are_ignored():
    restore = trap_sigterm()
    try:
        with pytest.raises(Terminated, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        os.kill(os.getpid(), signal.SIGTERM)  # while stopping: logged, not raised
        time.sleep(0.1)
    finally:
        restore()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def _guarded_child(tmp_path, disarm: bool) -> tuple[subprocess.Popen, str]:
    mark = tmp_path / "cleaned"
    script = tmp_path / "child.py"
    script.write_text(
        "import sys, time\n"
        "from stepkit.procs import Guard\n"
        f"g = Guard([sys.executable, '-c', 'import sys; open(sys.argv[1], \"w\").write(\"x\")', {str(mark)!r}], 'a test')\n"
        "print('ready', flush=True)\n"
        + ("g.disarm()\nprint('disarmed', flush=True)\n" if disarm else "")
        + "time.sleep(600)\n"
    )
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return p, str(mark)


@pytest.mark.parametrize("disarm", [False, True])
def test_guard_runs_its_cleanup_only_when_the_step_dies_armed(tmp_path, disarm):
    p, mark = _guarded_child(tmp_path, disarm)
    assert p.stdout.readline().strip() == "ready"
    if disarm:
        assert p.stdout.readline().strip() == "disarmed"
    p.kill()
    _, err = p.communicate(timeout=120)  # the guard holds the child's stderr until it has finished
    assert os.path.exists(mark) is (not disarm), err
    if not disarm:
        assert "ended without stopping it (killed)" in err
