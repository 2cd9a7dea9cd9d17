"""A Kubernetes API server stand-in on 127.0.0.1, for tests that run without a cluster.

It speaks the real REST protocol (paths, JSON bodies, ``Status`` errors, label and field
selectors, chunked ``follow=true`` log streams), so the UNMODIFIED ``kubernetes`` client
and the cncf provider's ``KubernetesPodOperator`` talk to it through an ordinary
kubeconfig. What it does, and does not do:

* Objects are stored in memory: namespaces, pods, secrets, configmaps, service accounts,
  events, services, RBAC (Roles, RoleBindings, ClusterRoles, ClusterRoleBindings),
  DaemonSets, EndpointSlices and Knative ``serving.knative.dev/v1`` Services: the kinds
  the project's clients and manifests use (any other kind is a 404, as an API server
  without that resource answers). Namespaced objects need their namespace to exist
  (404 otherwise, as on a real cluster); names are unique (409); ``generateName`` works;
  ``stringData`` of a Secret is folded into base64 ``data``. Deleting a namespace deletes
  everything in it at once (no ``Terminating`` phase).
* A created **pod runs its first container's** ``command + args`` **as a local process**:
  cwd is ``workdir`` (the repository root), the image is ignored and ``python``/``python3``
  is mapped to ``python`` (the test's interpreter, i.e. the project's virtualenv), the
  environment is ``base_env`` (what the image would set: ``PATH``, ``PYTHONPATH``,
  ``HOME``) plus the container's ``env`` (``value``, ``valueFrom.secretKeyRef``,
  ``configMapKeyRef``, ``fieldRef``) and ``envFrom`` (``secretRef``, ``configMapRef``),
  resolved from stored objects. Nothing else of the caller's environment leaks in. A
  missing Secret or key leaves the container waiting with ``CreateContainerConfigError``,
  as the kubelet does. Stdout and stderr are merged into the container log.
* The exit code sets the phase (``Succeeded``/``Failed``) and
  ``containerStatuses[0].state.terminated`` (``exitCode``, ``reason``). A pod with
  ``activeDeadlineSeconds`` that overruns is killed: phase ``Failed``, reason
  ``DeadlineExceeded``. Deleting a pod kills its process group (SIGTERM, then SIGKILL
  after ``min(grace, 5)`` s) and removes it at once.
* Knative Services get ``status.conditions`` (``ConfigurationsReady``, ``RoutesReady``,
  ``Ready``) that turn ``True`` ``ksvc_ready_seconds`` after each create/update, and a
  ``status.url`` from ``ksvc_url(obj)`` (tests point it at local stand-in workers).
  A **DaemonSet runs its pod template once per fake node** (``nodes``, default one node,
  ``kubeapi-node``): pods ``<name>-<node>`` with the template's labels, an
  ``ownerReference`` to the DaemonSet and ``spec.nodeName`` (also what a
  ``fieldRef: spec.nodeName`` resolves to), started as local processes like any pod;
  ``nodeSelector`` is matched against ``node_labels``. Deleting the DaemonSet deletes its
  pods (their processes get SIGTERM first); its status counts them.
* **Images with stand-in behaviour** (``images``: image -> command factory, supplied by
  the test): a container without ``command`` whose image is in the table runs the
  factory's command instead, on a free 127.0.0.1 port (env ``PORT``); the pod turns
  ``Ready`` once that port accepts connections (a TCP readiness probe). A **Knative
  Service** whose image is in the table gets a revision: ``minScale`` pods labelled as
  Knative labels them (``serving.knative.dev/service``, ``/configuration``, ``/revision``),
  sharing one port per Service (the workers bind it with ``SO_REUSEPORT``); the Service is
  ``Ready`` only when they are; a spec change rolls them to a new revision; a deleted pod of
  the current revision is replaced; deleting the Service deletes them. ``status.url`` is
  ``http://<name>.<namespace>.<ingress_domain>`` (Knative's default domain template) and
  ``status.address.url`` the pods' local address. An **ingress** on a free port routes
  requests by ``Host`` to those Services, as Istio's gateway does
  (:meth:`KubeAPIServer.ingress_service` is the ``istio-ingressgateway`` Service a test
  creates for it). **EndpointSlices** (``discovery.k8s.io/v1``, list by
  ``kubernetes.io/service-name``) are computed from the Services' selectors and the pods'
  local ports: what a client uses to reach a Service without cluster DNS.
* Not implemented (answered ``405``/``415`` with a message saying so): ``watch=true``, JSON
  patches (RFC 6902 operation lists; merge patches work),
  ``pods/exec``/``attach``/``portforward`` (WebSocket), authentication and RBAC
  enforcement (every request is allowed; RBAC objects are stored, not enforced),
  admission, scheduling, resource limits, images.

Why not ``kmock`` (PyPI, an aiohttp Kubernetes emulator by the author of Kopf; version
0.8 evaluated): it stores objects and serves list/watch/CRUD, but pods never run, there
is no ``pods/log`` (let alone ``follow=true``), and list requests are not filtered by
label selector, which ``KubernetesPodOperator`` needs to find and reattach pods; it
also registers a pytest plugin that requires ``pytest-asyncio`` (not a dependency
here), which broke test collection once installed. Process-backed pods would have
meant overriding most of it, so this is a small server of its own on the standard
library (``http.server`` with threads).

Use :class:`KubeAPIServer` as a context manager; ``write_kubeconfig(path)`` and
``connection_json()`` give the client settings.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO = Path(__file__).resolve().parents[2]

#: (group, version, plural) -> (kind, namespaced). group "" is the core API (/api/v1).
RESOURCES: dict[tuple[str, str, str], tuple[str, bool]] = {
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "secrets"): ("Secret", True),
    ("", "v1", "configmaps"): ("ConfigMap", True),
    ("", "v1", "serviceaccounts"): ("ServiceAccount", True),
    ("", "v1", "events"): ("Event", True),
    ("", "v1", "services"): ("Service", True),
    ("apps", "v1", "daemonsets"): ("DaemonSet", True),
    ("rbac.authorization.k8s.io", "v1", "roles"): ("Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"): ("RoleBinding", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles"): ("ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings"): ("ClusterRoleBinding", False),
    ("serving.knative.dev", "v1", "services"): ("Service", True),
    ("discovery.k8s.io", "v1", "endpointslices"): ("EndpointSlice", True),
}
#: Knative's labels on a revision's pods.
KSVC_LABEL, KCONF_LABEL, KREV_LABEL = (
    "serving.knative.dev/service",
    "serving.knative.dev/configuration",
    "serving.knative.dev/revision",
)
#: Namespaces every cluster has; never reported by :meth:`KubeAPIServer.objects_left`.
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public")
UNSUPPORTED_SUBRESOURCES = ("exec", "attach", "portforward", "proxy", "eviction", "binding")
#: Seconds between SIGTERM and SIGKILL when a pod is deleted (a real pod's grace is 30 s).
MAX_DELETE_GRACE = 5.0


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


class ApiError(Exception):
    """Answered as a ``Status`` object (what a real API server sends on errors)."""

    REASONS = {
        400: "BadRequest",
        404: "NotFound",
        405: "MethodNotAllowed",
        409: "AlreadyExists",
        410: "Gone",
        422: "Invalid",
        500: "InternalError",
    }

    def __init__(self, code: int, message: str, reason: str | None = None):
        super().__init__(message)
        self.code, self.message, self.reason = code, message, reason or self.REASONS.get(code, "Unknown")

    def status(self) -> dict:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


# --- selectors ------------------------------------------------------------------------

_REQ = re.compile(r"\s*(!?)\s*([A-Za-z0-9./_-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9._-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def _split_selector(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


def label_matcher(selector: str | None) -> Callable[[dict], bool]:
    """``a=b``, ``a==b``, ``a!=b``, ``a``, ``!a``, ``a in (x,y)``, ``a notin (x,y)``, comma = AND."""
    if not selector:
        return lambda labels: True
    tests = []
    for req in _split_selector(selector):
        m = _REQ.match(req)
        if not m:
            raise ApiError(400, f"unable to parse requirement: {req!r}")
        neg, key, op, value, setop, values = m.groups()
        if neg:
            if op or setop:
                raise ApiError(400, f"unable to parse requirement: {req!r}")
            tests.append(lambda lb, k=key: k not in lb)
        elif op in ("=", "=="):
            tests.append(lambda lb, k=key, v=value: lb.get(k) == v)
        elif op == "!=":
            tests.append(lambda lb, k=key, v=value: lb.get(k) != v)
        elif setop:
            vals = {v.strip() for v in values.split(",")}
            if setop == "in":
                tests.append(lambda lb, k=key, vs=vals: lb.get(k) in vs)
            else:
                tests.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
        else:
            tests.append(lambda lb, k=key: k in lb)
    return lambda labels: all(t(labels) for t in tests)


def field_matcher(selector: str | None) -> Callable[[dict], bool]:
    """``metadata.name=x``, ``involvedObject.name=x``, ``status.phase!=Running`` ... (AND)."""
    if not selector:
        return lambda obj: True
    tests = []
    for req in _split_selector(selector):
        m = re.match(r"\s*([A-Za-z0-9.]+)\s*(==|=|!=)\s*(.*?)\s*$", req)
        if not m:
            raise ApiError(400, f"invalid field selector: {req!r}")
        path, op, value = m.groups()

        def get(obj, p=path):
            for part in p.split("."):
                obj = obj.get(part) if isinstance(obj, dict) else None
            return "" if obj is None else str(obj)

        tests.append((lambda o, g=get, v=value: g(o) == v) if op != "!=" else (lambda o, g=get, v=value: g(o) != v))
    return lambda obj: all(t(obj) for t in tests)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (also used for strategic-merge patches: lists are replaced)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# --- pods as processes ------------------------------------------------------------------


@dataclass
class PodRun:
    """The local process behind one pod, and its log."""

    key: tuple[str, str]
    lines: list[tuple[float, bytes]] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    proc: subprocess.Popen | None = None
    done: bool = False
    killed_for: str | None = None  # "deadline" or "delete"


@dataclass
class PodContext:
    """What an image's command factory gets: the pod, its port and a Service resolver."""

    pod: dict
    port: int
    env: dict[str, str]
    home: Path
    shared: Path  # one folder per namespace, shared by its image-served pods (a volume)
    python: str
    service: Callable[[str], str]  # Service name -> "127.0.0.1:<port>" of a pod behind it


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KubeAPIServer:
    """The stand-in: an in-memory object store, pod processes, and the HTTP front end."""

    def __init__(
        self,
        *,
        workdir: Path | str = REPO,
        python: str = sys.executable,
        base_env: dict[str, str] | None = None,
        ksvc_url: Callable[[dict], str] | None = None,
        ksvc_ready_seconds: float = 0.5,
        namespaces: tuple[str, ...] = SYSTEM_NAMESPACES,
        nodes: tuple[str, ...] = ("kubeapi-node",),
        node_labels: dict[str, dict[str, str]] | None = None,
        images: dict[str, Callable[[PodContext], list[str]]] | None = None,
        ingress_domain: str = "example.com",
    ):
        self.images = dict(images or {})
        self.ingress_domain = ingress_domain
        self.pod_ports: dict[tuple[str, str], int] = {}  # image-served pods: (ns, name) -> local port
        self.ksvc_ports: dict[tuple[str, str], int] = {}  # served Knative Services: (ns, name) -> port
        self._ingress: ThreadingHTTPServer | None = None
        self.nodes = tuple(nodes)
        self.node_labels = {n: {"kubernetes.io/hostname": n, **((node_labels or {}).get(n) or {})} for n in self.nodes}
        self.workdir = Path(workdir)
        self.python = python
        self.base_env = {
            "PATH": os.path.dirname(python) + os.pathsep + "/usr/local/bin:/usr/bin:/bin",
            "PYTHONPATH": str(self.workdir),
            "LANG": "C.UTF-8",
            **(base_env or {}),
        }
        self.ksvc_url = ksvc_url or (
            lambda obj: "http://{name}.{namespace}.svc.cluster.local".format(**obj["metadata"])
        )
        self.ksvc_ready_seconds = ksvc_ready_seconds
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str, str, str], dict] = {}  # (group, version, plural, ns, name)
        self.runs: dict[tuple[str, str], PodRun] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path?query) of every request
        self.pods_created: list[dict] = []  # a copy of every pod as created (after defaults)
        self.pods_deleted: list[str] = []  # "namespace/name"
        self._rv = itertools.count(1)
        self._home = Path(tempfile.mkdtemp(prefix="kubeapi-"))
        self._httpd: ThreadingHTTPServer | None = None
        for ns in namespaces:
            self._store("", "v1", "namespaces", "", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- lifecycle -------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self, port: int = 0) -> KubeAPIServer:
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="kubeapi", daemon=True).start()
        if self.images:
            ingress = type("Ingress", (_IngressHandler,), {"api": self})
            self._ingress = ThreadingHTTPServer(("127.0.0.1", 0), ingress)
            self._ingress.daemon_threads = True
            threading.Thread(target=self._ingress.serve_forever, name="kubeapi-ingress", daemon=True).start()
        return self

    @property
    def ingress_port(self) -> int:
        assert self._ingress is not None, "no ingress: the stand-in starts one when given images"
        return self._ingress.server_address[1]

    def ingress_service(self) -> dict:
        """The ``istio-system/istio-ingressgateway`` Service (a LoadBalancer with its address, as
        the platform's Istio has it) pointing at the stand-in's ingress: create it in a test."""
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "istio-ingressgateway",
                "namespace": "istio-system",
                "labels": {"app": "istio-ingressgateway", "istio": "ingressgateway"},
            },
            "spec": {
                "type": "LoadBalancer",
                "selector": {"istio": "ingressgateway"},
                "ports": [{"name": "http2", "port": self.ingress_port, "targetPort": 8080}],
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "127.0.0.1"}]}},
        }

    def stop(self) -> None:
        """Kill every pod process and close the server."""
        for run in list(self.runs.values()):
            self._kill(run, "delete", grace=0.5)
        if self._ingress is not None:
            self._ingress.shutdown()
            self._ingress.server_close()
            self._ingress = None
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def kubeconfig(self, namespace: str = "default") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "kubeapi",
            "clusters": [{"name": "kubeapi", "cluster": {"server": self.url}}],
            "users": [{"name": "kubeapi", "user": {"token": "kubeapi-test-token"}}],
            "contexts": [
                {"name": "kubeapi", "context": {"cluster": "kubeapi", "user": "kubeapi", "namespace": namespace}}
            ],
        }

    def write_kubeconfig(self, path: Path | str, namespace: str = "default") -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.kubeconfig(namespace)))  # JSON is YAML
        return path

    def connection_json(self, kubeconfig_path: Path | str) -> str:
        """Value of ``AIRFLOW_CONN_KUBERNETES_DEFAULT`` pointing at this server."""
        return json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig_path), "in_cluster": False}}
        )

    # -- queries for tests -----------------------------------------------------------

    def list(self, plural: str, namespace: str | None = None, group: str = "", version: str = "v1") -> list[dict]:
        with self.lock:
            return [
                copy.deepcopy(o)
                for (g, v, p, ns, _), o in self.objects.items()
                if (g, v, p) == (group, version, plural) and (namespace is None or ns == namespace)
            ]

    def get(self, plural: str, namespace: str, name: str, group: str = "", version: str = "v1") -> dict | None:
        with self.lock:
            obj = self.objects.get((group, version, plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def objects_left(self) -> list[str]:
        """``kind namespace/name`` of every object a workload left (not events, not system namespaces)."""
        with self.lock:
            out = []
            for (_g, _v, p, ns, name), obj in self.objects.items():
                if p == "events" or ns in SYSTEM_NAMESPACES or (p == "namespaces" and name in SYSTEM_NAMESPACES):
                    continue
                out.append(f"{obj.get('kind')} {ns + '/' if ns else ''}{name}")
            return sorted(out)

    def pod_log(self, namespace: str, name: str) -> str:
        run = self.runs.get((namespace, name))
        return b"".join(line for _, line in run.lines).decode() if run else ""

    # -- object store ----------------------------------------------------------------

    def _store(self, group, version, plural, ns, obj) -> dict:
        kind, _ = RESOURCES[(group, version, plural)]
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_iso())
        meta["resourceVersion"] = str(next(self._rv))
        meta.setdefault("generation", 1)
        if ns:
            meta["namespace"] = ns
        obj["apiVersion"], obj["kind"] = api_version(group, version), kind
        self.objects[(group, version, plural, ns, meta["name"])] = obj
        return obj

    def create(self, group, version, plural, ns, body: dict) -> dict:
        with self.lock:
            kind, namespaced = RESOURCES[(group, version, plural)]
            meta = body.setdefault("metadata", {})
            if meta.get("namespace") and ns and meta["namespace"] != ns:
                raise ApiError(
                    400, "the namespace of the provided object does not match the namespace sent on the request"
                )
            if not meta.get("name"):
                if not meta.get("generateName"):
                    raise ApiError(422, f"{kind} is invalid: metadata.name: Required value", "Invalid")
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if namespaced and ("", "v1", "namespaces", "", ns) not in self.objects:
                raise ApiError(404, f'namespaces "{ns}" not found')
            key = (group, version, plural, ns if namespaced else "", meta["name"])
            if key in self.objects:
                raise ApiError(409, f'{plural}{"." + group if group else ""} "{meta["name"]}" already exists')
            obj = self._store(group, version, plural, ns if namespaced else "", body)
            self._on_create(group, plural, obj)
            return copy.deepcopy(obj)

    def read(self, group, version, plural, ns, name) -> dict:
        with self.lock:
            obj = self.objects.get((group, version, plural, ns, name))
            if obj is None:
                raise ApiError(404, f'{plural}{"." + group if group else ""} "{name}" not found')
            if (group, plural) == ("serving.knative.dev", "services"):
                self._ksvc_status(obj)
            return copy.deepcopy(obj)

    def list_objects(self, group, version, plural, ns, query) -> dict:
        labels = label_matcher(query.get("labelSelector"))
        fields = field_matcher(query.get("fieldSelector"))
        with self.lock:
            items = []
            if (group, plural) == ("discovery.k8s.io", "endpointslices"):
                items = [o for o in self._endpoint_slices(ns) if labels(o["metadata"]["labels"]) and fields(o)]
            for (g, v, p, ons, _name), obj in self.objects.items():
                if (g, v, p) != (group, version, plural) or (ns and ons != ns):
                    continue
                if labels(obj["metadata"].get("labels") or {}) and fields(obj):
                    if (group, plural) == ("serving.knative.dev", "services"):
                        self._ksvc_status(obj)
                    items.append(copy.deepcopy(obj))
            kind = RESOURCES[(group, version, plural)][0]
            return {
                "apiVersion": api_version(group, version),
                "kind": kind + "List",
                "metadata": {"resourceVersion": str(next(self._rv))},
                "items": items,
            }

    def replace(self, group, version, plural, ns, name, body: dict) -> dict:
        with self.lock:
            old = self.read(group, version, plural, ns, name)
            body.setdefault("metadata", {})
            body["metadata"]["uid"] = old["metadata"]["uid"]
            body["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            body["metadata"]["generation"] = old["metadata"].get("generation", 1) + (
                body.get("spec") != old.get("spec")
            )
            if "status" not in body and "status" in old:
                body["status"] = old["status"]
            obj = self._store(group, version, plural, ns, body)
            self._on_update(group, plural, obj, old)
            return copy.deepcopy(obj)

    def patch(self, group, version, plural, ns, name, patch: Any) -> dict:
        with self.lock:
            old = self.read(group, version, plural, ns, name)
            if not isinstance(patch, dict):  # no client here sends RFC 6902 operations
                raise ApiError(
                    415,
                    "JSON patch (a list of operations) is not implemented by the kubeapi stand-in; "
                    "send a merge patch (an object)",
                )
            new = merge_patch(old, patch)
            return self.replace(group, version, plural, ns, name, new)

    def delete(self, group, version, plural, ns, name, grace: float | None = None) -> dict:
        with self.lock:
            obj = self.read(group, version, plural, ns, name)
            del self.objects[(group, version, plural, ns, name)]
            if plural == "namespaces":
                for key in [k for k in self.objects if k[3] == name]:
                    self._forget(key)
            run = self.runs.get((ns, name)) if plural == "pods" and not group else None
            if plural == "pods" and not group:
                self.pods_deleted.append(f"{ns}/{name}")
            owned = self._owned_pods(ns, obj["metadata"]["uid"]) if (group, plural) == ("apps", "daemonsets") else []
            if (group, plural) == ("serving.knative.dev", "services"):  # its revisions' pods go with it
                owned = self._ksvc_pods(ns, name)
                self.ksvc_ports.pop((ns, name), None)
            replace = None
            if plural == "pods" and not group:
                self.pod_ports.pop((ns, name), None)
                replace = self._current_ksvc_of(obj)
        if run is not None:
            self._kill(run, "delete", grace=MAX_DELETE_GRACE if grace is None else grace)
        if replace is not None:  # the revision's ReplicaSet brings the pod count back to minScale
            with self.lock:
                if ("serving.knative.dev", "v1", "services", ns, replace) in self.objects:
                    self._revision_pods(self.objects[("serving.knative.dev", "v1", "services", ns, replace)])
        for pod in owned:  # the garbage collector's cascade: the pods get their grace period
            try:
                self.delete("", "v1", "pods", ns, pod, grace=grace)
            except ApiError:
                pass
        obj["metadata"]["deletionTimestamp"] = now_iso()
        return obj

    def delete_collection(self, group, version, plural, ns, query) -> dict:
        listing = self.list_objects(group, version, plural, ns, query)
        for obj in listing["items"]:
            self.delete(group, version, plural, obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        return listing

    def _forget(self, key) -> None:
        obj = self.objects.pop(key)
        if key[:3] == ("", "v1", "pods"):
            self.pods_deleted.append(f"{key[3]}/{key[4]}")
            run = self.runs.get((key[3], key[4]))
            if run is not None:
                threading.Thread(target=self._kill, args=(run, "delete", 0.5), daemon=True).start()
        return obj

    # -- per-kind behaviour ----------------------------------------------------------

    def _on_create(self, group: str, plural: str, obj: dict) -> None:
        if (group, plural) == ("", "secrets") and "stringData" in obj:
            data = obj.setdefault("data", {})
            for k, v in obj.pop("stringData").items():
                data[k] = base64.b64encode(str(v).encode()).decode()
        elif (group, plural) == ("", "namespaces"):
            obj["status"] = {"phase": "Active"}
        elif (group, plural) == ("", "pods"):
            self._start_pod(obj)
        elif (group, plural) == ("serving.knative.dev", "services"):
            obj["metadata"].setdefault("annotations", {})["kubeapi.test/changed-at"] = repr(time.time())
            self._revision_pods(obj)
            self._ksvc_status(obj)
        elif (group, plural) == ("apps", "daemonsets"):
            self._daemonset_pods(obj)

    def _daemonset_pods(self, ds: dict) -> None:
        """One pod per (selected) fake node, from the template, owned by the DaemonSet."""
        ns, name = ds["metadata"]["namespace"], ds["metadata"]["name"]
        tmpl = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
        selector = (tmpl.get("spec") or {}).get("nodeSelector") or {}
        nodes = [n for n in self.nodes if all(self.node_labels[n].get(k) == v for k, v in selector.items())]
        for node in nodes:
            pod = copy.deepcopy(tmpl)
            md = pod.setdefault("metadata", {})
            md["name"] = f"{name}-{node}"
            md["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": name,
                    "uid": ds["metadata"]["uid"],
                    "controller": True,
                }
            ]
            pod.setdefault("spec", {})["nodeName"] = node
            self._store("", "v1", "pods", ns, pod)
            self._start_pod(pod)
        n = len(nodes)
        ds["status"] = {
            "currentNumberScheduled": n,
            "desiredNumberScheduled": n,
            "numberReady": n,
            "numberAvailable": n,
            "updatedNumberScheduled": n,
            "numberMisscheduled": 0,
            "observedGeneration": ds["metadata"].get("generation", 1),
        }

    def _owned_pods(self, ns: str, uid: str) -> list[str]:
        return [
            k[4]
            for k, o in self.objects.items()
            if k[:4] == ("", "v1", "pods", ns)
            and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    def _on_update(self, group: str, plural: str, obj: dict, old: dict) -> None:
        if (group, plural) == ("serving.knative.dev", "services") and obj.get("spec") != old.get("spec"):
            obj["metadata"].setdefault("annotations", {})["kubeapi.test/changed-at"] = repr(time.time())
            obj.pop("status", None)
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            for pod in self._ksvc_pods(ns, name):  # a new revision replaces the old one's pods
                self._drop_pod(ns, pod)
            self._revision_pods(obj)
            self._ksvc_status(obj)

    def _ksvc_status(self, obj: dict) -> None:
        """Ready ``ksvc_ready_seconds`` after the last spec change (checked on each read)."""
        changed = float(obj["metadata"].get("annotations", {}).get("kubeapi.test/changed-at", "0"))
        ready = time.time() - changed >= self.ksvc_ready_seconds
        served = self._ksvc_image(obj) is not None
        if served:  # Ready when the current revision has its minScale pods Ready
            ns = obj["metadata"]["namespace"]
            pods = [self.objects[("", "v1", "pods", ns, p)] for p in self._ksvc_pods(ns, obj["metadata"]["name"])]
            rev = self._revision_name(obj)
            up = [p for p in pods if p["metadata"]["labels"].get(KREV_LABEL) == rev and _is_ready(p)]
            ready = ready and len(up) >= self._min_scale(obj)
        state = "True" if ready else "Unknown"
        gen = obj["metadata"].get("generation", 1)
        name = obj["metadata"]["name"]
        conds = [
            {
                "type": t,
                "status": state,
                "lastTransitionTime": now_iso(),
                **(
                    {}
                    if ready
                    else {
                        "reason": "RevisionMissing",
                        "message": "Configuration is waiting for a Revision to become ready.",
                    }
                ),
            }
            for t in ("ConfigurationsReady", "Ready", "RoutesReady")
        ]
        status = {"observedGeneration": gen, "conditions": conds, "latestCreatedRevisionName": f"{name}-{gen:05d}"}
        if ready:
            url = self.ksvc_url(obj)
            address = url
            if served:
                url = f"http://{name}.{obj['metadata']['namespace']}.{self.ingress_domain}"
                address = f"http://127.0.0.1:{self.ksvc_ports[(obj['metadata']['namespace'], name)]}"
            status.update(
                {
                    "latestReadyRevisionName": f"{name}-{gen:05d}",
                    "url": url,
                    "address": {"url": address},
                    "traffic": [{"revisionName": f"{name}-{gen:05d}", "latestRevision": True, "percent": 100}],
                }
            )
        obj["status"] = status

    # -- image-served pods, Knative revisions, EndpointSlices -------------------------

    def _image_factory(self, image: str | None) -> Callable[[PodContext], list[str]] | None:
        if not image:
            return None
        return self.images.get(image) or self.images.get(image.rsplit(":", 1)[0])

    def _ksvc_image(self, ksvc: dict) -> str | None:
        """The image of a Knative Service the stand-in serves (in ``images``), else None."""
        try:
            image = ksvc["spec"]["template"]["spec"]["containers"][0]["image"]
        except (KeyError, IndexError, TypeError):
            return None
        return image if self._image_factory(image) else None

    @staticmethod
    def _min_scale(ksvc: dict) -> int:
        ann = ((ksvc["spec"].get("template") or {}).get("metadata") or {}).get("annotations") or {}
        return max(1, int(ann.get("autoscaling.knative.dev/minScale", ann.get("autoscaling.knative.dev/min-scale", 1))))

    @staticmethod
    def _revision_name(ksvc: dict) -> str:
        return f"{ksvc['metadata']['name']}-{ksvc['metadata'].get('generation', 1):05d}"

    def _ksvc_pods(self, ns: str, name: str) -> list[str]:
        return [
            k[4]
            for k, o in self.objects.items()
            if k[:4] == ("", "v1", "pods", ns) and (o["metadata"].get("labels") or {}).get(KSVC_LABEL) == name
        ]

    def _current_ksvc_of(self, pod: dict) -> str | None:
        """The served Knative Service whose current revision this pod belongs to (None otherwise)."""
        labels = pod["metadata"].get("labels") or {}
        name, ns = labels.get(KSVC_LABEL), pod["metadata"].get("namespace", "")
        ksvc = self.objects.get(("serving.knative.dev", "v1", "services", ns, name)) if name else None
        if ksvc is None or self._ksvc_image(ksvc) is None or labels.get(KREV_LABEL) != self._revision_name(ksvc):
            return None
        return name

    def _revision_pods(self, ksvc: dict) -> None:
        """Create the current revision's missing pods (``minScale`` of them), labelled as Knative does."""
        if self._ksvc_image(ksvc) is None:
            return
        ns, name = ksvc["metadata"]["namespace"], ksvc["metadata"]["name"]
        rev = self._revision_name(ksvc)
        have = [
            p
            for p in self._ksvc_pods(ns, name)
            if self.objects[("", "v1", "pods", ns, p)]["metadata"]["labels"].get(KREV_LABEL) == rev
        ]
        tmpl = ksvc["spec"]["template"]
        for _ in range(self._min_scale(ksvc) - len(have)):
            spec = copy.deepcopy(tmpl.get("spec") or {})
            spec.pop("containerConcurrency", None)
            spec["containers"][0].setdefault("name", "user-container")
            pod = {
                "metadata": {
                    "name": f"{rev}-deployment-{uuid.uuid4().hex[:10]}",
                    "labels": {
                        **((tmpl.get("metadata") or {}).get("labels") or {}),
                        KSVC_LABEL: name,
                        KCONF_LABEL: name,
                        KREV_LABEL: rev,
                        "app": rev,
                    },
                    "annotations": dict((tmpl.get("metadata") or {}).get("annotations") or {}),
                },
                "spec": spec,
            }
            self._store("", "v1", "pods", ns, pod)
            self._start_pod(pod)

    def _drop_pod(self, ns: str, name: str) -> None:
        """Remove a pod now and kill its process in the background (a controller's delete)."""
        if ("", "v1", "pods", ns, name) in self.objects:
            self.pod_ports.pop((ns, name), None)
            self._forget(("", "v1", "pods", ns, name))

    def _service_address(self, ns: str, name: str) -> str:
        """``127.0.0.1:<port>`` of a ready-or-starting image-served pod behind Service ``name``."""
        svc = self.objects.get(("", "v1", "services", ns, name))
        if svc is None:
            raise ApiError(404, f'services "{name}" not found (the stand-in resolves a Service to its pods)')
        sel = label_matcher(",".join(f"{k}={v}" for k, v in ((svc.get("spec") or {}).get("selector") or {}).items()))
        for (g, _v, p, ons, pname), pod in self.objects.items():
            if (
                (g, p, ons) == ("", "pods", ns)
                and (ns, pname) in self.pod_ports
                and sel(pod["metadata"].get("labels") or {})
            ):
                return f"127.0.0.1:{self.pod_ports[(ns, pname)]}"
        raise ApiError(404, f"service {ns}/{name} has no pod with a port yet")

    def _endpoint_slices(self, ns: str) -> list[dict]:
        """One EndpointSlice per Service with a selector and per distinct local port of its pods."""
        out = []
        for (g, v, p, sns, name), svc in list(self.objects.items()):
            if (g, p) != ("", "services") or (ns and sns != ns):
                continue
            selector = (svc.get("spec") or {}).get("selector") or {}
            if not selector:
                continue
            sel = label_matcher(",".join(f"{k}={v}" for k, v in selector.items()))
            by_port: dict[int, list[dict]] = {}
            for (pg, _pv, pp, pns, pname), pod in self.objects.items():
                if (
                    (pg, pp, pns) == ("", "pods", sns)
                    and (sns, pname) in self.pod_ports
                    and sel(pod["metadata"].get("labels") or {})
                ):
                    by_port.setdefault(self.pod_ports[(sns, pname)], []).append(
                        {
                            "addresses": ["127.0.0.1"],
                            "conditions": {"ready": _is_ready(pod)},
                            "nodeName": pod["spec"].get("nodeName"),
                            "targetRef": {
                                "kind": "Pod",
                                "namespace": sns,
                                "name": pname,
                                "uid": pod["metadata"]["uid"],
                            },
                        }
                    )
            ports = (svc.get("spec") or {}).get("ports") or [{}]
            for i, (port, eps) in enumerate(sorted(by_port.items())):
                out.append(
                    {
                        "apiVersion": "discovery.k8s.io/v1",
                        "kind": "EndpointSlice",
                        "addressType": "IPv4",
                        "metadata": {
                            "name": f"{name}-kubeapi{i}",
                            "namespace": sns,
                            "labels": {
                                "kubernetes.io/service-name": name,
                                "endpointslice.kubernetes.io/managed-by": "kubeapi-stand-in",
                            },
                        },
                        "endpoints": eps,
                        "ports": [{"name": ports[0].get("name", ""), "port": port, "protocol": "TCP"}],
                    }
                )
        return out

    def _probe(self, key: tuple[str, str], port: int, timeout: float = 120.0) -> None:
        """TCP readiness probe: the pod turns Ready once its port accepts connections."""
        import socket

        end = time.time() + timeout
        while time.time() < end:
            run = self.runs.get(key)
            if run is None or run.done or ("", "v1", "pods", *key) not in self.objects:
                return
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            return
        with self.lock:
            pod = self.objects.get(("", "v1", "pods", *key))
            if pod is None or pod["status"].get("phase") != "Running":
                return
            for cond in pod["status"]["conditions"]:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["status"] = "True"
            pod["status"]["containerStatuses"][0]["ready"] = True
            pod["metadata"]["resourceVersion"] = str(next(self._rv))

    def _event(self, pod: dict, reason: str, message: str, type_: str = "Normal") -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        ev = {
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}"},
            "involvedObject": {
                "kind": "Pod",
                "namespace": ns,
                "name": name,
                "uid": pod["metadata"]["uid"],
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": now_iso(),
            "lastTimestamp": now_iso(),
            "source": {"component": "kubeapi-stand-in"},
        }
        self._store("", "v1", "events", ns, ev)

    # -- pods --------------------------------------------------------------------------

    def _resolve_env(self, ns: str, pod: dict, container: dict) -> dict[str, str]:
        """The container's environment as the kubelet builds it; ApiError(400) when a ref is missing."""

        def ref(plural: str, name: str, key: str | None, optional: bool) -> dict[str, str] | str | None:
            obj = self.objects.get(("", "v1", plural, ns, name))
            kind = "secret" if plural == "secrets" else "configmap"
            if obj is None:
                if optional:
                    return None
                raise ApiError(400, f'{kind} "{name}" not found')
            data = obj.get("data") or {}
            if plural == "secrets":
                data = {k: base64.b64decode(v).decode() for k, v in data.items()}
            if key is None:
                return data
            if key not in data:
                if optional:
                    return None
                raise ApiError(400, f"couldn't find key {key} in {kind.title()} {ns}/{name}")
            return data[key]

        env: dict[str, str] = {}
        for src in container.get("envFrom") or []:
            prefix = src.get("prefix", "")
            for kind, plural in (("secretRef", "secrets"), ("configMapRef", "configmaps")):
                if kind in src:
                    values = ref(plural, src[kind]["name"], None, src[kind].get("optional", False)) or {}
                    env.update({prefix + k: v for k, v in values.items()})
        for item in container.get("env") or []:
            if "value" in item:
                env[item["name"]] = re.sub(
                    r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"]
                )
            elif "valueFrom" in item:
                vf = item["valueFrom"]
                if "secretKeyRef" in vf:
                    r = vf["secretKeyRef"]
                    value = ref("secrets", r["name"], r["key"], r.get("optional", False))
                elif "configMapKeyRef" in vf:
                    r = vf["configMapKeyRef"]
                    value = ref("configmaps", r["name"], r["key"], r.get("optional", False))
                elif "fieldRef" in vf:
                    path = vf["fieldRef"]["fieldPath"]
                    value = {
                        "metadata.name": pod["metadata"]["name"],
                        "metadata.namespace": ns,
                        "metadata.uid": pod["metadata"]["uid"],
                        "spec.nodeName": pod["spec"].get("nodeName", self.nodes[0]),
                        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
                        "status.podIP": "127.0.0.1",
                        "status.hostIP": "127.0.0.1",
                    }.get(path)
                    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
                    if m:
                        value = (pod["metadata"].get(m.group(1)) or {}).get(m.group(2))
                else:
                    raise ApiError(400, f"env {item['name']}: valueFrom {sorted(vf)} is not supported by the stand-in")
                if value is not None:
                    env[item["name"]] = str(value)
            else:
                env[item["name"]] = ""
        return env

    def _start_pod(self, pod: dict) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        spec = pod.setdefault("spec", {})
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("serviceAccountName", "default")
        spec["nodeName"] = spec.get("nodeName") or self.nodes[0]
        container = spec["containers"][0]
        pod["status"] = {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "hostIP": "127.0.0.1",
            "podIP": "127.0.0.1",
            "qosClass": "Burstable",
        }
        self._container_status(pod, {"waiting": {"reason": "ContainerCreating"}}, ready=False)
        self.pods_created.append(copy.deepcopy(pod))
        self._event(pod, "Scheduled", f"Successfully assigned {ns}/{name} to kubeapi-node")
        run = PodRun((ns, name))
        self.runs[(ns, name)] = run
        try:
            env = self._resolve_env(ns, pod, container)
        except ApiError as exc:
            self._container_status(
                pod, {"waiting": {"reason": "CreateContainerConfigError", "message": exc.message}}, ready=False
            )
            self._event(pod, "Failed", f"Error: {exc.message}", "Warning")
            return
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        home = self._home / ns / name
        home.mkdir(parents=True, exist_ok=True)
        port = None
        factory = self._image_factory(container.get("image")) if not container.get("command") else None
        if factory is not None:  # the image's stand-in behaviour, on a local port
            ksvc = (pod["metadata"].get("labels") or {}).get(KSVC_LABEL)
            port = self.ksvc_ports.setdefault((ns, ksvc), free_port()) if ksvc else free_port()
            self.pod_ports[(ns, name)] = port
            env = {**env, "PORT": str(port)}
            shared = self._home / ns / "_shared"
            shared.mkdir(parents=True, exist_ok=True)
            try:
                argv = (
                    list(
                        factory(
                            PodContext(
                                pod=pod,
                                port=port,
                                env=dict(env),
                                home=home,
                                shared=shared,
                                python=self.python,
                                service=lambda svc: self._service_address(ns, svc),
                            )
                        )
                    )
                    + argv
                )
            except ApiError as exc:
                self._container_status(
                    pod, {"waiting": {"reason": "CreateContainerError", "message": exc.message}}, ready=False
                )
                self._event(pod, "Failed", f"Error: {exc.message}", "Warning")
                return
        if not argv:
            raise ApiError(422, "the stand-in needs the container's command (images are not run)", "Invalid")
        if argv[0] in ("python", "python3"):
            argv[0] = self.python
        full_env = {**self.base_env, "HOME": str(home), "HOSTNAME": name, **env}
        self._event(
            pod, "Pulled", f'Container image "{container.get("image")}" ignored: the stand-in runs the command locally'
        )
        try:
            run.proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            pod["status"]["phase"] = "Failed"
            self._container_status(
                pod,
                {"terminated": {"exitCode": 128, "reason": "StartError", "message": str(exc), "finishedAt": now_iso()}},
                ready=False,
            )
            run.done = True
            return
        started = now_iso()
        pod["status"].update({"phase": "Running", "startTime": started})
        ready = "False" if port is not None else "True"  # served images: Ready once the port answers
        pod["status"]["conditions"] += [{"type": "Initialized", "status": "True"}] + [
            {"type": t, "status": ready} for t in ("ContainersReady", "Ready")
        ]
        self._container_status(pod, {"running": {"startedAt": started}}, ready=port is None)
        if port is not None:
            threading.Thread(target=self._probe, args=((ns, name), port), daemon=True, name=f"probe-{name}").start()
        self._event(pod, "Started", f"Started container {container['name']}")
        threading.Thread(target=self._pump, args=(run, started), daemon=True, name=f"pod-{name}").start()
        deadline = spec.get("activeDeadlineSeconds")
        if deadline:
            timer = threading.Timer(float(deadline), self._kill, args=(run, "deadline", 0.0))
            timer.daemon = True
            timer.start()

    def _container_status(self, pod: dict, state: dict, *, ready: bool) -> None:
        c = pod["spec"]["containers"][0]
        pod["status"]["containerStatuses"] = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": ready,
                "restartCount": 0,
                "started": "running" in state,
                "state": state,
            }
        ]

    def _pump(self, run: PodRun, started: str) -> None:
        """Copy the process output into the log, then set the pod's final status."""
        assert run.proc is not None and run.proc.stdout is not None
        for line in iter(run.proc.stdout.readline, b""):
            with run.cond:
                run.lines.append((time.time(), line))
                run.cond.notify_all()
        code = run.proc.wait()
        with self.lock:
            pod = self.objects.get(("", "v1", "pods", *run.key))  # the stored version (patches replace it)
            if pod is None:  # deleted: nothing left to update
                with run.cond:
                    run.done = True
                    run.cond.notify_all()
                return
            status = pod["status"]
            if run.killed_for == "deadline":
                status.update(
                    {
                        "phase": "Failed",
                        "reason": "DeadlineExceeded",
                        "message": "Pod was active on the node longer than the specified deadline",
                    }
                )
                reason = "Error"
            else:
                status["phase"] = "Succeeded" if code == 0 else "Failed"
                reason = "Completed" if code == 0 else "Error"
            exit_code = code if code >= 0 else 128 - code  # killed by signal N: 128 + N
            for cond in status["conditions"]:
                if cond["type"] in ("Ready", "ContainersReady"):
                    cond["status"] = "False"
            self._container_status(
                pod,
                {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": reason,
                        "startedAt": started,
                        "finishedAt": now_iso(),
                    }
                },
                ready=False,
            )
            pod["metadata"]["resourceVersion"] = str(next(self._rv))
            if run.killed_for == "deadline":
                self._event(pod, "DeadlineExceeded", status["message"], "Warning")
            self._event(
                pod,
                "Killing" if run.killed_for else "Completed",
                f"container {pod['spec']['containers'][0]['name']} exited with {exit_code}",
            )
        with run.cond:
            run.done = True
            run.cond.notify_all()

    def _kill(self, run: PodRun, why: str, grace: float) -> None:
        proc = run.proc
        if proc is None or proc.poll() is not None:
            run.done = run.done or proc is None
            return
        run.killed_for = run.killed_for or why
        try:
            os.killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
            if grace > 0:
                try:
                    proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # grandchildren that ignored SIGTERM
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        with run.cond:  # the pump thread sets done once the output is drained
            run.cond.wait_for(lambda: run.done, timeout=5)

    def log_lines(self, ns: str, name: str, query: dict):
        """Check the request (ApiError now), then return a generator of log chunks (bytes).

        With ``follow=true`` the generator follows the process until it exits or the pod
        is deleted; ``timestamps``, ``sinceSeconds`` and ``tailLines`` work as on a kubelet.
        """
        with self.lock:
            pod = self.read("", "v1", "pods", ns, name)
            run = self.runs.get((ns, name))
        container = query.get("container")
        names = [c["name"] for c in pod["spec"]["containers"]]
        if container and container not in names:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        state = pod["status"]["containerStatuses"][0]["state"]
        if run is None or "waiting" in state:
            reason = state.get("waiting", {}).get("reason", "ContainerCreating")
            raise ApiError(400, f'container "{names[0]}" in pod "{name}" is waiting to start: {reason}')
        follow = _true(query.get("follow"))
        stamps = _true(query.get("timestamps"))
        since = float(query["sinceSeconds"]) if query.get("sinceSeconds") else None
        tail = int(query["tailLines"]) if query.get("tailLines") else None
        cutoff = time.time() - since if since else None
        return self._follow(run, ns, name, follow, stamps, cutoff, tail)

    def _follow(self, run: PodRun, ns, name, follow, stamps, cutoff, tail):
        with run.cond:
            backlog = [ln for ln in run.lines if cutoff is None or ln[0] >= cutoff]
            if tail is not None:
                backlog = backlog[-tail:] if tail else []
            i = len(run.lines)
        yield from (_fmt(t, line, stamps) for t, line in backlog)
        while follow:
            with run.cond:
                # B023: wait_for calls the predicate here, with this iteration's i
                run.cond.wait_for(lambda: len(run.lines) > i or run.done, timeout=1.0)  # noqa: B023
                new, i, finished = run.lines[i:], len(run.lines), run.done
            yield from (_fmt(t, line, stamps) for t, line in new)
            if finished or (ns, name) not in self.runs or ("", "v1", "pods", ns, name) not in self.objects:
                with run.cond:  # last lines written between the check and now
                    yield from (_fmt(t, line, stamps) for t, line in run.lines[i:])
                return


def _is_ready(pod: dict) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _true(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (Go's strconv.ParseBool)."""
    return (value or "").lower() in ("1", "t", "true")


def _fmt(t: float, line: bytes, stamps: bool) -> bytes:
    if not stamps:
        return line
    dt = datetime.fromtimestamp(t, UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f").encode() + b"000Z " + line


# --- HTTP -------------------------------------------------------------------------------

_PATH = re.compile(
    r"^/(?:api/(?P<cv>v1)|apis/(?P<group>[^/]+)/(?P<gv>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?"  # namespaced collection/object
    r"/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?/?$"
)


class _Handler(BaseHTTPRequestHandler):
    api: KubeAPIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet: tests read server.requests instead
        pass

    def _send_json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        raw = self._raw
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise ApiError(400, f"request body is not JSON: {exc}") from None

    def _dispatch(self, method: str) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(n) if n else b""  # always read: the connection is kept alive
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        self.api.requests.append((method, self.path))
        try:
            if url.path in ("/version", "/version/"):
                return self._send_json(
                    200,
                    {"major": "1", "minor": "35", "gitVersion": "v1.35.0-kubeapi-stand-in", "platform": "linux/amd64"},
                )
            if url.path in ("/api", "/api/"):
                return self._send_json(200, {"kind": "APIVersions", "versions": ["v1"]})
            m = _PATH.match(url.path)
            if not m:
                raise ApiError(404, f"the server could not find the requested resource ({url.path})")
            group = m["group"] or ""
            version = m["cv"] or m["gv"]
            plural, name, sub, ns = m["plural"], m["name"], m["sub"], m["ns"] or ""
            if (group, version, plural) not in RESOURCES:
                raise ApiError(404, f"the server could not find the requested resource ({group}/{version} {plural})")
            _, namespaced = RESOURCES[(group, version, plural)]
            if namespaced and not ns and method != "GET":
                raise ApiError(404, f"{plural} are namespaced: use /namespaces/<namespace>/{plural}")
            if _true(query.get("watch")):
                raise ApiError(405, "watch=true is not implemented by the kubeapi stand-in")
            if sub in UNSUPPORTED_SUBRESOURCES:
                raise ApiError(405, f"{plural}/{sub} (WebSocket/streaming) is not implemented by the kubeapi stand-in")
            self._route(method, group, version, plural, ns, name, sub, query)
        except ApiError as exc:
            self._send_json(exc.code, exc.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _route(self, method, group, version, plural, ns, name, sub, query) -> None:
        api = self.api
        if sub not in (None, "status", "log"):
            raise ApiError(404, f"{plural}/{sub} is not a known subresource")
        if sub == "log":
            if (group, plural) != ("", "pods") or method != "GET":
                raise ApiError(405, "log is a GET subresource of pods")
            return self._stream(api.log_lines(ns, name, query))
        if method == "GET":
            if name:
                return self._send_json(200, api.read(group, version, plural, ns, name))
            return self._send_json(200, api.list_objects(group, version, plural, ns, query))
        if method == "POST" and not name:
            return self._send_json(201, api.create(group, version, plural, ns, self._body() or {}))
        if method == "PUT" and name:
            return self._send_json(200, api.replace(group, version, plural, ns, name, self._body() or {}))
        if method == "PATCH" and name:
            return self._send_json(200, api.patch(group, version, plural, ns, name, self._body() or {}))
        if method == "DELETE" and name:
            body = self._body() or {}
            grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
            return self._send_json(
                200, api.delete(group, version, plural, ns, name, None if grace is None else float(grace))
            )
        if method == "DELETE":
            self._body()
            return self._send_json(200, api.delete_collection(group, version, plural, ns, query))
        raise ApiError(405, f"{method} is not allowed on {self.path}")

    def _stream(self, chunks) -> None:
        """A chunked ``text/plain`` response, flushed line by line (``follow=true``)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def do_GET(self):  # http.server API
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")


class _IngressHandler(BaseHTTPRequestHandler):
    """The Istio ingress gateway's part: route by ``Host`` (``<ksvc>.<namespace>.<domain>``)
    to the served Knative Service's pods; an unknown host gets 404, as from Istio."""

    api: KubeAPIServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _forward(self, method: str) -> None:
        import http.client

        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        host = (self.headers.get("Host") or "").split(":")[0].lower()
        suffix = "." + self.api.ingress_domain
        port = None
        if host.endswith(suffix) and host.count(".") >= 2:
            name, ns = host[: -len(suffix)].split(".", 1)
            port = self.api.ksvc_ports.get((ns, name))
        if port is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "content-length")}
            conn.request(method, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            status = resp.status
            ctype = resp.getheader("Content-Type")
        except OSError as exc:
            data, status, ctype = f"upstream connect error: {exc}".encode(), 503, "text/plain"
        finally:
            conn.close()
        self.send_response(status)
        if ctype:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._forward("GET")

    def do_POST(self):
        self._forward("POST")

    def do_PUT(self):
        self._forward("PUT")
