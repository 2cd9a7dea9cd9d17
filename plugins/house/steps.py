"""The house step factory: how every DAG declares a step of a task package.

A step is ``python -m <package> <argv...>`` (``mirage_tasks``, ``faasm_tasks``): the
plugins never import the task packages, they only build a command line. The runner
comes from :func:`house.config.get_config` (``HOUSE_RUNNER``, default ``local``):

* ``local``      -> :class:`house.local.LocalStepOperator` (a child process of the worker)
* ``kubernetes`` -> :class:`house.pod.HousePodOperator` (a pod; defaults in :func:`house.pod.pod_kwargs`)

Both operators take the same ``package``/``argv``/``preset`` arguments, so a DAG never
branches on the runner. The factory favours no package: ``package`` is required, and a
DAG that runs one package binds it once with :func:`steps_for`::

    from house import steps_for

    step, step_partial = steps_for("mirage_tasks")
    ingest = step("ingest", argv=["ingest", "--trace", "{{ params.trace }}", "--out", out],
                  preset="cpu-small", timeout=timedelta(minutes=30))
    sample = step_partial("sample", preset="cpu-large", timeout=timedelta(hours=2)).expand(argv=shard_argvs)

``argv`` items may be Jinja templates or XComArgs (``argv`` may also be one XComArg
resolving to a list). Mapped (``expand``) values are not templated: build them in an
upstream ``@task``.

A mapped step whose instances should be labelled in the grid (``xgboost · node 8`` rather than
``3``) expands over :func:`mapped_items` (each argv with its label, computed where the argv
is) and shows them with :data:`MAP_LABEL`::

    train = step_partial("train", preset="cpu-large", map_index_template=MAP_LABEL).expand_kwargs(items)

where ``items`` is an upstream ``@task`` returning ``mapped_items(argvs, labels)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, NamedTuple

from house import config as house_config

#: ``map_index_template`` of a step mapped over :func:`mapped_items`: each instance's label.
MAP_LABEL = "{{ task.map_label }}"

#: Keyword arguments reserved for the factory itself.
_RESERVED = frozenset({"package", "argv", "preset", "execution_timeout"})


def step_spec(
    task_id: str,
    *,
    package: str,
    preset: str = "cpu-small",
    timeout: timedelta = house_config.DEFAULT_STEP_TIMEOUT,
    pod_overrides: dict[str, Any] | None = None,
    **overrides: Any,
) -> tuple[type, dict[str, Any]]:
    """The operator class and its keyword arguments (everything except ``argv``).

    ``overrides`` are operator arguments valid for both runners (``retries``,
    ``trigger_rule``, ``pool``, ``env`` ...); ``pod_overrides`` apply only in
    kubernetes mode (``container_resources``, ``node_selector`` ...) and are ignored
    by the local runner.
    """
    bad = _RESERVED & overrides.keys()
    if bad:
        raise TypeError(f"{task_id}: pass {', '.join(sorted(bad))} through the factory's own parameters")
    if preset not in house_config.PRESETS:
        raise ValueError(f"{task_id}: unknown preset {preset!r}; choose from {', '.join(house_config.PRESETS)}")
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        raise ValueError(f"{task_id}: timeout must be a positive timedelta, got {timeout!r}")
    cfg = house_config.get_config()
    kwargs: dict[str, Any] = {"task_id": task_id, "package": package, "preset": preset, "execution_timeout": timeout}
    if cfg.runner == "kubernetes":
        from house.pod import HousePodOperator, pod_kwargs  # heavy provider import

        kwargs.update(pod_kwargs(package, house_config.PRESETS[preset], timeout, cfg))
        kwargs.update(pod_overrides or {})
        # adopt_flag (external ids kept across a retry, house.external) works on both runners: the
        # pod operator reads the announcements from the pod's log as it runs (house.pod)
        kwargs.update(overrides)
        return HousePodOperator, kwargs
    from house.local import LocalStepOperator

    kwargs.update(overrides)
    return LocalStepOperator, kwargs


def step(
    task_id: str,
    *,
    argv: Sequence[Any] | Any,
    package: str,
    preset: str = "cpu-small",
    timeout: timedelta = house_config.DEFAULT_STEP_TIMEOUT,
    pod_overrides: dict[str, Any] | None = None,
    **overrides: Any,
):
    """Declare one step: ``python -m <package> <argv...>`` with ``preset`` resources.

    :param task_id: the Airflow task id.
    :param argv: the step's command-line arguments (templated; items may be XComArgs).
    :param package: the task package run with ``python -m``.
    :param preset: ``cpu-small``, ``cpu-large`` or ``gpu``.
    :param timeout: ``execution_timeout`` (and, for pods, ``active_deadline_seconds``).
    :param pod_overrides: ``KubernetesPodOperator`` arguments, kubernetes runner only.
    :param overrides: other operator arguments (``retries``, ``trigger_rule``, ``env`` ...).
    :returns: the operator (``LocalStepOperator`` or ``HousePodOperator``).
    """
    cls, kwargs = step_spec(
        task_id, package=package, preset=preset, timeout=timeout, pod_overrides=pod_overrides, **overrides
    )
    return cls(argv=argv, **kwargs)


def step_partial(
    task_id: str,
    *,
    package: str,
    preset: str = "cpu-small",
    timeout: timedelta = house_config.DEFAULT_STEP_TIMEOUT,
    pod_overrides: dict[str, Any] | None = None,
    **overrides: Any,
):
    """A mapped step: ``step_partial(...).expand(argv=<XComArg of argv lists>)``.

    ``.expand_kwargs`` also works with dicts holding ``argv`` (and ``env``, ``map_label``: see
    :func:`mapped_items`).
    """
    cls, kwargs = step_spec(
        task_id, package=package, preset=preset, timeout=timeout, pod_overrides=pod_overrides, **overrides
    )
    return cls.partial(**kwargs)


def mapped_items(argvs: Sequence[Sequence[Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """The ``expand_kwargs`` items of a labelled mapped step: ``{"argv": argv, "map_label": label}``
    for each argv and the label at the same index (a ``ValueError`` when the lists differ in length)."""
    if len(argvs) != len(labels):
        raise ValueError(f"{len(argvs)} argvs but {len(labels)} labels")
    return [{"argv": list(a), "map_label": str(label)} for a, label in zip(argvs, labels)]


class PackageSteps(NamedTuple):
    """:func:`step` and :func:`step_partial` with ``package`` bound (see :func:`steps_for`)."""

    step: Callable[..., Any]
    step_partial: Callable[..., Any]


def steps_for(package: str) -> PackageSteps:
    """The factory bound to one task package: ``step, step_partial = steps_for("faasm_tasks")``."""
    if not isinstance(package, str) or not package.isidentifier():
        raise ValueError(f"steps_for: {package!r} is not a Python package name")
    return PackageSteps(functools.partial(step, package=package), functools.partial(step_partial, package=package))


def default_args(owner: str = house_config.DEFAULT_OWNER, **extra: Any) -> dict[str, Any]:
    """DAG ``default_args``: owner, retries, retry delay and a timeout for helper tasks."""
    return {
        "owner": owner,
        "retries": house_config.DEFAULT_RETRIES,
        "retry_delay": house_config.DEFAULT_RETRY_DELAY,
        "execution_timeout": house_config.DEFAULT_HELPER_TIMEOUT,
        **extra,
    }


def cron_schedule(expression: str):
    """A DAG's cron schedule (UTC) whose first run is the next cron time *after* it is unpaused.

    Airflow's plain ``schedule="@daily"`` with a ``start_date`` and ``catchup=False`` creates a
    run for the most recent past cron time the moment the DAG is unpaused, and the trigger
    form's "Unpause on trigger" box is ticked by default: a user's first manual run then
    starts beside (or, with ``max_active_runs=1``, queues behind) a scheduled run nobody asked
    for. Without a ``start_date``, ``CronTriggerTimetable(run_immediately=timedelta(0))``
    schedules the first run at the next cron time instead; after that, runs follow the cron
    as usual (a DAG paused for a while resumes with its latest missed time, ``catchup=False``).
    DAGs using it must not set ``start_date``.
    """
    from airflow.sdk import CronTriggerTimetable  # the factory imports Airflow only when a DAG asks

    return CronTriggerTimetable(expression, timezone="UTC", run_immediately=timedelta(0))
