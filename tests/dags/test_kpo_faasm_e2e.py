"""``faasm_benchmarks`` end to end through the real ``KubernetesPodOperator`` (``HOUSE_RUNNER=kubernetes``,
``target=knative``) on the Kubernetes API stand-in (``tests/kubeapi``).

Every step is a pod created by the unmodified cncf provider, running ``python -m faasm_tasks ...``
as a local process under the ``faasm-benchmark`` ServiceAccount (whose RBAC is applied, and every
request the steps sent is checked against it). The steps deploy the 2020 Faasm layout into the
platform's ``faasm`` namespace with the official ``kubernetes`` client; the stand-in gives its
images local behaviour (the test's image table):

* ``faasm/redis`` -> a ``redis-server`` on a free 127.0.0.1 port (one for the queue, one for state);
* ``faasm/upload`` -> the package's upload server (``faasm_tasks.local_server upload``);
* ``faasm/knative-worker`` -> the package's worker (``faasm_tasks.local_server worker``), in the
  pods the stand-in creates for the Knative Service's revision (``minScale`` of them);

with the Redis hosts taken from the pods' ``REDIS_QUEUE_HOST``/``REDIS_STATE_HOST`` as Faasm does.
Invocations go through the stand-in's Host-routing ingress (the ``istio-ingressgateway``
LoadBalancer Service the test creates, as the platform's Istio has it); the steps reach Redis and
the upload server at their Services' EndpointSlices, never by ``pods/exec``. Data (the Python
function, the matrix archive) comes from S3 on a moto server; results go to the same moto
server (``HOUSE_STORAGE_ROOT=s3://...``, credentials through the storage Secret) in the
successful run and to a local folder in the failing one.

What this does not show (only a real cluster can): images, real Faasm/WebAssembly, Knative's
autoscaler and activator, Istio, cluster DNS and networking, the kubelet (probes, limits, node
placement), RBAC enforcement (checked here by rule evaluation, not by an authorizer).
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from conftest import REPO, load_dag, task_states
from kubeapi.fixtures import IMAGE_ENV
from kubeapi.rbac import access_of
from kubeapi.server import KubeAPIServer

pytestmark = [pytest.mark.timeout(400), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
STEP_NS, FAASM_NS = "airflow", "faasm"
SECRET = "house-storage-credentials"
IMAGE = "registry.example.org/house/faasm-tasks:0.1.0"
EXPERIMENT, SYSTEM = "matrix_multiplication", "wasm"
GROUP = f"{EXPERIMENT}__{SYSTEM}"
# target: the default, knative; one trial of the one point: this test owns the pods' path, the
# measurement design (repeats, the A/A arms) is the local runs' (tests/faasm/test_aa_control_e2e.py)
CONF = {"experiments": [EXPERIMENT], "systems": [SYSTEM], "repeats": 1, "aa_control": False}
STEPS = ("deploy", "wait_ready", "upload_data", "run", "collect", "teardown", "verify_clean")
DATA_BUCKET = "faasm-data"
RESULTS_BUCKET = "house-e2e"


class Stored:
    """The files under the storage root, relative to it, on a local folder or in the bucket."""

    def __init__(self, root: str, s3_url: str | None):
        self.root, self.s3_url = root, s3_url

    def keys(self) -> list[str]:
        if self.s3_url is None:
            base = Path(self.root)
            return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file())
        from moto_s3 import list_keys

        prefix = self.root.removeprefix(f"s3://{RESULTS_BUCKET}/") + "/"
        return [k.removeprefix(prefix) for k in list_keys(self.s3_url, RESULTS_BUCKET, prefix)]

    def read(self, key: str) -> bytes:
        if self.s3_url is None:
            return (Path(self.root) / key).read_bytes()
        from moto_s3 import s3_client

        full = self.root.removeprefix(f"s3://{RESULTS_BUCKET}/") + "/" + key
        return s3_client(self.s3_url).get_object(Bucket=RESULTS_BUCKET, Key=full)["Body"].read()

    def json(self, key: str):
        return json.loads(self.read(key))

    def glob(self, pattern: str) -> list[str]:
        import fnmatch

        return [k for k in self.keys() if fnmatch.fnmatch(k, pattern)]


def small_catalogue(folder: Path) -> Path:
    """The packaged matrix experiment cut to one point (size 100, one worker replica, one repeat): the steps
    read it through ``FAASM_CATALOGUE_DIR`` (the same name replaces the packaged entry)."""
    exp = yaml.safe_load((REPO / "faasm_tasks" / "experiments" / f"{EXPERIMENT}.yaml").read_text())
    exp["params"]["n_workers"] = 1
    exp["sweep"] = {s: [{"param": "matrix_size", "values": [100]}] for s in exp["systems"]}
    exp["deploy"]["wasm"]["worker_replicas"] = 1
    exp["repeats"] = 1
    folder.mkdir()
    (folder / f"{EXPERIMENT}.yaml").write_text(yaml.safe_dump(exp))
    return folder


def image_table(worker_state_url: str | None = None) -> dict:
    """What the Faasm images do on the stand-in. ``worker_state_url`` gives the workers a state
    store that does not answer (every call fails)."""

    def redis_urls(ctx):
        return (
            f"redis://{ctx.service(ctx.env['REDIS_QUEUE_HOST'])}/0",
            f"redis://{ctx.service(ctx.env['REDIS_STATE_HOST'])}/0",
        )

    def redis(ctx):
        return [
            "redis-server",
            "--port",
            str(ctx.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(ctx.home),
        ]

    def server(role):
        def cmd(ctx):
            queue, state = redis_urls(ctx)
            return [
                ctx.python,
                "-m",
                "faasm_tasks.local_server",
                role,
                "--port",
                str(ctx.port),
                "--redis-url",
                queue,
                "--state-redis-url",
                (worker_state_url if role == "worker" else None) or state,
                "--shared-dir",
                str(ctx.shared / "files"),
                "--functions-dir",
                str(ctx.shared / "functions"),
            ]

        return cmd

    return {"faasm/redis": redis, "faasm/upload": server("upload"), "faasm/knative-worker": server("worker")}


@pytest.fixture
def faasm_cluster(tmp_path, monkeypatch):
    """moto S3 (the data bucket, with the function), the stand-in with the platform's objects
    (namespaces, the RBAC manifests, the storage Secret in both namespaces, Knative's autoscaler
    ConfigMap, Istio's ingress Service), and the house settings for the kubernetes runner.
    Yields ``start(worker_state_url=None, s3_results=False) -> (api, Stored)``; everything is
    stopped at the end."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (make system-deps)")
    from moto_s3 import moto_s3, s3_client, storage_env

    for key in [k for k in list(__import__("os").environ) if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    catalogue = small_catalogue(tmp_path / "catalogue")
    root = tmp_path / "storage"
    started = []
    with moto_s3(DATA_BUCKET, RESULTS_BUCKET) as url:
        s3_client(url).put_object(
            Bucket=DATA_BUCKET,
            Key="func/python/mat_mul.py",
            Body=b"# mat_mul: the local worker runs its own Python implementation\n",
        )

        def start(worker_state_url: str | None = None, s3_results: bool = False) -> tuple[KubeAPIServer, Stored]:
            api = KubeAPIServer(workdir=REPO, base_env=dict(IMAGE_ENV), images=image_table(worker_state_url)).start()
            started.append(api)
            path = api.write_kubeconfig(tmp_path / "kubeconfig.json")
            api.base_env["KUBECONFIG"] = str(path)  # the stand-in's "service account mount" for step pods
            monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", api.connection_json(path))
            for key, value in {
                "HOUSE_RUNNER": "kubernetes",
                "HOUSE_NAMESPACE": STEP_NS,
                "HOUSE_STORAGE_SECRET": SECRET,
                "HOUSE_IMAGE_FAASM": IMAGE,
            }.items():
                monkeypatch.setenv(key, value)
            results = f"s3://{RESULTS_BUCKET}/house" if s3_results else str(root)
            monkeypatch.setenv("HOUSE_STORAGE_ROOT", results)
            for ns in (STEP_NS, "knative-serving", "istio-system"):
                api.create("", "v1", "namespaces", "", {"metadata": {"name": ns}})
            for doc in yaml.safe_load_all((REPO / "deploy" / "rbac" / "faasm-benchmark.yaml").read_text()):
                group, version = doc["apiVersion"].rpartition("/")[::2]
                plural = {
                    "ServiceAccount": "serviceaccounts",
                    "Namespace": "namespaces",
                    "Role": "roles",
                    "RoleBinding": "rolebindings",
                    "ClusterRole": "clusterroles",
                    "ClusterRoleBinding": "clusterrolebindings",
                }[doc["kind"]]
                api.create(group, version, plural, doc["metadata"].get("namespace", ""), doc)
            secret = {**storage_env(url), "FAASM_CATALOGUE_DIR": str(catalogue)}
            for ns in (STEP_NS, FAASM_NS):  # the platform copies the storage Secret into the benchmark namespace
                api.create("", "v1", "secrets", ns, {"metadata": {"name": SECRET}, "stringData": dict(secret)})
            api.create(
                "",
                "v1",
                "configmaps",
                "knative-serving",
                {"metadata": {"name": "config-autoscaler"}, "data": {"stable-window": "60s"}},
            )
            api.create("", "v1", "services", "istio-system", api.ingress_service())
            api.platform = api.objects_left()  # what the platform provides: all that may be left
            return api, Stored(results, url if s3_results else None)

        try:
            yield start
        finally:
            for api in started:
                api.stop()


def faasm_pods(api: KubeAPIServer) -> list[dict]:
    return [p for p in api.pods_created if p["metadata"]["namespace"] == FAASM_NS]


def assert_steps_and_cleanup(api: KubeAPIServer, dr) -> None:
    """One pod per step task instance that ran, under the benchmark ServiceAccount; every pod
    (steps and the deployment's) deleted; the billing DaemonSet and the Knative Service created
    and gone; only the platform's objects left; every request of the steps within their RBAC."""
    st = task_states(dr)
    tries = {ti.task_id: ti.try_number for ti in dr.get_task_instances()}
    steps = [p for p in api.pods_created if p["metadata"]["namespace"] == STEP_NS]
    ran = sorted(p["metadata"]["labels"]["task_id"] for p in steps)
    python_tasks = {"watcher"} | {t for t in st if t.endswith(".prepare")}
    # one pod per try of every step task that ran (a retried step: a new pod per try)
    assert ran == sorted(
        t for t, s in st.items() if s in ("success", "failed") and t not in python_tasks for _ in range(tries[t])
    ), (ran, st)
    for pod in steps:
        assert pod["spec"]["serviceAccountName"] == "faasm-benchmark"
        (c,) = pod["spec"]["containers"]
        assert c["image"] == IMAGE and c["command"] == ["python", "-m", "faasm_tasks"]
    names = {p["metadata"]["name"] for p in faasm_pods(api)}
    assert {"redis-queue", "redis-state", "upload", "faasm-billing-kubeapi-node"} <= names, names
    workers = [
        p for p in faasm_pods(api) if p["metadata"]["labels"].get("serving.knative.dev/service") == "faasm-worker"
    ]
    assert workers and all(
        p["metadata"]["labels"]["serving.knative.dev/revision"].startswith("faasm-worker-") for p in workers
    )
    created = {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in api.pods_created}
    assert created == set(api.pods_deleted) and not api.list("pods"), set(created) - set(api.pods_deleted)
    assert ("POST", f"/apis/apps/v1/namespaces/{FAASM_NS}/daemonsets") in api.requests
    assert ("POST", f"/apis/serving.knative.dev/v1/namespaces/{FAASM_NS}/services") in api.requests
    assert not api.list("services", FAASM_NS, group="serving.knative.dev")
    assert not api.list("daemonsets", FAASM_NS, group="apps") and not api.list("services", FAASM_NS)
    assert api.objects_left() == api.platform, sorted(set(api.objects_left()) ^ set(api.platform))
    # every request outside the step namespace (the operator's) came from a step: within the Faasm RBAC
    from test_deploy import _all_manifests, _can, _rules_for

    grants = _rules_for(_all_manifests(), (STEP_NS, "faasm-benchmark"))
    step_calls = {access_of(m, p) for m, p in api.requests if access_of(m, p) and access_of(m, p).namespace != STEP_NS}
    assert {a.resource for a in step_calls} >= {"pods", "services", "endpointslices", "daemonsets", "configmaps"}
    denied = sorted(str(a) for a in step_calls if not _can(grants, a.verb, a.group, a.resource, a.namespace, a.name))
    assert not denied, denied
    assert not [a for a in step_calls if a.resource.endswith("/exec")]


def test_faasm_benchmarks_through_kpo_on_the_standin(faasm_cluster, capfd):
    api, stored = faasm_cluster(s3_results=True)
    dr = load_dag("faasm_benchmarks").test(logical_date=LOGICAL_DATE, run_conf=CONF)
    st = task_states(dr)
    assert dr.state == "success", st
    for t in STEPS:
        assert st[f"{GROUP}.{t}"] == "success", (t, st)
    assert st["summarize"] == st["check"] == st["watcher"] == "success", st
    assert st["sgd_reuters_svm__wasm.deploy"] == "skipped"
    assert_steps_and_cleanup(api, dr)
    workers = [p for p in faasm_pods(api) if p["metadata"]["labels"].get("serving.knative.dev/service")]
    assert (
        len({p["metadata"]["labels"]["serving.knative.dev/revision"] for p in workers}) == 1
    )  # run's redeploy: same spec
    assert "[base]" in "".join(capfd.readouterr())  # the steps' log lines reached the task log

    # every step was given the bucket, never a local path
    for pod in api.pods_created:
        if pod["metadata"]["namespace"] == STEP_NS or pod["metadata"]["name"].startswith("faasm-billing"):
            c = pod["spec"]["containers"][0]
            argv = c.get("args") or c["command"]
            assert argv[argv.index("--results") + 1] == f"s3://{RESULTS_BUCKET}/house/faasm_benchmarks"
    keys = stored.keys()
    assert keys and all(k.startswith("faasm_benchmarks/") for k in keys), keys  # nothing outside the prefix
    (run,) = {"/".join(k.split("/")[:3]) for k in stored.glob("faasm_benchmarks/2026-11-29/*/*")}
    (record_key,) = stored.glob(f"{run}/{EXPERIMENT}/{SYSTEM}/*/run.json")
    record = stored.json(record_key)
    assert record["status"] == "succeeded" and record["target"] == "knative", record
    assert record["params"]["matrix_size"] == 100 and record["metrics"]["call_status"] == "success"
    assert record["target_info"]["images"]["worker"] == "faasm/knative-worker:0.1.3"
    assert record["metrics"]["between_points"]["queue_keys_flushed"] >= 0
    assert stored.read(record_key.replace("run.json", "RUN_TIME.log")).decode().endswith("ms")
    # host metrics: the billing DaemonSet's sampler wrote its segments under the run
    segments = sorted(stored.glob(f"{run}/billing/kubeapi-node/*.jsonl"))
    assert segments and json.loads(stored.read(segments[0]).splitlines()[0])["header"]["host"] == "kubeapi-node"
    ops = {stored.json(k)["step"] for k in stored.glob(f"{run}/_ops/*.json")}
    assert {"deploy", "wait-ready", "upload-data", "run", "collect", "teardown", "verify-clean"} <= ops, ops
    (upload,) = [stored.json(k) for k in stored.glob(f"{run}/_ops/upload-data-*.json")]
    assert {"function", "matrix-archive", "state"} <= {o["kind"] for o in upload["objects"]}
    (teardown,) = [stored.json(k)["report"] for k in stored.glob(f"{run}/_ops/teardown-*.json")]
    assert not teardown["incomplete"] and "ksvc/faasm-worker" in teardown["deleted"], teardown
    assert teardown["state_keys_deleted"] >= 1  # the product and intermediates, through the Redis client
    assert stored.json(f"{run}/summary/_SUCCESS.json")["step"] == "summarize"
    assert stored.glob(f"{run}/_ops/check-*.json")
    steps = [p for p in api.pods_created if p["metadata"]["namespace"] == STEP_NS]
    print(
        f"\nS3 run: {len(steps)} step pods, {len(faasm_pods(api))} pods in {FAASM_NS}, {len(api.requests)} API "
        f"requests, {len(keys)} objects in s3://{RESULTS_BUCKET}/house/"
    )


def test_failed_load_step_still_tears_down_and_fails_the_run(faasm_cluster, monkeypatch):
    """The workers' state store does not answer: the point fails and ``run`` exits 1; collect,
    teardown and verify-clean still run and succeed, the watcher fails the run, nothing is left."""
    import house.config as house_config

    monkeypatch.setattr(house_config, "DEFAULT_RETRY_DELAY", timedelta(seconds=1))  # the retries, without the wait
    api, stored = faasm_cluster(worker_state_url="redis://127.0.0.1:9/0")
    dr = load_dag("faasm_benchmarks").test(logical_date=LOGICAL_DATE, run_conf=CONF)
    st = task_states(dr)
    assert dr.state == "failed", st
    assert st[f"{GROUP}.run"] == "failed", st
    runs = [p for p in api.pods_created if p["metadata"]["labels"].get("task_id") == f"{GROUP}.run"]
    assert len(runs) == house_config.DEFAULT_RETRIES + 1  # each try in a fresh pod, each failing
    for t in ("collect", "teardown", "verify_clean"):
        assert st[f"{GROUP}.{t}"] == "success", (t, st)
    assert st["watcher"] == "failed", st
    assert_steps_and_cleanup(api, dr)
    records = [stored.json(k) for k in stored.glob(f"faasm_benchmarks/2026-11-29/*/{EXPERIMENT}/{SYSTEM}/*/run.json")]
    assert sorted(r["attempt"] for r in records) == [1, 2, 3]  # one attempt per try, none overwritten
    assert all(r["status"] == "failed" and r["outcome"]["error"] for r in records), records
