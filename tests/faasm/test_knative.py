"""Knative target without a cluster: rendered manifests validated against the Kubernetes
schemas (kubernetes-validate) and the Knative Service CRD schema (jsonschema); the
operations run against a recording fake of the Kubernetes API."""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace as NS

import jsonschema
import kubernetes_validate
import pytest
import yaml

from faasm_tasks.catalogue import get_experiment, load_catalogue, resolve
from faasm_tasks.targets.knative import KnativeTarget, label_value, render
from stepkit import StepError

# The CRD is not vendored: it lives in the workspace's shared/schemas (see its SOURCES.md);
# KNATIVE_SERVICE_CRD points elsewhere.
CRD = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "..",
    "shared",
    "schemas",
    "knative-serving-service-crd.yaml",
)
K8S_VERSION = "1.35"


@pytest.fixture(scope="module")
def ksvc_schema():
    path = os.environ.get("KNATIVE_SERVICE_CRD", CRD)
    if not os.path.exists(path):
        pytest.skip(f"Knative Service CRD not found at {path} (set KNATIVE_SERVICE_CRD)")
    with open(path) as f:
        crd = yaml.safe_load(f)
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _validate(doc, ksvc_schema):
    if doc["apiVersion"] == "serving.knative.dev/v1":
        jsonschema.Draft4Validator(ksvc_schema).validate(doc)
        # the revision template is a pod spec: check it with the core schema too
        spec = copy.deepcopy(doc["spec"]["template"]["spec"])
        spec.pop("containerConcurrency", None)
        for c in spec["containers"]:
            c.setdefault("name", "user-container")  # what Knative defaults it to
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t"}, "spec": spec}, K8S_VERSION, strict=True
        )
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(load_catalogue()))
@pytest.mark.parametrize("system", ["wasm", "native"])
def test_rendered_manifests_validate(name, system, ksvc_schema):
    exp = get_experiment(name)
    if system not in exp["systems"]:
        pytest.skip("system not in experiment")
    docs = render(resolve(exp, system, "knative"), run_id="manual__2026-11-29T16:00:00+00:00")
    kinds = [d["kind"] for d in docs]
    # no Namespace: the platform provides it with the steps' RBAC
    assert kinds[:3] == ["Pod", "Service", "Pod"] and "ConfigMap" in kinds and "Namespace" not in kinds
    for d in docs:
        _validate(d, ksvc_schema)
    ksvcs = {d["metadata"]["name"]: d for d in docs if d["apiVersion"].startswith("serving")}
    w = ksvcs["faasm-worker"]["spec"]["template"]
    n = str(exp["deploy"][system]["worker_replicas"])
    assert w["metadata"]["annotations"]["autoscaling.knative.dev/minScale"] == n
    assert w["metadata"]["annotations"]["autoscaling.knative.dev/maxScale"] == n
    for svc in exp["deploy"][system].get("native_services", []):
        fn = "python" if exp.get("python") else svc["function"]
        t = ksvcs["faasm-" + fn.replace("_", "-")]["spec"]["template"]
        assert t["spec"]["containerConcurrency"] == 1
        env = {e["name"]: e["value"] for e in t["spec"]["containers"][0]["env"]}
        assert env["COLD_START_DELAY_MS"] == "800" and env["REDIS_QUEUE_HOST"] == "redis-queue"
    want = label_value("manual__2026-11-29T16:00:00+00:00")
    assert all(d["metadata"]["labels"]["faasm-tasks/run-id"] == want for d in docs if d["kind"] != "ConfigMap")


def test_schema_catches_broken_ksvc(ksvc_schema):
    docs = render(resolve(get_experiment("sgd_reuters_svm"), "wasm", "knative"))
    ksvc = copy.deepcopy(next(d for d in docs if d["apiVersion"].startswith("serving")))
    ksvc["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": "8080"}]
    with pytest.raises(jsonschema.ValidationError):
        _validate(ksvc, ksvc_schema)
    pod = copy.deepcopy(next(d for d in docs if d["kind"] == "Pod"))
    pod["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(pod, ksvc_schema)


def test_label_value_sanitised():
    v = label_value("manual__2026-11-29T16:00:00+00:00")
    assert len(v) <= 63 and ":" not in v and "+" not in v and v[0].isalnum() and v[-1].isalnum()


# ---------------------------------------------------------------- fake Kubernetes API
class ApiErr(Exception):
    def __init__(self, status, reason=""):
        super().__init__(f"({status}) {reason}")
        self.status, self.reason = status, reason


class ReadTimeoutError(Exception):
    """Named like urllib3's, which the target treats as retryable."""


def _match(labels, selector):
    if not selector:
        return True
    for part in selector.split(","):
        if "=" in part:
            k, v = part.split("=", 1)
            if labels.get(k) != v:
                return False
        elif part not in labels:
            return False
    return True


class FakeCluster:
    """Records every call; ``fail[method]`` is a list of exceptions raised first, in order."""

    def __init__(self, clock):
        self.calls, self.fail = [], {}
        self.ksvcs, self.pods, self.services, self.ns, self.cms = {}, {}, {}, {"faasm"}, {"config-autoscaler": {}}
        self.daemonsets = {}
        self.clock = clock
        self.ready_after = 0.0  # fake time at which ksvcs/pods turn Ready

    def _rec(self, name, *a):
        self.calls.append((name, a))
        q = self.fail.get(name)
        if q:
            raise q.pop(0)

    def pod(self, name, labels, ready=True):
        cond = [NS(type="Ready", status="True" if ready else "False")]
        self.pods[name] = NS(metadata=NS(name=name, labels=labels, deletion_timestamp=None), status=NS(conditions=cond))

    # CoreV1Api
    def read_namespace(self, name):
        self._rec("read_namespace", name)
        if name not in self.ns:
            raise ApiErr(404, "NotFound")
        return NS(metadata=NS(name=name))

    # AppsV1Api (the billing DaemonSet: one pod on the one fake node)
    def create_namespaced_daemon_set(self, ns, body):
        name = body["metadata"]["name"]
        self._rec("create_namespaced_daemon_set", name)
        if name in self.daemonsets:
            raise ApiErr(409, "AlreadyExists")
        self.daemonsets[name] = body
        self.pod(f"{name}-node1", body["spec"]["template"]["metadata"]["labels"])

    def list_namespaced_daemon_set(self, ns, label_selector=None):
        self._rec("list_namespaced_daemon_set", label_selector)
        return NS(
            items=[
                NS(metadata=NS(name=n))
                for n, d in self.daemonsets.items()
                if _match(d["metadata"]["labels"], label_selector)
            ]
        )

    def delete_namespaced_daemon_set(self, name, ns, **kw):
        self._rec("delete_namespaced_daemon_set", name)
        if self.daemonsets.pop(name, None) is None:
            raise ApiErr(404, "NotFound")
        for p in self.pods.values():
            if p.metadata.labels.get("app.kubernetes.io/name") == name:
                p.metadata.deletion_timestamp = "now"
        return {}

    def create_namespaced_pod(self, ns, body):
        self._rec("create_namespaced_pod", body["metadata"]["name"])
        if body["metadata"]["name"] in self.pods:
            raise ApiErr(409, "AlreadyExists")
        self.pod(body["metadata"]["name"], body["metadata"]["labels"], ready=True)

    def create_namespaced_service(self, ns, body):
        self._rec("create_namespaced_service", body["metadata"]["name"])
        if body["metadata"]["name"] in self.services:
            raise ApiErr(409, "AlreadyExists")
        self.services[body["metadata"]["name"]] = body

    def patch_namespaced_config_map(self, name, ns, body):
        self._rec("patch_namespaced_config_map", name)
        if name not in self.cms:
            raise ApiErr(404, "NotFound")
        self.cms[name].update(body["data"])
        return self.cms[name]

    def create_namespaced_config_map(self, ns, body):
        self._rec("create_namespaced_config_map", body["metadata"]["name"])

    def list_namespaced_pod(self, ns, label_selector=None):
        self._rec("list_namespaced_pod", label_selector)
        return NS(items=[p for p in self.pods.values() if _match(p.metadata.labels, label_selector)])

    def read_namespaced_pod(self, name, ns):
        self._rec("read_namespaced_pod", name)
        if name not in self.pods:
            raise ApiErr(404, "NotFound")
        return self.pods[name]

    def delete_namespaced_pod(self, name, ns, **kw):
        self._rec("delete_namespaced_pod", name)
        if name not in self.pods:
            raise ApiErr(404, "NotFound")
        del self.pods[name]
        return {}

    def read_namespaced_service(self, name, ns):
        self._rec("read_namespaced_service", name)
        if name not in self.services:
            raise ApiErr(404, "NotFound")
        return self.services[name]

    def delete_namespaced_service(self, name, ns, **kw):
        self._rec("delete_namespaced_service", name)
        if self.services.pop(name, None) is None:
            raise ApiErr(404, "NotFound")
        return {}

    # CustomObjectsApi
    def create_namespaced_custom_object(self, g, v, ns, plural, body):
        name = body["metadata"]["name"]
        self._rec("create_namespaced_custom_object", name)
        if name in self.ksvcs:
            raise ApiErr(409, "AlreadyExists")
        obj = copy.deepcopy(body)
        obj["metadata"].update(generation=1, resourceVersion="1")
        self.ksvcs[name] = obj

    def get_namespaced_custom_object(self, g, v, ns, plural, name):
        self._rec("get_namespaced_custom_object", name)
        if name not in self.ksvcs:
            raise ApiErr(404, "NotFound")
        return self.ksvcs[name]

    def replace_namespaced_custom_object(self, g, v, ns, plural, name, body):
        self._rec("replace_namespaced_custom_object", name, body["metadata"].get("resourceVersion"))
        obj = copy.deepcopy(body)
        obj["metadata"]["generation"] = self.ksvcs[name]["metadata"]["generation"] + 1
        self.ksvcs[name] = obj

    def delete_namespaced_custom_object(self, g, v, ns, plural, name, **kw):
        self._rec("delete_namespaced_custom_object", name)
        if name not in self.ksvcs:
            raise ApiErr(404, "NotFound")
        del self.ksvcs[name]
        for p in list(self.pods.values()):  # its pods start terminating
            if p.metadata.labels.get("serving.knative.dev/service") == name:
                p.metadata.deletion_timestamp = "now"
        return {}

    def list_namespaced_custom_object(self, g, v, ns, plural, label_selector=None):
        self._rec("list_namespaced_custom_object", label_selector)
        now = self.clock()
        items = []
        for obj in self.ksvcs.values():
            obj = copy.deepcopy(obj)
            if now >= self.ready_after:
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "conditions": [{"type": "Ready", "status": "True"}],
                }
            else:
                obj["status"] = {
                    "observedGeneration": obj["metadata"]["generation"],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "Unknown",
                            "reason": "RevisionMissing",
                            "message": "Configuration is waiting for a Revision to become ready.",
                        }
                    ],
                }
            items.append(obj)
        return {"items": [o for o in items if _match(o["metadata"].get("labels", {}), label_selector)]}

    def tick(self):
        """Called on every fake sleep: terminating pods vanish, ksvcs get their pods."""
        for name, p in list(self.pods.items()):
            if p.metadata.deletion_timestamp:
                del self.pods[name]
        if self.clock() >= self.ready_after:
            for name, obj in self.ksvcs.items():
                want = int(obj["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/minScale"])
                have = [p for p in self.pods.values() if p.metadata.labels.get("serving.knative.dev/service") == name]
                for i in range(len(have), want):
                    self.pod(
                        f"{name}-{i}-{int(self.clock() * 10)}",
                        {"serving.knative.dev/service": name, **obj["metadata"]["labels"]},
                    )


class FakeRedis:
    """The two Redis servers behind ``redis-queue`` and ``redis-state``, as redis-py clients
    (the methods the target calls); ``calls`` records (service, method, args)."""

    def __init__(self):
        self.calls = []
        self.state = {"sgd_params", "sgd_weights", "python_intermediate_1_0_0_0_0", "sgd_inputs_vals"}
        self.queue = 5

    def client(self, service):
        fake = self

        class Client:
            def __getattr__(self, method):
                def call(*args, **kw):
                    fake.calls.append((service, method, args))
                    return getattr(fake, f"_{method}")(service, *args, **kw)

                return call

        return Client()

    def _dbsize(self, service):
        return self.queue if service == "redis-queue" else len(self.state)

    def _flushall(self, service):
        assert service == "redis-queue", "only the queue is flushed whole"
        self.queue = 0
        return True

    def _scan_iter(self, service, match="*", count=None):
        import fnmatch

        assert service == "redis-state"
        return iter(sorted(k.encode() for k in self.state if fnmatch.fnmatch(k, match)))

    def _exists(self, service, *keys):
        return sum(k in self.state for k in keys)

    def _delete(self, service, *keys):
        assert service == "redis-state"
        n = len(self.state & set(keys))
        self.state -= set(keys)
        return n


@pytest.fixture
def fake():
    t = {"now": 0.0}
    clock = lambda: t["now"]  # noqa: E731
    cluster = FakeCluster(clock)
    rexec = FakeRedis()

    def sleep(s):
        t["now"] += s
        cluster.tick()

    target = KnativeTarget(
        run_id="r1",
        core=cluster,
        custom=cluster,
        apps=cluster,
        redis_fn=rexec.client,
        sleep=sleep,
        clock=clock,
        poll_s=1.0,
        billing={"image": "faasm-tasks:0.1.0", "command": ["python", "-m", "faasm_tasks", "billing-agent"]},
    )
    return target, cluster, rexec, t


def _plan():
    return resolve(get_experiment("tf_inference_latency"), "native", "knative")


def test_deploy_is_idempotent_and_retries(fake):
    target, cluster, _, _ = fake
    cluster.fail["create_namespaced_pod"] = [ApiErr(500, "etcd hiccup")]
    rep = target.deploy(_plan())
    assert {r["name"]: r["action"] for r in rep["resources"]}["faasm-worker"] == "created"
    assert [c for c in cluster.calls if c[0] == "create_namespaced_pod"].count(
        ("create_namespaced_pod", ("redis-queue",))
    ) == 2
    rep2 = target.deploy(_plan())
    actions = {(r["kind"], r["name"]): r["action"] for r in rep2["resources"]}
    assert actions[("Service", "faasm-worker")] == "replaced" and actions[("Pod", "upload")] == "exists"
    assert actions[("ConfigMap", "config-autoscaler")] == "patched"
    assert ("replace_namespaced_custom_object", ("faasm-worker", "1")) in cluster.calls


def test_deploy_names_each_service_before_creating_it_and_adopts_an_earlier_trys(fake):
    """``on_service`` hears each Knative Service's name before its create call; ``adopt`` (the
    names an earlier try announced): one deployed again is replaced in place, one this plan no
    longer deploys is deleted, one that is gone is created afresh."""
    target, cluster, _, _ = fake
    heard = []
    target.on_service = lambda name: heard.append((name, name in cluster.ksvcs))
    target.deploy(_plan())
    assert heard == [("faasm-worker", False), ("faasm-image", False)]  # named while not yet created
    del cluster.ksvcs["faasm-image"]  # the earlier try was killed before this one existed
    cluster.ksvcs["faasm-old"] = {**cluster.ksvcs["faasm-worker"], "metadata": {"name": "faasm-old"}}
    rep = target.deploy(_plan(), adopt=["faasm-worker", "faasm-image", "faasm-old"])
    actions = {r["name"]: r["action"] for r in rep["resources"] if r["name"].startswith("faasm-")}
    assert actions == {
        "faasm-worker": "adopted",
        "faasm-image": "created (adopted, was gone)",
        "faasm-old": "retired",
    }, actions
    assert sorted(cluster.ksvcs) == ["faasm-image", "faasm-worker"] and rep["adopted"][0] == "faasm-worker"


def test_wait_ready_uses_conditions_and_times_out(fake):
    target, cluster, _, t = fake
    target.deploy(_plan())
    cluster.ready_after = 5.0
    rep = target.wait_ready(60)
    assert rep["ready"] and 5.0 <= t["now"] <= 8.0
    cluster.ready_after = 1e9
    cluster.ksvcs["faasm-worker"]["metadata"]["generation"] = 2
    with pytest.raises(StepError, match="faasm-worker"):
        target.wait_ready(10)


def test_teardown_tolerates_404_409_timeouts_and_is_idempotent(fake):
    target, cluster, rexec, t = fake
    target.deploy(_plan())
    cluster.tick()
    assert any("serving.knative.dev/service" in p.metadata.labels for p in cluster.pods.values())
    cluster.fail["delete_namespaced_custom_object"] = [ApiErr(409, "Conflict"), ReadTimeoutError("read timed out")]
    keys = ["sgd_params", "sgd_weights", "python_intermediate_*"]
    rep = target.teardown(keys, timeout_s=120)
    assert not rep["incomplete"], rep
    assert rep["queue_keys_flushed"] == 5 and rep["state_keys_deleted"] == 3
    assert rexec.state == {"sgd_inputs_vals"}  # uploaded data is kept, run keys are gone
    assert set(rep["deleted"]) == {"ksvc/faasm-worker", "ksvc/faasm-image"}
    assert not cluster.ksvcs and not [p for p in cluster.pods if p.startswith("faasm-")]
    n_del = sum(c[0] == "delete_namespaced_custom_object" for c in cluster.calls)
    assert n_del == 4  # one 409 retry, one timeout retry
    # again: nothing left, nothing fails
    rep2 = target.teardown(keys, timeout_s=30)
    assert not rep2["incomplete"] and rep2["deleted"] == []
    assert target.verify_clean(keys)["clean"]
    # full teardown deletes Redis/upload, tolerating what is already gone, and never the namespace
    rep3 = target.teardown(keys, timeout_s=30, full=True)
    assert "pod/upload" in rep3["deleted"] and "service/redis-state" in rep3["deleted"]
    rep4 = target.teardown(keys, timeout_s=30, full=True)
    assert "pod/upload" in rep4["absent"]
    assert "faasm" in cluster.ns and not [c for c in cluster.calls if c[0] in ("create_namespace", "delete_namespace")]


def test_teardown_reports_pods_that_never_go(fake):
    target, cluster, _, _ = fake
    target.deploy(_plan())
    cluster.tick()
    cluster.pod("stuck", {"serving.knative.dev/service": "faasm-worker"})
    cluster.tick = lambda: None  # nothing ever terminates
    rep = target.teardown([], timeout_s=5)
    assert rep["incomplete"] and "stuck" in rep["incomplete"][0]
    assert not target.verify_clean([])["clean"]


def test_non_retryable_error_surfaces(fake):
    target, cluster, _, _ = fake
    target.deploy(_plan())
    cluster.fail["delete_namespaced_custom_object"] = [ApiErr(403, "Forbidden")]
    with pytest.raises(StepError, match="Forbidden"):
        target.teardown([], timeout_s=30)


def test_soft_restart_replaces_pods(fake):
    target, cluster, rexec, _ = fake
    target.deploy(_plan())
    cluster.tick()
    before = {n for n, p in cluster.pods.items() if "serving.knative.dev/service" in p.metadata.labels}
    rep = target.soft_restart(60)
    after = {n for n, p in cluster.pods.items() if "serving.knative.dev/service" in p.metadata.labels}
    assert rep["ready"] and before and after and not (before & after)
    assert ("redis-queue", "flushall", ()) in rexec.calls


def test_deploy_needs_the_platforms_namespace(fake):
    """The namespace holds the steps' RBAC: deploy never creates it; missing -> exit 2 naming it."""
    target, cluster, _, _ = fake
    cluster.ns.clear()
    with pytest.raises(StepError, match="benchmark namespace 'faasm' does not exist"):
        target.deploy(_plan())
    assert not [c for c in cluster.calls if c[0].startswith("create")]


def test_billing_daemonset_deployed_removed_and_verified(fake):
    target, cluster, _, _ = fake
    assert "faasm-billing" not in str(target.deploy(_plan()))  # tf latency: no billing (the manual's nobill)
    rep = target.deploy(resolve(get_experiment("sgd_reuters_svm"), "wasm", "knative"))
    assert ("DaemonSet", "faasm-billing") in {(r["kind"], r["name"]) for r in rep["resources"]}
    ds = cluster.daemonsets["faasm-billing"]
    tmpl = ds["spec"]["template"]
    assert tmpl["metadata"]["labels"]["faasm-tasks/run-id"] == "r1"
    assert tmpl["spec"]["hostNetwork"] and tmpl["spec"]["hostPID"]
    assert tmpl["spec"]["containers"][0]["command"][-1] == "billing-agent"
    cluster.tick()
    # a sampler pod left after teardown is reported, then gone
    cluster.pods["faasm-billing-node1"].metadata.deletion_timestamp = None
    assert "faasm-billing" in " ".join(target.verify_clean([])["problems"])
    rep = target.teardown([], timeout_s=60)
    assert rep["billing"]["deleted"] == ["daemonset/faasm-billing"] and not rep["incomplete"], rep
    assert not cluster.daemonsets and "faasm-billing-node1" not in cluster.pods
    assert target.verify_clean([])["clean"]


def test_release_table_selects_images():
    from faasm_tasks.targets.knative import RELEASES, release_images

    plan = resolve(get_experiment("tf_inference_latency"), "native", "knative")
    docs = render(plan, release="0.1.3")
    images = {
        d["metadata"]["name"]: (
            d["spec"]["template"]["spec"]["containers"][0]["image"]
            if d["kind"] == "Service" and "template" in d["spec"]
            else d["spec"]["containers"][0]["image"]
        )
        for d in docs
        if d["kind"] in ("Pod", "Service") and ("containers" in d["spec"] or "template" in d["spec"])
    }
    assert images == {
        "redis-queue": "faasm/redis:0.1.3",
        "redis-state": "faasm/redis:0.1.3",
        "upload": "faasm/upload:0.1.3",
        "faasm-worker": "faasm/knative-worker:0.1.3",
        "faasm-image": "faasm/knative-native-image:0.1.3",
    }
    later = render(plan, release="0.6.7")
    assert [d for d in later if d["metadata"]["name"] == "faasm-worker"][0]["spec"]["template"]["spec"]["containers"][
        0
    ]["image"] == "faasm/worker:0.6.7"
    assert (
        release_images("0.1.3", "registry.example/mirror")["worker"] == "registry.example/mirror/knative-worker:0.1.3"
    )
    assert list(RELEASES)[0] == "0.1.3"
    with pytest.raises(StepError, match="--release '9.9'"):
        release_images("9.9")
    upload = [d for d in docs if d["kind"] == "Pod" and d["metadata"]["name"] == "upload"][0]
    env = {e["name"]: e["value"] for e in upload["spec"]["containers"][0]["env"]}
    assert env["REDIS_STATE_HOST"] == "redis-state" and env["REDIS_QUEUE_HOST"] == "redis-queue"
    assert env["CGROUP_MODE"] == "off" and env["NETNS_MODE"] == "off"


#: API method -> (verb, group, resource) of the RBAC rule it needs.
_RBAC = {
    "create_namespaced_pod": ("create", "", "pods"),
    "list_namespaced_pod": ("list", "", "pods"),
    "read_namespaced_pod": ("get", "", "pods"),
    "delete_namespaced_pod": ("delete", "", "pods"),
    "create_namespaced_service": ("create", "", "services"),
    "delete_namespaced_service": ("delete", "", "services"),
    "read_namespaced_service": ("get", "", "services"),
    "create_namespaced_custom_object": ("create", "serving.knative.dev", "services"),
    "get_namespaced_custom_object": ("get", "serving.knative.dev", "services"),
    "replace_namespaced_custom_object": ("update", "serving.knative.dev", "services"),
    "delete_namespaced_custom_object": ("delete", "serving.knative.dev", "services"),
    "list_namespaced_custom_object": ("list", "serving.knative.dev", "services"),
    "create_namespaced_daemon_set": ("create", "apps", "daemonsets"),
    "list_namespaced_daemon_set": ("list", "apps", "daemonsets"),
    "delete_namespaced_daemon_set": ("delete", "apps", "daemonsets"),
}


def test_rbac_manifest_covers_every_call_of_the_target(fake):
    """Every API call of a deploy .. verify-clean (billing DaemonSet included) is granted to the
    step pods' ServiceAccount, and the Role in the benchmark namespace grants no verb the target
    does not use beyond pods/log get and ConfigMap create/patch (see the manifest)."""
    from pathlib import Path

    target, cluster, rexec, _ = fake
    plan = resolve(get_experiment("sgd_reuters_svm"), "wasm", "knative")
    target.deploy(plan)
    target.wait_ready(60)
    plan.deployment["worker_replicas"] = 5  # run's per-N_WORKERS redeploy: replaces the ksvc
    target.deploy(plan)
    target.soft_restart(60)
    target.teardown(["sgd_params"], timeout_s=60, full=True)
    assert target.verify_clean(["sgd_params"], full=True)["clean"]
    docs = list(yaml.safe_load_all((Path(__file__).parents[2] / "deploy/rbac/faasm-benchmark.yaml").read_text()))
    [role] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "faasm-benchmark"]
    granted = {
        (v, g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }
    methods = {c[0] for c in cluster.calls}
    in_ns = {m for m in methods if m in _RBAC}
    assert methods - in_ns <= {"read_namespace", "patch_namespaced_config_map", "create_namespaced_config_map"}
    # Redis through a client to the Services' endpoints (what list_namespaced_endpoint_slice finds): no exec
    needed = {_RBAC[m] for m in in_ns} | {("list", "discovery.k8s.io", "endpointslices")}
    assert needed <= granted, needed - granted
    documented_extra = {
        ("get", "", "pods/log"),
        ("create", "", "configmaps"),
        ("patch", "", "configmaps"),
        ("get", "apps", "daemonsets"),
    }
    assert granted - needed <= documented_extra, granted - needed
    assert {c[0] for c in rexec.calls} == {"redis-queue", "redis-state"}  # cleanup through the Redis clients
    assert not {g for rule in role["rules"] for g in rule["resources"] if g in ("pods/exec", "pods/attach")}
    # beyond the namespace: get on the namespace itself, the autoscaler ConfigMap by name
    [ns_role] = [d for d in docs if d["kind"] == "ClusterRole"]
    assert ns_role["rules"] == [
        {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["faasm"], "verbs": ["get"]}
    ]
    [autoscaler] = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == "knative-serving"]
    assert autoscaler["rules"][0]["resourceNames"] == ["config-autoscaler"]


def test_run_redeploys_per_n_workers(fake, tmp_path, monkeypatch):
    """``run --replicas per-point`` (the default) deploys N replicas and waits for them before
    the points with N workers; ``--replicas fixed`` keeps the deployment; succeeded points are
    skipped without a redeploy."""
    from faasm_tasks.__main__ import STEPS
    from faasm_tasks.steps import run as run_step
    from faasm_tasks.targets.base import Endpoints
    from stepkit.cli import main

    target, cluster, _, _ = fake
    deployed, points = [], []
    real_deploy = target.deploy

    def deploy(plan):
        deployed.append(plan.deployment["worker_replicas"])
        return real_deploy(plan)

    monkeypatch.setattr(target, "deploy", deploy)
    monkeypatch.setattr(target, "endpoints", lambda: Endpoints("http://127.0.0.1:9/", "http://127.0.0.1:9"))
    monkeypatch.setattr(run_step, "get_target", lambda name, args: target)

    def fake_point(ctx, info, point, rep, prefix, first, date, extra=None):
        args, plan = ctx.args, ctx.plan
        points.append((plan.deployment["worker_replicas"], point["n_workers"]))
        from faasm_tasks.results import Attempt

        att = Attempt(
            prefix,
            {
                "run_id": args.run_id,
                "date": date,
                "experiment": plan.name,
                "system": plan.system,
                "target": "knative",
                "params": point,
                "repeat": rep,
            },
        )
        att.finish(True, None, {})
        return {"prefix": prefix, "attempt": 1, "status": "succeeded"}

    monkeypatch.setattr(run_step, "_run_point", fake_point)
    common = [
        "--target",
        "knative",
        "--run-id",
        "r1",
        "--results",
        str(tmp_path),
        "--date",
        "2026-11-30",
        "--state-dir",
        str(tmp_path / "state"),
        "--experiment",
        "sgd_reuters_svm",
        "--system",
        "wasm",
        "--only",
        "sync_interval=60000",
        "--repeats",
        "2",
    ]
    assert main("faasm_tasks", STEPS, ["run", *common]) == 0
    # once per N, not per trial: the shuffled order keeps each N's trials together (a block)
    assert sorted(deployed) == list(range(5, 55, 5)) and deployed != sorted(deployed)
    assert points == [(n, n) for n in deployed for _ in range(2)]  # N replicas, run with N workers
    deployed.clear()
    assert main("faasm_tasks", STEPS, ["run", *common]) == 0  # all succeeded: skipped, nothing redeployed
    assert deployed == []
    points.clear()
    assert main("faasm_tasks", STEPS, ["run", *common, "--replicas", "fixed", "--rerun"]) == 0
    assert deployed == [] and {p[0] for p in points} == {10}  # the catalogue's fixed 10 replicas


def test_endpoints_and_redis_from_the_services_without_dns_or_exec():
    """From a step pod: the ingress at its LoadBalancer address and ``http2`` port, the upload
    server and Redis at the ready endpoints of their ClusterIP Services (EndpointSlices)."""

    def svc(ports, ip=None):
        lb = NS(ingress=[NS(ip=ip, hostname=None)]) if ip else NS(ingress=None)
        return NS(spec=NS(ports=[NS(name=n, port=p) for n, p in ports]), status=NS(load_balancer=lb))

    def slice_(name, port, ready=True, port_name=""):
        return NS(
            ports=[NS(name=port_name, port=port)], endpoints=[NS(addresses=["10.1.2.3"], conditions=NS(ready=ready))]
        )

    services = {
        ("istio-system", "istio-ingressgateway"): svc([("status-port", 15021), ("http2", 31380)], "192.0.2.7"),
        ("faasm", "upload"): svc([("http", 8002)]),
    }
    slices = {
        "upload": [slice_("upload", 8002, port_name="http")],
        "redis-state": [slice_("redis-state", 6379)],
        "redis-queue": [slice_("redis-queue", 6379, ready=False)],
    }
    calls = []

    class Core:
        def read_namespaced_service(self, name, ns):
            return services[(ns, name)]

    class Discovery:
        def list_namespaced_endpoint_slice(self, ns, label_selector):
            calls.append((ns, label_selector))
            return NS(items=slices.get(label_selector.split("=", 1)[1], []))

    t = KnativeTarget(run_id="r1", core=Core(), discovery=Discovery())
    ep = t.endpoints()
    assert ep.invoke_url == "http://192.0.2.7:31380/" and ep.upload_url == "http://10.1.2.3:8002"
    assert t.service_address("redis-state") == "10.1.2.3:6379"
    with pytest.raises(StepError, match="faasm/redis-queue has no ready endpoint"):
        t.service_address("redis-queue")
    assert ("faasm", "kubernetes.io/service-name=upload") in calls
    assert t.redis("redis-state").connection_pool.connection_kwargs["host"] == "10.1.2.3"  # lazy: no connection yet
    t2 = KnativeTarget(run_id="r1", core=Core(), discovery=Discovery(), redis_urls={"redis-queue": "redis://q:7/0"})
    assert t2.redis("redis-queue").connection_pool.connection_kwargs["port"] == 7
