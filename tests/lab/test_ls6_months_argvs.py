"""``lab/campaigns/ls6_months.py`` spells no step flag itself: every command it would run is built by
the planner's :func:`mirage_tasks.run.plan.argv` and parses with that step's own parser (its
process runner replaced by a recorder, so nothing runs). A flag renamed in a step, or a value
the step refuses, fails here instead of hours into the bench."""

from __future__ import annotations

import importlib
import sys

from conftest import REPO

from mirage_tasks.run.plan import step_parser


def _bench(name: str):
    return importlib.import_module(f"lab.campaigns.{name}")


def test_ls6_months_builds_every_command_through_the_planner(tmp_path, monkeypatch):
    mod = _bench("ls6_months")
    seen: list[list[str]] = []
    monkeypatch.setattr(mod, "run", lambda argv, log: seen.append(list(argv)))
    (tmp_path / "r").mkdir()
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "ls6_months.py",
            "--root",
            str(tmp_path / "r"),
            "--trace",
            "/x/ls6.log",
            "--months",
            "2023-01",
            "2023-02",
            "--nodes",
            "1",
            "8",
            "--models",
            "xgboost",
            "transformer",
            "--param",
            "xgboost:n_estimators=5",
            "--waste-weight",
            "0.2",
            "--curve-fractions",
            "0.5",
        ],
    )
    assert mod.main() == 0
    steps = [a[0] for a in seen]
    assert steps.count("ingest") == 1 and steps.count("sample") == 2 and steps.count("merge") == 2
    # per month and node: reactive, avg and each model validated; each model trained; plus the curve
    assert steps.count("train") == 2 * 2 * 2 + 2 * 2 and steps.count("validate") == 2 * 2 * 4 + 2 * 2
    for a in seen:
        if a[0] == "metrics":
            continue  # its inputs are the committed validations, none here
        ns = step_parser(a[0]).parse_args(a[1:])
        if a[0] == "train":
            assert ns.threads == 1 and ns.waste_weight == 0.2 and ns.samples_until
            if ns.model == "xgboost":
                assert ns.param == ["n_estimators=5"] and ns.hpo_trials == 10
            else:
                assert ns.param == (["epochs=20"] if ns.model == "transformer" else []) and not ns.hpo_trials
        if a[0] == "sample":
            assert ns.cluster_config == "ls6" and ns.probe_spacing == "end" and ns.workers == 1
        if a[0] == "validate":
            assert ns.cluster_config == "ls6" and ns.interval_hours == 4 and ns.count == 156


def test_ls6_months_writes_no_step_flag_by_hand():
    """Its only ``--flag`` strings are its own options (``add_argument``; messages may name them)."""
    import ast
    import re

    tree = ast.parse((REPO / "lab" / "campaigns" / "ls6_months.py").read_text())
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            own.update(id(a) for a in ast.walk(node))
    by_hand = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and re.fullmatch(r"--[a-z][a-z0-9-]*", n.value)
        and id(n) not in own
    ]
    assert by_hand == [], f"lab/campaigns/ls6_months.py spells step flags by hand: {by_hand}"
