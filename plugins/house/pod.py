"""``HousePodOperator``: a ``KubernetesPodOperator`` that runs ``python -m <package> <argv...>``.

Every pod default of the house lives in :func:`pod_kwargs` (values from
:mod:`house.config`); this module is imported only when the runner is ``kubernetes``,
so DAG files parse without loading the Kubernetes provider in local mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from kubernetes.client import models as k8s

from house import config as house_config
from house.argv import drop_omitted
from house.bundle import bundle_env
from house.links import StepReportLink


class HousePodOperator(KubernetesPodOperator):
    """A pod running one step of a task package: ``cmds=["python", "-m", package]``, ``arguments=argv``.

    ``argv`` (templated through ``arguments``; may hold XComArgs) and ``env`` (extra
    environment variables, same as the local runner's) are the per-item values; the run's bundle
    and version (:mod:`house.bundle`) are added when the templates are rendered, so
    ``HousePodOperator.partial(...).expand(argv=...)`` maps a step. ``map_label``: a mapped
    instance's label in the UI, as for the local runner (:func:`house.mapped_items`).
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

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        super().render_template_fields(context, jinja_env)
        self.arguments = drop_omitted(self.arguments)  # an empty optional flag is no argument at all
        # the run's bundle and version (house.bundle), recorded in the step's marker: set here, where
        # the task's context is, replacing any of the same name (the pod names the code that ran)
        bundle = bundle_env(context)
        kept = [e for e in (self.env_vars or []) if getattr(e, "name", None) not in bundle]
        self.env_vars = [*kept, *(k8s.V1EnvVar(name=k, value=v) for k, v in bundle.items())]


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
