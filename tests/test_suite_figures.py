"""devtools/suite_figures.py: docs/testing.md's figures come from a real run's JUnit report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "devtools"))
import suite_figures as sf  # noqa: E402  (devtools/ is not a package)


def _case(cls: str, name: str, secs: float, tier: str | None, outcome: str = "") -> str:
    props = f'<properties><property name="tier" value="{tier}"/></properties>' if tier else ""
    inner = {"failed": '<failure message="x"/>', "skipped": '<skipped message="s"/>'}.get(outcome, "")
    return f'<testcase classname="{cls}" name="{name}" time="{secs}">{props}{inner}</testcase>'


def _report(tmp_path: Path, cases: list[str], wall: float = 600.0) -> Path:
    p = tmp_path / "report.xml"
    p.write_text(
        f'<?xml version="1.0"?><testsuites><testsuite name="pytest" time="{wall}" timestamp="2026-12-07T09:00:00">'
        + "".join(cases)
        + "</testsuite></testsuites>"
    )
    return p


def test_figures_per_tier_with_outcomes_slowest_and_wall(tmp_path):
    rep = _report(
        tmp_path,
        [
            _case("tests.test_a", "t1", 1.5, "unit"),
            _case("tests.test_a", "t2", 0.5, "unit", "skipped"),
            _case("tests.dags.test_b", "t3", 30.0, "dag", "failed"),
            _case("tests.test_c_e2e", "t4", 200.0, "e2e"),
            _case("tests.test_c_e2e", "t5", 100.0, "e2e"),
        ],
    )
    fig = sf.read_report(rep)
    assert fig["wall_s"] == 600.0
    assert fig["tiers"]["unit"] == {
        "tests": 2,
        "passed": 1,
        "failed": 0,
        "skipped": 1,
        "seconds": 2.0,
        "slowest": ("test_a::t1", 1.5),
    }
    assert fig["tiers"]["dag"]["failed"] == 1 and fig["tiers"]["e2e"]["slowest"] == ("test_c_e2e::t4", 200.0)
    text = sf.render(fig, workers=4, note="Beside a CPU hog.")
    assert (
        "5 tests in 4 pytest-xdist workers, 600 s wall (10.0 min) against 332 s of test time summed. Beside a CPU hog."
        in text
    )
    assert "| e2e | 2 | 2 | 0 | 0 | 300 s | `test_c_e2e::t4` 200 s |" in text
    assert "| all | 5 | 3 | 1 | 1 | 332 s | |" in text
    assert "lab" not in text.split(sf.END)[0].split("|---|")[1]  # a tier with no test has no row


def test_a_case_without_tier_or_a_broken_report_is_refused_by_name(tmp_path):
    with pytest.raises(sf.ReportError, match="test tests.test_a::t1 has no tier"):
        sf.read_report(_report(tmp_path, [_case("tests.test_a", "t1", 1.0, None)]))
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites><testsuite")
    assert sf.main([str(bad)]) == 2


def test_write_replaces_only_the_block_and_refuses_a_doc_without_one(tmp_path):
    doc = tmp_path / "testing.md"
    doc.write_text(f"# T\n\nbefore\n{sf.BEGIN}\nold figures\n{sf.END}\nafter\n")
    sf.write_block(doc, f"{sf.BEGIN}\nnew\n{sf.END}")
    assert doc.read_text() == f"# T\n\nbefore\n{sf.BEGIN}\nnew\n{sf.END}\nafter\n"
    doc.write_text("no block\n")
    with pytest.raises(sf.ReportError, match="exactly one block"):
        sf.write_block(doc, "x")
    assert doc.read_text() == "no block\n"


def test_the_real_conftest_puts_each_tests_tier_in_the_report(tmp_path):
    """What make test writes: pytest's own JUnit report, tiers from tests/conftest.py."""
    out = tmp_path / "r.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_tiers.py",
            "tests/dags/test_house_config.py",
            f"--junitxml={out}",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    fig = sf.read_report(out)
    assert set(fig["tiers"]) == {"unit", "dag"}, fig["tiers"].keys()
    assert fig["tiers"]["dag"]["tests"] > 0 and fig["tiers"]["unit"]["tests"] > 0
