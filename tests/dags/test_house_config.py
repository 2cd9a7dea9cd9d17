"""``house.config`` (settings and their sources) and the ``house.steps`` factory's checks."""

from __future__ import annotations

import sys
from datetime import timedelta

import pytest
from conftest import REPO

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def _fresh_variable_cache():
    from house.config import clear_variable_cache

    clear_variable_cache()
    yield
    clear_variable_cache()


@pytest.fixture
def clean_env(monkeypatch):
    """No HOUSE_* settings at all (conftest sets a temporary storage root)."""
    import os

    for key in [k for k in os.environ if k.startswith(("HOUSE_", "AIRFLOW_VAR_HOUSE_"))]:
        monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture
def variables(monkeypatch):
    """Stand-in for ``airflow.sdk.Variable.get``: a dict, and the keys looked up."""
    from airflow.sdk import Variable

    store: dict[str, str] = {}
    asked: list[str] = []

    def fake_get(key, default=None, **_):
        asked.append(key)
        return store.get(key, default)

    monkeypatch.setattr(Variable, "get", staticmethod(fake_get))
    return store, asked


def test_defaults(clean_env):
    from house.config import DEFAULT_IMAGES, get_config

    cfg = get_config()
    assert cfg.runner == "local"
    assert cfg.storage_root == str(REPO / "var" / "storage")
    assert cfg.code_root == str(REPO)
    assert cfg.python == sys.executable
    assert cfg.images == dict(DEFAULT_IMAGES)
    for package in DEFAULT_IMAGES:
        assert cfg.image_for(package)  # every default image is pinned
    assert cfg.namespace == "airflow"
    assert cfg.kube_conn_id == "kubernetes_default"
    assert cfg.storage_secret == "house-storage-credentials"
    assert cfg.gpu_pool == "gpu"
    assert cfg.gpu_node_selector == {"nvidia.com/gpu.present": "true"}
    # a form's inputs: the storage root and the traces shipped beside the checkout, nothing else
    assert cfg.input_roots() == [str(REPO / "var" / "storage"), str(REPO.parent / "shared" / "traces")]


def test_input_roots(clean_env):
    """HOUSE_INPUT_ROOTS adds to the storage root (always allowed); pods see no checkout, so the
    kubernetes runner allows only its storage root by default; a relative or '..' root is refused."""
    from house.config import ConfigError, get_config

    clean_env.setenv("HOUSE_STORAGE_ROOT", "/srv/house")
    clean_env.setenv("HOUSE_INPUT_ROOTS", "/data/traces, s3://bucket/traces")
    assert get_config().input_roots() == ["/srv/house", "/data/traces", "s3://bucket/traces"]
    clean_env.setenv("HOUSE_INPUT_ROOTS", "none")
    assert get_config().input_roots() == ["/srv/house"]
    clean_env.delenv("HOUSE_INPUT_ROOTS")
    clean_env.setenv("HOUSE_RUNNER", "kubernetes")
    clean_env.setenv("HOUSE_STORAGE_ROOT", "s3://bucket/house")
    assert get_config().input_roots() == ["s3://bucket/house"]
    for bad in ("traces", "/data/../etc"):
        clean_env.setenv("HOUSE_INPUT_ROOTS", bad)
        with pytest.raises(ConfigError, match="HOUSE_INPUT_ROOTS"):
            get_config()


def test_environment_overrides(clean_env):
    from house.config import get_config

    settings = {
        "HOUSE_RUNNER": "Kubernetes",
        "HOUSE_STORAGE_ROOT": "s3://bucket/house",
        "HOUSE_CODE_ROOT": "/opt/code",
        "HOUSE_PYTHON": "/usr/bin/python3",
        "HOUSE_IMAGE_MIRAGE": "reg/mirage:2.0",
        "HOUSE_NAMESPACE": "ns",
        "HOUSE_KUBE_CONN_ID": "k8s_prod",
        "HOUSE_STORAGE_SECRET": "s3-creds",
        "HOUSE_GPU_POOL": "a100",
        "HOUSE_GPU_NODE_SELECTOR": "gpu=a100, zone=z1",
        "HOUSE_IMAGE_EXTRA": "reg/extra:1",
    }
    for key, value in settings.items():
        clean_env.setenv(key, value)
    cfg = get_config()
    assert cfg.runner == "kubernetes"
    assert cfg.storage_root == "s3://bucket/house"
    assert cfg.code_root == "/opt/code"
    assert cfg.python == "/usr/bin/python3"
    assert cfg.image_for("mirage_tasks") == "reg/mirage:2.0"
    assert cfg.image_for("extra_tasks") == "reg/extra:1"
    assert cfg.namespace == "ns"
    assert cfg.kube_conn_id == "k8s_prod"
    assert cfg.storage_secret == "s3-creds"
    assert cfg.gpu_pool == "a100"
    assert cfg.gpu_node_selector == {"gpu": "a100", "zone": "z1"}


def test_airflow_variables_apply_when_env_unset(clean_env, variables):
    from house.config import get_config

    store, asked = variables
    store.update({"house_namespace": "from-variable", "house_runner": "kubernetes"})
    clean_env.setenv("HOUSE_RUNNER", "local")  # the environment wins over the Variable
    clean_env.setenv("AIRFLOW_VAR_HOUSE_GPU_POOL", "env-var-pool")  # Airflow's env-var Variables
    cfg = get_config()
    assert cfg.runner == "local"
    assert cfg.namespace == "from-variable"
    assert cfg.gpu_pool == "env-var-pool"
    assert "house_runner" not in asked and "house_gpu_pool" not in asked


def test_variable_lookups_are_reused(clean_env, variables):
    from airflow.sdk import DAG

    from house import step
    from house.config import get_config

    store, asked = variables
    store["house_namespace"] = "ns1"
    with DAG("house_cache", schedule=None):
        for i in range(5):
            step(f"s{i}", package="mirage_tasks", argv=["x"])
    assert asked.count("house_namespace") == 1
    assert get_config().namespace == "ns1"


def test_no_variable_lookups_when_everything_is_set(clean_env, variables):
    from house.config import get_config

    clean_env.setenv("HOUSE_NO_VARIABLES", "1")
    get_config()
    assert variables[1] == []


def _broken_variables(monkeypatch):
    from airflow.sdk import Variable

    def broken(*_, **__):
        raise RuntimeError("no metadata database")

    monkeypatch.setattr(Variable, "get", staticmethod(broken))


def test_runner_from_a_variable_alone(clean_env, variables):
    """HOUSE_RUNNER unset, the Variable house_runner set: the factory builds pods."""
    from airflow.sdk import DAG

    from house import steps_for
    from house.config import get_config
    from house.pod import HousePodOperator

    store, asked = variables
    store.update({"house_runner": "kubernetes", "house_storage_root": "s3://bucket/house"})
    assert get_config().runner == "kubernetes"
    step, _ = steps_for("faasm_tasks")
    with DAG("house_variable_runner", schedule=None):
        op = step("s", argv=["x"])
    assert isinstance(op, HousePodOperator) and op.package == "faasm_tasks"
    assert "house_runner" in asked


def test_unreadable_runner_variable_is_an_error_not_local(clean_env, monkeypatch):
    """The Variable lookup fails and HOUSE_RUNNER is unset: never a silent local runner."""
    from house.config import ConfigError, get_config

    _broken_variables(monkeypatch)
    with pytest.raises(
        ConfigError,
        match=r"HOUSE_RUNNER is not set and Airflow Variable house_runner could not "
        r"be read \(RuntimeError: no metadata database\); refusing",
    ):
        get_config()


def test_unreadable_runner_variable_fails_the_dag_parse(clean_env, monkeypatch, tmp_path):
    """A DAG file declaring a step then fails to import, with the reason in the import error."""
    from airflow.dag_processing.dagbag import DagBag

    _broken_variables(monkeypatch)
    dag_file = tmp_path / "uses_factory.py"
    dag_file.write_text(
        "from datetime import datetime\n"
        "from airflow.sdk import DAG\n"
        "from house import steps_for\n"
        "step, _ = steps_for('faasm_tasks')\n"
        "with DAG('uses_factory', schedule=None, start_date=datetime(2026, 1, 1)):\n"
        "    step('s', argv=['x'])\n"
    )
    bag = DagBag(dag_folder=str(dag_file))
    assert not bag.dags
    (error,) = bag.import_errors.values()
    assert "refusing to fall back to the local runner" in error


def test_unreadable_variables_with_runner_in_env_use_defaults_loudly(clean_env, monkeypatch, caplog):
    from house.config import get_config

    _broken_variables(monkeypatch)
    clean_env.setenv("HOUSE_RUNNER", "local")
    with caplog.at_level("WARNING", logger="house.config"):
        cfg = get_config()
    assert cfg.runner == "local" and cfg.namespace == "airflow"
    assert "house_namespace could not be read" in caplog.text


def test_no_variables_switch_uses_defaults_without_lookups(clean_env, monkeypatch):
    from house.config import get_config

    _broken_variables(monkeypatch)
    clean_env.setenv("HOUSE_NO_VARIABLES", "1")
    assert get_config().runner == "local"


def test_factory_has_no_default_package():
    import inspect

    from house import steps
    from house.steps import step, step_partial, step_spec, steps_for

    for fn in (step, step_partial, step_spec):
        param = inspect.signature(fn).parameters["package"]
        assert param.default is inspect.Parameter.empty, f"{fn.__name__}: package defaults to {param.default!r}"
    with pytest.raises(TypeError, match="package"):
        steps.step("x", argv=["y"])
    with pytest.raises(ValueError, match="package name"):
        steps_for("not a package")


def test_steps_for_binds_the_package(clean_env):
    from airflow.sdk import DAG

    from house import steps_for

    step, step_partial = steps_for("faasm_tasks")
    with DAG("house_bound", schedule=None):
        op = step("a", argv=["deploy"])
        mapped = step_partial("m").expand(argv=[["a"]])
    assert op.package == "faasm_tasks" and op.command()[1:3] == ["-m", "faasm_tasks"]
    assert mapped.partial_kwargs["package"] == "faasm_tasks"


def test_storage_prefix(clean_env):
    from house import storage_prefix
    from house.config import ConfigError

    clean_env.setenv("HOUSE_STORAGE_ROOT", "s3://bucket/house/")
    assert storage_prefix("faasm_benchmarks") == "s3://bucket/house/faasm_benchmarks"
    assert (
        storage_prefix("mirage_pipeline", "2023-03-01T000000Z")
        == "s3://bucket/house/mirage_pipeline/2023-03-01T000000Z"
    )
    for bad in ("", "..", "/"):
        with pytest.raises(ConfigError, match="bad path part"):
            storage_prefix("mirage_pipeline", bad)


def test_both_dags_resolve_storage_through_storage_prefix():
    """Neither DAG file builds its prefix from the storage root by hand."""
    from conftest import DAGS

    for name in ("mirage_pipeline.py", "faasm_benchmarks.py"):
        text = (DAGS / name).read_text()
        assert "storage_root" not in text, f"{name} reads the storage root itself"
        assert "storage_prefix" in text, f"{name} does not use house.storage_prefix"
        assert 'package="' not in text, f"{name} repeats package=: bind it once with steps_for"


def test_invalid_settings(clean_env):
    from house.config import ConfigError, get_config

    clean_env.setenv("HOUSE_RUNNER", "docker")
    with pytest.raises(ConfigError, match="HOUSE_RUNNER"):
        get_config()
    clean_env.setenv("HOUSE_RUNNER", "kubernetes")
    with pytest.raises(ConfigError, match="HOUSE_STORAGE_ROOT"):
        get_config()  # pods cannot write to the worker's disk
    clean_env.setenv("HOUSE_STORAGE_ROOT", "s3://b/x")
    clean_env.setenv("HOUSE_GPU_NODE_SELECTOR", "nonsense")
    with pytest.raises(ConfigError, match="HOUSE_GPU_NODE_SELECTOR"):
        get_config()


def test_unknown_package_needs_an_image(clean_env):
    from house.config import ConfigError, get_config, image_env_var

    assert image_env_var("mirage_tasks") == "HOUSE_IMAGE_MIRAGE"
    assert image_env_var("faasm_tasks") == "HOUSE_IMAGE_FAASM"
    with pytest.raises(ConfigError, match="HOUSE_IMAGE_OTHER"):
        get_config().image_for("other_tasks")


def test_factory_rejects_bad_declarations():
    from airflow.sdk import DAG

    from house import step

    with DAG("house_bad", schedule=None):
        with pytest.raises(ValueError, match="preset"):
            step("a", package="faasm_tasks", argv=["x"], preset="huge")
        with pytest.raises(ValueError, match="timeout"):
            step("b", package="faasm_tasks", argv=["x"], timeout=timedelta(0))
        with pytest.raises(TypeError, match="execution_timeout"):
            step("c", package="faasm_tasks", argv=["x"], execution_timeout=timedelta(minutes=1))


def test_factory_local_mode(clean_env):
    from airflow.sdk import DAG

    from house import default_args, step, step_partial
    from house.local import LocalStepOperator

    with DAG("house_local", schedule=None, default_args=default_args(owner="me")):
        op = step(
            "a",
            package="mirage_tasks",
            argv=["ingest"],
            preset="gpu",
            timeout=timedelta(minutes=3),
            pod_overrides={"node_selector": {"x": "y"}},
        )  # ignored locally
        mapped = step_partial("m", package="mirage_tasks", timeout=timedelta(minutes=4)).expand(argv=[["a"], ["b"]])
    assert isinstance(op, LocalStepOperator)
    assert op.execution_timeout == timedelta(minutes=3)
    assert op.owner == "me" and op.retries >= 1
    assert op.pool != "gpu"  # pools are a cluster concern; a local run needs no pool set up
    assert mapped.operator_class is LocalStepOperator
    assert mapped.partial_kwargs["execution_timeout"] == timedelta(minutes=4)


def test_describe_runs_without_airflow_context(clean_env):
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-m", "house.config"],
        cwd=REPO / "plugins",
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOUSE_NO_VARIABLES": "1"},
    )
    cfg = json.loads(out.stdout)
    assert cfg["runner"] == "local" and cfg["storage_root"].endswith("var/storage")
    # the deadline intervals print as seconds (a timedelta is no JSON)
    assert cfg["deadlines"] == {"faasm_benchmarks": 72000.0, "mirage_service": 259200.0}
