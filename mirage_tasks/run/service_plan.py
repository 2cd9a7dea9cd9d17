"""What a ``mirage_service`` run will submit, for the person asked to approve it, and whether it
needs asking at all.

A run on the project's local Slurm (``make slurm``: daemons on this machine, nothing spent) is
not asked about; any other cluster is a site's, where every job is charged to an account. The
criterion (:func:`local_demo_slurm`): the steps run locally (``HOUSE_RUNNER=local``), the run's
``slurm_conf`` is make slurm's file (:data:`~mirage_tasks.run.forms.LOCAL_SLURM_CONF` under the
checkout, as given or as an absolute path to the same file), and that file's controller is on
this machine (every ``SlurmctldHost`` ``localhost`` or a 127.x address). Anything else (another
slurm.conf, make slurm's path holding a site's file, any run in a pod, which reads the mounted
site Secret) asks first.

:func:`service_plan` is the approval's text (Markdown), built from the run's typed form
(:class:`~mirage_tasks.run.forms.ServiceRun`) and the keeper's own ``sbatch`` command line
(:func:`mirage_tasks.slurm.keeper.sbatch_args`), so what is approved is what is submitted.
No Airflow here: the DAG's approval step (``house.approvals``) calls both.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..sim import decision_rules as dr
from ..slurm.keeper import limit_minutes, sbatch_args
from .forms import LOCAL_SLURM_CONF, ServiceRun

#: a slurm.conf's controller lines and its cluster name
_HOST = re.compile(r"^\s*(SlurmctldHost|ControlMachine|ControlAddr)\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)
_CLUSTER = re.compile(r"^\s*ClusterName\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)


def _loopback(host: str) -> bool:
    """``localhost``, ``localhost(127.0.0.1)``, ``127.0.0.1``: a controller on this machine."""
    names = [host.split("(", 1)[0], *re.findall(r"\(([^)]*)\)", host)]
    for name in filter(None, names):
        if name == "localhost":
            continue
        try:
            if not ipaddress.ip_address(name).is_loopback:
                return False
        except ValueError:  # a host name other than localhost: some other machine
            return False
    return True


def controllers(conf_text: str) -> list[str]:
    """The controller hosts a slurm.conf names (``SlurmctldHost``, or the older ``ControlMachine``)."""
    return [m.group(2) for m in _HOST.finditer(conf_text)]


def local_demo_slurm(slurm_conf: str, *, local_runner: bool, code_root: str | Path) -> str | None:
    """Why a run with this ``slurm_conf`` needs no approval (make slurm's local cluster), or None
    when it submits to a site's Slurm and must be approved first (see the module's criterion)."""
    if not local_runner:
        return None
    root = Path(code_root)
    given = root / str(slurm_conf or "")  # an absolute slurm_conf stays itself
    ours = root / LOCAL_SLURM_CONF
    try:
        if given.resolve() != ours.resolve() or not ours.is_file():
            return None
        hosts = controllers(ours.read_text(errors="replace"))
    except OSError:
        return None
    if not hosts or not all(_loopback(h) for h in hosts):
        return None
    return (
        f"slurm_conf {slurm_conf} is make slurm's local cluster (controller {', '.join(hosts)} on this "
        "machine): nothing is charged, no approval asked"
    )


def _where(run: ServiceRun, code_root: str | Path) -> list[str]:
    conf = Path(code_root) / run.slurm_conf
    cluster = hosts = None
    try:
        text = conf.read_text(errors="replace")
        m = _CLUSTER.search(text)
        cluster, hosts = (m.group(1) if m else None), controllers(text)
    except OSError:  # in a pod the conf is the mounted Secret, not readable where this runs
        pass
    return [
        f"- slurm.conf: `{run.slurm_conf}`"
        + ("" if cluster or hosts else " (not readable here; the step reads it where it runs)"),
        *([f"- cluster: `{cluster}`"] if cluster else []),
        *([f"- controller: `{', '.join(hosts)}`"] if hosts else []),
        f"- partition: `{run.partition}`" if run.partition else "- partition: the cluster's default",
        f"- account charged: `{run.account}`" if run.account else "- account charged: the submitting user's default",
    ]


def _rule(run: ServiceRun) -> list[str]:
    inputs = {
        "model": run.model,
        "avg-cal samples": run.avg_cal_samples,
        "wait predictor": run.waitpred,
        "guarantee-cal samples": run.guarantee_samples,
    }
    named = [f"{k} `{v}`" for k, v in inputs.items() if v]
    rule = dr.RULES.get(run.policy)
    line = f"- `{run.policy}`" + (f": {rule.description}" if rule else "") + (f" ({', '.join(named)})" if named else "")
    return [line, "- never later than the predecessor's end; the keeper cancels no job it did not submit"]


def _names(run: ServiceRun) -> str:
    first, last = f"`svc-{run.policy}-1`", f"`svc-{run.policy}-{run.links}`"
    return f"the same named {first}" if run.links == 1 else f"the same named {first} to {last}"


def service_plan(run: ServiceRun, *, code_root: str | Path = ".") -> str:
    """The approval's text: what will be submitted (the ``sbatch`` line, nodes, time limit), where
    (cluster, partition, account), for how long (the service's horizon and node-hours) and with
    which decision rule."""
    limit_min = limit_minutes(run.service_hours * 3600.0, run.factor)
    jobs = run.links + 1  # the first job, then one successor per link
    hours = limit_min / 60
    argv = sbatch_args(f"svc-{run.policy}-0", run.node, limit_min, partition=run.partition, account=run.account)
    lines = [
        f"**keep_service** will keep a service alive on a Slurm cluster for {run.links} succession(s): "
        f"{jobs} jobs of {run.node} whole node(s), each {hours:g} h, one after another.",
        "",
        f"**What** (the first job, as the keeper submits it; then {_names(run)}):",
        "",
        f"    {shlex.join(argv)}",
        "",
        f"- nodes: {run.node} (exclusive); time limit: {hours:g} h ({limit_min} min) per job",
        "",
        "**Where**:",
        "",
        *_where(run, code_root),
        "",
        "**For how long**:",
        "",
        f"- {jobs} jobs end to end: about {jobs * hours:g} h of service from the first job's start "
        f"({jobs * hours / 24:.1f} days), plus the queue wait before it",
        f"- at most {jobs * hours * run.node:g} node-hours charged (each job holds its nodes its whole limit)",
        *([f"- time compression x{run.factor:g}: a test cluster, not a real one"] if run.factor != 1 else []),
        "",
        "**Decision rule** (when each successor is submitted):",
        "",
        *_rule(run),
    ]
    lines += [
        "",
        f"No answer within {run.approval_hours:g} h counts as **Reject**: the run then ends without submitting.",
    ]
    return "\n".join(lines) + "\n"


def service_approval(
    form: Mapping[str, Any], *, local_runner: bool, code_root: str | Path, defaults: Mapping[str, Any] | None = None
) -> str | dict[str, Any]:
    """What the DAG's approval step asks for a run with the params ``form`` (over ``defaults``, the
    deployment's own): why nothing (a string: make slurm's local cluster, :func:`local_demo_slurm`),
    or ``{"subject", "body", "hours"}``: the :func:`service_plan` and the form's ``approval_hours``."""
    run = ServiceRun.from_params(form, defaults)
    why = local_demo_slurm(run.slurm_conf, local_runner=local_runner, code_root=code_root)
    if why:
        return why
    jobs = run.links + 1
    hours = limit_minutes(run.service_hours * 3600.0, run.factor) / 60
    where = run.partition or "the default partition"
    return {
        "subject": (
            f"Submit {jobs} Slurm jobs of {run.node} node(s) x {hours:g} h ({run.policy}) to {where} "
            f"of {run.slurm_conf}?"
        ),
        "body": service_plan(run, code_root=code_root),
        "hours": run.approval_hours,
    }
