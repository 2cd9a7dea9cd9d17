"""A folder of daily sacct exports ingested as one trace (``mirage_tasks.data.exports``): its
export files in day order, the others skipped and named, a job in two exports keeping the newest
row, rejected rows naming their file; the fingerprint covers the export files only; the folder
is checked against the allowed roots like a file; and the sample family is named by the folder."""

from __future__ import annotations

import gzip
import json
import os
from datetime import date, timedelta

import pytest

from mirage_tasks.data import exports
from mirage_tasks.data.schema import read_trace
from stepkit import MARKER, reach
from stepkit.cli import main

STEPS = {"ingest": ("mirage_tasks.steps.ingest", "")}
HEADER = "JobID|User|Partition|Submit|Start|End|Timelimit|NNodes|State|Priority"


def ingest(*argv: str) -> int:
    return main("mirage_tasks", STEPS, ["ingest", *argv])


def day_file(folder, name: str, *rows: str) -> None:
    (folder / name).write_text("\n".join([HEADER, *rows]) + "\n")


def row(job: str, submit: str, end: str = "Unknown", state: str = "RUNNING") -> str:
    start = submit.replace(":00:00", ":10:00")
    return f"{job}|alice|gpu|{submit}|{start}|{end}|02:00:00|1|{state}|1000"


def site(tmp_path):
    """Three days of exports, a job of Jan 2 still running in its export and ended in Jan 3's,
    and what a watched folder also holds: an upload in progress, a marker, a file without a day,
    a subfolder."""
    folder = tmp_path / "exports"
    folder.mkdir()
    # names not in day order: the day in the name orders them, not the name
    day_file(folder, "z-2023-01-01.log", row("1", "2023-01-01T01:00:00", "2023-01-01T02:00:00", "COMPLETED"))
    day_file(folder, "b-2023-01-02.log", row("2", "2023-01-02T05:00:00"), row("3", "2023-01-02T06:00:00"))
    day_file(
        folder,
        "a-2023-01-03.log",
        row("2", "2023-01-02T05:00:00", "2023-01-03T01:00:00", "COMPLETED"),
        row("4", "2023-01-03T07:00:00", "2023-01-03T08:00:00", "COMPLETED"),
        "5|x|gpu",  # a broken row: rejected, naming this file and its line
    )
    (folder / "c-2023-01-04.log.part").write_text("half an upload")
    (folder / "_SUCCESS.json").write_text("{}")
    (folder / "ls6-latest.log").write_text("no day in this name")
    (folder / "old-2023-01-05").mkdir()
    return folder


def test_a_folder_is_one_trace_of_its_exports_in_day_order(tmp_path, capsys):
    folder = site(tmp_path)
    out = tmp_path / "o"
    assert ingest("--trace", f"file://{folder}", "--timezone", "UTC", "--out", str(out)) == 0
    rep = json.loads((out / "ingest_report.json").read_text())
    notes = rep["notes"]
    assert [(f["name"], f["day"]) for f in notes["files"]] == [
        ("z-2023-01-01.log", "2023-01-01"),
        ("b-2023-01-02.log", "2023-01-02"),
        ("a-2023-01-03.log", "2023-01-03"),
    ]
    assert {s["name"] for s in notes["skipped"]} == {"ls6-latest.log", "old-2023-01-05"}
    assert notes["duplicates_across_files"] == 1
    assert rep["rows_read"] == 6 and rep["rows_kept"] == 4
    assert rep["rejected"] == [{"line": 4, "reason": "3 fields, expected 10", "file": "a-2023-01-03.log"}]
    assert "a-2023-01-03.log: line 4 rejected" in capsys.readouterr().err
    df, meta = read_trace(str(out))
    df = df.set_index("job_id")
    assert sorted(df.index) == ["1", "2", "3", "4"]
    # job 2 ran across midnight: Jan 3's export knows its end, and that row is kept
    assert str(df.loc["2", "end"]) == "2023-01-03 01:00:00+00:00" and df.loc["2", "status"] == "COMPLETED"
    assert meta.source == f"file://{folder}"
    # the step's inputs are the export files: the marker names them, not the upload or the marker
    marker = json.loads((out / MARKER).read_text())
    assert [os.path.basename(i["uri"]) for i in marker["inputs"]] == [f["name"] for f in notes["files"]]
    capsys.readouterr()
    assert ingest("--trace", f"file://{folder}", "--timezone", "UTC", "--out", str(out)) == 0
    assert "skipped" in capsys.readouterr().out


def test_the_fingerprint_covers_the_export_files_only(tmp_path):
    folder = site(tmp_path)
    fp = exports.fingerprint(str(folder))
    assert fp.startswith("exports:")
    (folder / "d-2023-01-04.log.part").write_text("another upload in progress")
    (folder / "notes.txt").write_text("no day")
    assert exports.fingerprint(str(folder)) == fp
    day_file(folder, "d-2023-01-04.log", row("6", "2023-01-04T01:00:00"))
    assert exports.fingerprint(str(folder)) != fp
    from mirage_tasks.run.plan import trace_fingerprint

    assert trace_fingerprint(str(folder)) == exports.fingerprint(str(folder))
    assert trace_fingerprint(str(folder / "d-2023-01-04.log")).startswith("sha256:")


def test_a_folder_without_exports_or_of_mixed_formats_is_refused(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "readme.txt").write_text("x")
    assert ingest("--trace", str(empty), "--timezone", "UTC", "--out", str(tmp_path / "o1")) == 2
    err = capsys.readouterr().err
    assert "a folder given as a trace holds daily exports named with their day" in err
    assert "readme.txt: sacct export 'readme.txt': no day" in err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    day_file(mixed, "a-2023-01-01.log", row("1", "2023-01-01T01:00:00"))
    (mixed / "b-2023-01-02.swf").write_text("; UnixStartTime: 0\n1 0 0 1 1 -1 -1 1 60 -1 1 1 1 -1 -1 -1 -1 -1\n")
    assert ingest("--trace", str(mixed), "--timezone", "UTC", "--out", str(tmp_path / "o2")) == 2
    assert "b-2023-01-02.swf" in capsys.readouterr().err  # the file that is not the first one's format
    for o in ("o1", "o2"):
        assert not (tmp_path / o / MARKER).exists()


def test_a_folder_is_checked_against_the_roots_like_a_file(tmp_path, capsys):
    from mirage_tasks.run.runconf import MirageRun, input_params

    (tmp_path / "site").mkdir()
    folder = site(tmp_path / "site")
    run = MirageRun.from_params({"trace": f"file://{folder}"})
    reach.check_params(input_params(run), [str(tmp_path / "site")])
    with pytest.raises(reach.Refused, match=r"param trace .* refused: outside the allowed roots"):
        reach.check_params(input_params(run), [str(tmp_path / "elsewhere")])
    # a link in the folder that leads out of it is never read
    secret = tmp_path / "secret-2023-01-06.log"
    secret.write_text(HEADER + "\n" + row("9", "2023-01-06T01:00:00") + "\n")
    os.symlink(secret, folder / "link-2023-01-06.log")
    found = exports.list_exports(str(folder))
    assert "link-2023-01-06.log" not in [u.rsplit("/", 1)[-1] for _d, u in found.files]
    assert ("link-2023-01-06.log", "a link leading out of the folder") in found.skipped


def test_the_days_of_a_folder_are_one_family_named_by_the_folder():
    """Every day of a watched folder samples into one family per node size (named by the folder,
    not by its content, which grows by a file a day); a single export file's days are another."""
    from mirage_tasks.run.plan import sample_source, samples_day, samples_trace
    from mirage_tasks.run.runconf import MirageRun

    params = {"trace": "file:///data/ls6/sacct", "trace_timezone": "America/Chicago", "node_sizes": [1, 8]}
    run = MirageRun.from_params(params)
    fams = set()
    for day, fp in (("2023-02-01", "exports:aa"), ("2023-02-02", "exports:bb")):
        t = samples_trace(run, "/r/mirage", day, fp)
        assert sample_source(t["identity"], run)["source"] == "file:///data/ls6/sacct"
        fams.add(tuple(p.rsplit("/", 1)[0] for p in samples_day(run, "/r/mirage", t, day)["partitions"].values()))
    assert len(fams) == 1
    one = MirageRun.from_params(dict(params, trace="file:///data/ls6/sacct/ls6-2023-02-01.log.gz"))
    t = samples_trace(one, "/r/mirage", "2023-02-01", "sha256:aa")
    assert (
        tuple(p.rsplit("/", 1)[0] for p in samples_day(one, "/r/mirage", t, "2023-02-01")["partitions"].values())
        not in fams
    )


def _ls6_days(ls6_log, folder, first: str, last: str) -> None:
    """The ls6 log's jobs as a site's daily exports: one file per local submit day in [first, last]."""
    lines = gzip.open(ls6_log, "rt").read().splitlines()
    head, rows = lines[1:3], lines[3:]
    by_day: dict[str, list[str]] = {}
    for r in rows:
        f = r.split("\t")
        if len(f) >= 10 and first <= f[4][:10] <= last:
            by_day.setdefault(f[4][:10], []).append(r)
    for day, kept in by_day.items():
        (folder / f"ls6-{day}.log").write_text("\n".join([*head, *kept]) + "\n")


@pytest.mark.timeout(300)
def test_a_growing_folder_keeps_its_days_and_a_backfill_skips_them(ls6_log, tmp_path):
    """Real ingest and sample runs on the ls6 log cut into daily exports. Jan 2 and Jan 8 sampled
    from the folder holding Jan 1-8 (Jan 2: what the watched run of Jan 8's export samples; Jan 8:
    a day sampled before its workload's exports); four more exports arrive; a backfill of both
    days with the folder as its trace skips Jan 2 (its jobs are the same) and samples Jan 8 again
    (the new exports hold jobs of its workload). Jan 2 sampled
    earlier from its own export file (the layout before) is another family and stays untouched."""
    from mirage_tasks.run.plan import (
        checked_against,
        export_sample_day,
        samples_day,
        samples_trace,
        trace_fingerprint,
    )
    from mirage_tasks.run.runconf import MirageRun

    steps = {s: (f"mirage_tasks.steps.{s}", "") for s in ("ingest", "sample")}
    folder, shared = tmp_path / "exports", str(tmp_path / "mirage")
    folder.mkdir()
    _ls6_days(ls6_log, folder, "2023-01-01", "2023-01-08")
    params = {
        "trace_timezone": "America/Chicago",
        "node_sizes": [1],
        "interval_hours": 8,
        "probes": 2,
        "warmup_days": 2,
        "workload_days": 5,
    }

    def runs(trace: str, days: list[str]) -> dict[str, dict]:
        """Ingest ``trace`` and plan ``days`` against it (what ``day_plan`` does after ``prepare_trace``)."""
        run = MirageRun.from_params(dict(params, trace=trace))
        t = samples_trace(run, shared, days[0], trace_fingerprint(trace))
        assert main("mirage_tasks", steps, t["argv"]) == 0
        return {d: samples_day(run, shared, t, d, have=checked_against(t["trace"], 5), workers=1) for d in days}

    def sample(planned: dict[str, dict]) -> None:
        for d in planned.values():
            for argv in d["sample"]:
                assert main("mirage_tasks", steps, argv) == 0

    def stamp(partition: str) -> int:
        return os.stat(f"{partition}/{MARKER}").st_mtime_ns

    # the watched run of Jan 8's export samples the day it completes: Jan 2
    assert export_sample_day("2023-01-08", 5) == "2023-01-02"
    single = runs(f"file://{folder}/ls6-2023-01-02.log", ["2023-01-02"])
    sample(single)
    watched = runs(f"file://{folder}", ["2023-01-02", "2023-01-08"])
    assert {d: p["missing"] for d, p in watched.items()} == {"2023-01-02": [1], "2023-01-08": [1]}
    sample(watched)
    parts = {d: p["partitions"]["1"] for d, p in watched.items()}
    assert single["2023-01-02"]["partitions"]["1"] != parts["2023-01-02"]  # another family
    before = {d: stamp(p) for d, p in parts.items()}
    old = stamp(single["2023-01-02"]["partitions"]["1"])

    assert {d: p["missing"] for d, p in runs(f"file://{folder}", list(parts)).items()} == {
        "2023-01-02": [],
        "2023-01-08": [],
    }
    _ls6_days(ls6_log, folder, "2023-01-09", "2023-01-12")  # four more days' exports arrive
    backfill = runs(f"file://{folder}", list(parts))
    assert {d: p["partitions"]["1"] for d, p in backfill.items()} == parts  # the same family
    assert {d: p["missing"] for d, p in backfill.items()} == {"2023-01-02": [], "2023-01-08": [1]}
    sample(backfill)
    assert stamp(parts["2023-01-02"]) == before["2023-01-02"] and stamp(parts["2023-01-08"]) != before["2023-01-08"]
    assert stamp(single["2023-01-02"]["partitions"]["1"]) == old


@pytest.mark.parametrize("workload_days", [5, 4.5, 0.25])
def test_the_day_an_export_completes_sees_only_jobs_of_the_exports_so_far(workload_days):
    """Its samples' horizon is the UTC midnight starting the export's day: the jobs submitted
    before it are in that export or an earlier one, in any site time zone (UTC-12 to UTC+14)."""
    from mirage_tasks.data.prefixes import horizon
    from mirage_tasks.run.plan import export_sample_day

    for export_day in ("2023-03-01", "2024-01-06", "2023-12-31"):
        day = export_sample_day(export_day, workload_days)
        assert horizon(day, workload_days) == export_day
        # one day later and its horizon reaches into the next export (a site east of UTC)
        later = (date.fromisoformat(day) + timedelta(days=1)).isoformat()
        assert horizon(later, workload_days) > export_day


def test_the_days_a_watched_run_samples():
    """``watched_days``: the day each of the run's exports completes (several when their events
    reached one run), the other days the folder's exports complete to catch up when not
    committed (an export whose event reached no run), none before the folder's first export."""
    from mirage_tasks.run.plan import watched_days

    folder = [f"2023-01-{d:02d}" for d in range(4, 13)]  # complete Dec 29 .. Jan 6 (five-day workload)
    w = watched_days(["2023-01-11", "2023-01-10"], folder, 5)
    assert w == {"days": ["2023-01-04", "2023-01-05"], "catch_up": ["2023-01-06"], "early": [], "first": "2023-01-04"}
    # a run of early exports alone: nothing of its own, the folder's complete days to catch up
    w = watched_days(["2023-01-04", "2023-01-05"], folder, 5)
    assert w["days"] == [] and w["early"] == ["2022-12-29", "2022-12-30"]
    assert w["catch_up"] == ["2023-01-04", "2023-01-05", "2023-01-06"]
    # a folder of early exports only: nothing at all
    assert watched_days(["2023-01-06"], folder[:3], 5) == {
        "days": [],
        "catch_up": [],
        "early": ["2022-12-31"],
        "first": "2023-01-04",
    }
    # the same export twice (announced again after a restart): its day once
    assert watched_days(["2023-01-10", "2023-01-10"], folder, 4.5)["days"] == ["2023-01-04"]
    with pytest.raises(ValueError, match="folder's export days"):
        watched_days(["2023-01-10"], [], 5)
