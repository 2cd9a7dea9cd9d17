"""The Kubernetes + Knative target (2020-era Faasm: the ``knative`` invocation protocol).

Manifests come from ``faasm_tasks/templates`` (Redis queue/state, upload service, the
Knative autoscaler ConfigMap, the Faasm worker Service with min = max scale N, native
per-function Services with container concurrency 1) plus the per-node billing sampler
DaemonSet; images come from the release table :data:`RELEASES`. The benchmark namespace
is the platform's (it holds the steps' RBAC): deploy checks it exists, nothing creates or
deletes it. Everything is
applied with the official ``kubernetes`` client; readiness comes from the Services'
``Ready`` condition (at the current generation) and the pods' ``Ready`` condition,
never from fixed sleeps. Teardown is hard and idempotent: 404 counts as gone, 409 and
API timeouts are retried until a deadline, and it waits for the pods to disappear.

A step reaches the deployment's Services from any pod, without ``pods/exec`` and without
cluster DNS: Redis (queue flush, run-state keys) through a Redis client to the
``redis-queue``/``redis-state`` Services, and the upload server, at the ready addresses
their EndpointSlices list (``--redis-queue-url``/``--redis-state-url``/``--upload-url``
override them); invocations go through the Istio ingress gateway's LoadBalancer address
and its ``http2`` port (or ``--invoke-url``).

The API clients and the Redis client factory are injectable, so tests run against a fake.
"""

from __future__ import annotations

import copy
import logging
import re
import time
from collections.abc import Callable, Sequence
from importlib import resources
from string import Template
from typing import Any

import yaml

from stepkit import StepError

from .base import Endpoints, Target

log = logging.getLogger(__name__)
GROUP, VERSION, PLURAL = "serving.knative.dev", "v1", "services"
MANAGED = {"app.kubernetes.io/managed-by": "faasm-tasks"}
SELECTOR = "app.kubernetes.io/managed-by=faasm-tasks"
KNATIVE_ENV = {
    "REDIS_STATE_HOST": "redis-state",
    "REDIS_QUEUE_HOST": "redis-queue",
    "HOST_TYPE": "knative",
    "LOG_LEVEL": "info",
    "CGROUP_MODE": "off",
    "NETNS_MODE": "off",
    "PYTHON_PRELOAD": "off",
    "TF_CODEGEN": "on",
    "SGD_CODEGEN": "off",
    "PYTHON_CODEGEN": "off",
    "MAX_IN_FLIGHT_RATIO": "1",
    "NO_SCHEDULER": "1",
    "MAX_WORKERS_PER_FUNCTION": "4",
    "THREADS_PER_WORKER": "100",
    "BOUND_TIMEOUT": "30000",
    "UNBOUND_TIMEOUT": "600000",
    "GLOBAL_MESSAGE_TIMEOUT": "120000",
    "ENDPOINT_INTERFACE": "eth0",
    "FUNCTION_STORAGE": "fileserver",
    "FILESERVER_URL": "http://upload:8002",
}


#: Image names and tags per Faasm release, selected with ``--release``. ``0.1.3`` is the release the
#: experiments manual (faasm/faasm ``docs/experiments.md`` @ 37d81e8a9) deploys: ``faasm/knative-worker``
#: and ``faasm/knative-native-<func>`` (``knative.deploy`` / ``deploy-native``), ``faasm/redis`` and
#: ``faasm/upload`` from ``deploy/k8s/{common,bare-metal}``. ``0.6.7`` is the later layout
#: (``deploy/k8s/worker.yml`` @ f65dfee03): the worker image renamed ``faasm/worker``. ``{func}`` is
#: the native function (``reuters_svm``, ``image``, ``python``).
RELEASES: dict[str, dict[str, str]] = {
    "0.1.3": {
        "worker": "faasm/knative-worker:0.1.3",
        "redis": "faasm/redis:0.1.3",
        "upload": "faasm/upload:0.1.3",
        "native": "faasm/knative-native-{func}:0.1.3",
    },
    "0.6.7": {
        "worker": "faasm/worker:0.6.7",
        "redis": "faasm/redis:0.6.7",
        "upload": "faasm/upload:0.6.7",
        "native": "faasm/knative-native-{func}:0.6.7",
    },
}
DEFAULT_RELEASE = "0.1.3"
#: The upload pod's environment (``deploy/k8s/bare-metal/upload.yml`` @ 37d81e8a9 plus the Redis hosts,
#: without which state uploads would miss redis-state, and isolation off as on the workers).
UPLOAD_ENV = {
    "FUNCTION_STORAGE": "local",
    "LOG_LEVEL": "info",
    "REDIS_STATE_HOST": "redis-state",
    "REDIS_QUEUE_HOST": "redis-queue",
    "CGROUP_MODE": "off",
    "NETNS_MODE": "off",
}
BILLING_NAME = "faasm-billing"


def release_images(release: str, registry: str | None = None) -> dict[str, str]:
    """The images of ``release``; ``registry`` replaces the ``faasm`` organisation (a mirror)."""
    if release not in RELEASES:
        raise StepError(f"--release {release!r} is not one of {', '.join(RELEASES)}")
    imgs = dict(RELEASES[release])
    if registry and registry != "faasm":
        imgs = {k: registry.rstrip("/") + "/" + v.split("/", 1)[1] for k, v in imgs.items()}
    return imgs


def label_value(s: str) -> str:
    """A valid label value (<= 63 chars of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", s)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", v) or "run"


def service_name(func: str) -> str:
    return "faasm-" + func.replace("_", "-")


def _template(name: str, values: dict[str, Any]) -> list[dict[str, Any]]:
    text = resources.files("faasm_tasks").joinpath(f"templates/{name}").read_text()
    return [d for d in yaml.safe_load_all(Template(text).substitute(values)) if d]


def _env(d: dict[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in d.items()]


def render(
    plan,
    *,
    namespace: str = "faasm",
    run_id: str = "run",
    release: str = DEFAULT_RELEASE,
    registry: str | None = None,
    redis_image: str | None = None,
    upload_service_type: str = "ClusterIP",
    invoke_host: str = "istio-ingressgateway.istio-system",
    invoke_port: int = 80,
    include_common: bool = True,
    billing: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """All manifests for an experiment's deployment, in apply order.

    The benchmark namespace is not among them: the platform provides it (with the RBAC of
    ``deploy/rbac/faasm-benchmark.yaml``); ``deploy`` checks that it exists. ``billing``
    (``{"image", "command"}``) adds the per-node billing sampler DaemonSet."""
    imgs = release_images(release, registry)
    labels = {**MANAGED, "faasm-tasks/run-id": label_value(run_id)}
    v = {
        "namespace": namespace,
        "redis_image": redis_image or imgs["redis"],
        "upload_image": imgs["upload"],
        "upload_service_type": upload_service_type,
    }
    docs: list[dict[str, Any]] = []
    if include_common:
        docs += _template("redis.yaml", v) + _template("upload.yaml", v)
        docs += _template("autoscaler.yaml", v)
    dep = plan.deployment
    worker = _ksvc(
        v,
        "faasm-worker",
        imgs["worker"],
        int(dep["worker_replicas"]),
        concurrency=0,
        scale_to_zero="false",
        stable_window="120s",
        env=KNATIVE_ENV,
    )
    docs.append(worker)
    for svc in dep.get("native_services", []):
        fname = "python" if plan.experiment.get("python") else svc["function"]
        image = imgs["native"].format(func=fname)
        env = {
            **KNATIVE_ENV,
            "COLD_START_DELAY_MS": str(int(plan.params.get("cold_start_delay_ms", 800))),
            "FAASM_INVOKE_HOST": invoke_host,
            "FAASM_INVOKE_PORT": str(invoke_port),
        }
        docs.append(
            _ksvc(
                v,
                service_name(fname),
                image,
                int(svc["replicas"]),
                concurrency=1,
                scale_to_zero="true",
                stable_window="20s",
                env=env,
            )
        )
    for d in docs:
        md = d.setdefault("metadata", {})
        if d["kind"] != "ConfigMap" or md.get("namespace") == namespace:
            md["labels"] = {**(md.get("labels") or {}), **labels}
        if d["kind"] == "Service" and d["apiVersion"].startswith(GROUP):
            tmd = d["spec"]["template"]["metadata"]
            tmd["labels"] = {**(tmd.get("labels") or {}), **labels}
        if d["kind"] == "Pod" and d["metadata"]["name"] == "upload":
            d["spec"]["containers"][0]["env"] = _env(UPLOAD_ENV)
    if billing:
        docs.append(
            billing_daemonset(
                namespace,
                run_id,
                billing["image"],
                billing["command"],
                billing.get("node_selector"),
                billing.get("secret"),
            )
        )
    return docs


def billing_daemonset(
    namespace: str,
    run_id: str,
    image: str,
    command: list[str],
    node_selector: dict[str, str] | None = None,
    secret: str | None = None,
) -> dict[str, Any]:
    """The per-node billing sampler (the manual samples every host of its billing inventory):
    one pod per node, on the nodes ``node_selector`` picks (the experiment's node pool; all
    schedulable nodes without it), labelled with the run; it writes its samples under the
    run's results prefix (``command``)."""
    labels = {**MANAGED, "faasm-tasks/run-id": label_value(run_id), "app.kubernetes.io/name": BILLING_NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": BILLING_NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {
                "matchLabels": {
                    "app.kubernetes.io/name": BILLING_NAME,
                    "faasm-tasks/run-id": labels["faasm-tasks/run-id"],
                }
            },
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    # host network and PID: the node's counters, not the pod's (psutil reads /proc)
                    "hostNetwork": True,
                    "hostPID": True,
                    "terminationGracePeriodSeconds": 10,
                    **({"nodeSelector": dict(node_selector)} if node_selector else {}),
                    "containers": [
                        {
                            "name": "billing",
                            "image": image,
                            "command": list(command),
                            "env": [
                                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                                {"name": "PYTHONUNBUFFERED", "value": "1"},
                            ],
                            # storage credentials, as the step pods get them (a Secret in this namespace)
                            **({"envFrom": [{"secretRef": {"name": secret}}]} if secret else {}),
                            "resources": {
                                "requests": {"cpu": "50m", "memory": "64Mi"},
                                "limits": {"cpu": "200m", "memory": "256Mi"},
                            },
                        }
                    ],
                },
            },
        },
    }


def _ksvc(v, name, image, replicas, *, concurrency, scale_to_zero, stable_window, env) -> dict[str, Any]:
    [doc] = _template(
        "ksvc.yaml",
        {
            **v,
            "name": name,
            "image": image,
            "replicas": replicas,
            "concurrency": concurrency,
            "scale_to_zero": scale_to_zero,
            "stable_window": stable_window,
        },
    )
    doc["spec"]["template"]["spec"]["containers"][0]["env"] = _env(env)
    return doc


CONFLICT = object()  # sentinel: a create found the object already there


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def _retryable(exc: BaseException) -> bool:
    st = _status(exc)
    if st is not None:
        return st in (0, 409, 429, 500, 502, 503, 504)
    name = type(exc).__name__
    return isinstance(exc, (TimeoutError, ConnectionError)) or name in (
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "MaxRetryError",
        "ProtocolError",
        "NewConnectionError",
    )


class KnativeTarget(Target):
    name = "knative"

    def __init__(
        self,
        *,
        namespace: str = "faasm",
        run_id: str = "run",
        core=None,
        custom=None,
        redis_fn: Callable[[str], Any] | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        release: str = DEFAULT_RELEASE,
        registry: str | None = None,
        invoke_url: str | None = None,
        upload_url: str | None = None,
        domain: str = "faasm.example.com",
        protocol: str = "knative",
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 2.0,
        apps=None,
        billing: dict[str, Any] | None = None,
        discovery=None,
        redis_urls: dict[str, str] | None = None,
        client_hosts: tuple[str, ...] = (),
        client_command: str | None = None,
    ):
        self.ns, self.run_id = namespace, run_id
        self._core, self._custom, self._redis_fn, self._discovery = core, custom, redis_fn, discovery
        self.redis_urls = {k: v for k, v in (redis_urls or {}).items() if v}  # Service name -> redis:// URL
        self._redis_clients: dict[str, Any] = {}
        self.kubeconfig, self.context = kubeconfig, context
        self.release, self.registry = release, registry
        self.images = release_images(release, registry)
        self._apps = apps
        self.billing = billing  # {"image", "command", "node_selector"} or None: no billing DaemonSet
        self.invoke_url, self.upload_url, self.domain, self.protocol = invoke_url, upload_url, domain, protocol
        self.sleep, self.clock, self.poll_s = sleep, clock, poll_s
        self.request_timeout = 30
        # load clients on other hosts (the load spec's client_hosts), one each; the controller
        # stays in the run step's process (docs/faasm.md, "Load from several client hosts")
        self.client_hosts = tuple(h.strip() for h in client_hosts if h.strip())
        self.client_command = client_command
        #: told each Knative Service's name before :meth:`deploy` creates it (the deploy step announces it)
        self.on_service: Callable[[str], None] | None = None

    @classmethod
    def from_args(cls, args) -> KnativeTarget:
        return cls(
            namespace=args.namespace,
            run_id=args.run_id,
            kubeconfig=args.kubeconfig,
            context=args.context,
            release=args.release,
            registry=args.image_registry,
            invoke_url=args.invoke_url,
            upload_url=args.upload_url,
            domain=args.domain,
            protocol=args.protocol or "knative",
            billing=billing_spec(args),
            redis_urls={
                "redis-queue": getattr(args, "redis_queue_url", None),
                "redis-state": getattr(args, "redis_state_url", None),
            },
            client_hosts=tuple((getattr(args, "client_hosts", None) or "").split(",")),
            client_command=getattr(args, "client_command", None),
        )

    # ---------------------------------------------------------------- clients
    def _load_config(self) -> None:
        from kubernetes import config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            try:
                config.load_kube_config(config_file=self.kubeconfig, context=self.context)
            except (config.ConfigException, FileNotFoundError) as exc:
                raise StepError(f"no Kubernetes configuration: {exc}") from exc

    def _api(self, attr: str, cls: str):
        """The injected client in ``attr``, else one ``kubernetes.client.<cls>`` made on first use."""
        if getattr(self, attr) is None:
            from kubernetes import client

            self._load_config()
            setattr(self, attr, getattr(client, cls)())
        return getattr(self, attr)

    @property
    def core(self):
        return self._api("_core", "CoreV1Api")

    @property
    def apps(self):
        return self._api("_apps", "AppsV1Api")

    @property
    def custom(self):
        return self._api("_custom", "CustomObjectsApi")

    @property
    def discovery(self):
        return self._api("_discovery", "DiscoveryV1Api")

    def service_address(self, name: str, port_name: str | None = None, deadline: float | None = None) -> str:
        """``host:port`` of a ready endpoint of Service ``name`` (its EndpointSlices): reachable
        from any pod of the cluster, with no cluster DNS and no exec. StepError when none is ready."""
        deadline = deadline if deadline is not None else self.clock() + 30
        res = self._call(
            f"list endpointslices of {name}",
            lambda: self.discovery.list_namespaced_endpoint_slice(
                self.ns, label_selector=f"kubernetes.io/service-name={name}"
            ),
            deadline,
            absent_ok=True,
        )
        for sl in getattr(res, "items", None) or []:
            ports = [p for p in (sl.ports or []) if port_name is None or p.name == port_name] or (sl.ports or [])
            for ep in sl.endpoints or []:
                cond = ep.conditions
                if ports and ep.addresses and (cond is None or cond.ready is not False):
                    return f"{ep.addresses[0]}:{ports[0].port}"
        raise StepError(
            f"Service {self.ns}/{name} has no ready endpoint (is the deployment up? deploy and wait-ready first)"
        )

    def redis(self, service: str):
        """A Redis client for ``redis-queue`` or ``redis-state`` (database 0, as Faasm uses it)."""
        if service not in self._redis_clients:
            if self._redis_fn is not None:
                self._redis_clients[service] = self._redis_fn(service)
            else:
                import redis  # the knative target's steps only

                url = self.redis_urls.get(service) or f"redis://{self.service_address(service)}/0"
                self._redis_clients[service] = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=10)
        return self._redis_clients[service]

    # ---------------------------------------------------------------- retry helper
    def _call(
        self, what: str, fn: Callable[[], Any], deadline: float, *, absent_ok: bool = False, conflict_ok: bool = False
    ) -> Any:
        """Call the API; 404 -> None when ``absent_ok``; 409 -> CONFLICT when ``conflict_ok``
        (a create that finds the object); otherwise 409/5xx/timeouts are retried until the deadline."""
        delay = 0.5
        while True:
            try:
                return fn()
            except StepError:
                raise
            except Exception as exc:  # classified below
                if _status(exc) == 404 and absent_ok:
                    return None
                if _status(exc) == 409 and conflict_ok:
                    return CONFLICT
                if not _retryable(exc) or self.clock() + delay > deadline:
                    raise StepError(f"{what}: {type(exc).__name__}: {getattr(exc, 'reason', exc)}") from exc
                log.warning("%s: %s, retrying", what, type(exc).__name__)
                self.sleep(delay)
                delay = min(delay * 2, 8.0)

    # ---------------------------------------------------------------- deploy
    def render(self, plan) -> list[dict[str, Any]]:
        return render(
            plan,
            namespace=self.ns,
            run_id=self.run_id,
            release=self.release,
            registry=self.registry,
            billing=self.billing if plan.experiment.get("billing") else None,
        )

    def _apply(self, doc: dict[str, Any], deadline: float) -> str:
        kind, md = doc["kind"], doc["metadata"]
        name, ns = md["name"], md.get("namespace", self.ns)
        if doc["apiVersion"].startswith(GROUP):
            r = self._call(
                f"create ksvc {name}",
                lambda: self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, doc),
                deadline,
                conflict_ok=True,
            )
            if r is not CONFLICT:
                return "created"
            cur = self._call(
                f"get ksvc {name}",
                lambda: self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name),
                deadline,
            )
            body = copy.deepcopy(doc)
            body["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
            self._call(
                f"replace ksvc {name}",
                lambda: self.custom.replace_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, body),
                deadline,
            )
            return "replaced"
        if kind == "ConfigMap":
            patched = self._call(
                f"patch configmap {ns}/{name}",
                lambda: self.core.patch_namespaced_config_map(name, ns, {"data": doc["data"]}),
                deadline,
                absent_ok=True,
            )
            if patched is None:
                self._call(
                    f"create configmap {ns}/{name}",
                    lambda: self.core.create_namespaced_config_map(ns, doc),
                    deadline,
                    conflict_ok=True,
                )
                return "created"
            return "patched"
        create = {
            "DaemonSet": lambda: self.apps.create_namespaced_daemon_set(ns, doc),
            "Pod": lambda: self.core.create_namespaced_pod(ns, doc),
            "Service": lambda: self.core.create_namespaced_service(ns, doc),
        }[kind]
        r = self._call(f"create {kind} {name}", create, deadline, conflict_ok=True)
        return "exists" if r is CONFLICT else "created"  # pods/services are kept as they are

    def check_namespace(self, deadline: float) -> None:
        """The benchmark namespace is the platform's (it holds the steps' Role and RoleBinding):
        never created or deleted here. Missing -> exit 2 naming it."""
        ns = self._call(
            f"read namespace {self.ns}", lambda: self.core.read_namespace(self.ns), deadline, absent_ok=True
        )
        if ns is None:
            raise StepError(
                f"benchmark namespace {self.ns!r} does not exist: the platform provides it with the "
                f"steps' RBAC (deploy/rbac/faasm-benchmark.yaml; see docs/deploy.md); --namespace "
                f"names another"
            )

    def deploy(self, plan, adopt: Sequence[str] = ()) -> dict[str, Any]:
        """Apply the plan's manifests. Each Knative Service's name goes to :attr:`on_service`
        before it is created (the deploy step announces it, so a retry of its task knows it even
        when this process is killed mid-create). ``adopt``: the Services an earlier try of the
        same deploy created (``deploy --adopt-services``): one this plan deploys again is
        replaced in place (``adopted``: the same name, never a second Service), one it no longer
        deploys is deleted (``retired``), so no earlier try's Service is left running unowned."""
        deadline = self.clock() + 300
        self.check_namespace(deadline)
        out = []
        docs = self.render(plan)
        for doc in docs:
            name = doc["metadata"]["name"]
            if doc["apiVersion"].startswith(GROUP) and self.on_service is not None:
                self.on_service(name)
            action = self._apply(doc, deadline)
            if doc["apiVersion"].startswith(GROUP) and name in adopt:
                action = "adopted" if action == "replaced" else f"{action} (adopted, was gone)"
            out.append({"kind": doc["kind"], "name": name, "action": action})
        deployed = {d["metadata"]["name"] for d in docs if d["apiVersion"].startswith(GROUP)}
        for name in (n for n in adopt if n not in deployed):
            r = self._call(
                f"delete ksvc {name}",
                lambda n=name: self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, n),
                deadline,
                absent_ok=True,
            )
            out.append({"kind": "Service", "name": name, "action": "retired" if r is not None else "retired (gone)"})
        return {"status": "applied", "resources": out, **({"adopted": list(adopt)} if adopt else {})}

    # ---------------------------------------------------------------- readiness
    def _ksvcs(self, deadline: float) -> list[dict[str, Any]]:
        res = self._call(
            "list ksvcs",
            lambda: self.custom.list_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, label_selector=SELECTOR),
            deadline,
            absent_ok=True,
        )
        return list((res or {}).get("items", []))

    def _pods(self, selector: str, deadline: float) -> list[Any]:
        res = self._call(
            "list pods",
            lambda: self.core.list_namespaced_pod(self.ns, label_selector=selector),
            deadline,
            absent_ok=True,
        )
        return list(getattr(res, "items", None) or [])

    @staticmethod
    def _pod_ready(p) -> bool:
        if getattr(p.metadata, "deletion_timestamp", None):
            return False
        conds = (getattr(p.status, "conditions", None) or []) if p.status else []
        return any(c.type == "Ready" and c.status == "True" for c in conds)

    @staticmethod
    def ksvc_ready(obj: dict[str, Any]) -> tuple[bool, str]:
        st = obj.get("status") or {}
        gen = (obj.get("metadata") or {}).get("generation")
        if gen is not None and st.get("observedGeneration") != gen:
            return False, f"observedGeneration {st.get('observedGeneration')} != generation {gen}"
        for c in st.get("conditions") or []:
            if c.get("type") == "Ready":
                return c.get(
                    "status"
                ) == "True", f"Ready={c.get('status')} {c.get('reason', '')} {c.get('message', '')}".strip()
        return False, "no Ready condition yet"

    def _not_ready(self, deadline: float) -> list[str]:
        waiting = []
        for role in ("redis-queue", "redis-state", "upload"):
            pods = self._pods(f"role={role}", deadline)
            if not any(self._pod_ready(p) for p in pods):
                waiting.append(f"pod {role} not Ready")
        ksvcs = self._ksvcs(deadline)
        if not ksvcs:
            waiting.append("no Knative services")
        for k in ksvcs:
            name = k["metadata"]["name"]
            ok, why = self.ksvc_ready(k)
            if not ok:
                waiting.append(f"ksvc {name}: {why}")
                continue
            want = int(k["spec"]["template"]["metadata"]["annotations"].get("autoscaling.knative.dev/minScale", 1))
            ready = sum(self._pod_ready(p) for p in self._pods(f"serving.knative.dev/service={name}", deadline))
            if ready < want:
                waiting.append(f"ksvc {name}: {ready}/{want} pods Ready")
        return waiting

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        t0 = self.clock()
        deadline = t0 + timeout_s
        while True:
            waiting = self._not_ready(deadline)
            if not waiting:
                return {"ready": True, "waited_s": round(self.clock() - t0, 3)}
            if self.clock() + self.poll_s > deadline:
                raise StepError(f"not ready after {timeout_s}s: " + "; ".join(waiting))
            self.sleep(self.poll_s)

    def soft_restart(self, timeout_s: float) -> dict[str, Any]:
        deadline = self.clock() + timeout_s
        names = [k["metadata"]["name"] for k in self._ksvcs(deadline)]
        if "faasm-worker" in names:
            self.flush_queue()
        old = []
        for name in names:
            for p in self._pods(f"serving.knative.dev/service={name}", deadline):
                old.append(p.metadata.name)
                self._call(
                    f"delete pod {p.metadata.name}",
                    lambda n=p.metadata.name: self.core.delete_namespaced_pod(n, self.ns, grace_period_seconds=0),
                    deadline,
                    absent_ok=True,
                )
        while True:  # the old pods must be gone (or terminating) before readiness means anything
            left = [
                p.metadata.name
                for n in names
                for p in self._pods(f"serving.knative.dev/service={n}", deadline)
                if p.metadata.name in old and not getattr(p.metadata, "deletion_timestamp", None)
            ]
            if not left:
                break
            if self.clock() + self.poll_s > deadline:
                raise StepError(f"pods not deleted: {left}")
            self.sleep(self.poll_s)
        return {"deleted_pods": old, **self.wait_ready(max(1.0, deadline - self.clock()))}

    # ---------------------------------------------------------------- endpoints
    def endpoints(self) -> Endpoints:
        inv, up = self.invoke_url, self.upload_url
        if not inv or not up:
            deadline = self.clock() + 30
            if not inv:
                svc = self._call(
                    "get istio ingress",
                    lambda: self.core.read_namespaced_service("istio-ingressgateway", "istio-system"),
                    deadline,
                    absent_ok=True,
                )
                inv = _lb_url(svc, 80, ("http2", "http"))
            if not up:
                up = _lb_url(
                    self._call(
                        "get upload service",
                        lambda: self.core.read_namespaced_service("upload", self.ns),
                        deadline,
                        absent_ok=True,
                    ),
                    8002,
                    ("http",),
                )
                if not up:  # a ClusterIP Service (the default): its ready endpoint, from inside the cluster
                    try:
                        up = "http://" + self.service_address("upload", "http", deadline)
                    except StepError:
                        up = None
        if not inv or not up:
            raise StepError(
                "knative target needs --invoke-url (no LoadBalancer address on "
                "istio-system/istio-ingressgateway) and --upload-url (no LoadBalancer address or "
                f"ready endpoint of {self.ns}/upload)"
            )
        extra: dict[str, Any] = {}
        if self.client_hosts:
            extra["client_hosts"] = list(self.client_hosts)
            if self.client_command:
                extra["client_command"] = self.client_command
        return Endpoints(inv.rstrip("/") + "/", up, protocol=self.protocol, domain=self.domain, extra=extra)

    # ---------------------------------------------------------------- redis
    def flush_queue(self) -> int:
        r = self.redis("redis-queue")
        n = int(r.dbsize())
        r.flushall()
        return n

    def _scan(self, pattern: str) -> list[str]:
        return sorted(
            {
                k.decode() if isinstance(k, bytes) else str(k)
                for k in self.redis("redis-state").scan_iter(match=pattern, count=1000)
            }
        )

    def _state_keys(self, patterns: list[str]) -> list[str]:
        """The run-state keys present: glob patterns scanned, plain names checked."""
        r = self.redis("redis-state")
        keys: list[str] = []
        for pat in patterns:
            found = self._scan(pat) if any(c in pat for c in "*?[") else ([pat] if r.exists(pat) else [])
            keys += [k for k in found if k not in keys]
        return keys

    def delete_state_keys(self, patterns: list[str]) -> int:
        keys = self._state_keys(patterns)
        r = self.redis("redis-state")
        return sum(int(r.delete(*keys[i : i + 200])) for i in range(0, len(keys), 200))

    def _pod_exists(self, name: str, deadline: float) -> bool:
        return (
            self._call(
                f"read pod {name}", lambda: self.core.read_namespaced_pod(name, self.ns), deadline, absent_ok=True
            )
            is not None
        )

    # ---------------------------------------------------------------- teardown
    def teardown(self, run_state_keys: list[str], timeout_s: float, full: bool = False) -> dict[str, Any]:
        deadline = self.clock() + timeout_s
        rep: dict[str, Any] = {"deleted": [], "absent": [], "incomplete": []}
        for pod, what, fn in (
            ("redis-queue", "queue_keys_flushed", self.flush_queue),
            ("redis-state", "state_keys_deleted", lambda: self.delete_state_keys(run_state_keys)),
        ):
            if not self._pod_exists(pod, deadline):  # API errors (e.g. Forbidden) surface here
                continue
            try:
                rep[what] = fn()
            except Exception as exc:  # noqa: BLE001 - Redis failures are reported, teardown goes on
                msg = f"{pod} cleanup failed: {type(exc).__name__}: {exc}"
                if full:  # its data goes with the pod, deleted below
                    rep.setdefault("notes", []).append(msg + " (the pod is deleted with its data)")
                else:
                    rep["incomplete"].append(msg)
        names = [k["metadata"]["name"] for k in self._ksvcs(deadline)]
        for name in names:
            r = self._call(
                f"delete ksvc {name}",
                lambda n=name: self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, n),
                deadline,
                absent_ok=True,
            )
            (rep["deleted"] if r is not None else rep["absent"]).append(f"ksvc/{name}")
        if full:
            for kind, name, fn in [
                ("pod", "upload", self.core.delete_namespaced_pod),
                ("pod", "redis-queue", self.core.delete_namespaced_pod),
                ("pod", "redis-state", self.core.delete_namespaced_pod),
                ("service", "upload", self.core.delete_namespaced_service),
                ("service", "redis-queue", self.core.delete_namespaced_service),
                ("service", "redis-state", self.core.delete_namespaced_service),
            ]:
                r = self._call(f"delete {kind} {name}", lambda f=fn, n=name: f(n, self.ns), deadline, absent_ok=True)
                (rep["deleted"] if r is not None else rep["absent"]).append(f"{kind}/{name}")
        # wait until the services' pods are gone
        while True:
            left = [p.metadata.name for p in self._pods("serving.knative.dev/service", deadline)]
            if full:
                left += [p.metadata.name for p in self._pods("app=faasm", deadline)]
            if not left:
                break
            if self.clock() + self.poll_s > deadline:
                rep["incomplete"].append(f"pods still present after {timeout_s}s: {sorted(set(left))}")
                break
            self.sleep(self.poll_s)
        billing = self.stop_billing(max(1.0, deadline - self.clock()))
        rep["billing"] = billing
        if billing.get("left"):
            rep["incomplete"].append(f"billing sampler pods still present: {billing['left']}")
        return rep

    # ---------------------------------------------------------------- billing DaemonSet
    def _billing_pods(self, deadline: float) -> list[str]:
        sel = f"app.kubernetes.io/name={BILLING_NAME},faasm-tasks/run-id={label_value(self.run_id)}"
        return [p.metadata.name for p in self._pods(sel, deadline)]

    def _billing_sets(self, deadline: float) -> list[str]:
        res = self._call(
            "list daemonsets",
            lambda: self.apps.list_namespaced_daemon_set(
                self.ns, label_selector=f"{SELECTOR},app.kubernetes.io/name={BILLING_NAME}"
            ),
            deadline,
            absent_ok=True,
        )
        return [d.metadata.name for d in (getattr(res, "items", None) or [])]

    def stop_billing(self, timeout_s: float) -> dict[str, Any]:
        """Delete the billing DaemonSet (its samplers write their last samples on SIGTERM) and
        wait until its pods are gone. Idempotent; ``left`` lists pods that did not go."""
        deadline = self.clock() + timeout_s
        out: dict[str, Any] = {"deleted": [], "left": []}
        for name in self._billing_sets(deadline):
            r = self._call(
                f"delete daemonset {name}",
                lambda n=name: self.apps.delete_namespaced_daemon_set(n, self.ns, propagation_policy="Foreground"),
                deadline,
                absent_ok=True,
            )
            if r is not None:
                out["deleted"].append(f"daemonset/{name}")
        while True:
            left = self._billing_pods(deadline)
            if not left:
                return out
            if self.clock() + self.poll_s > deadline:
                out["left"] = left
                return out
            self.sleep(self.poll_s)

    def verify_clean(self, run_state_keys: list[str], full: bool = False) -> dict[str, Any]:
        """What a teardown left: Knative Services and their pods, billing, run keys in Redis;
        with ``full`` (a ``teardown --full``) also the Redis and upload pods and Services."""
        deadline = self.clock() + 60
        problems = []
        ksvcs = [k["metadata"]["name"] for k in self._ksvcs(deadline)]
        if ksvcs:
            problems.append(f"Knative services left: {ksvcs}")
        pods = [p.metadata.name for p in self._pods("serving.knative.dev/service", deadline)]
        if pods:
            problems.append(f"service pods left: {pods}")
        sets = self._billing_sets(deadline)
        if sets:
            problems.append(f"billing DaemonSets left: {sets}")
        billing_pods = self._billing_pods(deadline)
        if billing_pods:
            problems.append(f"billing sampler pods left: {billing_pods}")
        if full:
            common = [p.metadata.name for p in self._pods("app=faasm", deadline)]
            if common:
                problems.append(f"Redis/upload pods left: {common}")
            for name in ("upload", "redis-queue", "redis-state"):
                if (
                    self._call(
                        f"read service {name}",
                        lambda n=name: self.core.read_namespaced_service(n, self.ns),
                        deadline,
                        absent_ok=True,
                    )
                    is not None
                ):
                    problems.append(f"service {name} left")
        if self._pod_exists("redis-queue", deadline):
            n = int(self.redis("redis-queue").dbsize())
            if n:
                problems.append(f"redis-queue holds {n} keys")
        if self._pod_exists("redis-state", deadline):
            left = self._state_keys(run_state_keys)
            if left:
                problems.append(f"run state keys left: {left[:20]}")
        return {"clean": not problems, "problems": problems, "namespace": self.ns}

    def describe(self) -> dict[str, Any]:
        return {
            "target": "knative",
            "namespace": self.ns,
            "release": self.release,
            "images": dict(self.images),
            **({"client_hosts": list(self.client_hosts)} if self.client_hosts else {}),
        }


def billing_spec(args) -> dict[str, Any] | None:
    """The billing DaemonSet's settings from the step's flags; None without ``--billing-image``."""
    image = getattr(args, "billing_image", None)
    if not image:
        return None
    from ..common import run_date  # common imports the targets' callers

    selector = {}
    for item in getattr(args, "billing_node_selector", None) or []:
        if "=" not in item:
            raise StepError(f"--billing-node-selector expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        selector[k] = v
    try:
        date = ["--date", run_date(args)]
    except StepError:  # a bad --date must not stop a teardown (which needs no sampler command)
        date = []
    command = [
        "python",
        "-m",
        "faasm_tasks",
        "billing-agent",
        "--target",
        "knative",
        "--run-id",
        args.run_id,
        "--results",
        args.results,
        *date,
        "--interval",
        str(getattr(args, "billing_interval", 2.0)),
    ]
    return {
        "image": image,
        "command": command,
        "node_selector": selector,
        "secret": getattr(args, "billing_secret", None) or None,
    }


def _lb_url(svc, port: int, names: tuple[str, ...] = ()) -> str | None:
    """``http://<LoadBalancer address>:<port>``: the Service's port named one of ``names`` (Istio's
    gateway: ``http2``), else ``port``. None without a LoadBalancer address."""
    try:
        ing = svc.status.load_balancer.ingress[0]
    except (AttributeError, IndexError, TypeError):
        return None
    for p in (getattr(svc.spec, "ports", None) or []) if getattr(svc, "spec", None) else []:
        if p.name in names:
            port = p.port
            break
    return f"http://{ing.ip or ing.hostname}:{port}"
