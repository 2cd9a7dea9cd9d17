"""The monthly gate (``python -m mirage_tasks gate``): a month whose primary rule regressed fails
(exit 1, the numbers in the log, a committed verdict), a normal month passes, and only earlier
months are ever read. The months' stored outputs are made here as the pipeline leaves them: a
run prefix per month with its ``_runs`` record (run id ``samples_complete__<M>``) and a
committed ``metrics`` output."""

from __future__ import annotations

import json

import pytest

from mirage_tasks.run.runlog import record_run
from stepkit import MARKER, Step, storage
from stepkit.cli import main

STEPS = {"gate": ("mirage_tasks.steps.gate", "")}


def _row(model: str, node: int, mean: float, **kw) -> dict:
    row = {
        "model": model,
        "node": node,
        "level": "all",
        "n": 100,
        "mean_interruption_h": mean,
        "mean_interruption_ci_lo": mean * 0.8,
        "mean_interruption_ci_hi": mean * 1.2,
        "mean_overlap_h": 0.4,
    }
    row.update(kw)
    return row


def metrics_doc(reduction: float, ci: tuple[float, float], *, reactive: float = 2.0, avg: float = 1.8) -> dict:
    """One month's metrics: xgboost with ``reduction`` (and its interval) against reactive, at nodes 1 and 8."""
    rows = []
    for node in (1, 8):
        rule = reactive * (1 - reduction)
        diff = rule - avg
        rows += [
            _row(
                "xgboost",
                node,
                rule,
                reduction_vs_reactive=reduction,
                reduction_ci_lo=ci[0],
                reduction_ci_hi=ci[1],
                diff_vs_avg_h=diff,
                diff_vs_avg_ci_lo=diff - 0.2,
                diff_vs_avg_ci_hi=diff + 0.2,
            ),
            _row("reactive", node, reactive),
            _row("avg", node, avg),
            _row("xgboost", node, rule, level="heavy"),  # other levels are not judged
        ]
    return {"rows": rows}


def store_month(runs: str, month: str, doc: dict | str, *, key: str | None = None) -> str:
    """A pipeline run prefix of ``month`` with its run record and committed metrics (``doc``; a
    string is written as is: a corrupt file)."""
    prefix = storage.join(runs, key or f"{month}-01T000000Z-abc")
    record_run(
        prefix,
        dag_id="mirage_pipeline",
        run_id=f"samples_complete__{month}",
        run_type="manual",
        logical_date=None,
        params={},
        defaults={},
    )
    out = storage.join(prefix, "metrics")
    step = Step("metrics", out, "test", {"month": month})
    if isinstance(doc, str):
        step.write_bytes("metrics.json", doc.encode())
    else:
        step.write_json("metrics.json", doc)
    step.commit()
    return out


NORMAL = dict(reduction=0.25, ci=(0.10, 0.40))


@pytest.fixture
def runs(tmp_path) -> str:
    return str(tmp_path / "storage" / "mirage_pipeline")


def gate(runs: str, month: str, out: str, *extra: str) -> int:
    return main("mirage_tasks", STEPS, ["gate", "--runs", runs, "--month", month, "--out", out, *extra])


def test_normal_months_pass(runs, tmp_path, capsys):
    for m in ("2023-01", "2023-02", "2023-03"):
        store_month(runs, m, metrics_doc(**NORMAL))
    out = str(tmp_path / "gate" / "2023-03")
    assert gate(runs, "2023-03", out, "--margin", "0.1") == 0
    verdict = json.loads((tmp_path / "gate" / "2023-03" / "gate.json").read_text())
    assert (tmp_path / "gate" / "2023-03" / MARKER).exists()
    assert verdict["passed"] and verdict["earlier_months"] == ["2023-01", "2023-02"]
    bars = {(c["node"], c["bar"]) for c in verdict["checks"]}
    assert bars == {(n, b) for n in (1, 8) for b in ("reactive", "avg", "earlier months")}
    assert "gate 2023-03: PASSED" in capsys.readouterr().out


def test_a_month_made_to_regress_fails_with_its_numbers(runs, tmp_path, capsys):
    store_month(runs, "2023-01", metrics_doc(**NORMAL))
    store_month(runs, "2023-02", metrics_doc(**NORMAL))
    # the rule interrupts 50 % more than reactive (interval -80 % .. -30 %), and more than avg
    store_month(runs, "2023-03", metrics_doc(reduction=-0.5, ci=(-0.8, -0.3)))
    out = str(tmp_path / "gate" / "2023-03")
    assert gate(runs, "2023-03", out) == 1
    log = capsys.readouterr().out
    assert "gate 2023-03: FAILED" in log
    assert "[FAIL] node 1 vs reactive: -0.500 [-0.800, -0.300], limit -0.100" in log
    assert "[FAIL] node 8 vs avg" in log and "[FAIL] node 1 vs earlier months" in log
    assert "xgboost +3.000 h" in log  # the rule's hours, reactive's, avg's
    verdict = json.loads((tmp_path / "gate" / "2023-03" / "gate.json").read_text())
    assert not verdict["passed"]
    # a retry finds the committed verdict and fails again: a rerun never turns it into a pass
    assert gate(runs, "2023-03", out) == 1
    assert "skipped" in capsys.readouterr().out


def test_a_drop_against_the_earlier_months_alone_fails(runs, tmp_path):
    """Still ahead of reactive and avg, but well below what the rule did in the months before."""
    store_month(runs, "2023-01", metrics_doc(**NORMAL))
    store_month(runs, "2023-02", metrics_doc(**NORMAL))
    store_month(runs, "2023-03", metrics_doc(reduction=0.0, ci=(-0.05, 0.05), avg=2.0))
    assert gate(runs, "2023-03", str(tmp_path / "g3")) == 1
    verdict = json.loads((tmp_path / "g3" / "gate.json").read_text())
    failed = {(c["node"], c["bar"]) for c in verdict["checks"] if c["failed"]}
    assert failed == {(1, "earlier months"), (8, "earlier months")}
    # the same month with no history is judged on reactive and avg only: it passes
    fresh = str(tmp_path / "fresh" / "mirage_pipeline")
    store_month(fresh, "2023-03", metrics_doc(reduction=0.0, ci=(-0.05, 0.05), avg=2.0))
    assert gate(fresh, "2023-03", str(tmp_path / "g3-fresh")) == 0


def test_later_months_are_never_read(runs, tmp_path):
    """Later months that would fail the month (a much better rule) or break the gate (a corrupt
    metrics.json) are ignored: the verdict is the one the month had before they existed."""
    store_month(runs, "2023-01", metrics_doc(**NORMAL))
    store_month(runs, "2023-02", metrics_doc(**NORMAL))
    store_month(runs, "2023-04", metrics_doc(reduction=0.9, ci=(0.85, 0.95)))
    store_month(runs, "2023-05", metrics_doc(reduction=0.9, ci=(0.85, 0.95)))
    store_month(runs, "2023-06", metrics_doc(reduction=0.9, ci=(0.85, 0.95)))
    store_month(runs, "2023-07", "{not json")
    assert gate(runs, "2023-02", str(tmp_path / "g2")) == 0
    verdict = json.loads((tmp_path / "g2" / "gate.json").read_text())
    assert verdict["earlier_months"] == ["2023-01"]
    assert all("2023-0" + d not in json.dumps(verdict["earlier_metrics"]) for d in "4567")
    # judged against those later months, the same month would fail: the test can tell
    from mirage_tasks.evaluation.gate import judge, month_numbers

    later = {
        m: month_numbers(metrics_doc(reduction=0.9, ci=(0.85, 0.95)), "xgboost", m) for m in ("2022-10", "2022-11")
    }
    this = month_numbers(metrics_doc(**NORMAL), "xgboost", "x")
    assert not judge("2023-02", this, later, 0.1)["passed"]
    # and judge() itself drops a later month whatever the caller passes
    assert judge("2022-09", this, later, 0.1)["passed"]


def test_calibrated_average_is_the_bar_when_validated(runs, tmp_path):
    doc = metrics_doc(**NORMAL)
    doc["rows"] += [_row("avg-cal", 1, 1.0), _row("avg-cal", 8, 1.0)]  # xgboost's 1.5 h is 50 % worse
    store_month(runs, "2023-03", doc)
    assert gate(runs, "2023-03", str(tmp_path / "g")) == 1
    verdict = json.loads((tmp_path / "g" / "gate.json").read_text())
    failed = {(c["node"], c["bar"]) for c in verdict["checks"] if c["failed"]}
    assert failed == {(1, "avg-cal"), (8, "avg-cal")}


def test_bad_inputs_exit_2_naming_them(runs, tmp_path, capsys):
    store_month(runs, "2023-01", metrics_doc(**NORMAL))
    assert gate(runs, "2023-02", str(tmp_path / "g")) == 2
    assert "month 2023-02: no committed metrics" in capsys.readouterr().err
    assert gate(runs, "2023-01", str(tmp_path / "g"), "--rule", "moe") == 2
    assert "no rows of rule 'moe'" in capsys.readouterr().err
    assert gate(runs, "2023-13", str(tmp_path / "g")) == 2
    assert gate(runs, "2023-01", str(tmp_path / "g"), "--margin", "-1") == 2
    assert not (tmp_path / "g" / MARKER).exists()
