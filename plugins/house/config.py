"""Every house default in one place: runner, storage, images, cluster settings, presets.

Each setting is read, in order, from

1. its environment variable (e.g. ``HOUSE_RUNNER``),
2. the matching Airflow Variable (e.g. ``house_runner``; this includes Airflow's own
   ``AIRFLOW_VAR_HOUSE_RUNNER`` environment variables), looked up only when the
   environment variable is unset and only while Variables are reachable,
3. the built-in default below.

Call :func:`get_config` each time a value is needed (it is cheap). Environment
variables are read on every call, so tests switch mode by setting them; Variable
lookups made while parsing are reused for ``VARIABLE_CACHE_SECONDS`` within one
process (a running task always reads afresh). Setting
``HOUSE_NO_VARIABLES=1`` skips Variable lookups entirely.

A Variable lookup that fails (no metadata database, no API server) is an error for
``house_runner``: a runner chosen only by that Variable must never turn into ``local``
because the Variable could not be read, so :func:`get_config` raises
:class:`ConfigError` with the reason (a DAG file then fails to import, naming it). Set
``HOUSE_RUNNER`` in the environment (or ``HOUSE_NO_VARIABLES=1``) where Variables are
unreachable. For the other settings the default applies, with a warning in the log.
Set the environment variables on the Airflow workers and the DAG processor to keep
DAG parsing free of any Variable lookups.

=============================  ==========================  =============================================
environment variable           Airflow Variable            default
=============================  ==========================  =============================================
``HOUSE_RUNNER``               ``house_runner``            ``local`` (or ``kubernetes``)
``HOUSE_STORAGE_ROOT``         ``house_storage_root``      ``<repo>/var/storage`` (local runner only)
``HOUSE_CODE_ROOT``            ``house_code_root``         the repository holding ``plugins/``
``HOUSE_PYTHON``               ``house_python``            the worker's ``sys.executable``
``HOUSE_IMAGE_<PKG>``          ``house_image_<pkg>``       ``mirage-tasks:0.1.0``, ``faasm-tasks:0.1.0``
``HOUSE_NAMESPACE``            ``house_namespace``         ``airflow``
``HOUSE_KUBE_CONN_ID``         ``house_kube_conn_id``      ``kubernetes_default``
``HOUSE_STORAGE_SECRET``       ``house_storage_secret``    ``house-storage-credentials``
``HOUSE_GPUS``                 ``house_gpus``              ``false``: no GPU nodes (DAGs leave out GPU tasks)
``HOUSE_GPU_POOL``             ``house_gpu_pool``          ``gpu``
``HOUSE_GPU_NODE_SELECTOR``    ``house_gpu_node_selector`` ``nvidia.com/gpu.present=true``
``HOUSE_INPUT_ROOTS``          ``house_input_roots``       local: ``<repo>/../shared/traces``; kubernetes: none
``HOUSE_DEADLINE_<DAG>``       ``house_deadline_<dag>``    ``faasm_benchmarks``: ``20h``; ``mirage_service``: ``72h``
``HOUSE_DEADLINE_NOTIFIER``    ``house_deadline_notifier`` unset: the deadline record and log line only
``HOUSE_DEADLINE_NOTIFIER_KWARGS`` ``house_deadline_notifier_kwargs`` ``{}``
``HOUSE_GATE_MARGIN``          ``house_gate_margin``       ``0.10`` (``mirage_monthly``'s gate)
``HOUSE_NO_VARIABLES``         (none)                      unset; ``1`` = never look up Variables
=============================  ==========================  =============================================

``HOUSE_DEADLINE_<DAG>`` (``<DAG>`` the DAG id upper-cased: ``HOUSE_DEADLINE_FAASM_BENCHMARKS``,
``HOUSE_DEADLINE_MIRAGE_SERVICE``): how long after a run of that DAG is queued it must have
finished before its deadline alert fires (``house.deadlines``): seconds, or a number with ``s``,
``m``, ``h`` or ``d`` (``90s``, ``20h``, ``3d``). ``HOUSE_DEADLINE_NOTIFIER``: the dotted path of
a notifier class (a ``BaseNotifier`` with ``async_notify``, e.g. a Slack or SMTP provider's) that
a missed deadline is also sent to, built with the JSON object ``HOUSE_DEADLINE_NOTIFIER_KWARGS``
(its channel, connection id ...). Both are read when the DAG file is parsed.

``HOUSE_GATE_MARGIN``: how much worse (a fraction, ``0.10`` = 10 %) ``mirage_monthly``'s
gate lets the month's decision rule be than the bar it is held to before it fails the month.

``HOUSE_INPUT_ROOTS``: where the inputs a form names may be (comma-separated local folders or
URIs such as ``s3://bucket/traces``; ``none`` for no other), besides the storage root, which is
always allowed. Every step gets the resulting list (:func:`input_roots`) in
``STEPKIT_INPUT_ROOTS`` and refuses any other path or URI, ``/proc``, ``/sys``, ``/dev``, other
URL schemes, ``..`` and symlinks leading out (``stepkit.reach``): whoever may trigger a DAG must
not be able to make the worker read its own files or fetch from the cluster's network.

``<PKG>`` is the task package name without ``_tasks``: ``HOUSE_IMAGE_MIRAGE`` for
``mirage_tasks``, ``HOUSE_IMAGE_FAASM`` for ``faasm_tasks``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

log = logging.getLogger(__name__)

RUNNERS = ("local", "kubernetes")

#: The repository this plugins folder belongs to (``<repo>/plugins/house/config.py``).
REPO_ROOT = Path(__file__).resolve().parents[2]

#: Storage root of the local runner when ``HOUSE_STORAGE_ROOT`` is unset (git-ignored).
DEFAULT_STORAGE_ROOT = REPO_ROOT / "var" / "storage"

#: The traces shipped beside a local checkout (``../shared/traces``): a local runner's inputs by default.
SHIPPED_TRACES = REPO_ROOT.parent / "shared" / "traces"

#: Pinned image per task package; override with ``HOUSE_IMAGE_<PKG>``. Never ``latest``.
DEFAULT_IMAGES = MappingProxyType(
    {
        "mirage_tasks": "mirage-tasks:0.1.0",
        "faasm_tasks": "faasm-tasks:0.1.0",
    }
)

# --- Airflow task defaults ----------------------------------------------------------
DEFAULT_OWNER = "house"
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY = timedelta(minutes=2)
#: Timeout of tasks that are not steps (small @task helpers); steps set their own.
DEFAULT_HELPER_TIMEOUT = timedelta(minutes=10)
#: Timeout of a step when the DAG does not give one.
DEFAULT_STEP_TIMEOUT = timedelta(hours=1)

# --- Kubernetes pod defaults ----------------------------------------------------------
IMAGE_PULL_POLICY = "IfNotPresent"
#: Seconds a pod may stay Pending (image pull, scheduling) before the try fails.
STARTUP_TIMEOUT_SECONDS = 900
#: The pod's activeDeadlineSeconds is the step timeout plus this margin, so Airflow's
#: ``execution_timeout`` fires first and cleans up; the deadline is the backstop when
#: the worker itself dies.
ACTIVE_DEADLINE_MARGIN_SECONDS = 120
#: Labels on every pod (plus ``house/package`` and ``house/preset``).
POD_LABELS = MappingProxyType({"app.kubernetes.io/part-of": "house", "app.kubernetes.io/managed-by": "airflow"})
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TOLERATION = MappingProxyType({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})

# --- Local runner defaults ----------------------------------------------------------
#: Lines of stderr quoted in the failure message of a local step.
STDERR_TAIL_LINES = 40
#: Seconds between SIGTERM and SIGKILL when a local step is stopped.
KILL_GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class Preset:
    """Resources of one preset. ``gpus > 0`` adds the GPU limit, toleration, node selector, pool."""

    name: str
    requests: dict[str, str]
    limits: dict[str, str]
    gpus: int = 0


PRESETS = MappingProxyType(
    {
        "cpu-small": Preset(
            "cpu-small", requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "2", "memory": "2Gi"}
        ),
        "cpu-large": Preset(
            "cpu-large", requests={"cpu": "4", "memory": "16Gi"}, limits={"cpu": "8", "memory": "16Gi"}
        ),
        "gpu": Preset("gpu", requests={"cpu": "4", "memory": "32Gi"}, limits={"cpu": "8", "memory": "32Gi"}, gpus=1),
    }
)


class ConfigError(ValueError):
    """A house setting has an invalid value."""


# --- Deadlines and the monthly gate --------------------------------------------------
#: How long after it is queued a run must be done before its deadline alert fires.
#: ``faasm_benchmarks`` runs daily: a day's run still going after 20 h would collide with the
#: next one (``max_active_runs=1`` queues it). ``mirage_service``: the form's default keeps one
#: 48 h job, and a day of queue wait on top is already long; a longer service sets its own.
DEFAULT_DEADLINES = MappingProxyType(
    {
        "faasm_benchmarks": timedelta(hours=20),
        "mirage_service": timedelta(hours=72),
    }
)
#: ``mirage_monthly``'s gate fails a month whose rule is more than this fraction worse than its bar
#: (the baselines' interval, the earlier months' median): 10 %, above the month-to-month noise of
#: the paper-size runs' interruption hours.
DEFAULT_GATE_MARGIN = 0.10

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(env: str, text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``20h``, ``3d`` -> a positive timedelta; :class:`ConfigError` otherwise."""
    m = _DURATION.match(str(text).lower())
    if not m:
        raise ConfigError(f"{env}: expected seconds or a number with s, m, h or d (e.g. 20h), got {text!r}")
    seconds = float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    if seconds <= 0:
        raise ConfigError(f"{env}: the interval must be positive, got {text!r}")
    return timedelta(seconds=seconds)


def deadline_env_var(dag_id: str) -> str:
    """``faasm_benchmarks`` -> ``HOUSE_DEADLINE_FAASM_BENCHMARKS``."""
    return "HOUSE_DEADLINE_" + re.sub(r"[^A-Za-z0-9]", "_", dag_id).upper()


def _parse_margin(env: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{env}: expected a fraction such as 0.10, got {text!r}") from None
    if not 0 <= value < 10 or value != value:
        raise ConfigError(f"{env}: the margin must be a fraction in [0, 10), got {text!r}")
    return value


def _parse_kwargs(env: str, text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{env}: not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{env}: expected a JSON object, got {type(value).__name__}")
    return value


@dataclass(frozen=True)
class HouseConfig:
    """The resolved settings (see the module docstring for their sources)."""

    runner: str = "local"
    storage_root: str = str(DEFAULT_STORAGE_ROOT)
    code_root: str = str(REPO_ROOT)
    python: str = sys.executable
    images: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_IMAGES))
    namespace: str = "airflow"
    kube_conn_id: str = "kubernetes_default"
    storage_secret: str = "house-storage-credentials"
    gpus: bool = False
    gpu_pool: str = "gpu"
    gpu_node_selector: dict[str, str] = field(default_factory=lambda: {"nvidia.com/gpu.present": "true"})
    #: Where a form's inputs may be besides the storage root (``HOUSE_INPUT_ROOTS``).
    extra_input_roots: tuple[str, ...] = (str(SHIPPED_TRACES),)
    #: How long after it is queued a run of each DAG must be done (``HOUSE_DEADLINE_<DAG>``).
    deadlines: dict[str, timedelta | None] = field(default_factory=lambda: dict(DEFAULT_DEADLINES))
    #: The site's notifier a missed deadline is also sent to (dotted path), and its arguments.
    deadline_notifier: str | None = None
    deadline_notifier_kwargs: dict[str, Any] = field(default_factory=dict)
    #: The monthly gate's margin (a fraction): how much worse than its bar a month may be.
    gate_margin: float = DEFAULT_GATE_MARGIN

    def deadline_for(self, dag_id: str) -> timedelta | None:
        """The deadline interval of ``dag_id``, None where the setting says ``off``; :class:`ConfigError`
        for a DAG without one."""
        try:
            return self.deadlines[dag_id]
        except KeyError:
            raise ConfigError(
                f"no deadline interval for DAG {dag_id!r}: set {deadline_env_var(dag_id)} "
                "(seconds, or a number with s, m, h or d)"
            ) from None

    def input_roots(self) -> list[str]:
        """Every root a step may read: the storage root, then :attr:`extra_input_roots`."""
        return list(dict.fromkeys([self.storage_root, *self.extra_input_roots]))

    def image_for(self, package: str) -> str:
        """The pinned image of ``package``; :class:`ConfigError` if unknown or not pinned."""
        try:
            image = self.images[package]
        except KeyError:
            raise ConfigError(
                f"no image configured for task package {package!r}: set {image_env_var(package)}"
            ) from None
        return check_pinned(image, image_env_var(package))


def image_env_var(package: str) -> str:
    """``mirage_tasks`` -> ``HOUSE_IMAGE_MIRAGE``."""
    stem = package.removesuffix("_tasks")
    return "HOUSE_IMAGE_" + re.sub(r"[^A-Za-z0-9]", "_", stem).upper()


def check_pinned(image: str, source: str = "image") -> str:
    """Return ``image`` if it carries a tag other than ``latest`` or a digest, else raise."""
    image = image.strip()
    if "@sha256:" in image:
        return image
    last = image.rsplit("/", 1)[-1]  # a registry "host:5000/" is not a tag
    if ":" not in last:
        raise ConfigError(f"{source}: image {image!r} has no tag; pin a version, e.g. {image}:1.2.3")
    tag = last.rsplit(":", 1)[1]
    if not tag or tag == "latest":
        raise ConfigError(f"{source}: image {image!r} uses the tag {tag or '(empty)'!r}; pin a version")
    return image


#: Seconds a Variable lookup made outside a task (i.e. while parsing) is reused. A DAG
#: file calls the factory once per step and each call resolves the configuration:
#: without this, parsing one file would ask for every unset setting once per step.
VARIABLE_CACHE_SECONDS = 30.0
_variable_cache: dict[str, tuple[float, str | None]] = {}


def clear_variable_cache() -> None:
    _variable_cache.clear()


class VariableUnreadable(ConfigError):
    """An Airflow Variable could not be looked up (as opposed to being unset)."""


def _variable(key: str, *, required: bool = False) -> str | None:
    """An Airflow Variable, or None when unset.

    When the lookup itself fails: :class:`VariableUnreadable` if ``required``, else None
    with a warning (the caller's default applies).
    """
    env = os.environ.get("AIRFLOW_VAR_" + key.upper())  # Airflow's env-var secrets backend
    if env is not None:
        return env
    if os.environ.get("HOUSE_NO_VARIABLES", "").lower() in ("1", "true", "yes"):
        return None
    try:
        from airflow.sdk import Variable, get_current_context  # only when needed
    except Exception as exc:  # Airflow not importable
        if required:
            raise VariableUnreadable(
                f"Airflow Variable {key} cannot be read: Airflow is not importable ({exc})"
            ) from exc
        log.debug("Airflow unavailable (%s); using the default for %s", exc, key)
        return None
    try:  # a running task always reads afresh (dag.test() parses and runs in one process)
        get_current_context()
        in_task = True
    except Exception:  # noqa: BLE001 - no task context: parsing
        in_task = False
    cached = None if in_task else _variable_cache.get(key)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    try:
        value = Variable.get(key, default=None)
    except Exception as exc:  # no DB / API server
        if required:
            raise VariableUnreadable(f"Airflow Variable {key} could not be read ({type(exc).__name__}: {exc})") from exc
        log.warning("Airflow Variable %s could not be read (%s: %s); using the default", key, type(exc).__name__, exc)
        return None
    value = None if value is None else str(value)
    if not in_task:
        _variable_cache[key] = (time.monotonic() + VARIABLE_CACHE_SECONDS, value)
    return value


def _setting(env: str, default: str | None = None, *, required: bool = False) -> str | None:
    value = os.environ.get(env)
    if value is None:
        value = _variable(env.lower(), required=required)
    value = value.strip() if isinstance(value, str) else value
    return value if value else default


def _parse_selector(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"HOUSE_GPU_NODE_SELECTOR: expected key=value[,key=value], got {text!r}")
        out[key.strip()] = value.strip()
    return out


def _parse_roots(text: str) -> list[str]:
    """``HOUSE_INPUT_ROOTS``: comma-separated absolute folders or ``scheme://`` URIs."""
    out = []
    for item in filter(None, (p.strip() for p in text.split(","))):
        if "://" not in item and not os.path.isabs(item):
            raise ConfigError(f"HOUSE_INPUT_ROOTS: {item!r} is not an absolute folder or a URI")
        if any(seg in ("..", ".") for seg in item.split("://", 1)[-1].split("/")):
            raise ConfigError(f"HOUSE_INPUT_ROOTS: {item!r} holds a '..' or '.' segment")
        out.append(item)
    return out


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse_bool(env: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ConfigError(f"{env}: expected true or false, got {text!r}")


def get_config() -> HouseConfig:
    """Resolve every setting now (environment variable, then Airflow Variable, then default)."""
    try:
        runner = (_setting("HOUSE_RUNNER", "local", required=True) or "local").lower()
    except VariableUnreadable as exc:
        raise ConfigError(
            f"HOUSE_RUNNER is not set and {exc}; refusing to fall back to the local runner. "
            "Set HOUSE_RUNNER (local or kubernetes) in the environment of the DAG processor and "
            "workers, or HOUSE_NO_VARIABLES=1 to use the defaults without Variables"
        ) from exc
    if runner not in RUNNERS:
        raise ConfigError(f"HOUSE_RUNNER: {runner!r} is not one of {', '.join(RUNNERS)}")
    defaults = HouseConfig()
    storage_root = _setting("HOUSE_STORAGE_ROOT")
    if storage_root is None:
        if runner == "kubernetes":
            raise ConfigError(
                "HOUSE_STORAGE_ROOT must be set for the kubernetes runner "
                "(pods cannot see the worker's disk), e.g. s3://bucket/house"
            )
        storage_root = str(DEFAULT_STORAGE_ROOT)
    images = {}
    for package, image in DEFAULT_IMAGES.items():
        env = image_env_var(package)
        images[package] = _setting(env, image)
    # Extra packages may be declared purely by environment (HOUSE_IMAGE_<PKG>).
    for env, value in os.environ.items():
        if env.startswith("HOUSE_IMAGE_") and value.strip():
            package = env.removeprefix("HOUSE_IMAGE_").lower() + "_tasks"
            images.setdefault(package, value.strip())
    selector = _setting("HOUSE_GPU_NODE_SELECTOR")
    roots = _setting("HOUSE_INPUT_ROOTS")
    if roots is None:  # pods see no checkout: only the storage root there
        extra: tuple[str, ...] = (str(SHIPPED_TRACES),) if runner == "local" else ()
    else:
        extra = () if roots.lower() == "none" else tuple(_parse_roots(roots))
    deadlines = {
        dag_id: (None if text.strip().lower() == "off" else parse_duration(deadline_env_var(dag_id), text))
        if (text := _setting(deadline_env_var(dag_id))) is not None
        else default
        for dag_id, default in DEFAULT_DEADLINES.items()
    }
    notifier = _setting("HOUSE_DEADLINE_NOTIFIER")
    notifier_kwargs = _setting("HOUSE_DEADLINE_NOTIFIER_KWARGS")
    margin = _setting("HOUSE_GATE_MARGIN")
    return HouseConfig(
        runner=runner,
        storage_root=storage_root,
        code_root=_setting("HOUSE_CODE_ROOT", defaults.code_root),
        python=_setting("HOUSE_PYTHON", defaults.python),
        images=images,
        namespace=_setting("HOUSE_NAMESPACE", defaults.namespace),
        kube_conn_id=_setting("HOUSE_KUBE_CONN_ID", defaults.kube_conn_id),
        storage_secret=_setting("HOUSE_STORAGE_SECRET", defaults.storage_secret),
        gpus=_parse_bool("HOUSE_GPUS", _setting("HOUSE_GPUS", "false")),
        gpu_pool=_setting("HOUSE_GPU_POOL", defaults.gpu_pool),
        gpu_node_selector=_parse_selector(selector) if selector else defaults.gpu_node_selector,
        extra_input_roots=extra,
        deadlines=deadlines,
        deadline_notifier=notifier,
        deadline_notifier_kwargs=_parse_kwargs("HOUSE_DEADLINE_NOTIFIER_KWARGS", notifier_kwargs)
        if notifier_kwargs
        else {},
        gate_margin=_parse_margin("HOUSE_GATE_MARGIN", margin) if margin is not None else DEFAULT_GATE_MARGIN,
    )


def storage_prefix(dag_id: str, *parts: str) -> str:
    """Where a DAG's runs keep their outputs: ``<storage root>/<dag_id>[/<part>...]``.

    Every DAG resolves its prefix here, at run time (inside a task, or through the
    ``house_storage_prefix`` macro in a templated field: see :data:`MACROS`), so the
    storage root of every DAG comes from the same sources at the same moment.
    """
    for part in (dag_id, *parts):
        if not isinstance(part, str) or part.strip("/") in ("", ".", ".."):
            raise ConfigError(f"storage_prefix({dag_id!r}, ...): bad path part {part!r}")
    return "/".join([get_config().storage_root.rstrip("/"), *(p.strip("/") for p in (dag_id, *parts))])


#: The environment variable every step gets with :meth:`HouseConfig.input_roots` (``stepkit.reach.ENV``;
#: the plugins never import the task packages' ``stepkit``).
INPUT_ROOTS_ENV = "STEPKIT_INPUT_ROOTS"


def input_roots() -> list[str]:
    """The roots a form's inputs may be under now: the storage root and ``HOUSE_INPUT_ROOTS``."""
    return get_config().input_roots()


#: ``user_defined_macros`` for DAGs: ``{{ house_storage_prefix(dag.dag_id) }}``.
MACROS = MappingProxyType({"house_storage_prefix": storage_prefix})


def describe() -> dict[str, Any]:
    """The resolved configuration as a plain dict (for logs and ``python -m house.config``)."""
    from dataclasses import asdict

    out = asdict(get_config())
    # JSON-able: each deadline interval in seconds
    out["deadlines"] = {dag: interval.total_seconds() for dag, interval in out["deadlines"].items()}
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(describe(), indent=2, sort_keys=True))
