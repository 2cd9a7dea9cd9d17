"""Which code produced an output: the DAG bundle and its version, recorded in the success marker.

A step started by the house factory (``plugins/house``) gets the run's Airflow DAG bundle in two
environment variables, :data:`BUNDLE_NAME_ENV` and :data:`BUNDLE_VERSION_ENV` (a git commit for a
``GitDagBundle``; for a ``LocalDagBundle``, which has no version, the commit of the DAGs folder's
checkout or ``unversioned``). A step run by hand gets neither: it records the commit of the git
checkout its own code was imported from (``<sha>``, ``<sha>-dirty`` with uncommitted changes to
tracked files), or ``unversioned`` when that is no checkout (an installed image).

:func:`code_version` is what :meth:`stepkit.step.Step.commit` writes as the marker's ``code`` and
what the report headers show. It is recorded, never part of a fingerprint: a rerun of the same
inputs and parameters under a new commit still skips, and its outputs keep naming the code that
really made them.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

#: The environment variables the house factory sets for every step (``house.bundle`` repeats the
#: names: the plugins never import the task packages; ``tests/dags/test_bundle_env.py`` checks both agree).
BUNDLE_NAME_ENV = "HOUSE_BUNDLE_NAME"
BUNDLE_VERSION_ENV = "HOUSE_BUNDLE_VERSION"
#: The version of code that no version control names.
UNVERSIONED = "unversioned"
#: The suffix of a checkout's commit whose tracked files were changed since it.
DIRTY = "-dirty"


def git_version(folder: str | os.PathLike[str]) -> str | None:
    """The commit checked out at ``folder`` (``<sha>-dirty`` when tracked files differ from it), or
    None when ``folder`` is in no git checkout or git is missing."""
    try:
        sha = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--verify", "HEAD"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + (DIRTY if dirty else "") if sha else None


@functools.lru_cache(maxsize=1)
def _checkout_version() -> str:
    return git_version(Path(__file__).resolve().parent) or UNVERSIONED


def code_version() -> dict[str, str | None]:
    """``{"bundle_name", "bundle_version", "source"}`` of the code running this process: the house's
    environment variables when set (``source`` ``"env"``), else this checkout's commit (``"git"``)
    or ``unversioned`` (``"none"``)."""
    version = os.environ.get(BUNDLE_VERSION_ENV, "").strip()
    if version:
        return {"bundle_name": os.environ.get(BUNDLE_NAME_ENV) or None, "bundle_version": version, "source": "env"}
    found = _checkout_version()
    return {"bundle_name": None, "bundle_version": found, "source": "git" if found != UNVERSIONED else "none"}


def describe(code: dict | None) -> str:
    """One line naming the code: ``bundle house-dags at 3f2a...`` (a marker's ``code``, or None)."""
    if not isinstance(code, dict) or not code.get("bundle_version"):
        return "code version not recorded"
    name = code.get("bundle_name")
    where = f"bundle {name}" if name else "checkout"
    return f"{where} at {code['bundle_version']}"
