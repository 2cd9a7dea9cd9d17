"""A day that failed says FAILED: in its summary, its trend report, the check and their exit codes.

The tester's day: every experiment group of ``faasm_benchmarks`` failed at ``deploy`` (the
functions were not built), so no group recorded a single point. Before, the summary said
"0 points, 0 failed", the trend report "No data" and ``check`` exited 0. A corrupt
``run.json`` was skipped silently the same way. Each test here runs the real steps.
"""

from __future__ import annotations

import json
import os

import yaml
from faasm_testutil import ROOT, cli
from test_trends_history import END, write_history, write_run

from faasm_tasks.results import Attempt, point_prefix

#: The eight (experiment, system) groups of the packaged catalogue, as the DAG builds them.
GROUPS = [
    (doc["name"], system)
    for doc in (
        yaml.safe_load(open(os.path.join(ROOT, "faasm_tasks", "experiments", n)))
        for n in sorted(os.listdir(os.path.join(ROOT, "faasm_tasks", "experiments")))
        if n.endswith(".yaml")
    )
    for system in doc["systems"]
]


def _common(root: str, run_id: str) -> list[str]:
    return ["--target", "local", "--run-id", run_id, "--results", root, "--date", END]


def test_a_day_whose_every_group_failed_at_deploy_is_failed(tmp_path, monkeypatch):
    assert len(GROUPS) == 8, GROUPS
    root, state = str(tmp_path / "faasm_benchmarks"), str(tmp_path / "state")
    write_history(root, days=3, end="2026-11-19")  # earlier days measured fine: the window has data
    # the tester's trip: `make airflow` without `make functions`
    monkeypatch.setenv("FAASM_FUNCTIONS_BUILD_DIR", str(tmp_path / "no-build"))
    for exp, system in GROUPS:
        p = cli("deploy", *_common(root, "day"), "--experiment", exp, "--system", system, state_dir=state, check=False)
        assert p.returncode == 2 and "make functions" in p.stderr, (exp, system, p.stderr)
        assert "it had started no process" in p.stdout, p.stdout
    s = cli("summarize", *_common(root, "day"), state_dir=state, check=False)
    assert s.returncode == 1, (s.stdout, s.stderr)
    assert "8 failed experiment group(s)" in s.stdout, s.stdout
    out = os.path.join(root, END, "day")
    summary = json.load(open(os.path.join(out, "summary", "summary.json")))
    assert summary["points"] == [] and summary["failed"] == 8 and summary["status"] == "FAILED"
    assert sorted((g["experiment"], g["system"]) for g in summary["failed_groups"]) == sorted(GROUPS)
    assert all("make functions" in g["error"] and g["step"] == "deploy" for g in summary["failed_groups"])
    marker = json.load(open(os.path.join(out, "summary", "_SUCCESS.json")))
    assert marker["summary"]["failed"] == 8 and marker["summary"]["status"] == "FAILED", marker
    page = open(os.path.join(out, "trends", "trends.html"), encoding="utf-8").read()
    assert "FAILED: 8 failure(s) in this run" in page and "make functions" in page
    trends = json.load(open(os.path.join(out, "trends", "trends.json")))
    assert trends["status"] == "FAILED" and len(trends["failures"]) == 8
    assert json.load(open(os.path.join(out, "trends", "_SUCCESS.json")))["summary"]["status"] == "FAILED"
    c = cli("check", *_common(root, "day"), state_dir=state, check=False)
    assert c.returncode == 1 and "FAILED" in c.stderr and "8 failed experiment group(s)" in c.stderr, c.stderr


def test_a_corrupt_run_record_is_named_and_counted(tmp_path):
    root, state = str(tmp_path / "faasm_benchmarks"), str(tmp_path / "state")
    run_id = write_history(root, days=4)
    base = {
        "run_id": run_id,
        "date": END,
        "experiment": "sgd_reuters_svm",
        "system": "wasm",
        "target": "local",
        "params": {"n_workers": 9},
        "repeat": 0,
    }
    att = Attempt(point_prefix(root, END, run_id, "sgd_reuters_svm", "wasm", {"n_workers": 9}, 0), base)
    att.finish(True, None, {"run_time_ms": 10.0})
    rec = os.path.join(att.uri, "run.json")
    text = open(rec).read()
    with open(rec, "w") as f:  # truncated mid-write (a full disk, a killed copy)
        f.write(text[: len(text) // 2])
    c = cli("check", *_common(root, run_id), state_dir=state, check=False)
    assert c.returncode == 2, (c.returncode, c.stdout, c.stderr)
    assert rec in c.stderr and "JSONDecodeError" in c.stderr, c.stderr
    s = cli("summarize", *_common(root, run_id), state_dir=state, check=False)
    assert s.returncode == 1 and rec in s.stdout, s.stdout
    summary = json.load(open(os.path.join(root, END, run_id, "summary", "summary.json")))
    assert summary["failed"] == 1 and summary["unreadable"][0]["uri"].endswith(rec)
    page = open(os.path.join(root, END, run_id, "trends", "trends.html"), encoding="utf-8").read()
    assert "FAILED: 1 failure(s)" in page and "JSONDecodeError" in page


def test_damaged_metrics_are_a_failure_not_a_silent_gap(tmp_path):
    root, state = str(tmp_path / "faasm_benchmarks"), str(tmp_path / "state")
    run_id = write_history(root, days=4)
    write_run(root, END, "other")  # another run of the day: its records are fine
    # a run.json whose JSON parses but whose p99 is a string (hand-edited, or a writer's bug)
    rec = next(
        os.path.join(d, "run.json")
        for d, _, files in os.walk(os.path.join(root, END, run_id))
        if "run.json" in files and "tf_inference_latency" in d
    )
    doc = json.load(open(rec))
    doc["metrics"]["p99_us"] = "fast"
    json.dump(doc, open(rec, "w"))
    c = cli("check", *_common(root, run_id), state_dir=state, check=False)
    assert c.returncode == 2 and rec in c.stderr and "metric p99_us is 'fast'" in c.stderr, c.stderr


def test_workers_over_the_bound_is_bad_input(tmp_path):
    root, state = str(tmp_path / "faasm_benchmarks"), str(tmp_path / "state")
    p = cli(
        "deploy",
        *_common(root, "w"),
        "--experiment",
        "sgd_reuters_svm",
        "--workers",
        "100000",
        state_dir=state,
        check=False,
    )
    assert p.returncode == 2 and "--workers 100000: must be between 1 and 256" in p.stderr, p.stderr
    assert not os.path.exists(os.path.join(state, "w", "local", "state.json"))  # nothing was started
