"""No false successes: invalid load points, point-derived bounds, interrupted attempts, point keys."""

from __future__ import annotations

import json
import os

import psutil
import pytest
from faasm_testutil import cli, needs_local_target


def _summary(**kw):
    base = {"duration_s": 10.0, "requests_ok": 1000, "requests_all": 1000}
    return {**base, **kw}


def test_judge_load_reasons():
    from faasm_tasks.results import judge_load

    assert judge_load(_summary(), "closed", None) == []
    # the overloaded point: offered 100 req/s, 373 of 500 never sent, 25 req/s served
    r = judge_load(_summary(duration_s=5, requests_ok=125, scheduled=500, sent=127, late=0), "open", 100)
    assert len(r) == 2 and "25.4 req/s of 100 offered" in r[0] and "373 of 500" in r[1]
    # 1 request for a 3 s latency point
    r = judge_load(_summary(duration_s=3, requests_ok=1), "closed", None)
    assert r == ["only 1 successful requests (< 100 needed for the percentiles)"]
    # rate reached, but 2 % sent more than 5 ms late (threshold 1 %, then 5 %)
    ok = _summary(scheduled=1000, sent=1000, late=20, duration_s=10)
    assert judge_load(ok, "open", 100) == ["20 of 1000 requests late or never sent (2.00 %; limit 1 %)"]
    assert judge_load(ok, "open", 100, max_late_fraction=0.05) == []
    # sent 0.9 % short of the offered rate: fine; 1.1 %: invalid
    assert judge_load(_summary(scheduled=1000, sent=991, late=0), "open", 100) == []
    r = judge_load(_summary(scheduled=1000, sent=989, late=0), "open", 100)
    assert len(r) == 2 and "1.1 % short" in r[0]
    # open loop without sent counts (a closed-loop tool): unverifiable
    assert "unverified" in judge_load(_summary(), "open", 100)[0]


def test_point_budget_comes_from_the_point():
    from faasm_tasks.catalogue import get_experiment, resolve
    from faasm_tasks.steps.run import point_budget

    sgd = resolve(get_experiment("sgd_reuters_svm"), "native", "local")
    assert point_budget(sgd, {"epochs": 3, "n_workers": 2}) == 60 + 3 * 120
    assert point_budget(sgd, {"epochs": 1000}) == 3600  # capped by the catalogue's call_timeout_s
    assert point_budget(sgd, {"epochs": 3}, override=7) == 7
    mm = resolve(get_experiment("matrix_multiplication"), "native", "knative")
    assert point_budget(mm, {"matrix_size": 100}) == pytest.approx(60.06)
    assert point_budget(mm, {"matrix_size": 2000}) == 60 + 60 * 8
    tf = resolve(get_experiment("tf_inference_latency"), "native", "knative")
    # readiness deadline + warm-up + duration + its extension for --min-requests + timeout + 10 % + 15 s
    # + the driver's start deadline
    assert point_budget(tf, {"duration_s": 180}) == 120 + 10 + 180 + 60 + 5 + 18 + 15 + 60


def test_invalid_is_a_status_of_the_record_schema(tmp_path):
    from faasm_tasks.results import Attempt, validate_record

    base = {
        "run_id": "r",
        "date": "2026-11-29",
        "experiment": "e",
        "system": "native",
        "target": "local",
        "params": {"rate": 100.0},
        "repeat": 0,
    }
    att = Attempt(str(tmp_path / "p"), base)
    rec = att.finish(True, None, {"requests_ok": 3}, invalid_reasons=["only 3 successful requests"])
    assert rec["status"] == "invalid" and rec["outcome"]["ok"] is False
    assert rec["outcome"]["invalid_reasons"] == ["only 3 successful requests"]
    validate_record(rec)
    from stepkit import StepError

    with pytest.raises(StepError):
        validate_record({**rec, "status": "bogus"})


def test_interrupted_attempts_are_marked_failed(tmp_path):
    from faasm_tasks.results import Attempt, iter_records, mark_interrupted

    root = f"file://{tmp_path}/res"
    base = {
        "run_id": "r",
        "date": "2026-11-29",
        "experiment": "e",
        "system": "native",
        "target": "local",
        "params": {},
        "repeat": 0,
    }
    alive = Attempt(f"{root}/2026-11-29/r/e/native/a/repeat-0", base)  # owned by this live process
    dead = Attempt(f"{root}/2026-11-29/r/e/native/b/repeat-0", base)
    p = psutil.Popen(["true"])
    p.wait()
    dead.record["owner"] = {"host": dead.record["owner"]["host"], "pid": p.pid, "create_time": 1.0}
    dead._save()
    done = Attempt(f"{root}/2026-11-29/r/e/native/c/repeat-0", base)
    done.finish(True)
    assert mark_interrupted(root, "2026-11-29", "r") == [dead.uri]
    recs = {u: r for u, r in iter_records(root, "2026-11-29", "r")}
    assert recs[dead.uri]["status"] == "failed" and recs[dead.uri]["outcome"]["interrupted"]
    assert recs[alive.uri]["status"] == "running" and recs[done.uri]["status"] == "succeeded"
    assert mark_interrupted(root, "2026-11-29", "r") == []  # idempotent


@needs_local_target
@pytest.mark.timeout(240)
def test_overloaded_point_is_invalid_and_rate_is_part_of_the_key(tmp_path):
    """An open-loop point far above what the local workers serve is recorded invalid; the run
    step exits 1; a rerun at another --rate is a new point; summarize lists the invalid one."""
    state, results = str(tmp_path / "state"), f"file://{tmp_path}/results"
    common = ["--target", "local", "--run-id", "over", "--results", results, "--date", "2026-11-29"]
    exp = ["--experiment", "tf_inference_throughput", "--set", "duration_s=2", "--mode", "open"]
    try:
        cli("deploy", *common, "--experiment", "tf_inference_throughput", "--workers", "1", state_dir=state)
        cli("wait-ready", *common, "--timeout", "60", state_dir=state)
        cli("upload-data", *common, "--experiment", "tf_inference_throughput", state_dir=state)
        # 1 worker with a 40 ms cold start every 5th call cannot serve 3000 req/s on 4 connections
        over = cli("run", *common, *exp, "--rate", "3000", state_dir=state, check=False)
        assert over.returncode == 1 and "1 invalid" in over.stdout, over.stdout
        again = cli("run", *common, *exp, "--rate", "3000", state_dir=state, check=False)
        assert "run: skip" not in again.stdout  # an invalid point is not a success: it is measured again
        slow = cli("run", *common, *exp, "--rate", "5", "--min-requests", "5", state_dir=state, check=False)
        assert "run: skip" not in slow.stdout, slow.stdout  # another rate is another point
        cli("summarize", *common, state_dir=state)
    finally:
        cli("teardown", *common, state_dir=state, check=False)
    from faasm_tasks.results import iter_records

    recs = [r for _, r in iter_records(results, "2026-11-29", "over")]
    fast = [r for r in recs if r["params"]["rate"] == 3000.0]
    assert len(fast) == 2 and all(r["status"] == "invalid" for r in fast)
    reasons = fast[0]["outcome"]["invalid_reasons"]
    assert any("offered" in x for x in reasons), reasons
    assert all(r["params"]["mode"] == "open" and r["params"]["driver"] == "builtin" for r in recs)
    assert len({r["params"]["rate"] for r in recs}) == 2
    summary = json.load(open(os.path.join(str(tmp_path), "results", "2026-11-29", "over", "summary", "summary.json")))
    # the 3000 req/s point is listed once (its latest attempt), invalid; the 5 req/s one is another point
    # (valid on a quiet machine; on a busy one its schedule can slip too, which is not what this checks)
    inv = [p for p in summary["points"] if p["status"] == "invalid" and "rate=3000.0" in p["params"]]
    assert len(inv) == 1 and inv[0]["error"].startswith("invalid: ")
    assert len([p for p in summary["points"] if "rate=5.0" in p["params"]]) == 1


@pytest.mark.parametrize("step", ["teardown", "summarize", "collect"])
def test_each_later_step_marks_an_interrupted_attempt(tmp_path, step):
    from faasm_tasks.results import Attempt, iter_records

    root = f"file://{tmp_path}/res"
    base = {
        "run_id": "r",
        "date": "2026-11-29",
        "experiment": "e",
        "system": "native",
        "target": "local",
        "params": {},
        "repeat": 0,
    }
    att = Attempt(f"{root}/2026-11-29/r/e/native/a/repeat-0", base)
    att.record["owner"]["pid"] = 2**22 + 1  # beyond pid_max: no such process
    att._save()
    p = cli(
        step,
        "--target",
        "local",
        "--run-id",
        "r",
        "--results",
        root,
        "--date",
        "2026-11-29",
        state_dir=str(tmp_path / "state"),
        check=False,
    )
    # summarize exits 1 on a day with a failed point (after writing its outputs); the others succeed
    assert p.returncode == (1 if step == "summarize" else 0), (p.stdout, p.stderr)
    ((uri, rec),) = iter_records(root, "2026-11-29", "r")
    assert rec["status"] == "failed" and rec["outcome"]["interrupted"] is True
    if step == "summarize":
        summary = json.load(open(tmp_path / "res" / "2026-11-29" / "r" / "summary" / "summary.json"))
        assert summary["failed"] == 1 and summary["points"][0]["error"].startswith("interrupted")
