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


def _cell(month: str, diffs: dict[str, float], interrupted_lo: dict[str, float]) -> dict:
    """One fresh cell: each rule's difference to reactive (negative: better) with an interval 0.1 wide
    either side and a p-value that says so; the difference to avg-cal the same less 0.05."""
    import pandas as pd

    rows = {}
    for m in ("reactive", "avg-cal", *diffs):
        d = 0.0 if m == "reactive" else diffs.get(m, 0.0)
        da = 0.0 if m == "avg-cal" else d - 0.05

        def verdict(x: float) -> str:
            return "better" if x + 0.1 < 0 else "worse" if x - 0.1 > 0 else "no difference shown"

        rows[m] = {
            "n": 100,
            "objective": 1.0 + d,
            "diff_vs_reactive": d,
            "diff_reactive_ci_lo": d - 0.1,
            "diff_reactive_ci_hi": d + 0.1,
            "verdict_vs_reactive": verdict(d),
            "p_vs_reactive": 1e-4 if verdict(d) != "no difference shown" else 0.5,
            "diff_vs_avg_cal": da,
            "diff_ci_lo": da - 0.1,
            "diff_ci_hi": da + 0.1,
            "verdict": verdict(da),
            "p_vs_avg_cal": 1e-4 if verdict(da) != "no difference shown" else 0.5,
            "oracle_gain_share": -d,
            "oracle_share_ci_lo": -d - 0.1,
            "oracle_share_ci_hi": -d + 0.1,
            "interrupted_share": interrupted_lo.get(m, 0.2) + 0.05,
            "interrupted_lo": interrupted_lo.get(m, 0.2),
            "interrupted_hi": interrupted_lo.get(m, 0.2) + 0.1,
            "mean_wasted_node_h": 0.5,
        }
    return {
        "log": "KTH-SP2",
        "node": 1,
        "month": month,
        "kind": "fresh",
        "rows": pd.DataFrame.from_dict(rows, orient="index"),
        "per": pd.DataFrame(columns=["method", "sample", "signed_interruption_h"]),
        "cal": {"primary": {"rule": "xgboost"}},
    }


def test_the_answer_states_the_summary_tables_and_the_criteria_figures():
    from lab.pages.mirage_v2_page import _criteria, answer, summary_table

    rules = ["xgboost", "wait-pred-cal", "guarantee-10"]
    cells = [
        _cell("1997-04", {"xgboost": -0.5, "wait-pred-cal": -0.6, "guarantee-10": 2.0}, {"guarantee-10": 0.02}),
        _cell("1997-05", {"xgboost": 0.5, "wait-pred-cal": -0.6, "guarantee-10": 2.0}, {"guarantee-10": 0.15}),
        _cell("1997-06", {"xgboost": -0.5, "wait-pred-cal": 0.0, "guarantee-10": 2.0}, {"guarantee-10": 0.05}),
    ]
    [text, _] = answer(cells, rules)
    crit = _criteria(cells, rules)
    first = crit[0]  # "... does NOT hold** (2 of 3 cells better than both, 1 worse than reactive)."
    good, n = first.split("** (")[1].split(" cells better")[0].split(" of ")
    bad = first.split("better than both, ")[1].split(" worse")[0]
    assert f"in {good} of {n} cells and was worse than reactive (raw) in {bad}," in text
    assert ("**holds**" in text) == ("holds**" in first and "NOT" not in first)
    g10 = next(ln for ln in crit if "guarantee-10" in ln and ln.startswith("2"))
    held = sum(ln.endswith("(holds)") or "(holds);" in ln for ln in crit if "1997-" in ln and "interrupted" in ln)
    assert f"{held} of 3 cells for guarantee-10" in text and ("every cell: yes" in g10) == (held == 3)
    row = next(r for r in summary_table(cells, rules) if r.startswith("| wait-pred-cal |"))
    better_holm = row.split(" | ")[2].split(" / ")[1]
    worse_raw = row.split(" | ")[3].split(" / ")[0]
    share = row.split(" | ")[-1].rstrip(" |")
    assert f"wait-pred-cal, in {better_holm} of 3 cells (worse in {worse_raw} raw; mean oracle share {share})" in text
    assert "never worse than reactive (raw): wait-pred-cal." in text  # xgboost worse once, guarantee-10 always
