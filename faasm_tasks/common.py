"""Flags shared by every step and the small helpers around them."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
from typing import Any

from stepkit import StepError, storage

from .procs import default_state_root, run_dir

RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$")


def add_common(p: argparse.ArgumentParser, experiment: bool = False, experiment_required: bool = False) -> None:
    g = p.add_argument_group("run")
    g.add_argument("--target", choices=["local", "knative"], default=os.environ.get("FAASM_TARGET", "local"))
    g.add_argument("--run-id", required=True, help="identifies the run across steps (e.g. the Airflow run id)")
    g.add_argument("--results", required=True, help="results root URI (file:///..., /path or s3://bucket/prefix)")
    g.add_argument("--date", help="results date folder YYYY-MM-DD (default: the run's first step's UTC date)")
    g.add_argument(
        "--state-dir",
        default=default_state_root(),
        help="where local state (pids, ports, sampler) lives; env FAASM_TASKS_STATE_DIR",
    )
    g.add_argument(
        "--catalogue-dir",
        action="append",
        default=[],
        help="extra experiment catalogue directory (repeatable; env FAASM_CATALOGUE_DIR)",
    )
    if experiment:
        g.add_argument("--experiment", required=experiment_required, help="experiment name from the catalogue")
        g.add_argument("--system", choices=["wasm", "native"], default="native")
    k = p.add_argument_group("knative target")
    k.add_argument("--namespace", default="faasm")
    k.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    k.add_argument("--context", help="kubeconfig context")
    k.add_argument(
        "--release",
        default=os.environ.get("FAASM_RELEASE", "0.1.3"),
        help="Faasm release whose image names and tags to deploy (targets/knative.py RELEASES; "
        "default 0.1.3, the experiments manual's; env FAASM_RELEASE)",
    )
    k.add_argument("--image-registry", default=None, help="registry/organisation replacing 'faasm' (a mirror)")
    k.add_argument(
        "--billing-image",
        default=os.environ.get("FAASM_TASKS_IMAGE"),
        help="image of the per-node billing sampler DaemonSet (this package's image; env "
        "FAASM_TASKS_IMAGE); without it the knative target deploys no sampler",
    )
    k.add_argument(
        "--billing-node-selector",
        action="append",
        default=[],
        help="key=value node label of the nodes that run the experiment (repeatable; default: all)",
    )
    k.add_argument(
        "--billing-secret",
        default=os.environ.get("FAASM_BILLING_SECRET"),
        help="Secret in the benchmark namespace with the storage credentials for the sampler pods",
    )
    k.add_argument("--billing-interval", type=float, default=2.0, help="seconds between billing samples")
    k.add_argument("--domain", default="faasm.example.com", help="Knative domain used in Host headers")
    k.add_argument(
        "--invoke-url",
        default=os.environ.get("FAASM_INVOKE_URL"),
        help="ingress URL for invocations (knative target; env FAASM_INVOKE_URL)",
    )
    k.add_argument(
        "--upload-url",
        default=os.environ.get("FAASM_UPLOAD_URL"),
        help="upload service URL (knative target; env FAASM_UPLOAD_URL)",
    )
    k.add_argument(
        "--redis-queue-url",
        default=os.environ.get("FAASM_REDIS_QUEUE_URL"),
        help="redis:// URL of the queue Redis (default: the ready endpoint of the redis-queue Service; "
        "env FAASM_REDIS_QUEUE_URL)",
    )
    k.add_argument(
        "--redis-state-url",
        default=os.environ.get("FAASM_REDIS_STATE_URL"),
        help="redis:// URL of the state Redis (default: the ready endpoint of the redis-state Service; "
        "env FAASM_REDIS_STATE_URL)",
    )
    k.add_argument(
        "--client-hosts",
        default=os.environ.get("FAASM_CLIENT_HOSTS", ""),
        help="comma-separated hosts, one load client each, started by --client-command with the "
        "controller on this host (knative target; env FAASM_CLIENT_HOSTS; default: the clients run here)",
    )
    k.add_argument(
        "--client-command",
        default=os.environ.get("FAASM_CLIENT_COMMAND"),
        help="how a load client is started on a --client-hosts host, {host} replaced (default: "
        "ssh -o BatchMode=yes {host} python3 -m faasm_tasks.loadgen client; env FAASM_CLIENT_COMMAND)",
    )
    k.add_argument(
        "--protocol",
        choices=["knative", "planner"],
        default=None,
        help="invocation protocol (default: knative, the 2020 one)",
    )


def check_run_id(run_id: str) -> str:
    if not RUN_ID_RE.match(run_id):
        raise StepError(f"run id {run_id!r} must match {RUN_ID_RE.pattern}")
    return run_id


def run_date(args: Any) -> str:
    """The date folder of the run: --date, else the one recorded by an earlier step, else today (UTC)."""
    check_run_id(args.run_id)
    if args.date:
        try:
            dt.date.fromisoformat(args.date)
        except ValueError as exc:
            raise StepError(f"--date {args.date!r} is not YYYY-MM-DD") from exc
        return args.date
    # recorded under the results root, so a step in a fresh pod finds it (storage is all steps share)
    uri = date_record(args.results, args.run_id)
    try:
        rec = storage.read_json(uri)
        if isinstance(rec, dict) and rec.get("date"):
            return str(rec["date"])
    except FileNotFoundError:
        pass
    except OSError as exc:  # a file where a folder should be, no permission: say which flag
        raise StepError(f"--results {args.results}: cannot read the run's record there ({exc})") from None
    path = os.path.join(run_dir(args.state_dir, args.run_id), "date")
    try:
        with open(path, encoding="utf-8") as f:
            today = f.read().strip()  # recorded by an earlier version in the worker-local state
    except FileNotFoundError:
        today = dt.datetime.now(dt.UTC).date().isoformat()
        with open(path, "w", encoding="utf-8") as f:
            f.write(today)
    try:  # the first write of a run: an unwritable --results fails here, before anything is started
        storage.write_json(uri, {"run_id": args.run_id, "date": today})
    except OSError as exc:
        raise StepError(f"--results {args.results}: cannot write the run's record there ({exc})") from None
    return today


def date_record(results: str, run_id: str) -> str:
    """``<results>/_state/<run id>/date.json``: the run's date folder, for steps without ``--date``."""
    return storage.join(results, "_state", run_id, "date.json")


def load_plan(args: Any, overrides: dict[str, Any] | None = None):
    from .catalogue import get_experiment, resolve

    if not getattr(args, "experiment", None):
        raise StepError("--experiment is required")
    exp = get_experiment(args.experiment, args.catalogue_dir)
    return resolve(exp, args.system, args.target, overrides, getattr(args, "sweep_variant", None))


def add_replicas(p) -> None:
    """``--replicas`` and ``--sweep-variant`` (deploy and run)."""
    p.add_argument(
        "--replicas",
        choices=["per-point", "fixed"],
        default="per-point",
        help="knative: per-point (default, the manual's) redeploys with N replicas for each "
        "value of the catalogue's replicas_from parameter (n_workers) and runs with N workers; "
        "fixed keeps the catalogue's deploy replica counts for the whole sweep",
    )
    p.add_argument(
        "--sweep-variant",
        default="default",
        help="the catalogue's sweep (default: the manual's) or one of its sweep_variants "
        "(e.g. tf_inference_throughput: extended)",
    )


def state_keys_record(results: str, run_id: str) -> str:
    """``<results>/_state/<run id>/run-state-keys.json``: the run-state keys of every experiment
    this run deployed or ran, written by ``deploy`` and ``run``, read by ``teardown`` and
    ``verify-clean`` (which never read the catalogue: a broken or hostile catalogue file
    cannot keep a run's resources alive)."""
    return storage.join(results, "_state", run_id, "run-state-keys.json")


def record_state_keys(args: Any, plan: Any) -> None:
    """Add ``plan``'s experiment and its run-state keys to the run's record (deploy, run)."""
    uri = state_keys_record(args.results, args.run_id)
    doc = {"run_id": args.run_id, "experiments": [], "run_state_keys": []}
    keys, problem = teardown_state_keys(args)
    if problem is None and storage.exists(uri):
        from stepkit.safeload import read_document

        old = read_document(uri, "json")
        doc["experiments"] = [e for e in old.get("experiments", []) if isinstance(e, str)]
        doc["run_state_keys"] = keys
    if plan.name not in doc["experiments"]:
        doc["experiments"].append(plan.name)
    doc["run_state_keys"] += [k for k in plan.experiment.get("run_state_keys", []) if k not in doc["run_state_keys"]]
    storage.write_json(uri, doc)


def teardown_state_keys(args: Any) -> tuple[list[str], str | None]:
    """The run-state keys a teardown deletes: from the run's own record
    (:func:`state_keys_record`), never from the catalogue; none when no step recorded any.
    Never raises (a teardown must not stop on input errors). Returns (keys, problem)."""
    from stepkit.safeload import read_document

    uri = state_keys_record(args.results, args.run_id)
    try:
        if not storage.exists(uri):
            return [], None
        doc = read_document(uri, "json")
        keys = doc.get("run_state_keys") if isinstance(doc, dict) else None
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            return [], f"{uri}: run_state_keys is not a list of strings; no state keys deleted by name"
        return keys, None
    except Exception as exc:  # noqa: BLE001 - reported, the teardown goes on
        return [], f"run record {uri} not usable ({type(exc).__name__}: {exc}); no state keys deleted by name"


def parse_set(values: list[str]) -> dict[str, Any]:
    """``--set k=v`` parameter overrides (ints/floats parsed)."""
    out: dict[str, Any] = {}
    for item in values or []:
        if "=" not in item:
            raise StepError(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        for cast in (int, float):
            try:
                out[k] = cast(v)
                break
            except ValueError:
                continue
        else:
            out[k] = v
    return out
