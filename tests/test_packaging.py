"""The task images and the install files agree: everything they name is pinned."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _names(path: pathlib.Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(re.split(r"[\[=<>~ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return out


def test_every_requirement_is_pinned_in_constraints():
    pinned = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        pinned[name.lower().replace("_", "-")] = version
    assert pinned.get("torch") == "2.13.0", "pin torch==2.13.0 (no local +cpu suffix) so users can install it"
    assert pinned.get("apache-airflow") == "3.3.2"
    for req in ["requirements.txt", "requirements-dev.txt", "docker/requirements-mirage.txt", "docker/requirements-faasm.txt"]:
        missing = [n for n in _names(ROOT / req) if n not in pinned]
        assert not missing, f"{req}: {missing} not pinned in constraints.txt"
    assert not any("+" in v for v in pinned.values()), "local version labels cannot be installed elsewhere"


def test_dockerfiles_copy_what_exists():
    for df in (ROOT / "docker").glob("*.Dockerfile"):
        for line in df.read_text().splitlines():
            if line.startswith("COPY "):
                for src in line.split()[1:-1]:
                    assert (ROOT / src).exists(), f"{df.name}: COPY {src} does not exist"
