"""The run's DAG bundle and version reach every step: ``HOUSE_BUNDLE_NAME``/``HOUSE_BUNDLE_VERSION``.

Both runners (a local child's environment, a pod's container env) get them from the task's
context (``context["ti"].bundle_instance`` in Airflow 3.3.2); a ``LocalDagBundle`` without a
version falls back to its folder's git commit, else ``unversioned``.
"""

from __future__ import annotations

import subprocess
import textwrap
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_local_runner import make_op
from test_pod_specs import _TI, RUN_ID, assert_house_pod, kube_env  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)

SHA = "0123456789abcdef0123456789abcdef01234567"


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def env_root(tmp_path: Path) -> Path:
    """A task package ``envsteps`` printing the bundle variables it was given."""
    pkg = tmp_path / "code" / "envsteps"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(
        textwrap.dedent("""
        import os
        for k in ("HOUSE_BUNDLE_NAME", "HOUSE_BUNDLE_VERSION"):
            print(f"{k}={os.environ.get(k, '<unset>')}", flush=True)
        """)
    )
    return tmp_path / "code"


def _env_lines(log) -> dict[str, str]:
    out = {}
    for _, text in log.lines:
        if "HOUSE_BUNDLE_" in text and "=" in text and text.startswith("[stdout]"):
            k, v = text.split("] ", 1)[1].split("=", 1)
            out[k] = v
    return out


def test_names_agree_with_stepkit():
    from house import bundle
    from stepkit import provenance

    assert (bundle.BUNDLE_NAME_ENV, bundle.BUNDLE_VERSION_ENV, bundle.UNVERSIONED) == (
        provenance.BUNDLE_NAME_ENV,
        provenance.BUNDLE_VERSION_ENV,
        provenance.UNVERSIONED,
    )


def test_local_runner_passes_the_runs_bundle_and_no_env_param_overrides_it(env_root):
    op, log = make_op(env_root, [], env={"HOUSE_BUNDLE_VERSION": "made-up"})
    op.package = "envsteps"
    ti = SimpleNamespace(bundle_instance=SimpleNamespace(name="house-dags", version=SHA, path=env_root))
    op.execute({"ti": ti})
    assert _env_lines(log) == {"HOUSE_BUNDLE_NAME": "house-dags", "HOUSE_BUNDLE_VERSION": SHA}


def test_local_dag_bundle_falls_back_to_its_folders_commit(tmp_path):
    from house.bundle import bundle_env

    repo = tmp_path / "repo"
    (repo / "dags").mkdir(parents=True)
    (repo / "dags" / "d.py").write_text("x = 1\n")
    local = SimpleNamespace(name="dags-folder", version=None, supports_versioning=False, path=repo / "dags")
    ctx = {"ti": SimpleNamespace(bundle_instance=local)}
    assert bundle_env(ctx)["HOUSE_BUNDLE_VERSION"] == "unversioned"  # no checkout
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c1")
    sha = _git(repo, "rev-parse", "HEAD")
    assert bundle_env(ctx) == {"HOUSE_BUNDLE_NAME": "dags-folder", "HOUSE_BUNDLE_VERSION": sha}
    (repo / "dags" / "d.py").write_text("x = 2\n")  # a tracked file changed since the commit
    assert bundle_env(ctx)["HOUSE_BUNDLE_VERSION"] == sha + "-dirty"


def test_git_bundle_without_a_run_version_takes_its_current_commit():
    from house.bundle import bundle_env

    git = SimpleNamespace(
        name="house-git",
        version=None,  # the run was created with bundle versioning off
        supports_versioning=True,
        path=Path("/nonexistent"),
        get_current_version=lambda: SimpleNamespace(version=SHA),  # Airflow 3.3's BundleVersion
    )
    assert bundle_env({"ti": SimpleNamespace(bundle_instance=git)}) == {
        "HOUSE_BUNDLE_NAME": "house-git",
        "HOUSE_BUNDLE_VERSION": SHA,
    }


def test_in_process_run_finds_the_configured_bundle_of_its_dag_file():
    """``airflow dags test`` runs tasks without a bundle instance: the configured bundle (here the
    default ``dags-folder`` over the repository's dags/) that holds the DAG file names it."""
    from conftest import DAGS

    from house.bundle import bundle_env, folder_commit

    ctx = {"ti": SimpleNamespace(), "dag": SimpleNamespace(fileloc=str(DAGS / "mirage_pipeline.py"))}
    env = bundle_env(ctx)
    assert env["HOUSE_BUNDLE_NAME"] == "dags-folder"
    assert env["HOUSE_BUNDLE_VERSION"] == (folder_commit(DAGS) or "unversioned")
    outside = {"ti": SimpleNamespace(), "dag": SimpleNamespace(fileloc="/nonexistent/dag.py")}
    assert bundle_env(outside) == {"HOUSE_BUNDLE_NAME": "none", "HOUSE_BUNDLE_VERSION": "unversioned"}


def test_pod_spec_carries_the_bundle(kube_env):
    from airflow.sdk import DAG
    from kubernetes.client import ApiClient

    from house import step

    with DAG("house_bundle_env", schedule=None):
        op = step(
            "s",
            package="mirage_tasks",
            argv=["x", "--out", "s3://house-test/storage/x"],
            timeout=timedelta(minutes=5),
            env={"HOUSE_BUNDLE_VERSION": "made-up"},
        )
    ti = _TI(op, {})
    ti.bundle_instance = SimpleNamespace(name="house-dags", version=SHA, path=Path("/nonexistent"))
    context = {"dag": op.dag, "task": op, "ti": ti, "task_instance": ti, "run_id": RUN_ID, "params": {}}
    op.render_template_fields(context)
    manifest = ApiClient().sanitize_for_serialization(op.build_pod_request_obj(context, dry_run=True))
    assert_house_pod(manifest, preset="cpu-small", timeout=timedelta(minutes=5))
    env = [(e["name"], e.get("value")) for e in manifest["spec"]["containers"][0]["env"]]
    bundle = [(k, v) for k, v in env if k.startswith("HOUSE_BUNDLE_")]
    assert bundle == [("HOUSE_BUNDLE_NAME", "house-dags"), ("HOUSE_BUNDLE_VERSION", SHA)], env
