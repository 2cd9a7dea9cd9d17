"""One writer per output prefix, with real step processes (local folder and S3/moto):

* two ``ingest`` (or ``merge``) runs writing one ``--out`` at once -> exactly one exits 0 and the
  other exits 2 naming the first; the folder holds the winner's outputs whole;
* a writer killed with SIGKILL while holding the lease blocks others until the lease expired,
  then the next writer takes it over and commits.

The overlap of two writers is made certain, not hoped for: the first writer runs under a
wrapper that stops the process (SIGSTOP) right after it took the lease; the test waits for
that stop (``waitpid(WUNTRACED)``), runs the second writer, then resumes or kills the first.
Leases that must not expire during a test get an hour's ttl; the one that must expire gets
two seconds and the test waits for its ``expires_epoch`` to pass (a condition, no sleep).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO
from moto_s3 import list_keys, moto_s3, s3_client, storage_env
from proctree import wait_for
from test_verified_inputs import SAMPLE, ingest_argv, log, run  # noqa: F401 - the log fixture

from stepkit import MARKER, storage
from stepkit.lease import LEASE

pytestmark = pytest.mark.timeout(300)

#: ``python -c STOP_AFTER_LEASE <step> ...``: the step, stopped by SIGSTOP once it holds its lease.
STOP_AFTER_LEASE = """
import os, signal
import stepkit.lease as L
_acquire = L.Lease.acquire
def acquire(self):
    held = _acquire(self)
    os.kill(os.getpid(), signal.SIGSTOP)  # the test resumes or kills this writer
    return held
L.Lease.acquire = acquire
from stepkit.cli import main
from mirage_tasks.__main__ import STEPS
main("mirage_tasks", STEPS)
"""
HOUR = {"HOUSE_LEASE_TTL_S": "3600"}


def env(**extra: str) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra}
    e.pop("HOUSE_LEASE_HEARTBEAT_S", None)
    return e


def step_cli(*argv: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mirage_tasks", *argv],
        env=env(**(extra_env or {})),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )


def stopped_writer(*argv: str, extra_env: dict[str, str]) -> subprocess.Popen:
    """Start a step that stops itself (SIGSTOP) right after taking its lease; return once it has."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STOP_AFTER_LEASE, *argv],
        env=env(**extra_env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, status = os.waitpid(proc.pid, os.WUNTRACED)  # blocks until it stopped (or ended)
    if not os.WIFSTOPPED(status):
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the first writer ended before it held the lease (status {status}): {out}\n{err}")
    return proc


def resume(proc: subprocess.Popen) -> tuple[int, str, str]:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def committed_intact(out: str) -> dict:
    """The marker of ``out``, after checking every output it lists has its recorded size and SHA-256."""
    marker = storage.read_json(storage.join(out, MARKER))
    for rel, want in marker["outputs"].items():
        uri = storage.join(out, rel)
        assert storage.size_of(uri) == want["size"] and storage.sha256_of(uri) == want["sha256"], rel
    return marker


# ----------------------------------------------------------------------------- A: one writer per prefix


def test_two_ingests_into_one_prefix_one_wins(log, tmp_path):
    out = tmp_path / "trace"
    first = stopped_writer(*ingest_argv(log, out, "2023-01-01", "2023-01-20"), extra_env=HOUR)
    try:
        second = step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01"))
    finally:
        rc, _, err = resume(first)
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid}" in second.stderr and "being written by another run" in second.stderr
    assert "Traceback" not in second.stderr and "committed" not in second.stdout
    assert rc == 0, err
    marker = committed_intact(str(out))
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["window"]["from"].startswith("2023-01-01") and report["window"]["to"].startswith("2023-01-20")
    assert marker["params"]["from"] == report["window"]["from"]
    assert not (out / LEASE).exists()
    # the lease is given back: a later writer of the prefix is an ordinary rerun
    assert step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01")).returncode == 0


@pytest.fixture(scope="module")
def family(log, tmp_path_factory):
    """A short ingested window and three sampled days of it."""
    root = tmp_path_factory.mktemp("family")
    trace = root / "trace"
    assert run(*ingest_argv(log, trace, "2023-01-01", "2023-01-20")) == 0
    fam = root / "fam"
    assert (
        run(
            "sample",
            "--trace",
            str(trace),
            *SAMPLE,
            "--out",
            str(fam),
            "--day",
            "2023-01-05",
            "--day",
            "2023-01-06",
            "--day",
            "2023-01-07",
        )
        == 0
    )
    return trace, [str(fam / f"day=2023-01-0{d}") for d in (5, 6, 7)]


def test_two_merges_into_one_prefix_one_wins(family, tmp_path):
    _, days = family
    out = tmp_path / "dataset"
    first = stopped_writer("merge", "--in", *days[:2], "--out", str(out), extra_env=HOUR)
    try:
        second = step_cli("merge", "--in", *days[1:], "--out", str(out))
    finally:
        rc, _, err = resume(first)
    assert second.returncode == 2, second.stderr
    assert f"pid {first.pid}" in second.stderr and "being written by another run" in second.stderr
    assert rc == 0, err
    committed_intact(str(out))
    manifest = json.loads((out / "manifest.json").read_text())
    firsts = [storage.read_json(storage.join(d, MARKER))["fingerprint"] for d in days[:2]]
    assert manifest["shards"] == firsts  # the winner's inputs, whole
    assert not (out / LEASE).exists()


def test_killed_writer_is_taken_over_at_once_here_and_after_expiry_elsewhere(log, tmp_path):
    out = tmp_path / "trace"
    # a writer killed on this host with an hour-long lease: its pid is gone, so the next run
    # takes the lease over at once instead of waiting for the hour
    dead = stopped_writer(*ingest_argv(log, out, "2023-01-01", "2023-01-20"), extra_env=HOUR)
    dead.kill()
    dead.communicate(timeout=60)
    taker = step_cli(*ingest_argv(log, out, "2023-01-05", "2023-01-25"))
    assert taker.returncode == 0, taker.stderr
    assert "took over the lease of a writer that is gone" in taker.stderr and f"pid {dead.pid}" in taker.stderr
    assert not (out / LEASE).exists()

    # a dead writer of another host (its pid cannot be checked from here) with a two-second
    # lease: refused until it expires, then the next writer takes over and commits
    dead = stopped_writer(*ingest_argv(log, out, "2023-01-01", "2023-01-20"), extra_env={"HOUSE_LEASE_TTL_S": "2"})
    dead.kill()
    dead.communicate(timeout=60)
    lease = json.loads((out / LEASE).read_text())
    assert lease["owner"]["pid"] == dead.pid
    lease["owner"]["host"] = "another-host"
    (out / LEASE).write_text(json.dumps(lease))
    wait_for(lambda: time.time() > lease["expires_epoch"] + 0.5, "the killed writer's lease to expire")
    taker = step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01"))
    assert taker.returncode == 0, taker.stderr
    assert "took over the expired lease" in taker.stderr and f"pid {dead.pid}" in taker.stderr
    report = json.loads((out / "ingest_report.json").read_text())
    assert report["window"]["from"].startswith("2023-01-10")
    committed_intact(str(out))
    assert not (out / LEASE).exists()


def test_on_s3_one_writer_and_takeover(log, tmp_path, monkeypatch):
    bucket = "house-one-writer"
    with moto_s3(bucket) as url:
        s3env = storage_env(url)
        for k, v in s3env.items():
            monkeypatch.setenv(k, v)
        out = f"s3://{bucket}/mirage/traces/t"
        first = stopped_writer(*ingest_argv(log, out, "2023-01-01", "2023-01-20"), extra_env={**s3env, **HOUR})
        try:
            second = step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01"), extra_env=s3env)
        finally:
            rc, _, err = resume(first)
        assert second.returncode == 2 and f"pid {first.pid}" in second.stderr, second.stderr
        assert rc == 0, err
        keys = list_keys(url, bucket, "mirage/traces/t/")
        assert f"mirage/traces/t/{MARKER}" in keys and f"mirage/traces/t/{LEASE}" not in keys
        storage.filesystem(out)[0].invalidate_cache()
        marker = committed_intact(out)
        assert marker["params"]["from"].startswith("2023-01-01")

        dead = stopped_writer(
            *ingest_argv(log, out, "2023-01-05", "2023-01-25"), extra_env={**s3env, "HOUSE_LEASE_TTL_S": "2"}
        )
        dead.kill()
        dead.communicate(timeout=60)
        body = s3_client(url).get_object(Bucket=bucket, Key=f"mirage/traces/t/{LEASE}")["Body"].read()
        lease = json.loads(body)
        assert lease["owner"]["pid"] == dead.pid
        taker = step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01"), extra_env=s3env)
        assert taker.returncode == 0, taker.stderr  # its pid is gone from this host: taken over at once
        assert "took over the lease of a writer that is gone" in taker.stderr and f"pid {dead.pid}" in taker.stderr
        assert f"mirage/traces/t/{LEASE}" not in list_keys(url, bucket, "mirage/traces/t/")
        storage.filesystem(out)[0].invalidate_cache()
        assert committed_intact(out)["params"]["from"].startswith("2023-01-10")


def _signals_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT and SIGTERM at their default action, as for a step in a
    terminal's foreground. A process started in the background of a non-interactive shell (CI beside
    a CPU hog) inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler: the
    Ctrl-C this test sends would be dropped and synth would run to its end (exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_interrupted_synth_leaves_no_lease(tmp_path, sig):
    """``synth`` stopped while it generates (SIGTERM as Airflow and Kubernetes stop a task, SIGINT as
    Ctrl-C): its lease is gone with it, so the corrected rerun is not refused as "being written"."""
    out = tmp_path / "synth"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mirage_tasks",
            "synth",
            "--profile",
            "ls6-a100",
            "--from",
            "2020-01-01",
            "--to",
            "2023-01-01",
            "--out",
            str(out),
        ],
        env=env(**HOUR),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_signals_as_in_a_terminal,
    )
    try:
        wait_for(lambda: (out / LEASE).exists() or proc.poll() is not None, "synth to take its lease")
        assert proc.poll() is None, "synth ended before it could be interrupted"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=60)
    assert proc.returncode != 0, err
    assert not (out / LEASE).exists(), err
    rerun = step_cli("synth", "--profile", "ls6-a100", "--from", "2020-01-01", "--to", "2020-02-01", "--out", str(out))
    assert rerun.returncode == 0, rerun.stderr
