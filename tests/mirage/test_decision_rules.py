"""The decision rules are declared once (mirage_tasks.sim.decision_rules): the mirage_service form
offers exactly the keeper's rules, each place's rule list comes from the registry, and no code
outside the registry decides by comparing a rule's name written as a string literal (a rule
renamed or added there would silently miss such a comparison)."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from conftest import DAGS

from mirage_tasks.sim import decision_rules as dr

ROOT = Path(__file__).resolve().parents[2]
#: the code that decides: the task package, the DAG files, the house plugins and the lab wing
SCANNED = ("mirage_tasks", "dags", "plugins", "lab")
REGISTRY = ROOT / "mirage_tasks" / "sim" / "decision_rules.py"


def _service_dag_module():
    spec = importlib.util.spec_from_file_location("mirage_service_dag_rules", DAGS / "mirage_service.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_service_form_offers_the_keepers_rules():
    mod = _service_dag_module()
    assert mod.dag.params.get_param("policy").schema["enum"] == list(dr.KEEPER_RULES)
    assert list(dr.KEEPER_RULES) == ["model", "reactive", "avg", "avg-cal", "wait-pred", "guarantee", "guarantee-cal"]


def test_each_place_reads_its_rules_from_the_registry():
    from mirage_tasks.evaluation import validate
    from mirage_tasks.slurm import keeper, livewait

    assert keeper.DECISION_RULES == dr.names_at("keeper")
    assert livewait.WAIT_RULES == ("wait-pred", "guarantee", "guarantee-cal")
    assert validate.RULES == dr.names_at("validate")
    assert "guarantee-10" in validate.RULES and "guarantee" not in validate.RULES  # the simulator's name
    assert "wait-pred-cal" in validate.RULES and "wait-pred-cal" not in dr.KEEPER_RULES
    assert set(validate.PREDICTOR_RULES) == {"wait-pred", "wait-pred-cal", "guarantee-10", "guarantee-cal"}
    assert set(validate.CALIBRATED_RULES) == {"avg-cal", "wait-pred-cal", "guarantee-cal"}
    assert dr.rule("guarantee-10") is dr.rule("guarantee")
    with pytest.raises(KeyError, match="unknown decision rule 'guarantee-5'"):
        dr.rule("guarantee-5")


def _rule_literals(node: ast.expr) -> list[str]:
    """The rule names written as string literals among a comparison operand (itself, or the
    elements of a tuple, list or set it is)."""
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    names = dr.all_names()
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in names]


def rule_name_compares(root: Path) -> list[str]:
    """``path:line: names`` of every comparison (``==``, ``!=``, ``in``, ``not in`` ...) or ``match``
    case with a rule's name as a string literal, outside the registry."""
    found = []
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            if path.resolve() == REGISTRY:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if isinstance(node, ast.Compare):
                    hits = [n for op in (node.left, *node.comparators) for n in _rule_literals(op)]
                elif isinstance(node, ast.MatchValue):  # match policy: case "avg-cal": ...
                    hits = _rule_literals(node.value)
                else:
                    continue
                if hits:
                    found.append((str(path.relative_to(root)), node.lineno, ", ".join(hits)))
    return [f"{where}:{line}: {hits}" for where, line, hits in sorted(found)]


def test_no_rule_name_compared_as_a_literal():
    found = rule_name_compares(ROOT)
    assert not found, (
        "compare with the registry's names (mirage_tasks.sim.decision_rules: dr.AVG_CAL, dr.rule(name).needs(...), "
        "dr.names_at(place)), not a string literal:\n" + "\n".join(found)
    )


def test_the_scan_finds_a_literal_compare(tmp_path):
    """The scan above would fail on such a comparison (and on one inside a tuple)."""
    (tmp_path / "lab").mkdir()
    (tmp_path / "lab" / "odd.py").write_text(
        'def f(policy, m):\n    if policy == "avg-cal":\n        return 1\n    match m:\n        case "wait-pred":\n'
        '            return 2\n    return m in ("x", "guarantee-10")\n'
    )
    found = rule_name_compares(tmp_path)
    assert found == ["lab/odd.py:2: avg-cal", "lab/odd.py:5: wait-pred", "lab/odd.py:7: guarantee-10"]
