"""Test tiers: every test gets one of unit/dag/e2e/lab from its file name and folder."""

from __future__ import annotations

import tomllib

from conftest import E2E_FILES, REPO, TIERS, tier_of


def test_tier_follows_name_and_folder():
    tests = REPO / "tests"
    assert tier_of(tests / "test_stepkit.py") == "unit"
    assert tier_of(tests / "mirage" / "test_ingest.py") == "unit"
    assert tier_of(tests / "dags" / "test_pod_specs.py") == "dag"
    assert tier_of(tests / "dags" / "test_mirage_pipeline_e2e.py") == "e2e"
    assert tier_of(tests / "faasm" / "test_local_e2e.py") == "e2e"
    assert tier_of(tests / "mirage" / "steps" / "test_validate.py") == "e2e"  # moved: keeps its tier
    assert tier_of(tests / "dags" / "sub" / "test_x.py") == "dag"
    # the lab wing's tests: their own tier whatever the name, so `pytest -m unit` is the product's alone
    assert tier_of(tests / "lab" / "test_probe_replay.py") == "lab"
    assert tier_of(tests / "lab" / "test_mirage_eval_e2e.py") == "lab"
    assert tier_of(tests / "lab" / "sub" / "test_x.py") == "lab"
    assert tier_of(tests / "mirage" / "lab" / "test_x.py") == "unit"  # only the top-level tests/lab/


def test_every_lab_test_is_in_the_lab_tier_and_no_other():
    lab = sorted((REPO / "tests" / "lab").rglob("test_*.py"))
    assert lab, "tests/lab/ holds the lab wing's tests"
    assert {tier_of(p) for p in lab} == {"lab"}


def test_named_e2e_files_exist():
    present = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    assert E2E_FILES <= present, f"E2E_FILES names files that are gone: {sorted(E2E_FILES - present)}"


def test_markers_registered_in_pyproject():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert [m.split(":")[0] for m in cfg["markers"]] == list(TIERS)
    assert "--strict-markers" in cfg["addopts"]


def test_this_test_is_marked_unit(request):
    assert request.node.get_closest_marker("unit") is not None
    assert request.node.get_closest_marker("e2e") is None


def test_starts_a_step_names_steps_airflow_and_services():
    from conftest import starts_a_step

    assert starts_a_step(["/v/bin/python", "-m", "faasm_tasks", "deploy"]) == "faasm_tasks"
    assert starts_a_step(["/v/bin/python", "-m", "mirage_tasks.steps.sample"]) == "mirage_tasks.steps.sample"
    assert starts_a_step(["/v/bin/airflow", "dags", "list"]) == "airflow"
    assert starts_a_step(["redis-server", "--port", "0"]) == "redis-server"
    assert starts_a_step(["/v/bin/python", "-c", "print(1)"]) is None
    assert starts_a_step(["hadolint", "Dockerfile"]) is None


def test_a_unit_test_cannot_start_a_step():
    import subprocess
    import sys

    import pytest

    with pytest.raises(pytest.fail.Exception, match="e2e tier"):
        subprocess.run([sys.executable, "-m", "faasm_tasks", "--help"], capture_output=True, timeout=60)
    assert subprocess.run([sys.executable, "-c", "pass"], timeout=60).returncode == 0  # other processes run
