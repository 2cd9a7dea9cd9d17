"""The ls6-months report compares with an earlier run's committed JSON record, never with an
earlier page read back through git (``lab/pages/ls6_months_page.py``)."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from lab.pages import ls6_months_page as doc


def test_committed_records_load_as_the_comparison_reads_them():
    for name in ("ls6-months.json", "ls6-months-ff01480.json"):
        rec = doc.previous_run(REPO / "docs" / "results" / name)
        verdicts = doc.previous_verdicts(rec)
        models = doc.previous_models(rec)
        months = {m for m, _ in verdicts}
        assert months == {"2023-01", "2023-02", "2023-03"} and {n for _, n in verdicts} == {1, 8}
        assert all(
            set(v) == {"model", "interruption", "diff", "waste", "beats", "objective"} for v in verdicts.values()
        )
        assert len(models) == 24 and all(
            isinstance(v["interruption"], float) and isinstance(v["wasted"], float) for v in models.values()
        )


def test_a_file_that_is_not_a_record_is_refused_by_name(tmp_path):
    bad = tmp_path / "page.json"
    bad.write_text(json.dumps({"verdicts": {}}))
    with pytest.raises(SystemExit, match="page.json: not a run record"):
        doc.previous_run(bad)


def test_the_report_reads_no_page_through_git():
    src = (REPO / "lab" / "pages" / "ls6_months_page.py").read_text()
    assert "git" not in src.replace("digit", "")
