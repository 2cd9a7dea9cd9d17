"""docs/results/waitpred.md's per-month table (lab/pages/mirage_eval_page.py): the predictor's bound
beside the QBETS reference bound, month by month, and an output written before QBETS still renders."""

from __future__ import annotations

from lab.pages.mirage_eval_page import waitpred_months


def _wp(qbets: bool) -> dict:
    row = {"n": 10, "mae_h": 1.5, "within_1h": 0.6, "coverage": 0.9, "bound_median_h": 4.0}
    zero = {"n": 10, "mae_h": 2.0, "within_1h": 0.7}
    wp = {"out_of_sample": {"guarded": {"months": {"1997-01": row}}, "zero": {"months": {"1997-01": zero}}}}
    if qbets:
        wp["qbets"] = {"months": {"1997-01": {"n": 10, "coverage": 0.954, "bound_median_h": 22.02}}}
    return wp


def test_the_month_table_shows_the_qbets_bound_beside_the_predictors():
    head, _, row = waitpred_months(_wp(True))
    assert head.endswith("| coverage | bound median h | QBETS coverage | QBETS bound median h |")
    assert row == "| 1997-01 | 10 | 1.50 (2.00) | 60.0% (70.0%) | 90.0% | 4.00 | 95.4% | 22.02 |"


def test_an_output_written_before_qbets_renders_dashes():
    assert waitpred_months(_wp(False))[2].endswith("| 90.0% | 4.00 | - | - |")
