"""The v1 page (mirage-clusters.md) leads with the primary rule's counts; they are the counts its
'Verdicts, plainly' section states."""

from __future__ import annotations

import re

from lab.pages.mirage_eval_page import primary_answer, verdicts_section


def _verdicts():
    out = []
    # log A: xgboost better twice (once also better than the plain avg), once no difference
    for month, v, vs_avg in (
        ("m1", "better", "+0.1 [-0.1, +0.3] no difference shown"),
        ("m2", "better", "-0.5 [-0.9, -0.1] better"),
        ("m3", "no difference shown", "+0.4 [+0.1, +0.7] worse"),
    ):
        out.append(("A", month, 1, "xgboost", v, "-0.2 [-0.4, -0.1]", vs_avg))
        out.append(("A", month, 1, "avg-cal", "", "-", "+0.3 [+0.1, +0.5] worse"))
    # log B: xgboost worse once
    out.append(("B", "m1", 8, "xgboost", "worse", "+0.2 [+0.1, +0.4]", "-0.1 [-0.3, +0.1] no difference shown"))
    out.append(("B", "m1", 8, "linear_quantile", "better", "-0.2 [-0.4, -0.1]", "-"))
    out.append(("B", "m1", 8, "avg-cal", "", "-", "-0.3 [-0.5, -0.1] better"))
    return out


def test_the_answer_states_the_counts_of_verdicts_plainly():
    verdicts = _verdicts()
    section = "\n".join(verdicts_section(verdicts))
    [text, _] = primary_answer(verdicts)
    total = re.search(
        r"over (\d+) log x month x node cells: better in (\d+), worse in (\d+), no difference shown in (\d+)", section
    )
    assert total.groups() == ("4", "2", "1", "1")
    assert (
        f"over {total[1]} log x month x node cells: better in {total[2]}, worse in {total[3]}, no difference shown in "
        f"{total[4]};" in text
    )
    for log, better, cells in re.findall(r"\* (\w+): xgboost better than avg-cal in (\d+) of (\d+)", section):
        assert f"{better} of {cells} on {log}" in text
    plain = re.findall(r"against the plain avg: better in (\d+), worse in (\d+)\.", section)
    assert (
        f"Against the plain avg: better in {sum(int(b) for b, _ in plain)}, worse in {sum(int(w) for _, w in plain)}."
        in text
    )
    cal = re.search(
        r"The calibrated avg itself against the plain avg: better in (\d+), worse in (\d+) of (\d+) cells", section
    )
    assert cal.groups() == ("1", "3", "4")
    assert (
        f"The calibrated avg itself against the plain avg: better in {cal[1]}, worse in {cal[2]} of {cal[3]} cells."
        in text
    )


def test_no_primary_rows_no_answer():
    assert primary_answer([v for v in _verdicts() if v[3] != "xgboost"]) == []
