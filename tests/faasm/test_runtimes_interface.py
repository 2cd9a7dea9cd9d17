"""The runtimes package's boundary: a public interface, no private name crossing modules."""

from __future__ import annotations

from pathlib import Path

from faasm_testutil import outside_reaches, private_crossings

import faasm_tasks.runtimes as runtimes

PKG = Path(runtimes.__file__).parent
MODULES = {"common", "state", "wasm", "runc", "native", "inprocess"}


def test_the_package_is_its_modules():
    assert {p.stem for p in PKG.glob("*.py")} == MODULES | {"__init__"}


def test_no_private_name_crosses_the_packages_modules():
    assert private_crossings(PKG, MODULES) == []


def test_the_public_interface_is_the_package_and_nothing_outside_reaches_in():
    assert {
        "WasmRuntime",
        "NativeRuntime",
        "InProcess",
        "Host",
        "LocalTier",
        "GlobalTier",
        "CallFailed",
        "build_problems",
        "runc_list",
        "runc_remove",
        "wasmtime_version",
    } <= set(runtimes.__all__)
    assert all(not n.startswith("_") and hasattr(runtimes, n) for n in runtimes.__all__)
    assert outside_reaches(runtimes, "runtimes") == []
