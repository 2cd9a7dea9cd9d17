"""The Kubernetes API stand-in, driven by the unmodified ``kubernetes`` client."""

from __future__ import annotations

import json
import time

import pytest

from kubeapi.fixtures import kube_api, kube_client  # noqa: F401 - fixtures
from kubeapi.server import label_matcher

pytestmark = pytest.mark.timeout(60)

NS = "house-test"


def _core(kube_client):
    from kubernetes import client

    return client.CoreV1Api(kube_client)


def _pod(name: str, code: str, *, env=None, env_from=None, deadline=None, labels=None):
    from kubernetes.client import models as k8s

    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels or {"app": "t"}),
        spec=k8s.V1PodSpec(
            restart_policy="Never",
            active_deadline_seconds=deadline,
            containers=[
                k8s.V1Container(
                    name="base",
                    image="example.org/img:1.0",
                    command=["python", "-c"],
                    args=[code],
                    env=env,
                    env_from=env_from,
                )
            ],
        ),
    )


def _log(core, name: str, **kw) -> str:
    # _preload_content=False as the provider does: with preloading, kubernetes 36 returns
    # str(bytes) ("b'...'") for text/plain bodies, whatever the server.
    return core.read_namespaced_pod_log(name, NS, _preload_content=False, **kw).data.decode()


def _wait_phase(core, name, phases=("Succeeded", "Failed"), timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pod = core.read_namespaced_pod(name, NS)
        if pod.status.phase in phases:
            return pod
        time.sleep(0.05)
    raise AssertionError(f"pod {name} still {pod.status.phase} after {timeout} s")


@pytest.fixture
def core(kube_client):
    from kubernetes.client import models as k8s

    core = _core(kube_client)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
    return core


def test_namespaces_conflicts_and_not_found(kube_api, core):
    from kubernetes.client import models as k8s
    from kubernetes.client.exceptions import ApiException

    assert NS in [n.metadata.name for n in core.list_namespace().items]
    with pytest.raises(ApiException) as exc:
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NS)))
    assert exc.value.status == 409 and "already exists" in exc.value.body
    with pytest.raises(ApiException) as exc:
        core.create_namespaced_config_map("nowhere", k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="c")))
    assert exc.value.status == 404 and json.loads(exc.value.body)["message"] == 'namespaces "nowhere" not found'
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_secret("absent", NS)
    assert exc.value.status == 404
    core.create_namespaced_config_map(NS, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="c"), data={"k": "v"}))
    core.patch_namespaced_config_map("c", NS, {"data": {"k": "w"}})
    assert core.read_namespaced_config_map("c", NS).data == {"k": "w"}
    assert kube_api.objects_left() == [f"ConfigMap {NS}/c", f"Namespace {NS}"]
    core.delete_namespace(NS)  # takes everything in it
    assert kube_api.objects_left() == []


def test_pod_runs_command_with_resolved_env(kube_api, core):
    """secretKeyRef, envFrom secretRef/configMapRef and fieldRef resolve; the exit code sets the phase."""
    from kubernetes.client import models as k8s

    core.create_namespaced_secret(
        NS,
        k8s.V1Secret(
            metadata=k8s.V1ObjectMeta(name="creds"), string_data={"AWS_ACCESS_KEY_ID": "AKIA-test", "token": "s3cr3t"}
        ),
    )
    core.create_namespaced_config_map(NS, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="cfg"), data={"MODE": "x"}))
    assert core.read_namespaced_secret("creds", NS).data["token"] == "czNjcjN0"  # stringData -> base64 data
    env = [
        k8s.V1EnvVar(
            name="TOKEN",
            value_from=k8s.V1EnvVarSource(secret_key_ref=k8s.V1SecretKeySelector(name="creds", key="token")),
        ),
        k8s.V1EnvVar(
            name="POD", value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.name"))
        ),
        k8s.V1EnvVar(name="PLAIN", value="a b"),
    ]
    env_from = [
        k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name="creds")),
        k8s.V1EnvFromSource(config_map_ref=k8s.V1ConfigMapEnvSource(name="cfg")),
    ]
    code = (
        "import os, sys; print(sys.executable); "
        "print(*(os.environ.get(k) for k in ['TOKEN', 'POD', 'PLAIN', 'AWS_ACCESS_KEY_ID', 'MODE', 'HOME_SECRET'])); "
        "sys.exit(3)"
    )
    core.create_namespaced_pod(NS, _pod("p1", code, env=env, env_from=env_from))
    pod = _wait_phase(core, "p1")
    assert pod.status.phase == "Failed"
    (status,) = pod.status.container_statuses
    assert status.state.terminated.exit_code == 3 and status.state.terminated.reason == "Error"
    log = _log(core, "p1")
    import sys

    assert log.splitlines() == [sys.executable, "s3cr3t p1 a b AKIA-test x None"]  # nothing leaks from the test env

    core.create_namespaced_pod(NS, _pod("p2", "print('ok')"))
    pod = _wait_phase(core, "p2")
    assert pod.status.phase == "Succeeded" and pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_missing_secret_blocks_the_container(kube_api, core):
    from kubernetes.client import models as k8s

    env_from = [k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name="no-such-secret"))]
    core.create_namespaced_pod(NS, _pod("p", "print(1)", env_from=env_from))
    pod = core.read_namespaced_pod("p", NS)
    assert pod.status.phase == "Pending"
    waiting = pod.status.container_statuses[0].state.waiting
    assert waiting.reason == "CreateContainerConfigError" and "no-such-secret" in waiting.message


def test_follow_streams_lines_while_the_pod_runs(kube_api, core, tmp_path):
    """``follow=true`` delivers a line while the process still runs, and ends when it exits."""
    flag = tmp_path / "go"  # the pod prints its last line once the test creates this file
    code = f"import os, time\nprint('first', flush=True)\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.05)\nprint('last')"
    core.create_namespaced_pod(NS, _pod("follow", code))
    _wait_phase(core, "follow", phases=("Running",))
    resp = core.read_namespaced_pod_log("follow", NS, follow=True, timestamps=True, _preload_content=False)
    stream = resp.stream(amt=None)
    first = next(stream)
    assert first.endswith(b"Z first\n") and first[:4].isdigit()
    assert core.read_namespaced_pod("follow", NS).status.phase == "Running"
    flag.write_text("")
    rest = b"".join(stream)
    assert rest.endswith(b"Z last\n")
    assert _wait_phase(core, "follow").status.phase == "Succeeded"
    assert _log(core, "follow", tail_lines=1) == "last\n"


def test_deadline_kills_an_overrunning_pod(kube_api, core):
    core.create_namespaced_pod(NS, _pod("slow", "import time; time.sleep(120)", deadline=1))
    pod = _wait_phase(core, "slow", timeout=20)
    assert pod.status.phase == "Failed" and pod.status.reason == "DeadlineExceeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 137
    reasons = [e.reason for e in core.list_namespaced_event(NS, field_selector="involvedObject.name=slow").items]
    assert "DeadlineExceeded" in reasons


def test_list_by_label_and_delete_kills_the_process(kube_api, core):
    core.create_namespaced_pod(NS, _pod("a", "import time; time.sleep(120)", labels={"app": "x", "try": "1"}))
    core.create_namespaced_pod(NS, _pod("b", "print(1)", labels={"app": "x", "checked": "True"}))
    names = lambda sel: sorted(p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=sel).items)  # noqa: E731
    assert names("app=x") == ["a", "b"]
    assert names("app=x,checked!=True") == ["a"]
    assert names("app in (x,y),!checked") == ["a"]
    assert names("try") == ["a"]
    proc = kube_api.runs[(NS, "a")].proc
    core.delete_namespaced_pod("a", NS, grace_period_seconds=0)
    assert proc.poll() is not None
    assert names("app=x") == ["b"]


def test_label_selector_syntax():
    m = label_matcher("a=1,b!=2,c in (x, y),d notin (z),e,!f")
    assert m({"a": "1", "c": "x", "e": ""})
    assert not m({"a": "1", "c": "x", "e": "", "f": "1"})
    assert not m({"a": "1", "b": "2", "c": "x", "e": ""})


def test_knative_service_turns_ready(kube_api, core, kube_client):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    kube_api.ksvc_ready_seconds = 3600  # not ready until the test says so
    kube_api.ksvc_url = lambda obj: "http://127.0.0.1:9/" + obj["metadata"]["name"]
    api = client.CustomObjectsApi(kube_client)
    args = ("serving.knative.dev", "v1", NS, "services")
    body = {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "faasm-worker"},
        "spec": {"template": {"spec": {"containers": [{"image": "faasm/worker:0.1.3"}]}}},
    }
    api.create_namespaced_custom_object(*args, body)
    ready = lambda: {  # noqa: E731
        c["type"]: c["status"] for c in api.get_namespaced_custom_object(*args, "faasm-worker")["status"]["conditions"]
    }
    assert ready()["Ready"] == "Unknown"
    assert "url" not in api.get_namespaced_custom_object(*args, "faasm-worker")["status"]
    kube_api.ksvc_ready_seconds = 0
    assert ready() == {"ConfigurationsReady": "True", "Ready": "True", "RoutesReady": "True"}
    assert api.get_namespaced_custom_object(*args, "faasm-worker")["status"]["url"] == "http://127.0.0.1:9/faasm-worker"
    api.delete_namespaced_custom_object(*args, "faasm-worker")
    with pytest.raises(ApiException) as exc:
        api.delete_namespaced_custom_object(*args, "faasm-worker")
    assert exc.value.status == 404


def test_rbac_objects_and_unsupported_calls(kube_api, core, kube_client):
    from kubernetes import utils
    from kubernetes.client.exceptions import ApiException

    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": NS}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "r", "namespace": NS},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "rb", "namespace": NS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": NS}],
        },
    ]
    for doc in docs:
        utils.create_from_dict(kube_client, doc)
    assert kube_api.objects_left() == [
        f"Namespace {NS}",
        f"Role {NS}/r",
        f"RoleBinding {NS}/rb",
        f"ServiceAccount {NS}/sa",
    ]
    with pytest.raises(ApiException) as exc:
        core.list_namespaced_pod(NS, watch=True, _preload_content=False)
    assert exc.value.status == 405 and "watch" in exc.value.body


#: A tiny HTTP server answering "<name> <pid>" on $PORT, sharing the port (SO_REUSEPORT) like
#: the Knative workers the Faasm tests run; redis-like pods need only the port to answer.
_ECHO = r"""
import os, socket, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class S(HTTPServer):
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"{sys.argv[1]} {os.getpid()} {self.headers.get('Host')}".encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
S(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""


def test_served_images_knative_revisions_ingress_and_endpoint_slices(tmp_path):
    """Images given stand-in behaviour: a pod without command runs the factory's command on a
    local port, turns Ready when the port answers, and a Service's EndpointSlice points at it;
    a Knative Service gets minScale labelled pods, is Ready only with them, is reachable by Host
    through the ingress, gets a deleted pod replaced, and takes its pods with it when deleted."""
    import urllib.request

    from kubernetes import client, config

    from kubeapi.server import KubeAPIServer

    seen = []

    def echo(ctx):
        seen.append((ctx.pod["metadata"]["name"], ctx.port, ctx.env.get("GREETING")))
        return [ctx.python, "-c", _ECHO, ctx.pod["metadata"]["name"]]

    with KubeAPIServer(images={"example.org/echo": echo}, ksvc_ready_seconds=0.0) as api:
        path = api.write_kubeconfig(tmp_path / "kc.json")
        c = config.new_client_from_config(config_file=str(path))
        core, custom, disc = client.CoreV1Api(c), client.CustomObjectsApi(c), client.DiscoveryV1Api(c)
        core.create_namespace({"metadata": {"name": NS}})
        core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": "db", "labels": {"role": "db"}},
                "spec": {"containers": [{"name": "db", "image": "example.org/echo:1.0"}]},
            },
        )
        core.create_namespaced_service(
            NS,
            {"metadata": {"name": "db"}, "spec": {"selector": {"role": "db"}, "ports": [{"name": "x", "port": 6379}]}},
        )
        end = time.monotonic() + 30
        while not any(
            c.type == "Ready" and c.status == "True" for c in core.read_namespaced_pod("db", NS).status.conditions or []
        ):
            assert time.monotonic() < end, "pod never Ready"
            time.sleep(0.05)
        (sl,) = disc.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=db").items
        assert sl.endpoints[0].conditions.ready and sl.endpoints[0].target_ref.name == "db"
        port = sl.ports[0].port
        assert port == api.pod_ports[(NS, "db")] and sl.ports[0].name == "x"
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/").read().startswith(b"db ")

        ksvc = {
            "apiVersion": "serving.knative.dev/v1",
            "kind": "Service",
            "metadata": {"name": "hello"},
            "spec": {
                "template": {
                    "metadata": {"labels": {"team": "t"}, "annotations": {"autoscaling.knative.dev/minScale": "2"}},
                    "spec": {
                        "containers": [{"image": "example.org/echo:1.0", "env": [{"name": "GREETING", "value": "hi"}]}]
                    },
                }
            },
        }
        custom.create_namespaced_custom_object("serving.knative.dev", "v1", NS, "services", ksvc)
        pods = core.list_namespaced_pod(NS, label_selector="serving.knative.dev/service=hello").items
        assert len(pods) == 2 and {p.metadata.labels["serving.knative.dev/revision"] for p in pods} == {"hello-00001"}
        assert all(p.metadata.labels["team"] == "t" for p in pods)
        end = time.monotonic() + 30
        while True:
            obj = custom.get_namespaced_custom_object("serving.knative.dev", "v1", NS, "services", "hello")
            if any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"]):
                break
            assert time.monotonic() < end, obj["status"]
            time.sleep(0.05)
        assert obj["status"]["url"] == f"http://hello.{NS}.example.com"
        assert {s[2] for s in seen[1:]} == {"hi"} and len({s[1] for s in seen[1:]}) == 1  # one port per ksvc
        req = urllib.request.Request(
            f"http://127.0.0.1:{api.ingress_port}/", headers={"Host": f"hello.{NS}.example.com"}
        )
        assert urllib.request.urlopen(req).read().split()[0].decode() in {p.metadata.name for p in pods}
        with pytest.raises(urllib.error.HTTPError) as exc:  # no such Knative Service: Istio's 404
            urllib.request.urlopen(
                urllib.request.Request(
                    f"http://127.0.0.1:{api.ingress_port}/", headers={"Host": f"nope.{NS}.example.com"}
                )
            )
        assert exc.value.code == 404
        core.delete_namespaced_pod(pods[0].metadata.name, NS)  # the revision brings it back
        now = {
            p.metadata.name
            for p in core.list_namespaced_pod(NS, label_selector="serving.knative.dev/service=hello").items
        }
        assert len(now) == 2 and pods[0].metadata.name not in now
        custom.delete_namespaced_custom_object("serving.knative.dev", "v1", NS, "services", "hello")
        assert not core.list_namespaced_pod(NS, label_selector="serving.knative.dev/service=hello").items
        assert api.ingress_service()["status"]["loadBalancer"]["ingress"] == [{"ip": "127.0.0.1"}]
        c.close()
