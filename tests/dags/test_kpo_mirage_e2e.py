"""``mirage_pipeline`` end to end through the real ``KubernetesPodOperator`` (``HOUSE_RUNNER=kubernetes``).

Every step is a pod created by the unmodified cncf provider on the Kubernetes API stand-in
(``tests/kubeapi``), which runs the container's ``python -m mirage_tasks ...`` as a local
process of the project's interpreter (images are not run). Storage is an S3 bucket on a moto
server; the storage Secret carries the credentials into the pods.

``dag.test()`` does not raise when a task fails: every test checks ``dr.state``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import DAGS, REPO
from kubeapi.fixtures import IMAGE_ENV
from kubeapi.server import KubeAPIServer

from mirage_tasks.sim.probes import BASELINES

pytestmark = [pytest.mark.timeout(900), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
#: The run's own outputs live under ``mirage_pipeline/<logical date>-<config key>``; the trace and
#: the day partitions of samples under the content-keyed ``mirage/`` (shared by runs).
RUN_GLOB = "mirage_pipeline/2026-11-29T120000Z-*"
NS = "mirage-e2e"
SECRET = "house-storage-credentials"
IMAGE = "registry.example.org/house/mirage-tasks:0.1.0"

#: The smallest whole run: two quick models (no torch), one node size, one shard.
TINY_RUN = {
    "train_count": 20,
    "interval_hours": 12,
    "val_count": 2,
    "node_sizes": [1],
    "shards": 1,
    "probes": 3,
    "models": ["xgboost", "random_forest"],
    "train_params": {"xgboost": ["n_estimators=10"], "random_forest": ["n_estimators=5"]},
}
MODELS = ("xgboost", "random_forest")


def mirage_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "mirage_pipeline.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mirage_pipeline"]


def states(dr) -> dict[str, str]:
    out: dict[str, str] = {}
    for ti in dr.get_task_instances():
        key = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
        out[key] = str(ti.state)
    return out


def start_cluster(tmp_path: Path, monkeypatch, secret: dict[str, str]) -> KubeAPIServer:
    """The stand-in with the namespace and the storage Secret; the house settings for kubernetes."""
    api = KubeAPIServer(workdir=REPO, base_env=IMAGE_ENV).start()
    path = api.write_kubeconfig(tmp_path / "kubeconfig.json")
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", api.connection_json(path))
    monkeypatch.setenv("HOUSE_RUNNER", "kubernetes")
    monkeypatch.setenv("HOUSE_NAMESPACE", NS)
    monkeypatch.setenv("HOUSE_STORAGE_SECRET", SECRET)
    monkeypatch.setenv("HOUSE_IMAGE_MIRAGE", IMAGE)
    api.create("", "v1", "namespaces", "", {"metadata": {"name": NS}})
    api.create("", "v1", "secrets", NS, {"metadata": {"name": SECRET}, "stringData": secret})
    return api


def assert_pods_and_cleanup(api: KubeAPIServer, dr) -> list[dict]:
    """One pod per step task instance that ran, each with the house spec; all deleted; nothing left."""
    st = states(dr)
    helpers = {k.split("[")[0] for k in st if k.startswith("plan.")}  # the folded plan group: no pods
    step_tis = sorted(k for k, v in st.items() if v == "success" and k.split("[")[0] not in helpers)
    pods = api.pods_created
    for pod in pods:
        labels = pod["metadata"]["labels"]
        assert labels["dag_id"] == "mirage_pipeline" and labels["house/package"] == "mirage_tasks"
        (c,) = pod["spec"]["containers"]
        assert c["image"] == IMAGE and c["command"] == ["python", "-m", "mirage_tasks"]
        assert {"secretRef": {"name": SECRET}} in c["envFrom"]
        assert pod["spec"]["activeDeadlineSeconds"] > 0 and pod["spec"]["restartPolicy"] == "Never"
    ran = sorted(
        f"{p['metadata']['labels']['task_id']}[{p['metadata']['labels']['map_index']}]"
        if "map_index" in p["metadata"]["labels"]
        else p["metadata"]["labels"]["task_id"]
        for p in pods
    )
    assert ran == step_tis, (ran, st)  # exactly one pod per step task instance, none for helpers
    assert not api.list("pods", NS)
    assert sorted(api.pods_deleted) == sorted(f"{NS}/{p['metadata']['name']}" for p in pods)
    assert api.objects_left() == [f"Namespace {NS}", f"Secret {NS}/{SECRET}"]
    return pods


def assert_run_outputs(keys: list[str], read_json, read_text, exists) -> None:
    """Markers, models, metrics and report of the tiny run, through the given readers
    (``keys``: every stored path, relative to the storage root)."""
    import fnmatch

    (run,) = {k.split("/")[0] + "/" + k.split("/")[1] for k in keys if fnmatch.fnmatch(k, RUN_GLOB + "/*")}
    traces = [k for k in keys if fnmatch.fnmatch(k, "mirage/traces/*/_SUCCESS.json")]
    assert len(traces) == 1 and read_json(traces[0])["step"] == "synth"
    assert any(fnmatch.fnmatch(k, "mirage/samples/node1-*/day=*/_SUCCESS.json") for k in keys)
    PREFIX = run
    manifest = read_json(f"{PREFIX}/datasets/node1/manifest.json")
    assert manifest["n_samples"] == TINY_RUN["train_count"]
    for model in MODELS:
        assert read_json(f"{PREFIX}/models/{model}/node1/_SUCCESS.json")["step"] == "train"
    assert exists(f"{PREFIX}/metrics/samples.parquet")
    html = read_text(f"{PREFIX}/report/report.html")
    assert "data:image/png;base64," in html


def test_mirage_pipeline_through_kpo_on_s3(tmp_path, monkeypatch, capfd):
    """The suite's one whole ``mirage_pipeline`` run through the KubernetesPodOperator, with
    ``HOUSE_STORAGE_ROOT=s3://...`` on moto (the local-folder storage is the local pipeline run's,
    tests/dags/test_mirage_pipeline_e2e.py): endpoint and keys reach the pods through the storage
    Secret, and every output, marker, metric and report lands in the bucket. The worker gets the
    same settings: its ``plan`` task fingerprints the trace and lists the committed day partitions
    (docs/deploy.md: the workers' storage access). The fan-out becomes one pod per model, node size
    and shard, labelled in the grid as the plan labels them."""
    from moto_s3 import list_keys, moto_s3, s3_client, storage_env

    bucket = "house-e2e"
    for key in [k for k in list(__import__("os").environ) if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", f"s3://{bucket}/house")
    with moto_s3(bucket) as url:
        for key, value in storage_env(url).items():  # the worker's own storage access (plan)
            monkeypatch.setenv(key, value)
        api = start_cluster(tmp_path, monkeypatch, storage_env(url))
        try:
            dr = mirage_dag().test(logical_date=LOGICAL_DATE, run_conf=TINY_RUN)
            st = states(dr)
            assert dr.state == "success", st
            assert "train_gpu" not in st and "policy_gpu" not in st  # no GPU nodes declared (HOUSE_GPUS)
            assert st["policy_cpu"] == "skipped"
            # pods too are labelled in the grid by the plan's label of their argv
            labels = sorted(ti.rendered_map_index for ti in dr.get_task_instances() if ti.task_id == "train_cpu")
            assert labels == ["random_forest · node 1", "xgboost · node 1"]
            pods = assert_pods_and_cleanup(api, dr)
        finally:
            api.stop()
        # the models x node sizes and models+baselines x shards fan-out became one pod each
        trains = [p for p in pods if p["metadata"]["labels"]["task_id"] == "train_cpu"]
        assert len(trains) == len(MODELS)
        validates = [p for p in pods if p["metadata"]["labels"]["task_id"] == "validate"]
        assert len(validates) == len(MODELS) + len(BASELINES)
        # the step's own log lines reached the task log
        captured = capfd.readouterr()
        assert "[base]" in captured.out + captured.err
        for pod in pods:  # every path a step was given is in the bucket, never a local path
            paths = [a for a in pod["spec"]["containers"][0]["args"] if "://" in a or a.startswith("/")]
            assert paths and all(a.startswith(f"s3://{bucket}/house/") for a in paths), paths
        keys = list_keys(url, bucket)
        inside = [k for k in keys if k.startswith(("house/mirage_pipeline/", "house/mirage/"))]
        assert inside == keys, set(keys) - set(inside)  # nothing outside the house's prefixes
        client = s3_client(url)

        def read(key: str) -> bytes:
            return client.get_object(Bucket=bucket, Key=f"house/{key}")["Body"].read()

        assert_run_outputs(
            [k.removeprefix("house/") for k in keys],
            lambda k: json.loads(read(k)),
            lambda k: read(k).decode(),
            lambda k: f"house/{k}" in keys,
        )
        # every step that ran committed its marker in the bucket
        markers = [k for k in keys if k.endswith("/_SUCCESS.json")]
        steps = {json.loads(read(k.removeprefix("house/")))["step"] for k in markers}
        assert {"synth", "sample", "merge", "train", "validate", "fidelity", "metrics", "report"} <= steps, steps
        assert len(markers) >= len(pods) - 1, (len(markers), len(pods))
        print(f"\nS3 run: {len(pods)} pods, {len(keys)} objects, {len(markers)} markers in s3://{bucket}/house/")
