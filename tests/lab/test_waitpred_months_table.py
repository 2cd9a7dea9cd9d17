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


def _wp_promise() -> dict:
    """Two scored months; the folds' pick (corrected_q20) keeps the within-1-h promise in both, the
    single tail's (corrected_q40) breaks it in February (6.5 points below zero wait)."""

    def m(w):
        return {"n": 100, "within_1h": w}

    oos = {
        "zero": {"months": {"1997-01": m(0.66), "1997-02": m(0.66)}, "pooled": {"mae_h": 5.2}},
        "corrected_q20": {"months": {"1997-01": m(0.68), "1997-02": m(0.64)}, "pooled": {"mae_h": 4.4}},
        "corrected_q40": {"months": {"1997-01": m(0.655), "1997-02": m(0.595)}, "pooled": {"mae_h": 3.8}},
        "guarded": {"size_classes": {"1": {"n": 150, "coverage": 0.9}, "16-31": {"n": 50, "coverage": 0.74}}},
    }
    return {
        "pick": "corrected_q20",
        "params": {"margin": 0.05, "level": 0.9},
        "out_of_sample": oos,
        "criteria": {
            "coverage_in_target_every_month": True,
            "coverage_target": [0.85, 0.95],
            "coverage_size_classes_outside_target": ["16-31"],
        },
        "guard": {"check": "eligibility judged on 2 rolling-origin folds", "single_tail_pick": "corrected_q40"},
    }


def test_the_promise_table_shows_the_pick_beside_the_single_tails_month_by_month():
    from lab.pages.mirage_eval_page import waitpred_answer, waitpred_promise

    L = waitpred_promise(_wp_promise())
    assert L[0] == "Eligibility judged on 2 rolling-origin folds."
    assert "| month | n | zero within 1 h | corrected_q20 (folds) | kept | corrected_q40 (single tail) | kept |" in L
    assert "| 1997-01 | 100 | 66.0% | +2.0 | yes | -0.5 | yes |" in L
    assert "| 1997-02 | 100 | 66.0% | -2.0 | yes | -6.5 | **no** |" in L
    (answer, _) = waitpred_answer([("KTH-SP2", _wp_promise())])
    assert "in 2 of 2 scored months (KTH-SP2)" in answer and "kept it in 1." in answer
    assert "KTH-SP2 4.40 against 3.80 (5.20). " in answer
    assert answer.endswith(
        "The 90% bound's coverage was in [85%, 95%] in every scored month on 1 of 1 logs and in 1 of 2 "
        "job-size classes (outside: KTH-SP2 16-31 74.0%)."
    )
    # an output written before the folds: no table, no answer
    old = {k: v for k, v in _wp_promise().items() if k != "guard"}
    assert waitpred_promise(old) == [] and waitpred_answer([("KTH-SP2", old)]) == []


def test_the_trace_line_says_what_the_log_lacked_and_how_it_was_completed():
    from lab.pages.mirage_eval_page import hygiene_line

    assert hygiene_line(None) is None
    clean = {"limit_fill_at_ingest": {"jobs_without_limit": 0}, "never_ran": 0}
    assert hygiene_line(clean) == "Trace: every job requested a time limit; no job that never ran."
    h = {
        "limit_fill_at_ingest": {"jobs_without_limit": 3, "partition_max": 1, "user_history": 2, "log_default": 0},
        "never_ran": 14715,
        "never_ran_in_windows": 7929,
    }
    line = hygiene_line(h)
    assert "3 job(s) without a requested time" in line and "1 their partition's maximum" in line
    assert "14715 job(s) that never ran" in line and "7929 of them" in line
