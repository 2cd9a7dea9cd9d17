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
    for req in [
        "requirements.txt",
        "requirements-dev.txt",
        "docker/requirements-mirage.txt",
        "docker/requirements-faasm.txt",
    ]:
        missing = [n for n in _names(ROOT / req) if n not in pinned]
        assert not missing, f"{req}: {missing} not pinned in constraints.txt"
    assert not any("+" in v for v in pinned.values()), "local version labels cannot be installed elsewhere"


def test_dockerfiles_copy_what_exists():
    for df in (ROOT / "docker").glob("*.Dockerfile"):
        for line in df.read_text().splitlines():
            if line.startswith("COPY ") and "--from=" not in line:  # --from copies out of a build stage
                for src in [w for w in line.split()[1:-1] if not w.startswith("--")]:  # --chown=... is a flag
                    assert (ROOT / src).exists(), f"{df.name}: COPY {src} does not exist"


def test_wheel_holds_the_packages_their_data_and_entry_points(tmp_path):
    """``pip wheel .`` builds, and the wheel has every data file the packages read."""
    import subprocess
    import sys
    import zipfile

    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(ROOT),
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = [
        *(f"mirage_tasks/data/profiles/{p.name}" for p in (ROOT / "mirage_tasks" / "data" / "profiles").glob("*.json")),
        *(
            f"faasm_tasks/{d}/{p.name}"
            for d in ("experiments", "schemas", "templates")
            for p in (ROOT / "faasm_tasks" / d).iterdir()
            if p.is_file()
        ),
    ]
    assert len(expected) >= 10
    missing = [n for n in expected if n not in names]
    assert not missing, f"package data missing from {wheel.name}: {missing}"
    # every Python package of the three, subpackages included
    for pkg in ("stepkit", "mirage_tasks", "faasm_tasks"):
        for init in (ROOT / pkg).rglob("__init__.py"):
            rel = init.relative_to(ROOT).as_posix()
            assert rel in names, f"{rel} not in the wheel"
    assert not any(n.startswith(("dags/", "plugins/", "tests/", "bench/", "lab/")) for n in names)  # the product only
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "mirage-tasks = stepkit.cli:console" in text and "faasm-tasks = stepkit.cli:console" in text


def test_packages_import_from_the_installed_distribution():
    """The dev install (``pip install -e .``) is what resolves the packages, not a path hack."""
    from importlib import metadata

    dist = metadata.distribution("house-tasks")
    assert {ep.name for ep in dist.entry_points if ep.group == "console_scripts"} >= {"mirage-tasks", "faasm-tasks"}


def test_console_script_runs_the_step_registry(tmp_path):
    import shutil
    import subprocess

    exe = shutil.which("faasm-tasks") or str(pathlib.Path(sys_prefix()) / "bin" / "faasm-tasks")
    proc = subprocess.run([exe, "no-such-step"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert "unknown step 'no-such-step'" in proc.stderr and "deploy" in proc.stderr


def sys_prefix() -> str:
    import sys

    return sys.prefix
