"""The run step's randomized, interleaved order of trials (faasm_tasks.order) and the run
step's use of it: every (point, arm, repeat) once, reproducible from the seed, resumed on a
retry, cut by the time budget across the shuffled order, and reported."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from faasm_tasks import order
from faasm_tasks.order import AA_ARMS, Trial

SIZES = (100, 200)  # matrix_multiplication's local sweep, in the catalogue's order


def test_every_trial_exactly_once_in_a_seeded_reproducible_order():
    got = order.trials(4, 6, seed=11, arms=AA_ARMS)
    assert Counter(got) == Counter(Trial(p, a, r) for p in range(4) for a in AA_ARMS for r in range(6))
    assert len(got) == 4 * 2 * 6
    assert got == order.trials(4, 6, seed=11, arms=AA_ARMS)  # the same seed, the same order
    assert got != order.trials(4, 6, seed=12, arms=AA_ARMS)
    natural = [Trial(p, a, r) for p in range(4) for a in AA_ARMS for r in range(6)]
    assert got != natural  # shuffled, not the nested loops' order


def test_the_order_interleaves_points_and_arms():
    got = order.trials(3, 10, seed=5, arms=AA_ARMS)
    switches = sum((a.point, a.arm) != (b.point, b.arm) for a, b in zip(got, got[1:]))
    assert switches > len(got) // 2  # a point's repeats are not run back to back
    # no arm's trials all come before the other's
    first = [i for i, t in enumerate(got) if t.arm == "A"]
    second = [i for i, t in enumerate(got) if t.arm == "A'"]
    assert min(first) < max(second) and min(second) < max(first)


def test_blocks_keep_their_points_together_in_a_shuffled_block_order():
    blocks = ["n5", "n10", "n5", "n20"]
    got = order.trials(4, 3, seed=3, blocks=blocks)
    seen = [blocks[t.point] for t in got]
    runs = [b for i, b in enumerate(seen) if i == 0 or seen[i - 1] != b]
    assert sorted(runs) == sorted(set(blocks))  # each block one run of trials
    assert Counter(got) == Counter(Trial(p, None, r) for p in range(4) for r in range(3))


def test_default_seed_is_stable_and_differs_by_run_and_group():
    s = order.default_seed("scheduled__2026-12-07", "sgd_reuters_svm", "native")
    assert s == order.default_seed("scheduled__2026-12-07", "sgd_reuters_svm", "native")
    assert s != order.default_seed("scheduled__2026-12-08", "sgd_reuters_svm", "native")
    assert s != order.default_seed("scheduled__2026-12-07", "sgd_reuters_svm", "wasm")
    assert 0 <= s < 2**32


def test_arm_folders():
    assert order.repeat_dir(3, None) == "repeat-3"
    assert order.repeat_dir(3, "A'") == "repeat-3.A-prime"
    assert [order.arm_from_slug(order.arm_slug(a)) for a in AA_ARMS] == list(AA_ARMS)
    with pytest.raises(ValueError, match="unknown arm 'B'"):
        order.arm_slug("B")


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="2 blocks for 3 points"):
        order.trials(3, 2, seed=1, blocks=["a", "b"])
    with pytest.raises(ValueError, match="at least one arm"):
        order.trials(3, 2, seed=1, arms=())


# ----------------------------------------------------------------------- the run step


class _Target:
    """What the run step asks of a target, with nothing behind it (the points are faked)."""

    def endpoints(self):
        from faasm_tasks.targets.base import Endpoints

        return Endpoints("http://127.0.0.1:9/", "http://127.0.0.1:9")

    def describe(self):
        return {}

    def health(self):
        return None


@pytest.fixture
def run_step(tmp_path, monkeypatch):
    """``run(*argv) -> (rc, trials)``: the run step over matrix_multiplication's local points (sizes 100 and 200) with faked points;
    ``fail`` (a set of (matrix_size, arm, repeat)) makes those trials fail."""
    from faasm_tasks.__main__ import STEPS
    from faasm_tasks.results import Attempt
    from faasm_tasks.steps import run as run_mod
    from stepkit.cli import main

    monkeypatch.setattr(run_mod, "get_target", lambda name, args: _Target())
    monkeypatch.setattr(run_mod.procs, "label_self", lambda *a, **k: None)
    seen: list[tuple] = []
    fail: set[tuple] = set()

    def fake_point(ctx, info, point, rep, prefix, first, date, extra=None):
        args, plan = ctx.args, ctx.plan
        arm = (extra or {}).get("arm")
        seen.append((point["matrix_size"], arm, rep))
        base = {
            "run_id": args.run_id,
            "date": date,
            "experiment": plan.name,
            "system": plan.system,
            "target": "local",
            "params": point,
            "repeat": rep,
            **(extra or {}),
        }
        att = Attempt(prefix, base)
        ok = (point["matrix_size"], arm, rep) not in fail
        att.finish(ok, None if ok else "boom", {"run_time_ms": 1.0}, 0 if ok else 1)
        return {"prefix": prefix, "attempt": att.record["attempt"], "status": att.record["status"]}

    monkeypatch.setattr(run_mod, "_run_point", fake_point)
    common = [
        "--target",
        "local",
        "--run-id",
        "r1",
        "--results",
        str(tmp_path / "res"),
        "--date",
        "2026-12-07",
        "--state-dir",
        str(tmp_path / "state"),
        "--experiment",
        "matrix_multiplication",
        "--system",
        "native",
        "--no-billing",
    ]

    def run(*argv):
        seen.clear()
        rc = main("faasm_tasks", STEPS, ["run", *common, *argv])
        return rc, list(seen)

    run.fail = fail
    run.root = tmp_path / "res"
    return run


def _report(root) -> dict:
    reports = sorted((root / "2026-12-07" / "r1" / "_ops").glob("run-*.json"))
    return json.loads(reports[-1].read_text())


def test_run_measures_every_trial_once_in_the_seeded_order_and_reports_it(run_step):
    rc, seen = run_step("--repeats", "3", "--aa-control", "--seed", "42")
    assert rc == 0
    assert Counter(seen) == Counter((n, a, r) for n in SIZES for a in AA_ARMS for r in range(3))
    want = order.trials(2, 3, 42, AA_ARMS)
    assert [(SIZES[t.point], t.arm, t.repeat) for t in want] == seen
    rep = _report(run_step.root)
    assert rep["order"]["randomized"] is True and rep["order"]["seed"] == 42
    assert rep["order"]["seed_from"] == "--seed"
    assert rep["aa_control"] is True and rep["arms"] == ["A", "A'"]
    assert rep["trials_cut_by_budget"] == []
    assert {(d["params"]["matrix_size"], d["arm"], d["ok"]) for d in rep["repeats_done"]} == {
        (n, a, 3) for n in SIZES for a in AA_ARMS
    }
    # the arms' records are apart, each with its arm, trial and seed
    recs = [json.loads(p.read_text()) for p in run_step.root.rglob("run.json")]
    assert len(recs) == 12 and {r["arm"] for r in recs} == set(AA_ARMS) and {r["seed"] for r in recs} == {42}
    assert sorted(r["trial"] for r in recs) == list(range(12))


def test_a_retry_reproduces_the_order_and_skips_what_succeeded(run_step):
    run_step.fail.update({(200, "A'", 1), (100, "A", 0)})
    rc, first = run_step("--repeats", "3", "--aa-control")
    assert rc == 1 and len(first) == 12
    assert _report(run_step.root)["order"]["seed"] == order.default_seed("r1", "matrix_multiplication", "native")
    run_step.fail.clear()
    rc, again = run_step("--repeats", "3", "--aa-control")
    assert rc == 0
    assert again == [t for t in first if t in {(200, "A'", 1), (100, "A", 0)}]  # only the failed ones, in order
    rep = _report(run_step.root)
    assert sum(p["status"] == "skipped" for p in rep["points"]) == 10


def test_the_time_budget_cuts_across_the_shuffled_order(run_step, monkeypatch):
    from faasm_tasks.steps import run as run_mod

    clock = iter(range(0, 10_000, 60))  # every look at the clock: one more minute
    monkeypatch.setattr(run_mod.time, "monotonic", lambda: float(next(clock)))
    rc, seen = run_step("--repeats", "4", "--time-budget-min", "5", "--seed", "7")
    assert rc == 0
    assert 0 < len(seen) < 8
    rep = _report(run_step.root)
    assert rep["time_budget_s"] == 300 and rep["time_budget_note"] == "--time-budget-min 5"
    cut = {(c["params"]["matrix_size"], c["arm"], c["repeat"]) for c in rep["trials_cut_by_budget"]}
    assert cut | set(seen) == {(n, None, r) for n in SIZES for r in range(4)} and not cut & set(seen)
    want = [(SIZES[t.point], t.arm, t.repeat) for t in order.trials(2, 4, 7)]
    assert seen == want[: len(seen)]  # the cut is the tail of the shuffled order


def test_a_budget_above_the_experiments_is_capped_and_said(run_step):
    rc, _ = run_step("--repeats", "1", "--time-budget-min", "100000")
    assert rc == 0
    rep = _report(run_step.root)
    assert rep["time_budget_s"] == 7200 and "above the experiment's 120 min" in rep["time_budget_note"]


def test_bad_repeats_are_refused_before_anything_runs(run_step, capsys):
    rc, seen = run_step("--repeats", "-2")
    assert rc == 2 and seen == []
    assert "--repeats must be at least 1, got -2" in capsys.readouterr().err
