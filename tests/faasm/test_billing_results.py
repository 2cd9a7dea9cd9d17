from __future__ import annotations

import json

import psutil
import pytest

from faasm_tasks import billing
from faasm_tasks.results import Attempt, iter_records, latest_record, point_prefix, validate_record
from stepkit import StepError, storage


def rows():
    # 1 GB used for 10 s, then 3 GB: counters grow linearly
    out = []
    for i in range(0, 21, 2):
        out.append(
            {
                "t": 1000.0 + i,
                "cpu_pct": 50.0,
                "memory_used_mb": 1024.0 if i <= 10 else 3072.0,
                "net_sent_mb": i * 1.0,
                "net_recv_mb": i * 2.0,
                "disk_read_mb": 0.0,
                "disk_write_mb": i / 2,
                "cpu_time_user": i * 0.5,
                "cpu_time_system": 0.0,
                "cpu_time_idle": i,
                "cpu_time_iowait": 0.0,
            }
        )
    return out


def test_billing_summary_deltas_peak_and_gb_seconds():
    s = billing.summarize(rows(), 1002.0, 1010.0, "h")
    assert s["complete"] and s["net_sent_mb"] == 8.0 and s["net_recv_mb"] == 16.0 and s["disk_write_mb"] == 4.0
    assert s["memory_gb_s"] == pytest.approx(8.0)  # 1 GB for 8 s, exactly the window
    s2 = billing.summarize(rows(), 1000.0, 1020.0, "h")
    assert s2["peak_memory_mb"] == 3072.0 and s2["PEAK_MEMORY"] == 2048.0
    assert s2["memory_gb_s"] == pytest.approx(10 * 1 + 2 * 2 + 8 * 3)  # 1 GB to 10 s, ramp to 12 s, then 3 GB
    assert billing.summarize(rows()[:1], 999, 1001)["complete"] is False
    # a window between two sampler sessions gets no numbers from the neighbouring sessions
    gap = rows() + [dict(r, t=r["t"] + 100) for r in rows()]
    assert billing.summarize(gap, 1060.0, 1070.0)["samples"] == 0


def test_sampler_start_stop(tmp_path):
    st = str(tmp_path)
    a = billing.start_sampler(st, "run1", interval=0.2, max_s=300)
    # started means sampling: its first sample is written (however long its imports took)
    assert a["action"] == "started" and a["ready"] is True and a["samples"] >= 1
    assert billing.start_sampler(st, "run1", interval=0.2)["action"] == "already running"
    proc = psutil.Process(a["pid"])
    assert billing.await_samples(a["out"], 0, proc, n=3, timeout_s=120)["ready"]
    stop = billing.stop_sampler(st, "run1")
    assert stop["action"] == "stopped"
    assert billing.stop_sampler(st, "run1")["action"] == "none running"
    header, samples = billing.read_samples(open(billing.samples_path(st, "run1")).read())
    assert header["cpu_count"] >= 1 and len(samples) >= 4  # three awaited, one at stop
    assert {"memory_used_mb", "net_sent_mb", "disk_write_mb", "cpu_time_user", "cpu_pct"} <= set(samples[0])


BASE = {
    "run_id": "r",
    "date": "2026-11-29",
    "experiment": "e",
    "system": "native",
    "target": "local",
    "params": {"a": 1},
    "repeat": 0,
}


def test_attempts_never_overwrite_and_failed_is_kept(tmp_path):
    root = f"file://{tmp_path}"
    prefix = point_prefix(root, "2026-11-29", "r", "e", "native", {"a": 1}, 0)
    a1 = Attempt(prefix, dict(BASE))
    a1.write_text("partial.txt", "half")
    a1.finish(False, "boom")
    a2 = Attempt(prefix, dict(BASE))
    a2.write_text("x.txt", "1")
    with pytest.raises(StepError):
        a2.write_text("x.txt", "2")
    a2.finish(True)
    assert a1.uri.endswith("attempt-1") and a2.uri.endswith("attempt-2")
    r1 = storage.read_json(storage.join(a1.uri, "run.json"))
    assert r1["status"] == "failed" and r1["outcome"]["error"] == "boom" and r1["files"] == ["partial.txt"]
    assert storage.read_bytes(storage.join(a1.uri, "partial.txt")) == b"half"
    assert latest_record(prefix)["attempt"] == 2
    assert sorted(r["attempt"] for _, r in iter_records(root, "2026-11-29", "r")) == [1, 2]
    assert "/2026-11-29/r/e/native/a-1/repeat-0/attempt-1" in a1.uri


def test_record_schema_rejects_bad_records():
    good = {
        "schema_version": 1,
        **BASE,
        "attempt": 1,
        "status": "succeeded",
        "started": "x",
        "finished": "y",
        "outcome": {"ok": True},
        "images": {},
        "versions": {"faasm_tasks": "0", "python": "3"},
        "host": "h",
        "files": [],
    }
    validate_record(good)
    for bad in (
        {**good, "status": "done"},
        {**good, "target": "aws"},
        {k: v for k, v in good.items() if k != "run_id"},
        {**good, "date": "29/11/2026"},
    ):
        with pytest.raises(StepError):
            validate_record(bad)


def test_collect_says_when_an_attempt_has_no_samples_around_its_window(tmp_path):
    """An attempt that asked for billing and has no samples around its window gets a
    billing_summary.json saying so (collect never leaves it out silently); one that did not
    ask for billing gets none."""
    from faasm_testutil import cli

    root, date, run_id = f"file://{tmp_path}/results", "2026-11-29", "r-nosamples"
    seg = "\n".join(json.dumps(r) for r in [{"header": {"host": "node-a", "t": 1000.0}}] + rows()) + "\n"
    storage.write_bytes(storage.join(root, date, run_id, "billing", "node-a", "000000.jsonl"), seg.encode())
    uris = {}
    for name, wanted in (("wanted", True), ("unwanted", False)):
        prefix = point_prefix(root, date, run_id, "e", "native", {"p": name}, 0)
        att = Attempt(prefix, {**BASE, "run_id": run_id, "date": date, "params": {"p": name}})
        att.finish(True, None, {"window": {"start": 5000.0, "end": 5010.0}, "billing_wanted": wanted})
        uris[name] = att.uri
    out = cli(
        "collect",
        "--target",
        "local",
        "--run-id",
        run_id,
        "--results",
        root,
        "--date",
        date,
        state_dir=str(tmp_path / "state"),
    ).stdout
    doc = storage.read_json(storage.join(uris["wanted"], "billing_summary.json"))
    assert doc["no_samples"] is True and doc["hosts"] == []
    assert "node-a: 11 sample(s) from 1000.000 to 1020.000" in doc["problem"], doc
    assert doc["hosts_without_samples"] == [{"host": "node-a", "samples": 0}]
    rec = storage.read_json(storage.join(uris["wanted"], "run.json"))
    assert rec["billing"] == {"hosts": 0, "problem": doc["problem"]} and "billing_summary.json" in rec["files"]
    assert f"collect: no billing samples for {uris['wanted']}" in out
    assert not storage.exists(storage.join(uris["unwanted"], "billing_summary.json"))
