"""Nothing hangs, nothing lies, for the Mirage steps, in-process:

* inputs verified, not trusted: a ``trace.parquet`` replaced or truncated after its marker was
  written -> exit 2 naming it (no pyarrow traceback); an untouched one is hashed once per process;
* ``sample`` for days outside the trace's span -> exit 2 naming the days and the span;
* a run refused on bad input leaves no empty ``--out`` folder behind its lease.

Concurrent and killed writers (many processes) are in ``test_one_writer_e2e.py``.
"""

from __future__ import annotations

import pytest

from stepkit import MARKER, storage
from stepkit.cli import main

STEPS = {s: (f"mirage_tasks.steps.{s}", "") for s in ("ingest", "sample", "merge")}
TZ = ["--timezone", "UTC"]
SAMPLE = [
    "--start",
    "2023-01-01T00:00:00",
    "--node",
    "1",
    "--cluster-config",
    "ls6",
    "--probes",
    "2",
    "--warmup-days",
    "1",
    "--workload-days",
    "2",
    "--workers",
    "1",
]


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
        lines.append(
            f"{1000 + i}|u{i % 17}|gpu|{ts(submit[i])}|{ts(start[i])}|{ts(start[i] + run_s[i])}|"
            f"{limit[i] // 60:02d}:{limit[i] % 60:02d}:00|{nodes[i]}|COMPLETED|1000"
        )
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    path = tmp_path_factory.mktemp("log") / "sacct.txt"
    write_log(path)
    return path


def run(*argv: str) -> int:
    return main("mirage_tasks", STEPS, list(argv))


def ingest_argv(log, out, t_from, t_to, *extra):
    return ["ingest", "--trace", str(log), *TZ, "--from", t_from, "--to", t_to, "--out", str(out), *extra]


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
    assert (
        run(
            "sample",
            "--trace",
            str(a),
            *SAMPLE,
            "--out",
            str(tmp_path / "fam"),
            "--day",
            "2023-03-01",
            "--day",
            "2023-01-05",
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "sample day(s) 2023-03-01 lie outside" in err and span in err
    assert (
        run(
            "sample",
            "--trace",
            str(a),
            *SAMPLE,
            "--out",
            str(tmp_path / "win"),
            "--count",
            "3",
            "--interval-hours",
            "24",
            "--start",
            "2023-01-19T00:00:00",
        )
        == 2
    )
    assert "sample day(s) 2023-01-20, 2023-01-21 lie outside" in capsys.readouterr().err
    assert not (tmp_path / "fam").exists() and not (tmp_path / "win").exists()
    # before the first submit: sampled (a long training window can start before a log), and said
    assert run("sample", "--trace", str(a), *SAMPLE, "--out", str(tmp_path / "early"), "--day", "2022-12-30") == 0
    assert "sample day(s) 2022-12-30 come before the trace's first submit (2023-01-01)" in capsys.readouterr().err
    # the trace's newest day is covered (a growing trace samples it), however short its workload there
    assert run("sample", "--trace", str(a), *SAMPLE, "--out", str(tmp_path / "fam"), "--day", "2023-01-19") == 0
    assert (tmp_path / "fam" / "day=2023-01-19" / MARKER).exists()
