"""The knative target's per-node billing sampler and what ``collect`` makes of it, with every
step in its own "pod" (its own --state-dir): they share nothing but storage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from faasm_tasks.common import date_record
from faasm_tasks.results import Attempt, iter_records, point_prefix
from stepkit import storage

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*argv, state_dir, env=None, **kw):
    e = {**os.environ, "PYTHONPATH": REPO, "FAASM_TASKS_STATE_DIR": str(state_dir), **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "faasm_tasks", *argv, "--state-dir", str(state_dir)],
        cwd=REPO,
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kw,
    )


def test_agents_per_host_then_collect_in_a_fresh_pod(tmp_path):
    root = f"file://{tmp_path}/results"
    run_id = "manual__2026-11-30T10:00:00+00:00"
    common = ["--run-id", run_id, "--results", root]
    # two nodes' samplers, no --date: the date is recorded in storage by the first, read by the other
    agents = [
        _cli(
            "billing-agent",
            *common,
            "--interval",
            "0.2",
            "--flush-s",
            "0.5",
            env={"NODE_NAME": host},
            state_dir=tmp_path / f"pod-{host}",
        )
        for host in ("node-a", "node-b")
    ]
    try:
        deadline = time.time() + 60
        while (
            len(
                {
                    f.split("/")[-2]
                    for f in storage.list_files(str(tmp_path / "results"))
                    if f.endswith(".jsonl") and "/billing/" in f
                }
            )
            < 2
        ):  # both sampling (imports are slow here)
            assert time.time() < deadline, "the samplers wrote nothing"
            time.sleep(0.2)
        t0 = time.time()
        time.sleep(1.5)
        t1 = time.time()
        time.sleep(0.5)
    finally:
        for a in agents:
            a.send_signal(signal.SIGTERM)  # what the DaemonSet's deletion does
    outs = [a.communicate(timeout=30)[0] for a in agents]
    assert [a.returncode for a in agents] == [0, 0], outs
    date = storage.read_json(date_record(root, run_id))["date"]
    base = storage.join(root, date, run_id, "billing")
    files = storage.list_files(base)
    hosts = {f.split("/")[0] for f in files}
    assert hosts == {"node-a", "node-b"} and all(f.endswith(".jsonl") for f in files)
    assert sum(f.startswith("node-a/") for f in files) >= 2  # periodic segments, not one file at the end
    # one attempt of a "run" pod whose window lies inside the sampling
    prefix = point_prefix(root, date, run_id, "sgd_reuters_svm", "wasm", {"n_workers": 2}, 0)
    att = Attempt(
        prefix,
        {
            "run_id": run_id,
            "date": date,
            "experiment": "sgd_reuters_svm",
            "system": "wasm",
            "target": "knative",
            "params": {"n_workers": 2},
            "repeat": 0,
        },
    )
    att.finish(True, None, {"window": {"start": t0, "end": t1}})
    # collect in a fresh pod (new state dir, no --date): finds the date and both hosts in storage
    c = _cli("collect", *common, state_dir=tmp_path / "pod-collect")
    out = c.communicate(timeout=120)[0]
    assert c.returncode == 0, out
    [(uri, rec)] = list(iter_records(root, date, run_id))
    assert rec["billing"]["hosts"] == 2, rec
    summary = storage.read_json(storage.join(uri, "billing_summary.json"))
    assert sorted(h["host"] for h in summary["hosts"]) == ["node-a", "node-b"]
    assert all(h["complete"] and h["samples"] >= 5 and h["memory_gb_s"] > 0 for h in summary["hosts"]), summary


def test_agent_bad_input_exits_2(tmp_path):
    p = _cli("billing-agent", "--run-id", "r", "--results", str(tmp_path), "--interval", "0", state_dir=tmp_path / "s")
    out = p.communicate(timeout=60)[0]
    assert p.returncode == 2 and "--interval" in out
    assert not os.path.exists(tmp_path / "r")


def test_local_target_record_is_mirrored_to_storage(tmp_path):
    from types import SimpleNamespace as NS

    from faasm_tasks.targets.local import LocalTarget

    t = LocalTarget.from_args(NS(state_dir=str(tmp_path / "state"), run_id="r9", results=str(tmp_path / "res")))
    t.save({"status": "deployed", "procs": [{"pid": 1, "role": "redis"}], "redis_port": 6390})
    rec = storage.read_json(storage.join(str(tmp_path / "res"), "_state", "r9", "local-target.json"))
    assert rec["redis_port"] == 6390 and rec["procs"][0]["role"] == "redis" and rec["host"]
    assert t.load()["redis_port"] == 6390  # the worker-local file stays the authoritative one
