"""The v2 page names a log's own scored months for what they are: the shipped logs' are protocol
v1's (seen when v2's rules were designed), a site's own log's were never seen by anyone."""

from __future__ import annotations

from lab.pages.mirage_v2_page import V1_LOGS, seen_sections


def test_the_shipped_logs_are_v1s():
    assert V1_LOGS == {"KTH-SP2", "CTC-SP2", "ls6", "CEA-Curie"}


def test_a_sites_own_months_are_not_called_seen():
    cells = [{"log": "KTH-SP2", "month": "1997-01"}, {"log": "mysite", "month": "2024-03"}]
    (v1_title, v1), (own_title, own) = seen_sections(cells)
    assert v1_title.startswith("## Seen months (v1's") and [c["log"] for c in v1] == ["KTH-SP2"]
    assert "Seen" not in own_title and "no rule was designed knowing them" in own_title
    assert [c["log"] for c in own] == ["mysite"]
    [(title, _)] = seen_sections(cells[1:])
    assert "v1" not in title
