"""Issue 19, "nothing hangs, nothing lies", for the Mirage steps:

* one writer per output prefix: two ``ingest`` (or ``merge``) runs writing one ``--out`` at once
  -> exactly one exits 0 and the other exits 2 naming the first; a writer killed with SIGKILL
  while holding the lease is taken over once the lease expired (locally and on S3/moto);
* inputs verified, not trusted: a ``trace.parquet`` replaced or truncated after its marker was
  written -> exit 2 naming it; an untouched one is hashed once per process;
* ``sample`` for days outside the trace's span -> exit 2 naming the days and the span.

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

from stepkit import MARKER, storage
from stepkit.cli import main
from stepkit.lease import LEASE

pytestmark = pytest.mark.timeout(300)

STEPS = {s: (f"mirage_tasks.steps.{s}", "") for s in ("ingest", "sample", "merge")}
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
TZ = ["--timezone", "UTC"]
SAMPLE = ["--start", "2023-01-01T00:00:00", "--node", "1", "--cluster-config", "ls6", "--probes", "2",
          "--warmup-days", "1", "--workload-days", "2", "--workers", "1"]


def write_log(path, n: int = 2500, seed: int = 19) -> None:
    """A synthetic Slurm ``sacct --parsable2`` log: ``n`` jobs submitted from 2023-01-01 01:00 to
    2023-01-19 23:00 UTC (first and last exactly there), 1-8 nodes, waits up to 3 h, runs up to 10 h."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    t0, t1 = pd.Timestamp("2023-01-01T01:00:00").value // 10**9, pd.Timestamp("2023-01-19T23:00:00").value // 10**9
    submit = np.sort(np.concatenate([[t0, t1], rng.integers(t0, t1, n - 2)]))
    start = submit + rng.integers(0, 3 * 3600, n)
    run_s = rng.integers(600, 10 * 3600, n)
    limit = (run_s * 1.5 // 60).astype(int)
    nodes = rng.choice([1, 1, 1, 2, 4, 8], n)

    def ts(t):
        return pd.Timestamp(int(t), unit="s").strftime("%Y-%m-%dT%H:%M:%S")

    lines = ["JobID|User|Partition|Submit|Start|End|Timelimit|NNodes|State|Priority"]
    for i in range(n):
        lines.append(f"{1000 + i}|u{i % 17}|gpu|{ts(submit[i])}|{ts(start[i])}|{ts(start[i] + run_s[i])}|"
                     f"{limit[i] // 60:02d}:{limit[i] % 60:02d}:00|{nodes[i]}|COMPLETED|1000")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "sacct.txt"
    write_log(path)
    return path


def run(*argv: str) -> int:
    return main("mirage_tasks", STEPS, list(argv))


def env(**extra: str) -> dict[str, str]:
    e = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]), **extra}
    e.pop("HOUSE_LEASE_HEARTBEAT_S", None)
    return e


def step_cli(*argv: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mirage_tasks", *argv], env=env(**(extra_env or {})), cwd=REPO,
                          capture_output=True, text=True, timeout=240)


def stopped_writer(*argv: str, extra_env: dict[str, str]) -> subprocess.Popen:
    """Start a step that stops itself (SIGSTOP) right after taking its lease; return once it has."""
    proc = subprocess.Popen([sys.executable, "-c", STOP_AFTER_LEASE, *argv], env=env(**extra_env), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status = os.waitpid(proc.pid, os.WUNTRACED)  # blocks until it stopped (or ended)
    if not os.WIFSTOPPED(status):
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the first writer ended before it held the lease (status {status}): {out}\n{err}")
    return proc


def resume(proc: subprocess.Popen) -> tuple[int, str, str]:
    os.kill(proc.pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def wait_for(condition, what: str, deadline_s: float = 120.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out after {deadline_s} s waiting for {what}")


def committed_intact(out: str) -> dict:
    """The marker of ``out``, after checking every output it lists has its recorded size and SHA-256."""
    marker = storage.read_json(storage.join(out, MARKER))
    for rel, want in marker["outputs"].items():
        uri = storage.join(out, rel)
        assert storage.size_of(uri) == want["size"] and storage.sha256_of(uri) == want["sha256"], rel
    return marker


def ingest_argv(log, out, t_from, t_to, *extra):
    return ["ingest", "--trace", str(log), *TZ, "--from", t_from, "--to", t_to, "--out", str(out), *extra]


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
    assert run("sample", "--trace", str(trace), *SAMPLE, "--out", str(fam),
               "--day", "2023-01-05", "--day", "2023-01-06", "--day", "2023-01-07") == 0
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


def test_killed_writer_blocks_until_its_lease_expires_then_is_taken_over(log, tmp_path):
    out = tmp_path / "trace"
    # a dead writer whose lease is still valid: refused, naming it
    dead = stopped_writer(*ingest_argv(log, out, "2023-01-01", "2023-01-20"), extra_env=HOUR)
    dead.kill()
    dead.communicate(timeout=60)
    refused = step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01"))
    assert refused.returncode == 2 and f"pid {dead.pid}" in refused.stderr, refused.stderr
    (out / LEASE).unlink()

    # a dead writer with a two-second lease: once expired, the next writer takes over and commits
    dead = stopped_writer(*ingest_argv(log, out, "2023-01-01", "2023-01-20"), extra_env={"HOUSE_LEASE_TTL_S": "2"})
    dead.kill()
    dead.communicate(timeout=60)
    lease = json.loads((out / LEASE).read_text())
    assert lease["owner"]["pid"] == dead.pid
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

        dead = stopped_writer(*ingest_argv(log, out, "2023-01-05", "2023-01-25"),
                              extra_env={**s3env, "HOUSE_LEASE_TTL_S": "2"})
        dead.kill()
        dead.communicate(timeout=60)
        body = s3_client(url).get_object(Bucket=bucket, Key=f"mirage/traces/t/{LEASE}")["Body"].read()
        lease = json.loads(body)
        assert lease["owner"]["pid"] == dead.pid
        wait_for(lambda: time.time() > lease["expires_epoch"] + 0.5, "the killed writer's lease to expire")
        taker = step_cli(*ingest_argv(log, out, "2023-01-10", "2023-02-01"), extra_env=s3env)
        assert taker.returncode == 0, taker.stderr
        assert "took over the expired lease" in taker.stderr and f"pid {dead.pid}" in taker.stderr
        assert f"mirage/traces/t/{LEASE}" not in list_keys(url, bucket, "mirage/traces/t/")
        storage.filesystem(out)[0].invalidate_cache()
        assert committed_intact(out)["params"]["from"].startswith("2023-01-10")


def test_refused_run_leaves_no_folder(log, tmp_path, capsys):
    out = tmp_path / "nothing"
    assert run(*ingest_argv(log, out, "2030-01-01", "2030-02-01")) == 2  # no jobs in the window
    assert "no jobs left after the time window" in capsys.readouterr().err
    assert not out.exists()  # the lease came and went with the folder it made


# ----------------------------------------------------------------------------- B: inputs verified, not trusted


@pytest.fixture
def traces(log, tmp_path):
    """Two ingests of one window differing only in the recorded machine size: valid traces
    of the same size and different bytes."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert run(*ingest_argv(log, a, "2023-01-01", "2023-01-20", "--cluster-nodes", "100")) == 0
    assert run(*ingest_argv(log, b, "2023-01-01", "2023-01-20", "--cluster-nodes", "200")) == 0
    return a, b


def sample_day(trace, out, day="2023-01-05") -> int:
    return run("sample", "--trace", str(trace), *SAMPLE, "--out", str(out), "--day", day)


def test_replaced_trace_is_refused_naming_it(traces, tmp_path, capsys):
    a, b = traces
    assert (a / "trace.parquet").read_bytes() != (b / "trace.parquet").read_bytes()
    assert (a / "trace.parquet").stat().st_size == (b / "trace.parquet").stat().st_size  # the hash must tell
    (a / "trace.parquet").write_bytes((b / "trace.parquet").read_bytes())
    capsys.readouterr()
    assert sample_day(a, tmp_path / "fam") == 2
    err = capsys.readouterr().err
    assert f"input {a / 'trace.parquet'} has SHA-256" in err and f"{a / MARKER} recorded" in err
    assert "Traceback" not in err
    assert not (tmp_path / "fam").exists()


def test_truncated_trace_is_refused_naming_it(traces, tmp_path, capsys):
    a, _ = traces
    data = (a / "trace.parquet").read_bytes()
    (a / "trace.parquet").write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert sample_day(a, tmp_path / "fam") == 2
    err = capsys.readouterr().err
    assert f"input {a / 'trace.parquet'} has {len(data) // 2} bytes, but its marker" in err
    assert f"recorded {len(data)}" in err and "Traceback" not in err
    assert sample_day(a / "trace.parquet", tmp_path / "fam") == 2  # the trace given as its file
    assert f"input {a / 'trace.parquet'} has {len(data) // 2} bytes" in capsys.readouterr().err
    assert not (tmp_path / "fam").exists()


def test_untouched_trace_is_hashed_once_per_process(traces, tmp_path, monkeypatch, capsys):
    a, _ = traces
    counts: dict[str, int] = {}
    real = storage.sha256_of

    def counting(uri):
        counts[storage.normalize(uri)] = counts.get(storage.normalize(uri), 0) + 1
        return real(uri)

    monkeypatch.setattr(storage, "sha256_of", counting)
    assert sample_day(a, tmp_path / "f1", "2023-01-05") == 0
    assert sample_day(a, tmp_path / "f2", "2023-01-06") == 0  # a second step in the same process
    assert counts[str(a / "trace.parquet")] == 1
    assert counts[str(a / "submit_prefixes.json")] == 1


# ----------------------------------------------------------------------------- C: sample days inside the trace


def test_sample_days_outside_the_trace_are_refused(traces, tmp_path, capsys):
    a, _ = traces  # submits 2023-01-01T01:00 .. 2023-01-19T23:00
    span = "the trace's span 2023-01-01 .. 2023-01-19"
    capsys.readouterr()
    assert run("sample", "--trace", str(a), *SAMPLE, "--out", str(tmp_path / "fam"),
               "--day", "2019-06-01", "--day", "2023-01-05") == 2
    err = capsys.readouterr().err
    assert "sample day(s) 2019-06-01 lie outside" in err and span in err
    assert run("sample", "--trace", str(a), *SAMPLE, "--out", str(tmp_path / "win"),
               "--count", "3", "--interval-hours", "24", "--start", "2023-01-19T00:00:00") == 2
    assert "sample day(s) 2023-01-20, 2023-01-21 lie outside" in capsys.readouterr().err
    assert not (tmp_path / "fam").exists() and not (tmp_path / "win").exists()
    # the trace's newest day is covered (a growing trace samples it), however short its workload there
    assert run("sample", "--trace", str(a), *SAMPLE, "--out", str(tmp_path / "fam"), "--day", "2023-01-19") == 0
    assert (tmp_path / "fam" / "day=2023-01-19" / MARKER).exists()
