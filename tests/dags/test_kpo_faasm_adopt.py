"""A Faasm ``deploy`` try killed mid-run on the kubernetes runner; its retry adopts the Knative
Services the killed try announced, and ``teardown`` deletes every Service of either try.

The real ``HousePodOperator`` (the unmodified provider) runs ``python -m faasm_tasks deploy
--target knative`` in pods of the Kubernetes API stand-in (``tests/kubeapi``), against the stand-in
itself (the official ``kubernetes`` client in the pod). The first try announces ``faasm-worker``
and creates it, then announces ``faasm-python`` and is SIGKILLed before creating it
(``FAASM_TASKS_FAULT=ksvc:2``, which the test adds to try 1's pod only); the operator has kept both names in the
task's state store. The retry's pod gets ``--adopt-services faasm-worker,faasm-python``: it
replaces ``faasm-worker`` in place (one create in all) and creates the missing one. ``teardown``
(a separate task: it lists the Services by their label) leaves nothing behind.

The images behave as in tests/dags/test_kpo_faasm_e2e.py (Redis, the upload server, the Faasm
worker: local processes); the native function's image has no stand-in behaviour, so its Service
gets no pods. This is the adoption's path, not the Faasm deployment's (that test's subject).
"""

from __future__ import annotations

import json
import shutil
import textwrap
from datetime import UTC, datetime

import pytest
from conftest import REPO, bundle_dags, task_states
from kubeapi.fixtures import IMAGE_ENV
from kubeapi.server import KubeAPIServer
from test_kpo_faasm_e2e import image_table

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STEP_NS, FAASM_NS = "airflow", "faasm"
SECRET = "house-storage-credentials"
KSVCS = f"/apis/serving.knative.dev/v1/namespaces/{FAASM_NS}/services"

DAGS = textwrap.dedent("""
    import os
    from datetime import timedelta
    from airflow.sdk import DAG
    from house import default_args, steps_for

    step, _ = steps_for("faasm_tasks")
    COMMON = ["--target", "knative", "--namespace", "faasm", "--run-id", "{{ run_id }}",
              "--results", os.environ["HOUSE_STORAGE_ROOT"], "--experiment", "matrix_multiplication"]

    with DAG("faasm_adopt", schedule=None, default_args=default_args(retries=1, retry_delay=timedelta(seconds=1)),
             tags=["pipeline"]):
        deploy = step("deploy", argv=["deploy", *COMMON, "--system", "native", "--replicas", "fixed"],
                      adopt_flag="--adopt-services", timeout=timedelta(minutes=3))
        teardown = step("teardown", argv=["teardown", *COMMON, "--full", "--timeout", "30"],
                        trigger_rule="all_done", retries=0, timeout=timedelta(minutes=3))
        deploy >> teardown
""")


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make system-deps)")
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "faasm_adopt.py").write_text(DAGS)
    config = {
        "name": "faasm-adopt",
        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
        "kwargs": {"path": str(dags), "refresh_interval": 0},
    }
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([config]))
    storage = tmp_path / "storage"
    for key, value in {
        "HOUSE_RUNNER": "kubernetes",
        "HOUSE_NAMESPACE": STEP_NS,
        "HOUSE_STORAGE_SECRET": SECRET,
        "HOUSE_IMAGE_FAASM": "registry.example.org/house/faasm-tasks:0.1.0",
        "HOUSE_STORAGE_ROOT": str(storage),
    }.items():
        monkeypatch.setenv(key, value)
    with KubeAPIServer(
        workdir=REPO, base_env=dict(IMAGE_ENV), images=image_table()
    ) as api:  # cwd: this checkout's code
        path = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        api.base_env["KUBECONFIG"] = str(path)  # the step pods reach the same stand-in
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", api.connection_json(path))
        for ns in (STEP_NS, FAASM_NS, "knative-serving"):
            api.create("", "v1", "namespaces", "", {"metadata": {"name": ns}})
        autoscaler = {"metadata": {"name": "config-autoscaler"}, "data": {"stable-window": "60s"}}
        api.create("", "v1", "configmaps", "knative-serving", autoscaler)  # Knative's, patched by deploy
        api.create("", "v1", "secrets", STEP_NS, {"metadata": {"name": SECRET}, "stringData": {"UNUSED": "1"}})
        api.platform = api.objects_left()
        yield api, bundle_dags(dags)["faasm_adopt"], storage


def _kept_ids() -> list[str] | None:
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session

    from house.external import EXTERNAL_IDS_KEY

    with create_session() as session:
        row = session.query(TaskStateStoreModel).filter_by(task_id="deploy", key=EXTERNAL_IDS_KEY).one_or_none()
        return None if row is None else json.loads(row.value)


@pytest.fixture
def first_deploy_killed(monkeypatch):
    """``FAASM_TASKS_FAULT=ksvc:2`` in the pod of the deploy's first try (an env template would be
    rendered once only: ``dag.test()`` runs every try on the same operator's nested objects)."""
    from kubernetes.client import models as k8s

    from house.pod import HousePodOperator

    build = HousePodOperator.build_pod_request_obj

    def with_fault(self, context=None, *, dry_run=False):
        pod = build(self, context, dry_run=dry_run)
        if self.task_id == "deploy" and context is not None and context["ti"].try_number == 1:
            container = pod.spec.containers[0]
            container.env = [*(container.env or []), k8s.V1EnvVar(name="FAASM_TASKS_FAULT", value="ksvc:2")]
        return pod

    monkeypatch.setattr(HousePodOperator, "build_pod_request_obj", with_fault)


def test_a_killed_deploy_is_retried_adopting_its_knative_services(cluster, first_deploy_killed):
    api, dag, storage = cluster
    dr = dag.test(logical_date=LOGICAL_DATE)
    st = task_states(dr)
    assert st == {"deploy": "success", "teardown": "success"}, st
    assert {ti.task_id: ti.try_number for ti in dr.get_task_instances()}["deploy"] == 2

    first, second, teardown = (p for p in api.pods_created if p["metadata"]["namespace"] == STEP_NS)
    assert [p["metadata"]["labels"]["task_id"] for p in (first, second, teardown)] == ["deploy", "deploy", "teardown"]
    assert "--adopt-services" not in first["spec"]["containers"][0]["args"]
    assert {"name": "FAASM_TASKS_FAULT", "value": "ksvc:2"} in first["spec"]["containers"][0]["env"]
    assert "FAASM_TASKS_FAULT" not in {e["name"] for e in second["spec"]["containers"][0]["env"]}
    assert second["spec"]["containers"][0]["args"][-2:] == ["--adopt-services", "faasm-worker,faasm-python"]
    assert _kept_ids() == ["faasm-worker", "faasm-python"]

    # faasm-worker: created by the killed try; the retry's create met it (409) and replaced it in
    # place; faasm-python: created once, by the retry
    creates = [p for m, p in api.requests if m == "POST" and p == KSVCS]
    replaces = [p for m, p in api.requests if m == "PUT" and p.startswith(KSVCS + "/")]
    assert len(creates) == 3 and replaces == [f"{KSVCS}/faasm-worker"], (creates, replaces)
    (report,) = [json.loads(p.read_text()) for p in storage.rglob("_ops/deploy-*.json")]  # the killed try wrote none
    actions = {r["name"]: r["action"] for r in report["report"]["resources"] if r["kind"] == "Service"}
    assert actions["faasm-worker"] == "adopted" and actions["faasm-python"] == "created (adopted, was gone)", actions

    # teardown: every Service of either try deleted, every pod gone, only the platform's objects left
    assert f"DELETE {KSVCS}/faasm-worker" in {f"{m} {p}" for m, p in api.requests}
    assert f"DELETE {KSVCS}/faasm-python" in {f"{m} {p}" for m, p in api.requests}
    assert not api.list("services", FAASM_NS, group="serving.knative.dev")
    assert not api.list("pods")
    assert api.objects_left() == api.platform, sorted(set(api.objects_left()) ^ set(api.platform))
