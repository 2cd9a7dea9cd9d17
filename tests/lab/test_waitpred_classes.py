"""docs/results/waitpred.md's per-class table and the Targets verdict on coverage per job-size class
(lab/pages/mirage_eval_page.py) follow waitpred.json: the bound's coverage per size and requested-time
class beside QBETS's, where each size class's offset started, and which classes miss the target."""

from __future__ import annotations

import copy

from lab.pages.mirage_eval_page import _class_limits, waitpred_classes, waitpred_summary


def _r(n, cov, med, cap=0.0):
    return {"n": n, "coverage": cov, "bound_median_h": med, "at_cap": cap}


def _wp() -> dict:
    pooled = {"n": 300, "mae_h": 4.0, "within_1h": 0.7, "within_10m_waited_over_1h": 0.05, "spearman": 0.4}
    guarded = {
        "pooled": {**pooled, "coverage": 0.9, "bound_median_h": 5.0},
        "months": {"1997-01": {**_r(300, 0.9, 5.0), "within_1h": 0.7}},
        # in the JSON's order (keys sorted as strings): the page puts them in size order
        "size_classes": {"1": _r(200, 0.912, 3.5), "64-127": _r(10, 0.96, 40.0), "16-31": _r(90, 0.776, 10.26, 0.011)},
        "limit_classes": {"1-4h": _r(50, 0.9, 3.0), "<=1h": _r(70, 0.98, 1.2), ">24h": _r(180, 0.87, 11.4)},
    }
    return {
        "pick": "zero",
        "params": {"level": 0.9, "margin": 0.05},
        "out_of_sample": {
            "guarded": guarded,
            "zero": {"pooled": {**pooled, "mae_h": 4.0}, "months": {"1997-01": {"n": 300, "within_1h": 0.7}}},
        },
        "criteria": {
            "mae_at_or_below_zero": True,
            "mae_reduction_vs_zero": 0.0,
            "within_1h_within_5_points": True,
            "within_1h_promise_kept_every_month": True,
            "coverage_months": {"1997-01": 0.9},
            "coverage_target": [0.85, 0.95],
            "coverage_in_target_every_month": True,
            "coverage_size_classes": {"1": 0.912, "16-31": 0.776, "64-127": 0.96},
            "coverage_size_classes_outside_target": ["16-31", "64-127"],
        },
        "qbets": {
            "size_classes": {"1": {"coverage": 0.95, "bound_median_h": 20.0}},
            "limit_classes": {">24h": {"coverage": 0.93, "bound_median_h": 30.5}},
        },
        "bound": {
            "grouping": "job-size class",
            "group_min_known": 50,
            "groups": {
                "zero": {
                    "1": {"source": "calibrated"},
                    "16-31": {"source": "pooled fallback"},
                    "64-127": {"source": "pooled fallback"},
                },
                "plan": {"1": {"source": "pooled fallback"}},
            },
        },
    }


def test_the_class_table_reads_each_class_of_the_guarded_bound_beside_qbets():
    L = waitpred_classes(_wp())
    assert L[0].startswith("| job class | n | coverage | in target | bound median h | at cap | QBETS coverage |")
    assert L[2:] == [
        "| nodes 1 | 200 | 91.2% | yes | 3.50 | 0.0% | 95.0% | 20.00 | calibrated |",
        "| nodes 16-31 | 90 | 77.6% | **no** | 10.26 | 1.1% | - | - | pooled fallback |",
        "| nodes 64-127 | 10 | 96.0% | **no** | 40.00 | 0.0% | - | - | pooled fallback |",
        "| requested <=1h | 70 | 98.0% | **no** | 1.20 | 0.0% | - | - | - |",
        "| requested 1-4h | 50 | 90.0% | yes | 3.00 | 0.0% | - | - | - |",
        "| requested >24h | 180 | 87.0% | yes | 11.40 | 0.0% | 93.0% | 30.50 | - |",
    ]
    old = _wp()
    del old["bound"]  # an output written before the bound kept one offset per class
    assert waitpred_classes(old)[2].endswith("| 20.00 | - |")


def _targets(rows) -> str:
    return next(x for x in waitpred_summary(rows, [n for n, _ in rows]) if x.startswith("Targets"))


def test_the_targets_judge_coverage_per_size_class_naming_the_classes_that_miss():
    a, b = _wp(), _wp()
    b["criteria"]["coverage_size_classes_outside_target"] = []
    line = _targets([("ls6", a), ("KTH-SP2", b)])
    assert line.endswith(
        "in every job-size class: **not met** (outside: ls6 16-31 (77.6%, n 90), ls6 64-127 (96.0%, n 10))."
    )
    assert _targets([("KTH-SP2", b)]).endswith("in every job-size class: **met**.")
    # an output written before the criteria judged size classes: judged by the same criteria from its classes
    old = copy.deepcopy(a)
    for k in ("coverage_size_classes", "coverage_size_classes_outside_target"):
        del old["criteria"][k]
    old["out_of_sample"]["guarded"]["size_classes"]["64-127"]["coverage"] = 0.95
    assert _targets([("ls6", old)]).endswith("**not met** (outside: ls6 16-31 (77.6%, n 90)).")


def test_the_limits_say_what_the_bound_is_calibrated_per():
    (line,) = _class_limits([("ls6", _wp())])
    assert line.startswith("* The bound is calibrated per job-size class")
    assert "outside [85 %, 95 %] there: ls6 <=1h 98.0%." in line
    assert "else at the pooled offset (ls6 16-31, 64-127)" in line
    assert line.endswith(
        "Of the size classes outside the target (Summary), ls6 16-31, ls6 64-127 started at the pooled offset."
    )
    own = _wp()
    own["bound"]["groups"]["zero"]["16-31"]["source"] = "calibrated"
    assert _class_limits([("ls6", own)])[0].endswith("ls6 64-127 started at the pooled offset; ls6 16-31 at their own.")
    mg = _wp()
    mg["bound"]["groups"]["zero"]["16-31"] = {"source": "merged (16-31, 64-127)", "merged": ["16-31", "64-127"]}
    line = _class_limits([("ls6", mg)])[0]
    assert "until the merged ones hold as many (ls6 16-31), else at the pooled offset (ls6 64-127)" in line
    assert line.endswith("ls6 64-127 started at the pooled offset; ls6 16-31 at their merged neighbours'.")
    old = _wp()
    del old["bound"]
    assert _class_limits([("ls6", old)])[0].startswith("* Coverage is over all jobs of a month: the bound is not")
