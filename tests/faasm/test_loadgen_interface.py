"""The load driver's package boundary: a public interface, no private name crossing modules."""

from __future__ import annotations

import ast
from pathlib import Path

from faasm_testutil import outside_reaches, private_crossings

import faasm_tasks.loadgen as loadgen

PKG = Path(loadgen.__file__).parent


def test_no_private_name_crosses_the_packages_modules():
    assert private_crossings(PKG, {"conn", "spec", "measure", "report", "driver", "controller", "netns"}) == []


def test_the_public_interface_is_the_package_and_nothing_outside_reaches_in():
    assert {"LoadSpec", "run_load", "run_wrk", "summarize", "latency_txt", "explain_no_success"} <= set(loadgen.__all__)
    assert all(not n.startswith("_") and hasattr(loadgen, n) for n in loadgen.__all__)
    assert outside_reaches(loadgen, "loadgen") == []


def test_the_tests_use_public_names_only():
    # what a test imports from loadgen, or patches inside it (monkeypatch.setattr(loadgen.driver, "name")),
    # is a public name of the module that owns it
    found = []
    for path in sorted((PKG.parent.parent / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and "loadgen" in (node.module or ""):
                found += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "setattr"
                and len(node.args) >= 2
                and "loadgen" in ast.unparse(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
            ):
                found.append(f"{path.name}: {ast.unparse(node.args[0])}.{node.args[1].value}")
    assert not found, found
