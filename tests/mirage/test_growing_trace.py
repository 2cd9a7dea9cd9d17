"""A trace that grows in place (a cluster's next daily ``sacct`` export at the same path): the
days already sampled stay valid and only the days whose samples see new jobs are sampled again
(``mirage_tasks.data.prefixes``); a changed earlier row invalidates the days that see it, and a merge
refuses a partition sampled from other jobs."""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime

import pytest

from mirage_tasks.data.prefixes import EMPTY, horizon, prefix_before
from mirage_tasks.run.plan import plan_run
from mirage_tasks.run.runconf import MirageRun
from stepkit.cli import main

STEPS = {s: (f"mirage_tasks.steps.{s}", "") for s in ("ingest", "sample", "merge")}
APRIL = datetime(2023, 2, 1, tzinfo=UTC)
# a week of training samples every 8 h ending before January's validation window
PARAMS = {
    "trace": None,
    "trace_timezone": "America/Chicago",
    "window_from": None,
    "window_to": None,
    "synth_profile": "ls6-a100",
    "cluster_config": "ls6",
    "train_start": "2023-01-02T00:00:00+00:00",
    "train_count": 18,
    "val_start": "2023-01-20T00:00:00+00:00",
    "val_count": 3,
    "interval_hours": 8,
    "warmup_days": 2,
    "workload_days": 5,
    "probes": 2,
    "node_sizes": [1],
    "shards": 1,
    "models": ["xgboost"],
    "preset": "quick",
    "train_params": {},
    "device": "cpu",
    "policy_eval": "sampled",
    "seed": 0,
}


def run(*argv: str) -> int:
    return main("mirage_tasks", STEPS, list(argv))


def export(src, dst, before: str, edit_first_after: str | None = None) -> None:
    """The ls6 log cut at a local submit time (an export taken then); optionally one row
    submitted after ``edit_first_after`` gets another end time (a late correction)."""
    lines = gzip.open(src, "rt").read().splitlines()
    head, rows = lines[:3], lines[3:]
    kept, edited = [], False
    for row in rows:
        f = row.split("\t")
        if len(f) >= 10 and f[4] >= before:
            continue
        if (
            edit_first_after
            and not edited
            and len(f) == 10
            and f[5] != "Unknown"
            and edit_first_after <= f[4] < edit_first_after[:11] + "23:59:59"
        ):
            f[5] = f[5][:-2] + ("00" if f[5][-2:] != "00" else "01")
            row, edited = "\t".join(f), True
        kept.append(row)
    dst.write_text("\n".join([str(len(kept)), *head[1:], *kept]) + "\n")


def pipeline_plan(path, shared):
    params = dict(PARAMS, trace=str(path))
    return plan_run(MirageRun.from_params(params), str(shared), f"{shared}/runs", APRIL)


def run_plan(p) -> None:
    assert run(*p["trace_argv"]) == 0
    for argv in p["sample"]:
        assert run(*argv) == 0


@pytest.mark.timeout(600)
def test_a_grown_trace_keeps_its_sampled_days(ls6_log, tmp_path):
    shared = tmp_path / "mirage"
    path = tmp_path / "export.log"
    export(ls6_log, path, before="2023-01-11T00:00:00")  # yesterday's export
    p1 = pipeline_plan(path, shared)
    days = p1["days"]
    assert days == [f"2023-01-0{d}" for d in range(2, 8)] and p1["missing_days"]["1"] == days
    run_plan(p1)
    assert pipeline_plan(path, shared)["missing_days"]["1"] == []  # the same export again: nothing to do

    export(ls6_log, path, before="2023-01-14T00:00:00")  # today's export: three more days of jobs
    p2 = pipeline_plan(path, shared)
    assert p2["trace"] != p1["trace"] and p2["families"] == p1["families"]
    # the plan runs before ingest: without the new trace's digests it trusts the markers ...
    assert p2["missing_days"]["1"] == []
    assert run(*p2["trace_argv"]) == 0
    # ... after ingest (the DAG's plan.sample task) only the days that see the new jobs are missing:
    # horizon (day + 1 + 5 d, UTC midnight) after the old export's cut (local midnight = 06:00 UTC)
    p2 = pipeline_plan(path, shared)
    stale = [d for d in days if horizon(d, 5) > "2023-01-11"]
    assert stale == ["2023-01-06", "2023-01-07"]
    assert p2["missing_days"]["1"] == stale
    fam = p1["families"]["1"]
    stamps = {d: (tmp_path / fam / f"day={d}" / "_SUCCESS.json").stat().st_mtime_ns for d in days}
    # a merge against the grown trace refuses the stale days ...
    assert run(*p2["merge"][0]) == 2
    # ... and the sample step recomputes exactly them, even when asked for every day
    assert (
        run("sample", *p2["sample"][0][1 : p2["sample"][0].index("--day")], *sum((["--day", d] for d in days), [])) == 0
    )
    after = {d: (tmp_path / fam / f"day={d}" / "_SUCCESS.json").stat().st_mtime_ns for d in days}
    assert [d for d in days if after[d] != stamps[d]] == stale
    assert run(*p2["merge"][0]) == 0
    manifest = json.loads((tmp_path / p2["prefix"] / "datasets" / "node1" / "manifest.json").read_text())
    assert manifest["n_samples"] == 18

    # a late correction of one row submitted on Jan 10 afternoon (local): the days that see it are stale
    export(ls6_log, path, before="2023-01-14T00:00:00", edit_first_after="2023-01-10T12:00:00")
    p3 = pipeline_plan(path, shared)
    assert run(*p3["trace_argv"]) == 0
    p3 = pipeline_plan(path, shared)
    assert (
        p3["missing_days"]["1"]
        == [d for d in days if horizon(d, 5) > "2023-01-10"]
        == ["2023-01-05", "2023-01-06", "2023-01-07"]
    )


def test_horizon_and_prefix_lookup():
    assert horizon("2023-01-02", 5) == "2023-01-08" and horizon("2023-01-02", 4.5) == "2023-01-08"
    pre = {"days": {"2023-01-01": "a", "2023-01-02": "b"}, "all": "z"}
    assert prefix_before(pre, "2022-12-20", 5) == EMPTY  # horizon before the first job
    assert prefix_before(pre, "2022-12-26", 5) == "a"  # horizon 2023-01-01
    assert prefix_before(pre, "2022-12-27", 5) == "b"
    assert prefix_before(pre, "2022-12-28", 5) == "z"  # past the last day: every row
