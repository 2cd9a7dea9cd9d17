"""The suite's figures in ``docs/testing.md``, written from a real run rather than typed by hand.

``make test`` leaves pytest's JUnit report in ``var/test-report.xml``; each test case carries its
tier (``unit``, ``dag``, ``e2e``, ``lab``) as a property, set by ``tests/conftest.py``. This reads
the report and prints, per tier, the tests, their outcomes, the time they took summed and the
slowest one, then the whole run's wall time; ``--write`` replaces the block between the markers
below in a Markdown file::

    python devtools/suite_figures.py var/test-report.xml --workers 4 --write docs/testing.md \
        --note "Fresh clone, CI=true bash .ci/run beside stress-ng --cpu 2."
"""

from __future__ import annotations

import argparse
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

BEGIN = "<!-- suite-figures: begin (devtools/suite_figures.py writes this block) -->"
END = "<!-- suite-figures: end -->"
TIERS = ("unit", "dag", "e2e", "lab")


class ReportError(ValueError):
    pass


def read_report(path: Path) -> dict:
    """Per-tier counts and times, and the run's wall time, from a pytest JUnit XML report."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise ReportError(f"{path}: not a readable JUnit XML report ({e})") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ReportError(f"{path}: no <testsuite> element")
    tiers: dict[str, dict] = defaultdict(
        lambda: {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0, "slowest": ("", 0.0)}
    )
    wall, stamp = 0.0, ""
    for suite in suites:
        wall += float(suite.get("time", 0) or 0)
        stamp = stamp or suite.get("timestamp", "")
        for case in suite.iter("testcase"):
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            tier = props.get("tier")
            if tier not in TIERS:
                name = f"{case.get('classname')}::{case.get('name')}"
                raise ReportError(f"{path}: test {name} has no tier property (run with tests/conftest.py)")
            t = tiers[tier]
            secs = float(case.get("time", 0) or 0)
            t["tests"] += 1
            t["seconds"] += secs
            if case.find("skipped") is not None:
                t["skipped"] += 1
            elif case.find("failure") is not None or case.find("error") is not None:
                t["failed"] += 1
            else:
                t["passed"] += 1
            if secs > t["slowest"][1]:
                t["slowest"] = (f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}", secs)
    if not tiers:
        raise ReportError(f"{path}: the report holds no test case")
    return {"tiers": dict(tiers), "wall_s": wall, "timestamp": stamp}


def render(fig: dict, workers: int | None, note: str = "") -> str:
    rows = [
        "| tier | tests | passed | failed | skipped | test time summed | slowest test |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    total = {"tests": 0, "passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0}
    for tier in TIERS:
        t = fig["tiers"].get(tier)
        if not t:
            continue
        for k in total:
            total[k] += t[k]
        name, secs = t["slowest"]
        rows.append(
            f"| {tier} | {t['tests']:,} | {t['passed']:,} | {t['failed']:,} | {t['skipped']:,} "
            f"| {t['seconds']:,.0f} s | `{name}` {secs:,.0f} s |"
        )
    rows.append(
        f"| all | {total['tests']:,} | {total['passed']:,} | {total['failed']:,} | {total['skipped']:,} "
        f"| {total['seconds']:,.0f} s | |"
    )
    side = f"in {workers} pytest-xdist workers" if workers else "one after another"
    head = (
        f"Last recorded run ({fig['timestamp'][:16].replace('T', ' ') or 'time not recorded'}, "
        f"{os.cpu_count()}-core machine): {total['tests']:,} tests {side}, "
        f"{fig['wall_s']:,.0f} s wall ({fig['wall_s'] / 60:.1f} min) against {total['seconds']:,.0f} s "
        "of test time summed." + (f" {note.strip()}" if note.strip() else "")
    )
    return "\n".join([BEGIN, head, "", *rows, END])


def write_block(doc: Path, block: str) -> None:
    text = doc.read_text()
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ReportError(f"{doc}: needs exactly one block between {BEGIN!r} and {END!r}")
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    tmp = doc.with_name(doc.name + ".tmp")
    tmp.write_text(before + block + after)
    os.replace(tmp, doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, help="pytest's JUnit XML report (make test: var/test-report.xml)")
    ap.add_argument("--workers", type=int, default=None, help="the pytest-xdist workers of that run (0: serial)")
    ap.add_argument("--write", type=Path, default=None, help="Markdown file whose figures block to replace")
    ap.add_argument("--note", default="", help="how the run was made (a fresh clone, beside what load), said after it")
    a = ap.parse_args(argv)
    try:
        block = render(read_report(a.report), a.workers, a.note)
        if a.write:
            write_block(a.write, block)
    except ReportError as e:
        print(f"suite_figures: {e}", file=sys.stderr)
        return 2
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
