"""The Makefile's system installs wait (bounded, saying so) while another apt-get or dpkg holds the
package lock, instead of failing at once: devtools/apt_wait.sh against a stand-in apt-get."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "devtools" / "apt_wait.sh"


def _fake_apt(tmp_path: Path, free_after: Path) -> dict[str, str]:
    """An apt-get that reports a held lock until ``free_after`` exists, then succeeds."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {tmp_path / "calls"}\n'
        f"if [ -e {free_after} ]; then echo installed; exit 0; fi\n"
        "echo 'E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)' >&2\n"
        "exit 100\n"
    )
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_waits_for_the_lock_then_installs(tmp_path):
    free = tmp_path / "free"
    env = _fake_apt(tmp_path, free)
    p = subprocess.Popen(
        ["bash", str(SCRIPT), "60", "install", "-y", "somepackage"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    assert p.poll() is None, "gave up while the lock was held"
    free.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "holds the package lock; waiting up to 60 s" in err and err.count("waiting up to") == 1
    assert "installed" in out
    assert all("DPkg::Lock::Timeout" in c for c in (tmp_path / "calls").read_text().splitlines())


def test_gives_up_after_its_bound_naming_the_lock(tmp_path):
    env = _fake_apt(tmp_path, tmp_path / "never")
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(SCRIPT), "6", "update", "-qq"], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 100
    assert "still held after 6 s" in p.stderr and "nothing was installed" in p.stderr
    assert time.monotonic() - t0 >= 6


@pytest.mark.parametrize("msg,rc", [("E: Unable to locate package nosuch", 100)])
def test_other_failures_are_not_waited_on(tmp_path, msg, rc):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(f"#!/bin/sh\necho '{msg}' >&2\nexit {rc}\n")
    (bin_dir / "apt-get").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    t0 = time.monotonic()
    p = subprocess.run(
        ["bash", str(SCRIPT), "60", "install", "nosuch"], env=env, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == rc and msg in p.stderr and "waiting" not in p.stderr
    assert time.monotonic() - t0 < 10
