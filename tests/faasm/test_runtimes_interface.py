"""The runtimes package's boundary: a public interface, no private name crossing modules."""

from __future__ import annotations

import ast
from pathlib import Path

import faasm_tasks.runtimes as runtimes

PKG = Path(runtimes.__file__).parent
MODULES = {"common", "state", "wasm", "runc", "native", "inprocess"}


def test_the_package_is_its_modules():
    assert {p.stem for p in PKG.glob("*.py")} == MODULES | {"__init__"}


def test_no_private_name_crosses_the_packages_modules():
    crossing = []
    for path in sorted(PKG.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("faasm_tasks")):
                crossing += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and isinstance(node.value, ast.Name) and node.value.id in MODULES:
                crossing.append(f"{path.name}: {node.value.id}.{node.attr}")
    assert not crossing, crossing


def test_the_public_interface_is_the_package_and_nothing_outside_reaches_in():
    assert {"WasmRuntime", "NativeRuntime", "InProcess", "Host", "LocalTier", "GlobalTier", "CallFailed",
            "build_problems", "runc_list", "runc_remove", "wasmtime_version"} <= set(runtimes.__all__)
    assert all(not n.startswith("_") and hasattr(runtimes, n) for n in runtimes.__all__)
    root = PKG.parent.parent
    for folder in ("faasm_tasks", "bench"):
        for path in (root / folder).rglob("*.py"):
            if PKG in path.parents:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and "runtimes" in (node.module or ""):
                    assert node.module.rsplit(".", 1)[-1] == "runtimes", f"{path}: imports {node.module}"
                    assert not any(a.name.startswith("_") for a in node.names), f"{path}: {node.module}"
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                        and node.value.id == "runtimes":
                    assert not node.attr.startswith("_"), f"{path}:{node.lineno}: runtimes.{node.attr}"
                    assert node.attr in runtimes.__all__, f"{path}:{node.lineno}: runtimes.{node.attr} not exported"
