"""The table writer of docs/results/calibration.md: blocks and target checks."""

from __future__ import annotations

import pytest

from lab.pages.calibration_tables import fill, met


def test_fill_replaces_only_the_named_blocks():
    doc = "a\n<!-- generated:x -->\nold\n<!-- /generated:x -->\nb\n<!-- generated:y -->\nkeep\n<!-- /generated:y -->\n"
    out = fill(doc, {"x": "| new |"})
    assert (
        out
        == "a\n<!-- generated:x -->\n| new |\n<!-- /generated:x -->\nb\n<!-- generated:y -->\nkeep\n<!-- /generated:y -->\n"
    )
    assert fill(out, {"x": "| new |"}) == out  # idempotent
    with pytest.raises(SystemExit, match="generated:z"):
        fill(doc, {"z": "t"})


def test_targets_need_more_than_the_zero_wait_predictor_within_1h():
    m = {"mae_h": 2.5, "within_1h": 0.80, "zero_within_1h": 0.81, "spearman": 0.65, "daily_corr": 0.8}
    assert met(m) == {"mae_h": True, "within_1h": False, "spearman": True, "daily_corr": True}
    m.update(zero_within_1h=0.70, mae_h=2.51, spearman=0.649)
    assert met(m) == {"mae_h": False, "within_1h": True, "spearman": False, "daily_corr": True}


def test_only_rejects_unknown_blocks_before_reading_anything(capsys):
    from lab.pages.calibration_tables import main

    with pytest.raises(SystemExit) as exc:
        main(["--trace", "/nonexistent", "--ls6", "/nonexistent", "--only", "ls6-holds,nope"])
    assert exc.value.code == 2 and "nope" in capsys.readouterr().err


def test_holds_blocks_on_ls6(ls6_parquet, tmp_path):
    """The inferred-holds tables from a calibration.json naming the ls6 preset: counts per
    month, the shuffled-user null model far below the rule, and off/on rows."""
    import json

    from lab.pages.calibration_tables import Ls6
    from mirage_tasks.sim import PRESETS

    cal = tmp_path / "cal"
    cal.mkdir()
    doc = {
        "windows": {
            "calibrate_from": "2022-12-01T00:00:00-06:00",
            "calibrate_to": "2023-01-01T00:00:00-06:00",
            "score_from": "2023-01-01T00:00:00-06:00",
            "score_to": "2023-02-01T00:00:00-06:00",
        },
        "lead_in_days": 7,
        "config": PRESETS["ls6"].to_dict(),
        "trace_facts": {"dispatch_latency_s": 1},
    }
    (cal / "calibration.json").write_text(json.dumps(doc))
    ls6 = Ls6(str(ls6_parquet), str(cal), None)
    counts = ls6.holds_counts(shuffles=1).splitlines()
    assert [r.split(" | ")[0] for r in counts[2:]] == ["| 2022-12", "| 2023-01"]
    for r in counts[2:]:
        cells = [c.strip() for c in r.strip("|").split("|")]
        paired, shuffled = int(cells[2].replace(",", "")), float(cells[7].split(" ")[0])
        assert paired > 5 * max(shuffled, 1)
    rows = ls6.holds().splitlines()
    assert sum("holds off" in r for r in rows) == 4 and sum("holds inferred, 60 s" in r for r in rows) == 4


def test_the_answer_block_states_the_targets_tables_figures():
    """The answer's per-configuration figures are the targets table's cells (its out-of-sample rows)
    and its counts of targets met are the met / missed cells."""
    from lab.pages.calibration_tables import _row, answer_text, met

    def m(mae, w1, sp, dc):
        return {
            "n": 100,
            "mae_h": mae,
            "zero_mae_h": 4.54,
            "within_1h": w1,
            "zero_within_1h": 0.664,
            "within_10m": 0.5,
            "zero_within_10m": 0.5,
            "spearman": sp,
            "daily_corr": dc,
        }

    rows = [
        ("round 1", m(3.28, 0.622, 0.70, 0.5)),
        ("calibrated", m(2.4, 0.80, 0.70, 0.9)),
        ("default", m(6.98, 0.308, 0.5, 0.7)),
    ]
    text = answer_text(rows)
    assert text.startswith("**Answer.**")
    for label, x in rows:
        cells = [c.strip() for c in _row(label, "**out of sample**", x).strip("|").split("|")]
        got = f"{label}: " + (f"{sum(met(x).values())} of 4 met, " if label != "default" else "")
        assert f"{got}MAE {cells[3]} h, within 1 h {cells[5]}" in text
    assert "round 1: 1 of 4 met" in text and "calibrated: 4 of 4 met" in text and "default: 0 of 4" not in text
    assert text.endswith("Zero wait: MAE 4.54 h, within 1 h 66.4%.")
