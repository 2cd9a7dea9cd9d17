"""Shared fixtures for the Mirage tests: the real traces beside the repository, when present."""

from __future__ import annotations

import pathlib

import pytest

SHARED_TRACES = pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def shared_trace_path(name: str) -> pathlib.Path:
    """Path of a real trace in ../shared/traces, or skip the test with the reason."""
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"real trace {name} not found at {path} (../shared/traces beside the repository)")
    return path


@pytest.fixture(scope="session")
def shared_trace():
    """``shared_trace(name)``: path of a real trace, or skip with the reason."""
    return shared_trace_path


@pytest.fixture(scope="session")
def ls6_log() -> pathlib.Path:
    return shared_trace_path("ls6-a100.log.gz")


@pytest.fixture(scope="session")
def ls6_parquet(ls6_log, tmp_path_factory) -> pathlib.Path:
    """The whole ls6 log ingested once per session (US/Central local times)."""
    from mirage_tasks.__main__ import STEPS  # noqa: F401 - the CLI registry must import cleanly
    from stepkit.cli import main

    out = tmp_path_factory.mktemp("ls6")
    rc = main("mirage_tasks", {"ingest": ("mirage_tasks.ingest", "")},
              ["ingest", "--trace", str(ls6_log), "--timezone", "America/Chicago", "--out", str(out)])
    assert rc == 0
    return out
