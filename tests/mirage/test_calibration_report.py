"""The table writer of docs/results/calibration.md: blocks and target checks."""

from __future__ import annotations

import pytest

from mirage_tasks.sim.calibration_report import fill, met


def test_fill_replaces_only_the_named_blocks():
    doc = "a\n<!-- generated:x -->\nold\n<!-- /generated:x -->\nb\n<!-- generated:y -->\nkeep\n<!-- /generated:y -->\n"
    out = fill(doc, {"x": "| new |"})
    assert out == "a\n<!-- generated:x -->\n| new |\n<!-- /generated:x -->\nb\n<!-- generated:y -->\nkeep\n<!-- /generated:y -->\n"
    assert fill(out, {"x": "| new |"}) == out  # idempotent
    with pytest.raises(SystemExit, match="generated:z"):
        fill(doc, {"z": "t"})


def test_targets_need_more_than_the_zero_wait_predictor_within_1h():
    m = {"mae_h": 2.5, "within_1h": 0.80, "zero_within_1h": 0.81, "spearman": 0.65, "daily_corr": 0.8}
    assert met(m) == {"mae_h": True, "within_1h": False, "spearman": True, "daily_corr": True}
    m.update(zero_within_1h=0.70, mae_h=2.51, spearman=0.649)
    assert met(m) == {"mae_h": False, "within_1h": True, "spearman": False, "daily_corr": True}
