"""The run's DAG bundle and its version, handed to every step as environment variables.

Airflow 3.3.2 runs a task with the bundle version its DAG run was created with: the task runner
builds ``context["ti"].bundle_instance`` (a ``BaseDagBundle`` with ``name`` and ``version``, from
the supervisor's ``StartupDetails.bundle_info``; the SDK's ``context["dag_run"]`` carries no
bundle field). A ``GitDagBundle`` run's version is the commit the run was pinned to; a run created
with versioning off has none, and the bundle's current commit is taken. A ``LocalDagBundle`` (the
baked image, ``make demo``) has no version: the git commit of its folder's checkout stands in
(``<sha>-dirty`` when tracked files changed), else ``unversioned``. ``airflow dags test`` runs
tasks in process without a bundle instance; the configured bundle whose folder holds the DAG file
is taken then.

Both runners set :data:`BUNDLE_NAME_ENV` and :data:`BUNDLE_VERSION_ENV` (the names
``stepkit.provenance`` reads; the plugins never import the task packages), and the step records
them in its success marker.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

#: ``stepkit.provenance.BUNDLE_NAME_ENV`` / ``BUNDLE_VERSION_ENV``.
BUNDLE_NAME_ENV = "HOUSE_BUNDLE_NAME"
BUNDLE_VERSION_ENV = "HOUSE_BUNDLE_VERSION"
#: ``stepkit.provenance.UNVERSIONED``: a bundle no version control names.
UNVERSIONED = "unversioned"
#: The bundle name when no configured bundle holds the DAG file.
NO_BUNDLE = "none"


def folder_commit(folder: str | os.PathLike[str]) -> str | None:
    """The commit checked out at ``folder`` (``-dirty`` appended when tracked files changed), or None."""
    try:
        git = ["git", "-C", str(folder)]
        sha = subprocess.run([*git, "rev-parse", "--verify", "HEAD"], capture_output=True, text=True, timeout=20)
        if sha.returncode != 0 or not sha.stdout.strip():
            return None
        dirty = subprocess.run(
            [*git, "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def _configured_bundle(fileloc: str | None) -> Any:
    """The configured bundle whose folder holds ``fileloc`` (``airflow dags test``: no bundle instance)."""
    if not fileloc:
        return None
    try:
        from airflow.dag_processing.bundles.manager import DagBundlesManager

        for bundle in DagBundlesManager().get_all_dag_bundles():
            if Path(fileloc).resolve().is_relative_to(Path(bundle.path).resolve()):
                return bundle
    except Exception:  # noqa: BLE001 - a bundle class that cannot load here: no name, the folder's commit
        return None
    return None


def bundle_info(context: Any) -> tuple[str, str]:
    """``(name, version)`` of the bundle the task runs from (see the module docstring)."""
    bundle = getattr(context.get("ti"), "bundle_instance", None)
    dag = context.get("dag")
    fileloc = getattr(dag, "fileloc", None)
    if bundle is None:
        bundle = _configured_bundle(fileloc)
    name = str(getattr(bundle, "name", None) or NO_BUNDLE)
    version = getattr(bundle, "version", None)
    if not version and bundle is not None and getattr(bundle, "supports_versioning", False):
        try:  # a run created with bundle versioning off: the commit the bundle is at now
            current = bundle.get_current_version()
            version = getattr(current, "version", current)
        except Exception:  # noqa: BLE001 - fall back to the folder's commit
            version = None
    if not version:
        folder = getattr(bundle, "path", None) or (Path(fileloc).parent if fileloc else None)
        version = (folder_commit(folder) if folder else None) or UNVERSIONED
    return name, str(version)


def bundle_env(context: Any) -> dict[str, str]:
    """The environment variables naming the task's bundle: ``{HOUSE_BUNDLE_NAME, HOUSE_BUNDLE_VERSION}``."""
    name, version = bundle_info(context)
    return {BUNDLE_NAME_ENV: name, BUNDLE_VERSION_ENV: version}
