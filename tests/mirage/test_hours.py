"""Hours to seconds in one place: ``mirage_tasks.data.times.hours_to_s``."""

from __future__ import annotations

import re
from pathlib import Path

from mirage_tasks.data.times import hours_to_s

ROOT = Path(__file__).resolve().parents[2]


def test_whole_seconds_rounded_to_nearest():
    assert hours_to_s(12) == 43200 and hours_to_s(0.1) == 360 and hours_to_s("6") == 21600
    assert hours_to_s(1.4 / 3600) == 1 and hours_to_s(1.6 / 3600) == 2


def test_no_step_converts_hours_by_hand():
    pattern = re.compile(r"round\([^()]*hours[^()]*\*\s*3600\)")
    found = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in (ROOT / "mirage_tasks").rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and p.name != "times.py"
    ]
    assert found == [], f"hours to seconds by hand (use data.times.hours_to_s): {found}"
