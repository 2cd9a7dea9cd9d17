"""``devtools/rerun_at_version.py``: a stored output rerun at the commit its marker recorded.

A temporary git repository holds a copy of the code (``stepkit`` and ``mirage_tasks``); a cheap
``synth`` step runs from it (its marker records that commit and the command), then the code at
HEAD changes. The rerun at the recorded commit is bit-identical, which the changed HEAD would not
be (``--at HEAD`` shows the difference and names the JSON key), so the rerun truly ran the recorded code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.timeout(300)

TOOL = REPO / "devtools" / "rerun_at_version.py"
REPORT_LINE = '{"profile": args.profile, "seed": args.seed, "stats": stats}'


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOUSE_BUNDLE_")}
    env.update(extra)
    return env


def _tool(*args: str, repo: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args, "--repo", str(repo)],
        cwd=REPO,
        env=_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.fixture
def code_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    for pkg in ("stepkit", "mirage_tasks"):
        shutil.copytree(REPO / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "the code that makes the output")
    return repo


def test_rerun_at_the_recorded_version_is_bit_identical_and_other_code_is_not(code_repo, tmp_path):
    recorded = _git(code_repo, "rev-parse", "HEAD")
    out = tmp_path / "storage" / "synth"
    argv = ["synth", "--profile", "ls6-a100", "--from", "2023-01-01", "--to", "2023-01-03", "--seed", "3"]
    run = subprocess.run(
        [sys.executable, "-P", "-m", "mirage_tasks", *argv, "--out", str(out)],
        cwd=tmp_path,
        env=_env(PYTHONPATH=str(code_repo)),  # only the repository's copy of the code
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    marker = json.loads((out / "_SUCCESS.json").read_text())
    assert marker["code"] == {"bundle_name": None, "bundle_version": recorded, "source": "git"}
    assert marker["command"]["argv"] == [*argv, "--out", str(out)]

    # the code at HEAD changes what the step writes
    step_file = code_repo / "mirage_tasks" / "steps" / "synth.py"
    text = step_file.read_text()
    assert REPORT_LINE in text
    step_file.write_text(text.replace(REPORT_LINE, REPORT_LINE[:-1] + ', "changed": True}'))
    _git(code_repo, "commit", "-qam", "HEAD changes synth_report.json")
    head = _git(code_repo, "rev-parse", "HEAD")
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    same = _tool(str(out), repo=code_repo)
    assert same.returncode == 0, same.stdout + same.stderr
    for name in ("trace.parquet", "submit_prefixes.json", "synth_report.json"):
        assert any(line.split()[:2] == [name, "identical"] for line in same.stdout.splitlines()), same.stdout
    assert f"3 of 3 artefact(s) bit-identical at {recorded[:12]}" in same.stdout

    other = _tool(str(out), "--at", "HEAD", repo=code_repo)
    assert other.returncode == 1, other.stdout + other.stderr
    lines = {line.split()[0]: line for line in other.stdout.splitlines() if line.startswith("  ") and line.split()}
    assert lines["synth_report.json"].split()[1] == "differs" and "differs at changed" in lines["synth_report.json"]
    assert lines["trace.parquet"].split()[1] == "identical"
    assert f"rerun at {head}, not at the recorded version" in other.stdout

    # the stored output is untouched and no worktree is left behind
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _git(code_repo, "worktree", "list").count("\n") == 0


def test_an_output_without_a_recorded_command_cannot_be_rerun(code_repo, tmp_path):
    out = tmp_path / "old"
    out.mkdir()
    (out / "_SUCCESS.json").write_text(json.dumps({"step": "synth", "fingerprint": "x", "outputs": {}}))
    done = _tool(str(out), repo=code_repo)
    assert done.returncode == 2 and "records no command line" in done.stderr
    missing = _tool(str(tmp_path / "nothing"), repo=code_repo)
    assert missing.returncode == 2 and "no committed output" in missing.stderr


def test_differences_and_their_known_causes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("rerun_at_version", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.json_differences({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 3]}, "d": 0}) == ["b.c[1]", "d"]
    assert tool.with_out(["x", "--out", "/a", "--k"], "/b") == ["x", "--out", "/b", "--k"]
    assert tool.with_out(["x", "--out=/a"], "/b") == ["x", "--out=/b"]
    marker = {
        "params": {"common": {"threads": 4, "device": "cuda"}, "workers": 1},
        "code": {"bundle_version": "a" * 40 + "-dirty"},
        "inputs": [{"uri": "/in", "fingerprint": "step:1"}],
    }
    reasons = tool.known_reasons(marker, {"inputs": [{"uri": "/in", "fingerprint": "step:2"}]})
    assert reasons == [
        "computed with threads=4: floating-point sums may run in another order",
        "computed on cuda: GPU kernels are not bit-reproducible by default",
        "the recorded run had uncommitted changes to tracked files of its checkout",
        "inputs changed since the recorded run: /in",
    ]
    assert tool.known_reasons({"params": {"threads": 1}}, {}) == []
