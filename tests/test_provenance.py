"""The success marker names the code that wrote an output (``code``) and how it was run (``command``),
recorded outside the fingerprint: a rerun under other code still skips and keeps the record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import stepkit
from mirage_tasks.__main__ import STEPS
from stepkit import MARKER, Step, provenance, read_marker
from stepkit.cli import main

SHA = "0123456789abcdef0123456789abcdef01234567"


def _synth(out: Path) -> list[str]:
    return [
        "synth",
        "--profile",
        "ls6-a100",
        "--from",
        "2023-01-01",
        "--to",
        "2023-01-02",
        "--seed",
        "5",
        "--out",
        str(out),
    ]


def test_marker_records_the_bundle_and_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOUSE_BUNDLE_NAME", "house-dags")
    monkeypatch.setenv("HOUSE_BUNDLE_VERSION", SHA)
    out = tmp_path / "synth"
    assert main("mirage_tasks", STEPS, _synth(out)) == 0
    marker = read_marker(str(out))
    assert marker["code"] == {"bundle_name": "house-dags", "bundle_version": SHA, "source": "env"}
    assert marker["command"] == {"package": "mirage_tasks", "argv": _synth(out), "cwd": os.getcwd()}
    assert Step.command is None  # the CLI's record ends with its step: a library Step records none

    # the version is recorded, not fingerprinted: under newer code the same inputs skip, and the
    # marker still names the code that really wrote the outputs
    monkeypatch.setenv("HOUSE_BUNDLE_VERSION", "f" * 40)
    capsys.readouterr()
    assert main("mirage_tasks", STEPS, _synth(out)) == 0
    assert "skipped (up to date" in capsys.readouterr().out
    assert read_marker(str(out)) == marker


def test_a_marker_written_before_the_record_still_skips(tmp_path, capsys):
    out = tmp_path / "synth"
    assert main("mirage_tasks", STEPS, _synth(out)) == 0
    old = read_marker(str(out))
    del old["code"], old["command"]
    (out / MARKER).write_text(json.dumps(old))
    capsys.readouterr()
    assert main("mirage_tasks", STEPS, _synth(out)) == 0
    assert "skipped (up to date" in capsys.readouterr().out


def test_without_the_house_variables_the_checkout_commit_is_recorded(monkeypatch):
    for name in (provenance.BUNDLE_NAME_ENV, provenance.BUNDLE_VERSION_ENV):
        monkeypatch.delenv(name, raising=False)
    code = provenance.code_version()
    found = provenance.git_version(Path(stepkit.__file__).parent)
    if found is None:
        assert code == {"bundle_name": None, "bundle_version": "unversioned", "source": "none"}
    else:
        assert code == {"bundle_name": None, "bundle_version": found, "source": "git"}
        assert len(found.removesuffix(provenance.DIRTY)) == 40


def test_git_version_of_a_folder(tmp_path):
    import subprocess

    assert provenance.git_version(tmp_path) is None  # no checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    (tmp_path / "f.txt").write_text("1")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "c"]):
        subprocess.run([*git, *args], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert provenance.git_version(tmp_path) == sha
    (tmp_path / "new.txt").write_text("untracked: not the code that ran")
    assert provenance.git_version(tmp_path) == sha
    (tmp_path / "f.txt").write_text("2")
    assert provenance.git_version(tmp_path) == sha + "-dirty"


@pytest.mark.parametrize(
    "code, line",
    [
        ({"bundle_name": "house-dags", "bundle_version": SHA, "source": "env"}, f"bundle house-dags at {SHA}"),
        ({"bundle_name": None, "bundle_version": SHA, "source": "git"}, f"checkout at {SHA}"),
        (None, "code version not recorded"),
    ],
)
def test_describe(code, line):
    assert provenance.describe(code) == line
