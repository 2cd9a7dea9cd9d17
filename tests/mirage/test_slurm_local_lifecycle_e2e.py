"""E2E tier: ``make slurm`` / ``make slurm-stop`` / ``make slurm-status`` as their users run them,
on a real local Slurm (Debian's Slurm 22.05 and munge; MariaDB and slurmdbd for the status test)
in a temporary ``SLURM_ROOT``. Each test is about what the make targets promise:

* a ``make slurm`` stopped midway (SIGTERM to make, Ctrl-C to its group) leaves nothing running;
* ``make slurm-stop`` from a shell that sourced ``env.sh`` stops the cluster and its job steps
  and nothing else: not that make, not another ``make`` of that shell;
* ``make slurm-status`` exits non-zero naming each dead daemon;
* every daemon listens on 127.0.0.1 only (``ss -ltnp``).

Skips where Slurm (or, for the status test, slurmdbd and MariaDB) is not installed, or not as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proctree import wait_for

from lab.slurm.cluster import LocalSlurm, _alive, missing_accounting, missing_binaries

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    bool(missing_binaries()) or os.geteuid() != 0 or not shutil.which("make"),
    reason=(
        f"Slurm not installed ({', '.join(missing_binaries())}; make system-deps installs slurmctld slurmd "
        "slurm-client munge)"
        if missing_binaries()
        else "the local Slurm's daemons run as root (and make)"
    ),
)

needs_accounting = pytest.mark.skipif(
    bool(missing_accounting()), reason=f"not installed: {', '.join(missing_accounting())} (make system-deps)"
)


def _env(root: Path, **extra: str) -> dict[str, str]:
    """The make targets' environment: this checkout's code and the running interpreter's venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        SLURM_ROOT=str(root),
        PYTHONPATH=str(REPO) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        **extra,
    )
    return env


def _make(target: str, root: Path) -> list[str]:
    # -o system-deps: the test checks the Slurm targets, not the package installs before them; VENV on
    # the command line (the Makefile sets its own): the running interpreter's
    return ["make", "--no-print-directory", "-C", str(REPO), "-o", "system-deps", f"VENV={sys.prefix}", target]


def _of_root(root: Path) -> list[str]:
    """Processes (pid and command line) whose command line or working folder is in ``root``, or
    that a record under it names: what a local Slurm under ``root`` would leave behind."""
    prefix = str(root.resolve())
    c = LocalSlurm(root)
    recorded = {p for p in c._pids().values() if _alive(p)}
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                args = fh.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{d}/cwd")
        except OSError:
            continue
        if (prefix in args or cwd.startswith(prefix) or int(d) in recorded) and _alive(int(d)):
            out.append(f"{d} {args.strip()}")
    return out


def _stop(root: Path) -> None:
    c = LocalSlurm(root)
    c.stop()
    assert not c.running() and not c.leftovers()


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_make_slurm_stopped_midway_leaves_nothing_running(tmp_path, sig):
    """SIGTERM to ``make slurm`` (make passes it on to its command) or SIGINT to its process group
    (Ctrl-C), sent once munged and slurmctld run and before the slurmd are up: the start stops
    what it started (before, munged and slurmctld were left running: the start died at once, and
    the daemons run in sessions of their own, out of the terminal's reach)."""
    root = tmp_path / "slurm"
    proc = subprocess.Popen(
        _make("slurm", root),
        env=_env(root, SLURM_NODES="2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: (root / "pids" / "slurmctld.started").exists() or proc.poll() is not None,
            "slurmctld started",
            deadline_s=120,
        )
        assert proc.poll() is None, proc.stdout.read()
        assert {"munged", "slurmctld"} <= set(LocalSlurm(root).running())
        if sig == "TERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0, out
    try:
        assert _of_root(root) == [], out
    finally:
        _stop(root)


def test_make_slurm_stop_from_a_shell_with_env_sh_stops_only_the_cluster(tmp_path):
    """From a shell that sourced ``env.sh`` (so it and everything it starts carry ``SLURM_CONF``),
    with another ``make`` of that shell running: ``make slurm-stop`` exits 0, that other make
    survives, and the cluster's job step is gone although slurmctld died first (no ``scancel``:
    the step is found from the cluster's own spool folder). Before, stop killed every process
    carrying this ``SLURM_CONF``: its own make among them."""
    root = tmp_path / "slurm"
    r = subprocess.run(
        _make("slurm", root), env=_env(root, SLURM_NODES="2"), capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 0, r.stdout + r.stderr
    fake = tmp_path / "bin" / "make"  # a long-running program named make, started from the same shell
    fake.parent.mkdir()
    shutil.copy("/bin/sleep", fake)
    other = None
    try:
        c = LocalSlurm(root)
        env = {**c.env()}
        job = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-N",
                "1",
                "-t",
                "5",
                "--output=/dev/null",
                "--chdir=/tmp",
                "--wrap=exec sleep 271",
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert job.stdout.strip()
        wait_for(lambda: c.leftovers(), "the job's step running", deadline_s=120)
        steps = c.leftovers()
        os.kill(c.running()["slurmctld"], signal.SIGKILL)  # nobody left to cancel the job: stop must find it
        script = (
            f'source {root}/env.sh && test -n "$SLURM_CONF" || exit 9\n'
            f"{fake} 300 >/dev/null 2>&1 & echo $! > {tmp_path}/other.pid\n"
            f"{' '.join(_make('slurm-stop', root))}\n"
        )
        r = subprocess.run(
            ["bash", "-c", script], env=_env(root), capture_output=True, text=True, check=False, timeout=180
        )
        other = int((tmp_path / "other.pid").read_text())
        assert r.returncode == 0, (r.returncode, r.stdout + r.stderr)
        assert _alive(other), "the shell's other make was killed"
        assert not any(_alive(p) for p in steps), steps
        assert _of_root(root) == []
    finally:
        if other and _alive(other):
            os.kill(other, signal.SIGKILL)
        _stop(root)


def _listening(pids: set[int]) -> list[str]:
    """``ss -ltnp``'s listening TCP sockets (local address) of ``pids``."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True, timeout=30).stdout
    got = []
    for ln in out.splitlines():
        f = ln.split()
        if any(f"pid={p}," in ln for p in pids):
            got.append(f"{f[3]} {f[-1]}")
    return got


@needs_accounting
@pytest.mark.skipif(not shutil.which("ss"), reason="ss (iproute2) not installed")
def test_make_slurm_status_names_each_dead_daemon_and_every_daemon_listens_on_loopback(tmp_path):
    """A 2-node cluster with accounting: every daemon listens on 127.0.0.1 only (before, slurmctld,
    each slurmd and slurmdbd listened on 0.0.0.0); ``make slurm-status`` exits 0 while all run,
    then non-zero naming mariadbd once it is killed, and slurmdbd too once that is (before, both
    were "running" by the status: it listed what was alive and exited 0)."""
    root = tmp_path / "slurm"
    r = subprocess.run(
        _make("slurm", root),
        env=_env(root, SLURM_NODES="2", SLURM_ACCOUNTING="1", SLURM_USERS="2"),
        capture_output=True,
        text=True,
        check=False,
        timeout=280,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    try:
        c = LocalSlurm(root)
        pids = c.running()
        assert set(pids) == {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n2"}
        socks = _listening(set(pids.values()))
        assert len(socks) == 5, socks  # mariadbd, slurmdbd, slurmctld, two slurmd (munged: a unix socket)
        assert all(s.startswith("127.0.0.1:") for s in socks), socks

        def status() -> subprocess.CompletedProcess:
            return subprocess.run(
                _make("slurm-status", root), env=_env(root), capture_output=True, text=True, timeout=120
            )

        s = status()
        assert s.returncode == 0, s.stdout + s.stderr
        os.kill(pids["mariadbd"], signal.SIGKILL)
        wait_for(lambda: not _alive(pids["mariadbd"]), "mariadbd gone", deadline_s=30)
        s = status()
        assert s.returncode != 0 and "not running: mariadbd" in s.stderr, s.stdout + s.stderr
        assert "mariadbd: DEAD" in s.stdout and "slurmctld: running" in s.stdout, s.stdout
        os.kill(pids["slurmdbd"], signal.SIGKILL)
        wait_for(lambda: not _alive(pids["slurmdbd"]), "slurmdbd gone", deadline_s=30)
        s = status()
        assert s.returncode != 0 and "not running: mariadbd, slurmdbd" in s.stderr, s.stdout + s.stderr
    finally:
        _stop(root)
    s = subprocess.run(
        _make("slurm-status", root), env=_env(root), capture_output=True, text=True, check=False, timeout=60
    )
    assert s.returncode != 0 and "no local Slurm running" in s.stdout, s.stdout + s.stderr  # stopped: 3, make: 2
