"""Every module of ``mirage_tasks`` is on some DAG's path.

A DAG's path: the ``mirage_tasks`` modules a DAG file imports (they run in the scheduler), the
step modules of the steps the DAGs run (``python -m mirage_tasks <step>``), and everything those
import, transitively. The import graph is grimp's (what import-linter checks the contracts on:
function-level and ``TYPE_CHECKING`` imports included), with the imports it cannot see added: a
module's parent packages (importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__``), the
model registry's ``"module:function"`` references and the lazy names of ``mirage_tasks.sim``.

Which steps the DAGs run is read from the source, not listed here: the string that starts an
argv (a list literal's first item, or the first argument of ``plan.argv``) in the DAG files and
in the ``mirage_tasks`` modules they import, kept when it names a step of the step table. Code
that no DAG reaches (measurement harnesses, campaign-only steps) belongs in ``lab/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "mirage_tasks"


def _module_file(module: str) -> Path:
    path = ROOT.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _imported_modules(path: Path, graph: grimp.ImportGraph) -> set[str]:
    """The ``mirage_tasks`` modules ``path`` imports (absolute imports, any depth in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] == PACKAGE and n in graph.modules}
    return found


def _argv_heads(path: Path) -> set[str]:
    """The strings that start an argv in ``path``: ``["step", ...]`` and ``argv("step", ...)``."""
    heads = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        first = None
        if isinstance(node, ast.List) and node.elts:
            first = node.elts[0]
        elif isinstance(node, ast.Call) and node.args and getattr(node.func, "id", None) == "argv":
            first = node.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            heads.add(first.value)
    return heads


def dag_path() -> tuple[set[str], set[str], set[str]]:
    """(the steps the DAGs run, the modules on a DAG's path, every module of ``mirage_tasks``)."""
    from mirage_tasks.__main__ import STEPS
    from mirage_tasks.models.registry import FAMILIES
    from mirage_tasks.sim import _WHERE

    graph = grimp.build_graph(PACKAGE)
    # the imports the graph cannot see: by name (the registry), lazily (sim's __getattr__)
    for family in FAMILIES.values():
        for key in ("fit", "load", "presets", "hpo", "check", "net"):
            if ref := getattr(family, key):
                graph.add_import(importer="mirage_tasks.models.registry", imported=ref.partition(":")[0])
    for module in set(_WHERE.values()):
        graph.add_import(importer="mirage_tasks.sim", imported=f"mirage_tasks.sim.{module}")

    dag_imports = set()
    for path in sorted((ROOT / "dags").glob("*.py")):
        dag_imports |= _imported_modules(path, graph)
    # the plan modules a DAG imports build its argvs
    sources = sorted((ROOT / "dags").glob("*.py")) + [_module_file(m) for m in sorted(dag_imports)]
    steps = {head for path in sources for head in _argv_heads(path)} & set(STEPS)
    roots = dag_imports | {STEPS[s][0] for s in steps} | {f"{PACKAGE}.__main__"}

    reached = set(roots)
    for root in roots:
        reached |= graph.find_upstream_modules(root)
    reached = {m for m in reached if m.split(".")[0] == PACKAGE}
    # importing a module runs its parent packages' __init__ (and what they import)
    while parents := {".".join(m.split(".")[:i]) for m in reached for i in range(1, m.count(".") + 1)} - reached:
        reached |= parents
        for p in parents:
            reached |= {m for m in graph.find_upstream_modules(p) if m.split(".")[0] == PACKAGE}
    return steps, reached, set(graph.modules)


def test_the_dags_run_steps_of_the_step_table():
    """The scan finds the steps the DAGs are known to run (so the test below is not vacuous)."""
    steps, _, _ = dag_path()
    assert {"ingest", "sample", "train", "validate", "keep-service", "gate", "calibrate", "waitpred"} <= steps, steps


def test_every_mirage_module_is_on_a_dags_path():
    _, reached, modules = dag_path()
    assert len(reached) > 20, sorted(reached)
    off = sorted(modules - reached)
    assert off == [], "not on any DAG's path (move it to lab/):\n  " + "\n  ".join(off)
