"""``HousePodOperator``: a ``KubernetesPodOperator`` that runs ``python -m <package> <argv...>``.

Every pod default of the house lives in :func:`pod_kwargs` (values from
:mod:`house.config`); this module is imported only when the runner is ``kubernetes``,
so DAG files parse without loading the Kubernetes provider in local mode.

External ids across a retry (the contract of :mod:`house.external`, as the local runner keeps it):
the operator reads the pod's log as it runs (``get_logs``), and a provider callback
(``KubernetesPodOperatorCallback.progress_callback``) hands it every line, so each id the step
announces reaches the task's state store while the pod runs. A later try of the task instance
then meets one of two cases:

* the earlier try's pod still runs (its worker died; the pod did not): the provider reattaches to
  it (``durable``, the pod's identity in the same state store, or its labels) and follows its
  log from the start. The pod is adopted as it is: the step that announced the ids goes on, so
  nothing is passed back, and the ids it announced are kept again;
* that pod is gone or finished (the try failed, was stopped and its pod deleted, or the pod
  died): a new pod is created, with ``<adopt_flag> id,id,...`` appended to its arguments, so the
  step adopts what the earlier try started instead of submitting again.

A line reaches the callback once the next one begins (the provider joins continuation lines):
``stepkit.external.announce`` prints a second line right after each announcement for this.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.cncf.kubernetes.callbacks import KubernetesPodOperatorCallback
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from kubernetes.client import models as k8s

from house import config as house_config
from house.argv import drop_omitted
from house.bundle import bundle_env
from house.external import KeptIds, announced_ids
from house.links import StepReportLink


class HousePodOperator(KubernetesPodOperator):
    """A pod running one step of a task package: ``cmds=["python", "-m", package]``, ``arguments=argv``.

    ``argv`` (templated through ``arguments``; may hold XComArgs) and ``env`` (extra
    environment variables, same as the local runner's) are the per-item values; the run's bundle
    and version (:mod:`house.bundle`) are added when the templates are rendered, so
    ``HousePodOperator.partial(...).expand(argv=...)`` maps a step. ``map_label``: a mapped
    instance's label in the UI, as for the local runner (:func:`house.mapped_items`).
    ``adopt_flag``: the step's flag taking the ids an earlier try announced (module docstring).
    """

    operator_extra_links = (*KubernetesPodOperator.operator_extra_links, StepReportLink())

    def __init__(
        self,
        *,
        package: str,
        argv: Sequence[Any] | Any = (),
        env: dict[str, Any] | None = None,
        preset: str = "cpu-small",
        map_label: str | None = None,
        adopt_flag: str | None = None,
        **kwargs: Any,
    ):
        if isinstance(argv, (str, bytes)):
            raise TypeError(f"argv must be a list of arguments, not a string: {argv!r}")
        kwargs.setdefault("cmds", ["python", "-m", package])
        if env:
            extra = [k8s.V1EnvVar(name=str(k), value=str(v)) for k, v in env.items()]
            kwargs["env_vars"] = [*(kwargs.get("env_vars") or []), *extra]
        super().__init__(arguments=argv, **kwargs)
        self.package = package
        self.preset = preset
        self.map_label = map_label
        self.adopt_flag = adopt_flag
        self._kept: KeptIds | None = None
        self._adopt_args: list[str] = []

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)
        self.arguments = drop_omitted(self.arguments)  # an empty optional flag is no argument at all
        # the run's bundle and version (house.bundle), recorded in the step's marker: set here, where
        # the task's context is, replacing any of the same name (the pod names the code that ran)
        bundle = bundle_env(context)
        kept = [e for e in (self.env_vars or []) if getattr(e, "name", None) not in bundle]
        self.env_vars = [*kept, *(k8s.V1EnvVar(name=k, value=v) for k, v in bundle.items())]

    def execute(self, context: Any) -> Any:
        self._kept = KeptIds(context.get("task_state_store"), self.log)
        # for a new pod only: a reattached pod (get_or_create_pod) is the step that announced them
        self._adopt_args = self._kept.adopt_args(self.adopt_flag)
        # before the provider's pod manager exists (it takes the list when it is made)
        mine = [c for c in self.callbacks if not (isinstance(c, type) and issubclass(c, _AnnouncementReader))]
        self.callbacks = [*mine, _announcement_reader(self)]
        return super().execute(context)

    def build_pod_request_obj(self, context: Any = None, *, dry_run: bool = False) -> k8s.V1Pod:
        pod = super().build_pod_request_obj(context, dry_run=dry_run)
        if self._adopt_args:  # the new pod of a retry: the earlier try's ids, to adopt
            (base,) = [c for c in pod.spec.containers if c.name == self.base_container_name]
            base.args = [*(base.args or []), *self._adopt_args]
        return pod

    def get_or_create_pod(self, pod_request_obj: k8s.V1Pod, context: Any) -> k8s.V1Pod:
        pod = super().get_or_create_pod(pod_request_obj, context)
        if pod is not pod_request_obj:  # the provider reattached to a pod of an earlier try
            self.log.info(
                "adopted the earlier try's pod %s, still running; the ids it announces are kept again",
                pod.metadata.name,
            )
        elif self._adopt_args:
            self.log.info("an earlier try's external ids, passed back to adopt: %s", self._adopt_args[1])
        return pod

    def note_log_line(self, line: str) -> None:
        """One line of the step's log (the provider's callback): its announced ids are kept."""
        ids = announced_ids(line, self.log)
        if ids and self._kept is not None:
            self._kept.add(ids)


class _AnnouncementReader(KubernetesPodOperatorCallback):
    """Gives :attr:`operator` each line of its step container's log (the provider calls the
    static methods of a callback class: :func:`_announcement_reader` makes one per operator)."""

    operator: HousePodOperator

    @classmethod
    def progress_callback(cls, *, line: str, container_name: str, **kwargs: Any) -> None:  # type: ignore[override]
        if container_name == cls.operator.base_container_name:
            cls.operator.note_log_line(line)


def _announcement_reader(operator: HousePodOperator) -> type[_AnnouncementReader]:
    return type("AnnouncementReader", (_AnnouncementReader,), {"operator": operator})


def pod_kwargs(
    package: str, preset: house_config.Preset, timeout: timedelta, cfg: house_config.HouseConfig
) -> dict[str, Any]:
    """All ``KubernetesPodOperator`` arguments the house sets for a step."""
    requests = dict(preset.requests)
    limits = dict(preset.limits)
    if preset.gpus:
        requests[house_config.GPU_RESOURCE] = str(preset.gpus)
        limits[house_config.GPU_RESOURCE] = str(preset.gpus)
    kwargs: dict[str, Any] = {
        "image": cfg.image_for(package),
        "image_pull_policy": house_config.IMAGE_PULL_POLICY,
        "namespace": cfg.namespace,
        "kubernetes_conn_id": cfg.kube_conn_id,
        "labels": {**house_config.POD_LABELS, "house/package": package, "house/preset": preset.name},
        "container_resources": k8s.V1ResourceRequirements(requests=requests, limits=limits),
        # what the step may read (stepkit.reach): the storage root and HOUSE_INPUT_ROOTS only
        "env_vars": [
            k8s.V1EnvVar(name="PYTHONUNBUFFERED", value="1"),
            k8s.V1EnvVar(name=house_config.INPUT_ROOTS_ENV, value=",".join(cfg.input_roots())),
        ],
        # Storage credentials come from a Secret, never from the DAG or params.
        "env_from": [k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=cfg.storage_secret))],
        # The task images run as an unprivileged user (docker/*.Dockerfile: USER 10001).
        "security_context": k8s.V1PodSecurityContext(run_as_non_root=True),
        "container_security_context": k8s.V1SecurityContext(allow_privilege_escalation=False),
        "on_finish_action": "delete_pod",
        "active_deadline_seconds": int(timeout.total_seconds()) + house_config.ACTIVE_DEADLINE_MARGIN_SECONDS,
        "startup_timeout_seconds": house_config.STARTUP_TIMEOUT_SECONDS,
        "get_logs": True,
        "log_events_on_failure": True,
        "do_xcom_push": False,
        "deferrable": False,
    }
    if preset.gpus:
        kwargs["node_selector"] = dict(cfg.gpu_node_selector)
        kwargs["tolerations"] = [k8s.V1Toleration(**house_config.GPU_TOLERATION)]
        kwargs["pool"] = cfg.gpu_pool
    return kwargs
