"""The README stays a front door and the documentation's links hold.

* README.md is under 400 lines (the depth lives in ``docs/``, one page per concern).
* Every relative Markdown link in README.md and ``docs/*.md`` points at a file or folder that
  exists, and a ``#anchor`` names a heading of its target (GitHub's slugs: lower case, marks
  dropped, spaces to hyphens, a repeated heading numbered ``-1``, ``-2``...).
* Every page of ``docs/`` is linked from the README.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (no links are read there)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[`*]", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        s = slug(heading)
        n = seen.get(s, 0)
        out.add(s if n == 0 else f"{s}-{n}")
        seen[s] = n + 1
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not t.startswith(EXTERNAL)]


def test_slug_is_githubs():
    assert slug("`ingest`: any trace to one normalised table") == "ingest-any-trace-to-one-normalised-table"
    assert (
        slug("A real Slurm: `make slurm`, `replay-slurm`, `keep-service`")
        == "a-real-slurm-make-slurm-replay-slurm-keep-service"
    )
    assert (
        slug("`calibrate`: a fitted configuration for any cluster's trace")
        == "calibrate-a-fitted-configuration-for-any-clusters-trace"
    )
    assert slug("On Kubernetes (knative target)") == "on-kubernetes-knative-target"
    assert slug("1. Build and push the images") == "1-build-and-push-the-images"
    assert slug("`mirage_pipeline`") == "mirage_pipeline"


def test_readme_is_a_front_door():
    n = len(README.read_text().splitlines())
    assert n < 400, f"README.md has {n} lines: move the depth to docs/"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    bad = []
    for target in links(page):
        name, _, anchor = target.partition("#")
        dest = (page.parent / name).resolve() if name else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not bad, f"{page.relative_to(REPO)}: " + "; ".join(bad)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(README) if t.partition("#")[0]}
    missing = [p.name for p in PAGES if p.resolve() not in linked]
    assert not missing, f"docs pages not linked from README.md: {missing}"
