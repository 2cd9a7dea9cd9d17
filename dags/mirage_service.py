"""Keep a service alive on a Slurm cluster: the trained model's decision put to work.

One task, ``keep_service`` (``python -m mirage_tasks keep-service``): it submits the
service's first job (``node`` nodes, ``service_hours`` limit), watches it through ``squeue``
and ``sinfo``, builds the features the model was trained on from the live queue and submits
each successor when the model's calibrated rule says so (never later than the predecessor's
end). The param ``policy`` picks the decision rule, one of the keeper's rules in the one registry
(``mirage_tasks/sim/decision_rules.py``, the form's choices): ``reactive``, ``avg`` or ``avg-cal``
(calibrated on the training samples named by ``avg_cal_samples``) runs a baseline instead, and
``wait-pred``, ``guarantee`` or ``guarantee-cal`` the wait predictor's rules (a ``waitpred`` output: submit when the predicted start, or its upper
bound, reaches the predecessor's end; ``guarantee-cal`` with a margin calibrated for at most 10 %
interrupted on the end-spaced samples named by ``guarantee_samples``, drawn with that predictor).
Every decision is logged with
its inputs (``decisions.jsonl`` in the output). It never cancels a job it did not submit.
The deadline is the run's, not each decision's: a run still unfinished
``HOUSE_DEADLINE_MIRAGE_SERVICE`` (default 72 h) after it was queued is overdue, whatever it is
waiting for (an approval, its jobs' queue, its keeper's next decision); the triggerer logs it,
records it under ``_deadlines/mirage_service/`` in storage and tells the site's notifier, if one
is set (``house.deadlines``). It is no watchdog on the keeper's decisions: Airflow fixes a run's
deadline once, when the run is queued (a custom deadline reference too), and drops it only when
the run ends, so a keeper stuck between two decisions is reported when the whole run passes the
interval, not sooner. A site keeping longer services sets the interval above ``links`` job limits
(``service_hours / factor`` each) plus the queue waits and, on its Slurm, the approval wait.

The form is ``mirage_tasks.run.forms.ServiceRun``; each param is the ``keep-service`` flag of its
name, and one left empty (``model``, ``partition`` ...) is left out of the command line; only
``approval_hours`` (``ServiceRun.NOT_FLAGS``) is not a flag.

On a site's Slurm a person approves first: ``approve`` (``house.approvals``) shows the plan
(``mirage_tasks.run.service_plan``: the sbatch line, nodes, limit, cluster, partition, account,
the horizon, the decision rule) under Browse -> Required Actions. Approve: ``keep_service`` runs.
Reject, or no answer within ``approval_hours``: ``keep_service`` is skipped and the run ends;
each answer is recorded at ``<out>.approval.json`` beside the run's outputs. On make slurm's
local cluster (the local runner, ``var/slurm/slurm.conf`` with its controller on this machine)
nothing is asked and ``approve`` is skipped.

Locally (``make slurm``) it reads ``SLURM_CONF`` from the param ``slurm_conf`` (default
``var/slurm/slurm.conf``). In a pod the Slurm client and the munge key come from the
``mirage-slurm`` Secret (``slurm.conf`` and ``munge.key``, mounted at ``/etc/slurm`` and
``/etc/munge``; docs/deploy.md says how to make it and which account submits).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param, task

from house import default_args, get_config, param_argv, steps_for
from house.approvals import approval
from house.config import MACROS
from house.deadlines import deadline_alert
from mirage_tasks.run.forms import LOCAL_SLURM_CONF, ServiceRun
from mirage_tasks.run.runconf import class_form

step, _ = steps_for("mirage_tasks")
LOCAL = get_config().runner == "local"


#: The form's slurm.conf: the file ``make slurm`` writes locally, the mounted ``mirage-slurm`` Secret in a
#: pod. The only slurm_conf outside the allowed input roots a run may name.
SLURM_CONF = LOCAL_SLURM_CONF if LOCAL else "/etc/slurm/slurm.conf"
#: The form: :class:`mirage_tasks.run.forms.ServiceRun`'s fields, with this deployment's slurm.conf.
FORM = class_form(ServiceRun, defaults={"slurm_conf": SLURM_CONF})


def unknown_conf(conf: dict, known) -> str | None:
    """Why ``conf`` cannot be this DAG's run conf (keys that are not its params), or None."""
    odd = sorted(set(conf) - set(known))
    if odd:
        return f"unknown param(s) {', '.join(map(str, odd))} in the run conf; known: {', '.join(sorted(known))}"
    return None


def approval_request(params) -> str | dict:
    """What ``approve`` asks before a run submits to a site's Slurm (the plan, from the typed form),
    or why it asks nothing (make slurm's local cluster): ``mirage_tasks.run.service_plan``."""
    from mirage_tasks.run.service_plan import service_approval

    form = {k: params.get(k) for k in FORM if k in params}
    return service_approval(
        form, local_runner=LOCAL, code_root=get_config().code_root, defaults={"slurm_conf": SLURM_CONF}
    )


def _pod_overrides() -> dict:
    """The Slurm credentials in a pod: the ``mirage-slurm`` Secret as files (kubernetes runner only)."""
    if LOCAL:
        return {}
    from kubernetes.client import models as k8s  # only for the kubernetes runner

    vol = k8s.V1Volume(name="slurm", secret=k8s.V1SecretVolumeSource(secret_name="mirage-slurm", default_mode=0o400))
    mounts = [
        k8s.V1VolumeMount(name="slurm", mount_path="/etc/slurm/slurm.conf", sub_path="slurm.conf", read_only=True),
        k8s.V1VolumeMount(name="slurm", mount_path="/etc/munge/munge.key", sub_path="munge.key", read_only=True),
    ]
    return {"volumes": [vol], "volume_mounts": mounts}


with DAG(
    dag_id="mirage_service",
    description="Keep a service alive on a Slurm cluster (model, a baseline or the wait predictor's rules)",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    # a run unfinished HOUSE_DEADLINE_MIRAGE_SERVICE after it was queued is overdue: the run's deadline,
    # not one per keeper decision (house.deadlines)
    deadline=deadline_alert("mirage_service"),
    default_args=default_args(owner="mirage"),
    tags=["mirage", "ml"],
    user_defined_macros=dict(MACROS),
    # every param declared once, typed and described, in mirage_tasks.run.forms.ServiceRun
    params={name: Param(**spec) for name, spec in FORM.items()},
) as dag:
    # resolved at run time (the house macro), one folder per run
    out = "{{ house_storage_prefix(dag.dag_id) }}/{{ run_id | replace(':', '_') | replace('+', '_') }}"
    # one flag per param of the form; an empty optional one (model, partition, ...) is left out
    argv = ["keep-service", *param_argv({k: v for k, v in FORM.items() if k not in ServiceRun.NOT_FLAGS}), "--out", out]

    @task
    def check_conf(**context) -> None:
        """Refuse a run conf with a key the form does not have (a misspelt ``links`` would be
        ignored otherwise and the service kept with the default): fails at once, no retry."""
        from airflow.sdk.exceptions import AirflowFailException

        from house import input_roots
        from stepkit import reach

        conf = dict(getattr(context["dag_run"], "conf", None) or {})
        why = unknown_conf(conf, dag.params.keys())
        if why:
            raise AirflowFailException(why)
        # the URIs the step opens are data, not reach: under the storage root (or HOUSE_INPUT_ROOTS),
        # refused by name before keep_service starts; slurm_conf may also be the deployment's own
        # (the form's default: the mounted Secret in a pod, make slurm's file locally)
        params = context["params"]
        uris = {k: params.get(k) for k in ("model", "avg_cal_samples", "waitpred", "guarantee_samples")}
        if params.get("slurm_conf") != SLURM_CONF:
            uris["slurm_conf"] = params.get("slurm_conf")
        try:
            reach.check_params(uris, input_roots())
        except reach.Refused as exc:
            raise AirflowFailException(str(exc)) from exc
        # locally, a cluster first: the form untouched on a machine without one must say that (and how
        # to start one) before the step names a missing model
        if LOCAL:
            conf_path = Path(get_config().code_root) / str(params.get("slurm_conf") or SLURM_CONF)
            if not conf_path.is_file():
                raise AirflowFailException(
                    f"mirage_service keeps its service on a Slurm cluster, and there is none here: slurm_conf "
                    f"{params.get('slurm_conf')} does not exist. Start the project's local one with `make slurm` "
                    "(as root; docs/mirage-steps.md, 'a real Slurm'), or set slurm_conf to your cluster's slurm.conf."
                )

    # on a site's Slurm a person approves the plan first (house.approvals); skipped on make slurm's
    approve = approval("approve", request=approval_request, record=out + ".approval.json")
    keep = step(
        "keep_service",
        argv=argv,
        preset="cpu-small",
        timeout=timedelta(days=30),
        pod_overrides=_pod_overrides(),
        trigger_rule="none_failed",  # a skipped approval (nothing asked) is no refusal
        adopt_flag="--adopt-jobs",  # a retry adopts the Slurm jobs the failed try submitted (house.external)
    )
    check_conf() >> approve >> keep
