"""ls6-months.md leads with its answer: the months the best learned model beat avg, and per month
its differences to avg, as the rows of 'Does a learned model beat avg?' state them."""

from __future__ import annotations

from lab.pages.ls6_months_page import answer, verdict, verdict_row


def _row(model: str, interruption: float, d: float, lo: float, hi: float, waste: float) -> dict:
    return {
        "model": model,
        "mean_interruption_h": interruption,
        "diff_vs_avg_h": d,
        "diff_vs_avg_ci_lo": lo,
        "diff_vs_avg_ci_hi": hi,
        "wasted_diff_vs_avg": waste,
        "wasted_diff_vs_avg_ci_lo": waste - 0.5,
        "wasted_diff_vs_avg_ci_hi": waste + 0.5,
    }


def _cell(month: str, node: int, rows: list[dict]) -> dict:
    avg = {"model": "avg", "mean_interruption_h": 1.0}
    return {"month": month, "node": node, "verdict": verdict([avg, *rows]), "avg": avg, "objective": None}


def test_the_answer_states_the_verdict_rows():
    cells = [
        _cell("2023-01", 1, [_row("xgboost", 0.3, -0.7, -0.9, -0.4, -0.1)]),  # beats avg
        _cell(
            "2023-01",
            8,
            [_row("xgboost", 0.5, -0.5, -0.8, -0.2, 2.0), _row("linear_quantile", 0.9, -0.1, -0.3, 0.1, 0.0)],
        ),
        _cell("2023-02", 1, [_row("random_forest", 1.2, 0.2, -0.1, 0.5, 0.0)]),
        _cell("2023-02", 8, [_row("xgboost", 0.2, -0.8, -1.0, -0.6, 0.0)]),  # beats avg
    ]
    [text, _] = answer(cells, [1, 8], 2)
    assert "in 1 of 2 months for 1-node jobs; 1 of 2 months for 8-node jobs." in text
    for c in cells:
        cols = [x.strip() for x in verdict_row(c).strip("|").split("|")]
        month, node, model, _i, inter, waste, why, _o = cols
        assert f"{month} node {node} {model} {inter} h, {waste} node-h ({why})" in text
    assert "2023-01 node 8 xgboost -0.50 [-0.80, -0.20] h, +2.00 [+1.50, +2.50] node-h (no: wastes more)" in text


def test_no_cells_no_answer():
    assert answer([], [1, 8], 3) == []
