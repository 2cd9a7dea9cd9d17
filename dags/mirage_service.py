"""Keep a service alive on a Slurm cluster: the trained model's decision put to work.

One task, ``keep_service`` (``python -m mirage_tasks keep-service``): it submits the
service's first job (``node`` nodes, ``service_hours`` limit), watches it through ``squeue``
and ``sinfo``, builds the features the model was trained on from the live queue and submits
each successor when the model's calibrated rule says so (never later than the predecessor's
end); ``policy`` ``reactive``, ``avg`` or ``avg-cal`` (calibrated on the training samples named by
``avg_cal_samples``) runs a baseline instead, and ``wait-pred``, ``guarantee`` or ``guarantee-cal``
the wait predictor's rules (a ``waitpred`` output: submit when the predicted start, or its upper
bound, reaches the predecessor's end; ``guarantee-cal`` with a margin calibrated for at most 10 %
interrupted on the end-spaced samples named by ``guarantee_samples``, drawn with that predictor).
Every decision is logged with
its inputs (``decisions.jsonl`` in the output). It never cancels a job it did not submit.
A keeper run still going ``HOUSE_DEADLINE_MIRAGE_SERVICE`` (default 72 h) after it was queued is
overdue: the triggerer logs it, records it under ``_deadlines/mirage_service/`` in storage and
tells the site's notifier, if one is set (``house.deadlines``).

Locally (``make slurm``) it reads ``SLURM_CONF`` from the param ``slurm_conf`` (default
``var/slurm/slurm.conf``). In a pod the Slurm client and the munge key come from the
``mirage-slurm`` Secret (``slurm.conf`` and ``munge.key``, mounted at ``/etc/slurm`` and
``/etc/munge``; docs/deploy.md says how to make it and which account submits).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param, task

from house import default_args, get_config, steps_for
from house.config import MACROS
from house.deadlines import deadline_alert

step, _ = steps_for("mirage_tasks")
LOCAL = get_config().runner == "local"
#: The form's ranges: keep-service's own (``mirage_tasks.steps.keep_service.BOUNDS``, which
#: imports pandas, too heavy for parse time; tests/dags/test_mirage_service_form.py keeps them equal).
SERVICE_BOUNDS = {
    "node": (1, 100_000),
    "service_hours": (1 / 60, 24 * 366),
    "links": (1, 10_000),
    "factor": (1e-3, 1e6),
}


#: The form's slurm.conf: the file ``make slurm`` writes locally, the mounted ``mirage-slurm`` Secret in a
#: pod. The only slurm_conf outside the allowed input roots a run may name.
SLURM_CONF = "var/slurm/slurm.conf" if LOCAL else "/etc/slurm/slurm.conf"


def unknown_conf(conf: dict, known) -> str | None:
    """Why ``conf`` cannot be this DAG's run conf (keys that are not its params), or None."""
    odd = sorted(set(conf) - set(known))
    if odd:
        return f"unknown param(s) {', '.join(map(str, odd))} in the run conf; known: {', '.join(sorted(known))}"
    return None


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
    # a keeper still running HOUSE_DEADLINE_MIRAGE_SERVICE after it was queued is overdue (house.deadlines)
    deadline=deadline_alert("mirage_service"),
    default_args=default_args(owner="mirage"),
    tags=["mirage", "ml"],
    user_defined_macros=dict(MACROS),
    params={
        "policy": Param(
            "model",
            enum=["model", "reactive", "avg", "avg-cal", "wait-pred", "guarantee", "guarantee-cal"],
            description="who decides when to submit",
        ),
        # None, not "": the form must submit untouched; policy model without one fails at once (exit 2, --model)
        "model": Param(
            None,
            type=["null", "string"],
            description="trained model (a train output URI); needed by policy model, unused by reactive and avg",
        ),
        "avg_cal_samples": Param(
            None,
            type=["null", "string"],
            description="a sample output URI of the training period, on which avg-cal's "
            "threshold is calibrated; needed by policy avg-cal",
        ),
        "waitpred": Param(
            None,
            type=["null", "string"],
            description="a waitpred output URI (the wait predictor of this cluster's log); needed by "
            "policies wait-pred, guarantee and guarantee-cal",
        ),
        "guarantee_samples": Param(
            None,
            type=["null", "string"],
            description="a sample output URI drawn with sample --waitpred (the same predictor) "
            "and --probe-spacing end on the months before; guarantee-cal's margin "
            "is calibrated on it; needed by policy guarantee-cal",
        ),
        "node": Param(
            1, type="integer", minimum=1, maximum=SERVICE_BOUNDS["node"][1], description="nodes of each service job"
        ),
        "service_hours": Param(
            48.0,
            type="number",
            minimum=SERVICE_BOUNDS["service_hours"][0],
            maximum=SERVICE_BOUNDS["service_hours"][1],
            description="limit of each job (h), at most a year",
        ),
        "links": Param(
            1, type="integer", minimum=1, maximum=SERVICE_BOUNDS["links"][1], description="successions to keep"
        ),
        "factor": Param(
            1.0,
            type="number",
            minimum=SERVICE_BOUNDS["factor"][0],
            maximum=SERVICE_BOUNDS["factor"][1],
            description="time compression of the cluster (1 for a real one)",
        ),
        "slurm_conf": Param(
            SLURM_CONF,
            type="string",
            description="the cluster's slurm.conf (SLURM_CONF of the Slurm client); "
            "make slurm writes var/slurm/slurm.conf",
        ),
        # None, not "": Param("", type="string") is a required field in the trigger form (its JSON is null)
        "partition": Param(
            None, type=["null", "string"], description="Slurm partition of the service jobs (empty: the default)"
        ),
        "account": Param(
            None,
            type=["null", "string"],
            description="Slurm account charged for the service jobs (empty: the submitting user's default)",
        ),
    },
) as dag:
    # resolved at run time (the house macro), one folder per run
    out = "{{ house_storage_prefix(dag.dag_id) }}/{{ run_id | replace(':', '_') | replace('+', '_') }}"
    argv = [
        "keep-service",
        "--policy",
        "{{ params.policy }}",
        "--node",
        "{{ params.node }}",
        "--service-hours",
        "{{ params.service_hours }}",
        "--links",
        "{{ params.links }}",
        "--factor",
        "{{ params.factor }}",
        "--slurm-conf",
        "{{ params.slurm_conf }}",
        "--out",
        out,
        "{{ '--model=' ~ params.model if params.model else '--policy=' ~ params.policy }}",
        "{{ '--partition=' ~ params.partition if params.partition else '--links=' ~ params.links }}",
        "{{ '--account=' ~ params.account if params.account else '--node=' ~ params.node }}",
        "{{ '--avg-cal-samples=' ~ params.avg_cal_samples if params.avg_cal_samples else '--node=' ~ params.node }}",
        "{{ '--waitpred=' ~ params.waitpred if params.waitpred else '--node=' ~ params.node }}",
        "{{ '--guarantee-samples=' ~ params.guarantee_samples if params.guarantee_samples else '--node=' ~ params.node }}",
    ]

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

    check_conf() >> step(
        "keep_service", argv=argv, preset="cpu-small", timeout=timedelta(days=30), pod_overrides=_pod_overrides()
    )
