"""Trace-day sample partitions (``sample --day``) and window merges (``merge --start --count``)."""

from __future__ import annotations

import json

import numpy as np

from mirage_tasks.data.artifacts import read_npz
from mirage_tasks.sampling.schedule import day_tasks
from stepkit.cli import main

STEPS = {"sample": ("mirage_tasks.steps.sample", ""), "merge": ("mirage_tasks.steps.merge", "")}


def run(*argv: str) -> int:
    return main("mirage_tasks", STEPS, list(argv))


def sample(trace, out, *days, extra=()):
    args = [
        "sample",
        "--trace",
        str(trace),
        "--start",
        "2023-01-01T00:00:00",
        "--node",
        "1",
        "--cluster-config",
        "ls6",
        "--probes",
        "3",
        "--out",
        str(out),
        *extra,
    ]
    for d in days:
        args += ["--day", d]
    return run(*args)


def test_day_grid():
    day = 1673308800  # 2023-01-10T00:00:00Z
    assert [t for _, t in day_tasks(day, 4, anchor=0)] == [day + h * 3600 for h in (0, 4, 8, 12, 16, 20)]
    # a grid through 02:00: the same six per day, shifted; k counts grid points from the epoch
    tasks = day_tasks(day, 4, anchor=2 * 3600)
    assert [t - day for _, t in tasks] == [7200 + h * 3600 for h in (0, 4, 8, 12, 16, 20)]
    assert tasks[1][0] == tasks[0][0] + 1
    assert len(day_tasks(day, 5, anchor=0)) in (4, 5)


def test_partitions_are_committed_skipped_and_merged(ls6_parquet, tmp_path, capsys):
    fam = tmp_path / "family"
    assert sample(ls6_parquet, fam, "2023-01-10", "2023-01-11") == 0
    marker = json.loads((fam / "day=2023-01-10" / "_SUCCESS.json").read_text())
    assert marker["params"]["day"] == "2023-01-10" and marker["summary"]["n_samples"] == 6
    assert marker["summary"]["cpu_s"] > 0
    arrays = read_npz(str(fam / "day=2023-01-10" / "shard.npz"))
    assert set(np.unique(arrays["sample_start"])) == {1673308800 + h * 3600 for h in (0, 4, 8, 12, 16, 20)}
    stamp = (fam / "day=2023-01-10" / "_SUCCESS.json").stat().st_mtime_ns
    capsys.readouterr()
    assert sample(ls6_parquet, fam, "2023-01-10", "2023-01-12") == 0  # one complete, one new
    assert "1 computed, 1 already complete" in capsys.readouterr().out
    assert (fam / "day=2023-01-10" / "_SUCCESS.json").stat().st_mtime_ns == stamp

    days = [str(fam / f"day=2023-01-1{d}") for d in (0, 1, 2)]
    out = tmp_path / "ds"
    assert (
        run(
            "merge",
            "--in",
            *days,
            "--start",
            "2023-01-10T08:00:00",
            "--count",
            "10",
            "--interval-hours",
            "4",
            "--out",
            str(out),
        )
        == 0
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_samples"] == 10 and m["sample_start_min_iso"] == "2023-01-10T08:00:00+00:00"
    ds = read_npz(str(out / "dataset.npz"))
    assert sorted(set(ds["sample"].tolist())) == list(range(10))
    # a window reaching a day without a partition, or off the grid: refused, nothing written
    assert (
        run(
            "merge",
            "--in",
            *days[:2],
            "--start",
            "2023-01-11T08:00:00",
            "--count",
            "10",
            "--interval-hours",
            "4",
            "--out",
            str(tmp_path / "no"),
        )
        == 2
    )
    assert (
        run(
            "merge",
            "--in",
            *days,
            "--start",
            "2023-01-10T09:00:00",
            "--count",
            "3",
            "--interval-hours",
            "4",
            "--out",
            str(tmp_path / "no"),
        )
        == 2
    )
    assert run("merge", "--in", *days, "--start", "2023-01-10T08:00:00", "--out", str(tmp_path / "no")) == 2
    assert not (tmp_path / "no").exists()


def test_day_flags_are_checked(ls6_parquet, tmp_path):
    fam = tmp_path / "f"
    assert sample(ls6_parquet, fam, "2023-01-10", extra=["--count", "3"]) == 2
    assert sample(ls6_parquet, fam, "2023-01-10", "2023-01-10") == 2
    assert sample(ls6_parquet, fam, "10/01/2023") == 2
    assert sample(ls6_parquet, fam) == 2  # neither --count nor --day
    assert not fam.exists()
