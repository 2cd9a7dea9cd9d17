"""The task packages' import layering, read from the source with ``ast`` (no import runs).

Mirage's packages form a stack; a module may import its own layer and the layers below it,
never one above. The plan (``run``) builds every step's argv from the steps' own parsers, so
it sits above ``steps``; the step table (``mirage_tasks.__main__``, module names as text)
is the ``steps`` layer. The three wings (stepkit, mirage_tasks, faasm_tasks) meet only at a
command line, and none of them imports Airflow. The lab wing (``lab/``: campaigns, results pages,
research protocols) may import the product; the product (those three, dags/ and plugins/) never
imports the lab.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Mirage's layers, lowest first: (name, the modules or packages in it).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("data", ("mirage_tasks", "mirage_tasks.data")),  # the package root holds only __version__
    ("sim", ("mirage_tasks.sim",)),
    ("calibration", ("mirage_tasks.calibration",)),
    ("sampling", ("mirage_tasks.sampling",)),
    ("models", ("mirage_tasks.models",)),
    ("evaluation", ("mirage_tasks.evaluation",)),
    ("slurm", ("mirage_tasks.slurm",)),  # a real Slurm: its config, replay and the service keeper
    ("steps", ("mirage_tasks.steps", "mirage_tasks.__main__")),
    ("run", ("mirage_tasks.run",)),
)
#: What each wing may import of the others.
WINGS = {"stepkit": {"stepkit"}, "mirage_tasks": {"stepkit", "mirage_tasks"},
         "faasm_tasks": {"stepkit", "faasm_tasks"}, "lab": {"stepkit", "mirage_tasks", "faasm_tasks", "lab"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path``, function-level ones too;
    ``from pkg import sub`` counts as ``pkg.sub`` when ``sub`` is a module."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if _is_module(sub) else target))
    return out


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def layer(mod: str) -> int | None:
    """The index of ``mod``'s layer (the longest declared prefix), None outside Mirage."""
    best, index = -1, None
    for i, (_, members) in enumerate(LAYERS):
        for m in members:
            if (mod == m or mod.startswith(m + ".")) and len(m) > best:
                best, index = len(m), i
    return index


def sources(wing: str) -> list[Path]:
    return sorted((ROOT / wing).rglob("*.py"))


def upward(path: Path) -> list[str]:
    mod = module_name(path)
    here = layer(mod)
    found = []
    for line, target in imports(path):
        there = layer(target)
        if here is not None and there is not None and there > here:
            found.append(f"{path.relative_to(ROOT)}:{line}: {mod} ({LAYERS[here][0]}) imports {target} "
                         f"({LAYERS[there][0]})")
    return found


def test_every_mirage_module_has_a_layer():
    assert [module_name(p) for p in sources("mirage_tasks") if layer(module_name(p)) is None] == []
    # a package added beside the layers would land in the root's ("data") layer unnoticed
    top = {p.name for p in (ROOT / "mirage_tasks").iterdir() if (p / "__init__.py").is_file()}
    declared = {m.split(".")[1] for _, members in LAYERS for m in members if m.count(".") == 1}
    assert top <= declared, f"packages without a declared layer: {sorted(top - declared)}"
    flat = {p.stem for p in (ROOT / "mirage_tasks").glob("*.py")}
    assert flat == {"__init__", "__main__"}, f"modules at mirage_tasks' top level: {sorted(flat)}"


def test_the_package_docstring_names_every_layer_in_order():
    """``mirage_tasks/__init__.py``'s layer table is what a newcomer reads first: it lists the
    layers above, lowest first, and no other."""
    import re

    doc = ast.get_docstring(ast.parse((ROOT / "mirage_tasks" / "__init__.py").read_text()))
    rows = re.findall(r"^\| ``(\w+)``", doc, flags=re.M)
    assert rows == [name for name, _ in LAYERS], rows


def test_no_mirage_import_climbs_a_layer():
    assert [u for p in sources("mirage_tasks") for u in upward(p)] == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The check can fail: a sim module importing the evaluation layer is reported, also
    when the import is relative and inside a function."""
    fake = tmp_path / "mirage_tasks" / "sim"
    fake.mkdir(parents=True)
    for pkg in (tmp_path / "mirage_tasks", fake, tmp_path / "mirage_tasks" / "evaluation"):
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text("")
    (tmp_path / "mirage_tasks" / "evaluation" / "metrics.py").write_text("")
    (fake / "bad.py").write_text("def f():\n    from ..evaluation import metrics\n    return metrics\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward(fake / "bad.py") == [
        "mirage_tasks/sim/bad.py:2: mirage_tasks.sim.bad (sim) imports mirage_tasks.evaluation.metrics (evaluation)"]


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_wings_meet_only_at_a_command_line_and_never_import_airflow(wing):
    bad = []
    for path in sources(wing):
        for line, target in imports(path):
            top = target.split(".")[0]
            if top == "airflow" or (top in WINGS and top not in WINGS[wing]):
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert bad == []


def test_imports_by_name_stay_in_their_layer_too():
    """The registry's ``"module:function"`` references are imports too: a family's code is in
    the models layer (or below), and the step table names only step modules."""
    from mirage_tasks.__main__ import STEPS
    from mirage_tasks.models.registry import FAMILIES

    models = next(i for i, (name, _) in enumerate(LAYERS) if name == "models")
    refs = {getattr(f, k) for f in FAMILIES.values() for k in ("fit", "load", "presets", "hpo", "check", "net")}
    modules = {r.partition(":")[0] for r in refs if r}
    assert modules and all(layer(m) is not None and layer(m) <= models for m in modules), sorted(modules)
    assert {layer(m) for m, _ in STEPS.values()} == {layer("mirage_tasks.steps")}


@pytest.mark.parametrize("folder", ["dags", "plugins"])
def test_the_dags_and_plugins_never_import_the_lab(folder):
    """What Airflow loads is product: a DAG or plugin importing lab/ would ship research code
    to the scheduler (the task packages' own check: the wings test above)."""
    bad = [f"{p.relative_to(ROOT)}:{line}: imports {target}" for p in sources(folder)
           for line, target in imports(p) if target.split(".")[0] == "lab"]
    assert bad == []

