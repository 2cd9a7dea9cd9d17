"""What the runtimes share: the systems, the builds (paths, :func:`artefact`,
:func:`build_problems`), a call (:class:`Call`; :func:`resolve` maps a message to its module
and index), :class:`CallFailed`, and a chained call's message (:func:`chain_msg`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .. import workloads

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # faasm_tasks/
#: the package's builds (``make functions``); ``FAASM_FUNCTIONS_BUILD_DIR`` names another folder
BUILD_DIR = os.environ.get("FAASM_FUNCTIONS_BUILD_DIR") or os.path.join(HERE, "functions", "build")
# demo functions (tests) pick their index by name; the workloads' modules are the registry's
DEMO_INDEX = {"echo": 0, "sleep": 1, "fail": 2, "noop": 3, "trap": 4, "loop": 5, "alloc": 6}
SYSTEMS = ("wasm", "native")


class CallFailed(Exception):
    """The call failed; the message is the reason (the ``FAILED:`` payload)."""


def resolve(msg: dict[str, Any]) -> tuple[str, str, int]:
    """(state user, module, index) of an invocation message."""
    user, func = msg.get("user", ""), msg.get("function", "")
    if msg.get("python"):
        user, func = msg.get("py_user") or user, msg.get("py_func") or func
    index = int(msg.get("index", 0) or 0)
    if user == "demo" and func in DEMO_INDEX:
        return user, "demo", DEMO_INDEX[func]
    modules = workloads.modules()  # a kind registered after import (a plug-in's) counts too
    if (user, func) not in modules:
        raise CallFailed(f"no such function {user}/{func}")
    return user, modules[(user, func)], index


def _build_path(system: str, module: str, build_dir: str = BUILD_DIR) -> str:
    """The build of ``module``: in ``FAASM_FUNCTIONS_BUILD_DIRS`` (a plug-in kind's builds)
    when there, else in ``build_dir``."""
    rel = os.path.join("wasm", f"{module}.wasm") if system == "wasm" else os.path.join("native", module)
    for d in filter(None, os.environ.get("FAASM_FUNCTIONS_BUILD_DIRS", "").split(os.pathsep)):
        if os.path.isfile(os.path.join(d, rel)):
            return os.path.join(d, rel)
    return os.path.join(build_dir, rel)


def artefact(system: str, module: str, build_dir: str = BUILD_DIR) -> str:
    path = _build_path(system, module, build_dir)
    if not os.path.isfile(path):
        raise CallFailed(f"function build {path} missing: run `make functions`")
    return path


def build_problems(system: str, build_dir: str = BUILD_DIR) -> list[str]:
    """Why the functions cannot run on ``system``: each missing build of a workload's module,
    and each ``.wasm`` that is not a WebAssembly module (by its magic number), naming the file."""
    out = []
    for module in sorted(set(workloads.modules().values())):
        path = _build_path(system, module, build_dir)
        if not os.path.isfile(path):
            out.append(f"{path} missing")
            continue
        if system == "wasm":
            with open(path, "rb") as f:
                head = f.read(8)
            if head[:4] != b"\0asm":
                out.append(f"{path} is not a WebAssembly module (it starts {head[:4]!r}, not b'\\x00asm')")
    return out


@dataclass
class Call:
    user: str
    module: str
    index: int
    input: bytes
    msg: dict[str, Any]
    output: bytes = b""
    awaited: dict[int, str] = field(default_factory=dict)


def chain_msg(call: Call, index: int, data: bytes) -> dict[str, Any]:
    keep = ("user", "function", "python", "py_user", "py_func")
    out = {k: call.msg[k] for k in keep if k in call.msg}
    out.update({"index": index, "input_data": data.decode(errors="replace")})
    return out
