"""The import contracts: Mirage's layers, the wings, no Airflow, no cycles, no lab wing.

The contracts themselves are declared once, in ``pyproject.toml`` (``[tool.importlinter]``), and
checked by import-linter (``lint-imports``, run by ``make lint``; the import graph comes from the
source, function-level and ``TYPE_CHECKING`` imports included). Here: the whole tree keeps them,
and each contract breaks when a module is made to break it, in a copy of the tree (so the checks
can fail, and each violation is reported by the contract it breaks). What import-linter cannot
see is checked by hand below: the package root's own imports, the layer table of
``mirage_tasks/__init__.py``, and modules named as text (the model registry, the step table).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}
#: Mirage's layers, lowest first, as the layers contract declares them (highest first there);
#: each a tuple of the top-level modules of ``mirage_tasks`` in it.
LAYERS: tuple[tuple[str, ...], ...] = tuple(
    tuple(m.strip() for m in re.split(r"[|:]", layer)) for layer in reversed(CONTRACTS["mirage-layers"]["layers"])
)
#: Where the root packages live: plugins/ is on Airflow's path, so on the linter's too.
PACKAGE_DIRS = {
    "stepkit": ROOT,
    "mirage_tasks": ROOT,
    "faasm_tasks": ROOT,
    "house": ROOT / "plugins",
    "results_view": ROOT / "plugins",
}


def layer(mod: str) -> int:
    """The index of ``mod``'s Mirage layer, lowest 0; the package root is the lowest layer."""
    parts = mod.split(".")
    assert parts[0] == "mirage_tasks", mod
    if len(parts) == 1:
        return 0
    return next(i for i, names in enumerate(LAYERS) if parts[1] in names)


def lint_imports(root: Path) -> tuple[int, str]:
    """``lint-imports`` on the tree at ``root`` (its pyproject.toml, its packages, its plugins/):
    (exit status, output)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = f"{root}{os.pathsep}{root / 'plugins'}"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from importlinter.cli import lint_imports_command; lint_imports_command()",
            "--no-cache",
            "--no-logo",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, out.stdout + out.stderr


def verdicts(output: str) -> dict[str, str]:
    """Each checked contract's name -> KEPT or BROKEN, from lint-imports' output."""
    return {
        c["name"]: m.group(1)
        for c in CONFIG["contracts"]
        if (m := re.search(re.escape(c["name"]) + r" (KEPT|BROKEN)\b", output))
    }


def reports(output: str) -> dict[str, str]:
    """Each broken contract's id -> its report (the import chains lint-imports found)."""
    heads = sorted(
        (m.start(), m.end(), c["id"])
        for c in CONFIG["contracts"]
        if (m := re.search("^" + re.escape(c["name"]) + r"\n-+$", output, flags=re.M))
    )
    ends = [h[0] for h in heads[1:]] + [len(output)]
    return {cid: output[end:stop] for (_, end, cid), stop in zip(heads, ends, strict=True)}


def copy_tree(dest: Path) -> Path:
    """A copy of the root packages' Python sources and pyproject.toml at ``dest``, to break."""
    for pkg, where in PACKAGE_DIRS.items():
        shutil.copytree(
            where / pkg,
            dest / where.relative_to(ROOT) / pkg,
            ignore=lambda d, names: [
                n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(d) / n).is_dir())
            ],
        )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def add_lab(tree: Path) -> None:
    """The lab wing as a colleague is creating it: a top-level package beside the product's,
    which imports the product (allowed: only the other direction is not)."""
    (tree / "lab" / "wing").mkdir(parents=True)
    (tree / "lab" / "__init__.py").write_text("from mirage_tasks.data import times\n")
    (tree / "lab" / "pages.py").write_text("")
    (tree / "lab" / "wing" / "__init__.py").write_text("x = 1\n")


def test_the_tree_keeps_every_contract():
    rc, out = lint_imports(ROOT)
    assert rc == 0, out
    assert verdicts(out) == {c["name"]: "KEPT" for c in CONFIG["contracts"]}, out


@pytest.mark.parametrize("lab", ["absent", "a package"])
def test_a_copy_keeps_every_contract(tmp_path, lab):
    """The copy the next test breaks is itself clean, with or without a lab package beside it."""
    tree = copy_tree(tmp_path)
    if lab == "a package":
        add_lab(tree)
    rc, out = lint_imports(tree)
    assert rc == 0, out


#: (file in the copy, what is appended to it, the contract it breaks, the import the report names)
VIOLATIONS = [
    ("mirage_tasks/data/leak.py", "import lab\n", "product-not-lab", "mirage_tasks.data.leak -> lab"),
    (
        "faasm_tasks/steps/run.py",
        "\ndef _f():\n    from lab.wing import x\n    return x\n",
        "product-not-lab",
        "faasm_tasks.steps.run -> lab",
    ),
    ("plugins/house/steps.py", "\nimport lab.pages\n", "product-not-lab", "house.steps -> lab"),
    (
        "plugins/results_view/results_catalog.py",
        "\nimport lab\n",
        "product-not-lab",
        "results_view.results_catalog -> lab",
    ),
    ("stepkit/cli.py", "\nimport lab\n", "product-not-lab", "stepkit.cli -> lab"),
    (
        "mirage_tasks/sim/bad.py",
        "def f():\n    from ..evaluation import metrics\n    return metrics\n",
        "mirage-layers",
        "mirage_tasks.sim.bad -> mirage_tasks.evaluation.metrics",
    ),
    ("mirage_tasks/newpkg/__init__.py", "", "mirage-layers", "mirage_tasks.newpkg"),
    ("faasm_tasks/bad.py", "import airflow.sdk\n", "no-airflow", "faasm_tasks.bad -> airflow"),
    ("stepkit/bad.py", "from airflow import DAG\n", "no-airflow", "stepkit.bad -> airflow"),
    (
        "faasm_tasks/bad.py",
        "from mirage_tasks.data import times\n",
        "wings-independent",
        "faasm_tasks.bad -> mirage_tasks.data.times",
    ),
    ("stepkit/bad.py", "import faasm_tasks.common\n", "stepkit-below", "stepkit.bad -> faasm_tasks.common"),
    # the circles mended in the structure: their old imports back would close them again
    (
        "faasm_tasks/runtimes/runc.py",
        "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .native import NativeRuntime\n",
        "no-cycles",
        ".runc -> .native",
    ),
    (
        "mirage_tasks/slurm/livewait.py",
        "\ndef _g():\n    from .keeper import model_decider\n\n    return model_decider\n",
        "no-cycles",
        ".livewait -> .keeper",
    ),
]


@pytest.fixture(scope="module", params=["absent", "a package"])
def broken(request, tmp_path_factory) -> tuple[int, dict[str, str], str]:
    """lint-imports on a copy with every violation above (one run: each contract's report is
    read from its own section), with the lab package absent or present."""
    tree = copy_tree(tmp_path_factory.mktemp("broken"))
    if request.param == "a package":
        add_lab(tree)
    for path, code, _, _ in VIOLATIONS:
        target = tree / path
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as f:
            f.write(code)
    rc, out = lint_imports(tree)
    return rc, reports(out), out


def test_every_contract_breaks_on_a_violation(broken):
    rc, found, out = broken
    assert rc == 1, out
    assert sorted(found) == sorted(CONTRACTS), out


@pytest.mark.parametrize("path,code,contract,named", VIOLATIONS, ids=[f"{v[2]}:{v[0]}" for v in VIOLATIONS])
def test_each_violation_is_reported_by_the_contract_it_breaks(broken, path, code, contract, named):
    """The lab contract holds whether or not ``lab/`` exists yet (an external package until it
    is a root package); each report names the offending import."""
    _, found, out = broken
    assert named in found.get(contract, ""), out


def test_the_package_root_stays_in_the_lowest_layer():
    """``mirage_tasks/__init__.py`` (only ``__version__``) is the data layer: the layers contract
    does not look at its container's own module, so its imports are read here."""
    src = ROOT / "mirage_tasks" / "__init__.py"
    found = []
    for node in ast.walk(ast.parse(src.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:  # in __init__, level 1 is mirage_tasks
            base = "mirage_tasks" + (f".{node.module}" if node.module else "")
            found += [(node.lineno, base if node.module else f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or ""))
    assert [f"{src.name}:{n}: {m}" for n, m in found if m.split(".")[0] == "mirage_tasks" and layer(m) > 0] == []


def test_the_package_docstring_names_every_layer_in_order():
    """``mirage_tasks/__init__.py``'s layer table is what a newcomer reads first: it lists the
    contract's layers, lowest first, and no other."""
    doc = ast.get_docstring(ast.parse((ROOT / "mirage_tasks" / "__init__.py").read_text()))
    rows = re.findall(r"^\| ``(\w+)``", doc, flags=re.M)
    assert rows == [names[0] for names in LAYERS], rows


def test_imports_by_name_stay_in_their_layer_too():
    """The registry's ``"module:function"`` references are imports too, which no import graph
    shows: a family's code is in the models layer (or below), and the step table names only
    step modules."""
    from mirage_tasks.__main__ import STEPS
    from mirage_tasks.models.registry import FAMILIES

    models = next(i for i, names in enumerate(LAYERS) if "models" in names)
    refs = {getattr(f, k) for f in FAMILIES.values() for k in ("fit", "load", "presets", "hpo", "check", "net")}
    modules = {r.partition(":")[0] for r in refs if r}
    assert modules and all(layer(m) <= models for m in modules), sorted(modules)
    assert {layer(m) for m, _ in STEPS.values()} == {layer("mirage_tasks.steps")}


@pytest.mark.parametrize("folder", ["dags", "plugins"])
def test_the_dags_and_plugins_never_import_the_lab(folder):
    """What Airflow loads is product: a DAG or plugin importing lab/ would ship research code to the
    scheduler. dags/ is no package import-linter analyses, so its imports are read here (every
    ``import``/``from`` node, function-level ones too)."""
    import ast

    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "lab"]
    assert bad == []
