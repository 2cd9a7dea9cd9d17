"""Pod specs in kubernetes mode, rendered without a cluster and validated against the schema.

Every step of every DAG in ``dags/`` is rendered with ``build_pod_request_obj(dry_run=True)``,
plus a synthetic DAG that declares one step per preset and a mapped step, so the GPU
preset is covered before a real DAG uses it.
"""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)

K8S_VERSION = "1.35"  # oldest Kubernetes the provider supports that kubernetes-validate bundles
IMAGE = "registry.example.org/house/mirage-tasks:1.2.3"
IMAGES = {"mirage_tasks": IMAGE, "faasm_tasks": "registry.example.org/house/faasm-tasks:1.2.3"}
SECRET = "house-test-storage"
RUN_ID = "manual__2026-11-29T12:00:00+00:00"


@pytest.fixture
def kube_env(monkeypatch):
    monkeypatch.setenv("HOUSE_RUNNER", "kubernetes")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", "s3://house-test/storage")
    monkeypatch.setenv("HOUSE_IMAGE_MIRAGE", IMAGE)
    monkeypatch.setenv("HOUSE_IMAGE_FAASM", IMAGES["faasm_tasks"])
    monkeypatch.setenv("HOUSE_NAMESPACE", "house-test")
    monkeypatch.setenv("HOUSE_STORAGE_SECRET", SECRET)


class _TI:
    """Just enough of a task instance for template rendering and pod labels."""

    def __init__(self, op, xcoms: dict[tuple[str, str], Any], map_index: int = -1):
        self.dag_id = op.dag_id
        self.task_id = op.task_id
        self.run_id = RUN_ID
        self.map_index = map_index
        self.try_number = 1
        self._xcoms = xcoms

    def xcom_pull(self, task_ids=None, key="return_value", default=None, map_indexes=None, **_):
        return self._xcoms.get((task_ids, key), default)


def render_pod(op, xcoms: dict[tuple[str, str], Any] | None = None, map_index: int = -1) -> dict:
    """Render ``op``'s templates and pod; return the camelCase manifest."""
    from kubernetes.client import ApiClient

    ti = _TI(op, xcoms or {}, map_index)
    context = {
        "dag": op.dag,
        "task": op,
        "ti": ti,
        "task_instance": ti,
        "run_id": RUN_ID,
        "ds": "2026-11-29",
        "ds_nodash": "20261129",
        "params": dict(op.dag.params) if op.dag else {},
        # a partitioned DAG's steps (mirage_monthly's gate) name the run's month
        "dag_run": SimpleNamespace(run_id=RUN_ID, partition_key="2026-10", conf={}),
    }
    op.render_template_fields(context)
    pod = op.build_pod_request_obj(context, dry_run=True)
    return ApiClient().sanitize_for_serialization(pod)


def assert_house_pod(manifest: dict, *, preset: str, timeout: timedelta, package: str = "mirage_tasks") -> None:
    import kubernetes_validate

    from house import config as house_config

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
    spec = manifest["spec"]
    (container,) = spec["containers"]  # no XCom sidecar
    image = IMAGES[package]
    assert container["image"] == image
    assert ":" in image.rsplit("/", 1)[1] and not image.endswith(":latest")
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["command"] == ["python", "-m", package]
    assert all(isinstance(a, str) for a in container["args"])
    # storage credentials: only a reference to the Secret, never a value
    assert {"secretRef": {"name": SECRET}} in container["envFrom"]
    assert not any("AWS" in e["name"] or "SECRET" in e["name"] for e in container.get("env", []))
    # resources per preset
    expected = house_config.PRESETS[preset]
    res = container["resources"]
    for key, value in expected.requests.items():
        assert res["requests"][key] == value
    for key, value in expected.limits.items():
        assert res["limits"][key] == value
    gpu = "nvidia.com/gpu"
    if preset == "gpu":
        assert res["limits"][gpu] == "1"
        assert {"key": gpu, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    else:
        assert gpu not in res.get("limits", {}) and gpu not in res.get("requests", {})
        assert not spec.get("tolerations")
        assert not spec.get("nodeSelector")
    # lifecycle
    assert spec["activeDeadlineSeconds"] == int(timeout.total_seconds()) + house_config.ACTIVE_DEADLINE_MARGIN_SECONDS
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"] == {"runAsNonRoot": True}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    assert manifest["metadata"]["namespace"] == "house-test"
    labels = manifest["metadata"]["labels"]
    assert labels["app.kubernetes.io/part-of"] == "house"
    assert labels["house/package"] == package
    assert labels["house/preset"] == preset
    assert labels["dag_id"] and labels["task_id"] and labels["try_number"] == "1"


def assert_house_operator(op, *, preset: str, timeout: timedelta) -> None:
    from house.pod import HousePodOperator

    assert isinstance(op, HousePodOperator)
    assert op.on_finish_action.value == "delete_pod"
    assert op.do_xcom_push is False
    assert op.execution_timeout == timeout
    assert op.log_events_on_failure is True
    assert op.startup_timeout_seconds >= 300
    if preset == "gpu":
        assert op.pool == "gpu"
    else:
        assert op.pool != "gpu"


def test_dag_pods(kube_env):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.mappedoperator import MappedOperator
    from conftest import DAGS

    from house.pod import HousePodOperator

    bag = DagBag(dag_folder=str(DAGS))
    assert not bag.import_errors, bag.import_errors
    rendered = faasm_results = 0
    for dag in bag.dags.values():
        for op in dag.tasks:
            if isinstance(op, MappedOperator):
                if op.operator_class is not HousePodOperator:
                    continue
                op = op.unmap({"argv": ["step", "--out", "s3://house-test/storage/x"]})
            if not isinstance(op, HousePodOperator):
                continue
            # argv comes from an upstream @task: feed a representative value through XCom
            xcoms = {
                (up, key): ["step", "--out", "s3://house-test/storage/x"]
                for up in op.upstream_task_ids
                for key in (
                    "return_value",
                    "trace_argv",
                    "fidelity",
                    "metrics",
                    "report",
                    "ingest",
                    "calibrate",
                    "waitpred",
                )
            }  # mirage_evaluation's plan keys
            manifest = render_pod(op, xcoms)
            assert_house_operator(op, preset=op.preset, timeout=op.execution_timeout)
            assert_house_pod(manifest, preset=op.preset, timeout=op.execution_timeout, package=op.package)
            args = manifest["spec"]["containers"][0]["args"]
            if "--results" in args:  # faasm steps: the prefix comes from house.storage_prefix at run time
                assert args[args.index("--results") + 1] == f"s3://house-test/storage/{dag.dag_id}", args
                faasm_results += 1
            rendered += 1
    assert rendered >= 1 and faasm_results >= 1


def test_synthetic_presets(kube_env):
    """One step per preset, a templated argv and a mapped step, in kubernetes mode."""
    from airflow.sdk import DAG

    from house import step, step_partial

    timeouts = {"cpu-small": timedelta(minutes=5), "cpu-large": timedelta(hours=2), "gpu": timedelta(hours=6)}
    with DAG("house_presets", schedule=None) as dag:
        ops = {
            p: step(
                f"s_{p.replace('-', '_')}", package="mirage_tasks", argv=["x", "--day", "{{ ds }}"], preset=p, timeout=t
            )
            for p, t in timeouts.items()
        }
        mapped = step_partial("mapped_gpu", package="mirage_tasks", preset="gpu", timeout=timedelta(hours=1)).expand(
            argv=[["train", "--shard", "0"], ["train", "--shard", "1"]]
        )
    for preset, op in ops.items():
        manifest = render_pod(op)
        assert manifest["spec"]["containers"][0]["args"] == ["x", "--day", "2026-11-29"]
        assert_house_operator(op, preset=preset, timeout=timeouts[preset])
        assert_house_pod(manifest, preset=preset, timeout=timeouts[preset])

    assert mapped.pool == "gpu" and mapped.execution_timeout == timedelta(hours=1)
    for index, argv in enumerate([["train", "--shard", "0"], ["train", "--shard", "1"]]):
        op = dag.get_task("mapped_gpu").unmap({"argv": argv})
        manifest = render_pod(op, map_index=index)
        assert manifest["spec"]["containers"][0]["args"] == argv
        assert manifest["metadata"]["labels"]["map_index"] == str(index)
        assert_house_operator(op, preset="gpu", timeout=timedelta(hours=1))
        assert_house_pod(manifest, preset="gpu", timeout=timedelta(hours=1))


def test_labelled_mapped_pods(kube_env):
    """A step mapped over ``mapped_items`` (argv + label): each pod runs its argv, its label is the given one."""
    from airflow.sdk import DAG

    from house import MAP_LABEL, mapped_items, step_partial

    items = mapped_items(
        [["train", "--model", "xgboost"], ["train", "--model", "moe"]], ["xgboost · node 8", "moe · node 8"]
    )
    with DAG("house_labelled", schedule=None) as dag:
        step_partial(
            "labelled",
            package="mirage_tasks",
            preset="cpu-large",
            timeout=timedelta(hours=1),
            map_index_template=MAP_LABEL,
        ).expand_kwargs(items)
    for index, item in enumerate(items):
        op = dag.get_task("labelled").unmap(item)
        manifest = render_pod(op, map_index=index)
        assert manifest["spec"]["containers"][0]["args"] == item["argv"]
        assert dag.get_template_env().from_string(MAP_LABEL).render(task=op) == item["map_label"]
        assert_house_pod(manifest, preset="cpu-large", timeout=timedelta(hours=1))


def test_env_and_overrides(kube_env):
    from airflow.sdk import DAG

    from house import step

    with DAG("house_overrides", schedule=None):
        op = step(
            "s",
            package="mirage_tasks",
            argv=["x"],
            env={"MODE": "fast"},
            retries=5,
            pod_overrides={"annotations": {"team": "mirage"}},
        )
    manifest = render_pod(op)
    env = manifest["spec"]["containers"][0]["env"]
    assert {"name": "MODE", "value": "fast"} in env
    assert {"name": "PYTHONUNBUFFERED", "value": "1"} in env
    assert manifest["metadata"]["annotations"]["team"] == "mirage"
    assert op.retries == 5


@pytest.mark.parametrize("image", ["repo/mirage-tasks", "repo/mirage-tasks:latest", "host:5000/mirage-tasks"])
def test_unpinned_image_rejected(kube_env, monkeypatch, image):
    from airflow.sdk import DAG

    from house import ConfigError, step

    monkeypatch.setenv("HOUSE_IMAGE_MIRAGE", image)
    with DAG("house_bad_image", schedule=None), pytest.raises(ConfigError, match="pin"):
        step("s", package="mirage_tasks", argv=["x"])


def test_pinned_forms_accepted():
    from house.config import check_pinned

    for image in ("host:5000/repo/img:1.0", "img@sha256:" + "a" * 64, "ghcr.io/o/img:2026.11.29"):
        assert check_pinned(image) == image


def test_manifest_validation_catches_errors(kube_env):
    """The schema check is real: a bad field is rejected."""
    import kubernetes_validate
    from airflow.sdk import DAG

    from house import step

    with DAG("house_schema", schedule=None):
        op = step("s", package="faasm_tasks", argv=["x"])
    manifest = render_pod(op)
    manifest["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
