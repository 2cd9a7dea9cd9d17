"""Test environment shared by every test.

Airflow reads ``AIRFLOW_HOME`` and its configuration when ``airflow`` is first
imported, so this module sets them at import time, before any test module imports
Airflow: a throw-away ``AIRFLOW_HOME`` with SQLite, no example DAGs, ``dags/`` and
``plugins/`` of this repository. It never imports Airflow itself; tests that need the
metadata database request the ``airflow_db`` fixture (created once per session).

``HOUSE_*`` variables from the caller's shell are dropped so the house defaults are
what is tested; storage goes to a temporary directory, never into the repository.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"
#: ../shared/traces beside the repository; SHARED_TRACES names another folder (a git worktree
#: whose parent holds no shared/).
TRACES = Path(os.environ.get("SHARED_TRACES") or REPO.parent / "shared" / "traces")

_HOME = Path(tempfile.mkdtemp(prefix="airflow-test-home-"))

for _key in [k for k in os.environ if k.startswith(("HOUSE_", "AIRFLOW_VAR_HOUSE_"))]:
    del os.environ[_key]
os.environ.update(
    {
        "AIRFLOW_HOME": str(_HOME),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        "HOUSE_STORAGE_ROOT": str(_HOME / "storage"),
        # the steps read only the storage root and the shipped traces (stepkit.reach); TRACES may be
        # SHARED_TRACES rather than the house default beside the checkout
        "HOUSE_INPUT_ROOTS": str(TRACES),
        # dag.test() of a DAG with a deadline fails once its run succeeds in Airflow 3.3.2 (it looks
        # the alerts of an unstored copy up): the deadline tests set their own intervals
        "HOUSE_DEADLINE_FAASM_BENCHMARKS": "off",
        "HOUSE_DEADLINE_MIRAGE_SERVICE": "off",
    }
)
# The task packages come from the install (`pip install -e .`); the lab wing (lab/, not
# packaged) from the repository root, which pyproject.toml's `pythonpath` puts on sys.path; the
# plugins folder, which Airflow itself puts on sys.path when it loads plugins, is added here.
if str(PLUGINS) not in sys.path:
    sys.path.insert(0, str(PLUGINS))


#: Old Airflow import paths fail the tests. Added here rather than in pyproject.toml:
#: pytest imports a filter's warning class while reading its ini file, before this
#: module has set AIRFLOW_HOME, and importing ``airflow`` binds the home at import.
DEPRECATED_IMPORT_FILTER = "error::airflow.utils.deprecation_tools.DeprecatedImportWarning"


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", DEPRECATED_IMPORT_FILTER)


# --- test tiers (markers registered in pyproject.toml) ---------------------------------
#: ``unit``: modules and steps on small generated inputs (``make test-fast``, seconds);
#: ``dag``: DAG parsing, the house factory, pod specs, the local runner (tests/dags/);
#: ``e2e``: whole pipelines and many-process runs (``*_e2e.py``, plus the files below);
#: ``lab``: the lab wing's code (lab/: campaign drivers, page writers, the probe replay, the
#: Slurm replay), every test under tests/lab/ whatever its name, so ``pytest -m unit`` is
#: the product's alone and ``pytest -m lab`` the lab's.
#: The tier follows the file name (and tests/dags/ for ``dag``, tests/lab/ for ``lab``), so a
#: product test file moved to another folder keeps its tier. ``make test`` runs all four.
TIERS = ("unit", "dag", "e2e", "lab")
#: Files without ``_e2e`` in their name that run training loops, worker pools, timed
#: load or whole reports (5-30 s each on 2 cores): e2e, so the unit tier stays fast.
E2E_FILES = frozenset(
    {
        "test_train.py",  # torch/XGBoost/RF training, resume after a kill
        "test_validate.py",  # online validation in worker processes
        "test_sampling.py",  # simulator samples on the real ls6 log, sharded workers
        "test_models.py",  # REINFORCE training runs
        "test_report.py",  # the whole HTML report with its plots
        "test_loadgen.py",  # open/closed-loop load against live local servers (timing)
        # Files whose tests start whole steps (`python -m faasm_tasks ...`), servers or an
        # Airflow database: the unit tier (`make test-fast`) runs none of them (see
        # _unit_tier_starts_no_steps below, which enforces it).
        "test_teardown_faults.py",  # the Faasm local target's processes killed at each stage
        "test_validity.py",  # deploy/run/collect of overloaded and interrupted points
        "test_trends.py",  # summarize/check steps over a written history
        "test_trends_dag.py",  # faasm_benchmarks under dag.test() (Airflow database)
        "test_billing_agent.py",  # billing agents and collect as processes
        "test_billing_daemonset_standin.py",  # the billing DaemonSet on the Kubernetes stand-in
        "test_billing_results.py",  # the host sampler as a process
        "test_results_catalog.py",  # reports made by the report step, S3 on moto
        "test_packaging.py",  # builds a wheel, runs the console scripts
    }
)
#: What a unit test may not start: a whole step (``python -m mirage_tasks|faasm_tasks``, the
#: console scripts), Airflow, or a service. Such a test belongs in the e2e tier.
STEP_COMMANDS = ("mirage_tasks", "faasm_tasks", "mirage-tasks", "faasm-tasks", "airflow", "redis-server", "moto_server")


def tier_of(path: Path) -> str:
    """The tier of a test file: ``lab`` under tests/lab/, ``e2e`` by name, ``dag`` under tests/dags/,
    else ``unit``."""
    if path.relative_to(REPO / "tests").parts[0] == "lab":
        return "lab"
    if path.stem.endswith("_e2e") or path.name in E2E_FILES:
        return "e2e"
    if "dags" in path.relative_to(REPO / "tests").parts[:-1]:
        return "dag"
    return "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(Path(str(item.fspath)))
        if not any(item.get_closest_marker(t) for t in TIERS):  # an explicit tier marker wins
            item.add_marker(getattr(pytest.mark, tier))
        # in the JUnit report (make test writes var/test-report.xml): devtools/suite_figures.py
        # sums the run per tier from it for docs/testing.md
        item.user_properties.append(("tier", next(t for t in TIERS if item.get_closest_marker(t))))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # side by side (make test): the long tiers first, the seconds-long unit tests last, so the
        # workers end together instead of one finishing a long run while the others idle (a stable
        # sort: each file keeps its order, and every worker collects the same order)
        rank = {"lab": 0, "e2e": 0, "dag": 1, "unit": 2}
        items.sort(key=lambda it: rank[next(t for t in TIERS if it.get_closest_marker(t))])
        if item.get_closest_marker("unit") and "airflow_db" in getattr(item, "fixturenames", ()):
            raise pytest.UsageError(f"{item.nodeid}: a unit test uses the Airflow database; mark it e2e or dag")


def starts_a_step(args) -> str | None:
    """The step, Airflow or service command that ``args`` (a Popen argv) would start, if any."""
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    for i, a in enumerate(argv):
        if os.path.basename(a) in STEP_COMMANDS:
            return os.path.basename(a)
        if a == "-m" and i + 1 < len(argv) and argv[i + 1].split(".")[0] in STEP_COMMANDS:
            return argv[i + 1]
    return None


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_steps(request, monkeypatch):
    """``make test-fast`` is the edit-test loop: a unit test that starts a whole step, Airflow or
    a service fails here, naming it (mark such a test ``e2e``)."""
    if request.node.get_closest_marker("unit") is None:
        return
    import subprocess

    popen_init = subprocess.Popen.__init__

    def guarded(self, args, *a, **k):
        what = starts_a_step(args)
        if what:
            pytest.fail(
                f"a unit test started {what!r} ({args!r}): whole steps, Airflow and services "
                "belong in the e2e tier (mark the test e2e or list its file in E2E_FILES)"
            )
        popen_init(self, args, *a, **k)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


def pytest_unconfigure(config):
    shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def airflow_db(airflow_home: Path) -> Path:
    """A fresh SQLite metadata database (``airflow db reset``), once per session."""
    from airflow.utils import db  # after AIRFLOW_HOME is set

    db.resetdb()
    return airflow_home / "airflow.db"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """``../shared/traces`` next to the repository (skips when absent)."""
    if not TRACES.is_dir():
        pytest.skip(f"real traces not available: {TRACES} is absent (tests on real traces only run there)")
    return TRACES


# --- the real traces beside the repository, for the Mirage tests (skip where absent) ---


def shared_trace_path(name: str) -> Path:
    """Path of a real trace in ../shared/traces, or skip the test with the reason."""
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"real trace {name} not found at {path} (../shared/traces beside the repository)")
    return path


@pytest.fixture(scope="session")
def shared_trace():
    """``shared_trace(name)``: path of a real trace, or skip with the reason."""
    return shared_trace_path


@pytest.fixture(scope="session")
def ls6_log() -> Path:
    return shared_trace_path("ls6-a100.log.gz")


@pytest.fixture(scope="session")
def ls6_parquet(ls6_log, tmp_path_factory) -> Path:
    """The whole ls6 log ingested once per session (US/Central local times)."""
    from mirage_tasks.__main__ import STEPS  # noqa: F401 - the CLI registry must import cleanly
    from stepkit.cli import main

    out = tmp_path_factory.mktemp("ls6")
    rc = main(
        "mirage_tasks",
        {"ingest": ("mirage_tasks.steps.ingest", "")},
        ["ingest", "--trace", str(ls6_log), "--timezone", "America/Chicago", "--out", str(out)],
    )
    assert rc == 0
    return out


def load_dag(dag_id: str):
    """The DAG ``dag_id``, parsed from ``dags/<dag_id>.py`` (an import error fails the test)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags[dag_id]


def task_states(dr) -> dict[str, str]:
    """``{task_id: state}`` of a finished ``dag.test()`` run (``dag.test()`` never raises)."""
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


@pytest.fixture
def local_storage(tmp_path, monkeypatch) -> Path:
    """The local runner with a throw-away storage root."""
    root = tmp_path / "storage"
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(root))
    return root


def fake_bundle(
    tmp_path: Path, monkeypatch, *, package: str, main_source: str, dags_source: str, bundle: str
) -> tuple[Path, Path, Path]:
    """A fake task package ``<tmp>/code/<package>`` (its ``__main__`` is ``main_source``) and a
    DAG bundle ``<tmp>/dags`` holding ``dags_source``, configured so ``dag.test()`` serializes
    it. Returns ``(code root, dags folder, output folder)``."""
    import json

    code = tmp_path / "code" / package
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "__main__.py").write_text(main_source)
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / f"{bundle.replace('-', '_')}.py").write_text(dags_source)
    out = tmp_path / "out"
    out.mkdir()
    config = {
        "name": bundle,
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(dags), "refresh_interval": 0},
    }
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([config]))
    return tmp_path / "code", dags, out


def bundle_dags(dags: Path) -> dict:
    """The DAGs of a bundle folder (an import error fails the test)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(dags))
    assert not bag.import_errors, bag.import_errors
    return bag.dags
