"""faasm_benchmarks on the kubernetes runner: the step pods run under the benchmark
ServiceAccount, the target defaults to the cluster, and the billing sampler, release,
replica and sweep choices reach every step's argv (rendered without a cluster)."""

from __future__ import annotations

import pytest
from test_pod_specs import IMAGES, RUN_ID, SECRET, kube_env, render_pod  # noqa: F401 - kube_env is a fixture

pytestmark = pytest.mark.timeout(120)


def _faasm_dag():
    from airflow.dag_processing.dagbag import DagBag
    from conftest import DAGS

    bag = DagBag(dag_folder=str(DAGS / "faasm_benchmarks.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["faasm_benchmarks"]


def test_faasm_pods_run_as_the_benchmark_service_account(kube_env):
    from house.pod import HousePodOperator

    dag = _faasm_dag()
    assert dag.params["target"] == "knative"  # the default follows HOUSE_RUNNER=kubernetes
    assert dag.params["release"] == "0.1.3" and dag.params["replicas"] == "per-point"
    pods = [op for op in dag.tasks if isinstance(op, HousePodOperator)]
    assert pods
    for op in pods:
        manifest = render_pod(op)
        assert manifest["spec"]["serviceAccountName"] == "faasm-benchmark", op.task_id
        args = manifest["spec"]["containers"][0]["args"]
        assert args[args.index("--billing-image") + 1] == IMAGES["faasm_tasks"]
        assert args[args.index("--billing-secret") + 1] == SECRET
        assert args[args.index("--release") + 1] == "0.1.3"
        if op.task_id.endswith((".deploy", ".run")):
            assert args[args.index("--replicas") + 1] == "per-point", op.task_id
            assert ("--sweep-variant" in args) == op.task_id.startswith("tf_inference_throughput"), op.task_id


def test_target_default_is_local_on_the_local_runner(monkeypatch):
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    dag = _faasm_dag()
    assert dag.params["target"] == "local"
    assert not any("--billing-image" in (getattr(op, "argv", None) or []) for op in dag.tasks)
