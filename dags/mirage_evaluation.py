"""Queue-wait prediction at submission time on your own log, from the trigger form.

Fill in the log's description and trigger: ``plan`` checks it (a field that cannot be used fails
the run at once, naming it) and builds the command lines with the same functions as
``python -m lab.campaigns.mirage_eval --waitpred-only`` (``mirage_tasks.run.evalplan``); then

1. ``ingest`` reads the raw log (a Slurm ``sacct`` export or an SWF file, path or URI);
2. ``calibrate`` fits the simulator's machine size and priority weights on the calibration period
   (never larger than ``machine_nodes`` or the log's stated size); its figures are replay fidelity;
3. ``waitpred`` fits the candidates on the calibration period and scores every job submitted in
   the scored months, each from what was known at its submission: point predictions, a 90 % upper
   bound with its coverage per month, and the guard's pick beside zero wait.

Outputs: ``<storage root>/mirage_evaluation/<name>/{trace,cal,waitpred}``; ``waitpred.md`` and
``waitpred.json`` hold the tables. A rerun with the same description skips every step. From a
shell, the same::

    python -m lab.campaigns.mirage_eval --waitpred-only --log-file mysite.json
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from airflow.sdk import DAG, Param, task

from house import default_args, get_config, steps_for
from mirage_tasks.run.forms import EvaluationRun
from mirage_tasks.run.runconf import class_form

step, _ = steps_for("mirage_tasks")
LOCAL = get_config().runner == "local"
#: the form's example: the KTH SP2 log beside a local checkout (../shared/traces)
_KTH = Path(__file__).resolve().parents[2] / "shared" / "traces" / "KTH-SP2-1996-2.1-cln.swf.gz"
#: The form: :class:`mirage_tasks.run.forms.EvaluationRun`'s fields, the example log where it exists.
FORM = class_form(EvaluationRun, defaults={"trace": str(_KTH) if LOCAL and _KTH.exists() else None})

with DAG(
    dag_id="mirage_evaluation",
    description="Wait prediction at submission time on a log you describe (calibrate, waitpred)",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=2,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "ml"],
    # every param declared once, typed and described, in mirage_tasks.run.forms.EvaluationRun
    params={name: Param(**spec) for name, spec in FORM.items()},
) as dag:

    @task(multiple_outputs=True)
    def plan(params=None) -> dict:
        """The log description checked, and the three command lines."""
        from airflow.sdk.exceptions import AirflowFailException

        from house import input_roots, storage_prefix
        from mirage_tasks.run import evalplan
        from stepkit import reach

        try:  # the form's values typed and checked against the form's own schema
            run = EvaluationRun.from_params(dict(params or {}))
        except ValueError as exc:
            raise AirflowFailException(str(exc)) from exc
        try:  # the log is data, not reach: under the storage root or the shipped traces, before any read
            reach.check_params({"trace": run.trace}, input_roots())
        except reach.Refused as exc:
            raise AirflowFailException(str(exc)) from exc
        doc = {
            "name": run.name,
            "trace": run.trace,
            "calibrate": [run.calibrate_from, run.calibrate_to],
            "months": list(run.months),
            "timezone": run.timezone,
            "procs_per_node": run.procs_per_node,
            "machine_nodes": run.machine_nodes,
        }
        try:
            spec = evalplan.LogSpec.from_dict(doc, source="the trigger form")
            reach.check_params({"trace": spec.trace}, input_roots())  # as resolved (a relative path)
        except (evalplan.SpecError, reach.Refused) as exc:
            raise AirflowFailException(str(exc)) from exc
        budget = evalplan.Budget(trials=run.trials, timeout_s=float(run.timeout_s))
        argvs = dict(evalplan.waitpred_argvs(spec, storage_prefix("mirage_evaluation"), budget))
        print(f"log {spec.name}: outputs under {storage_prefix('mirage_evaluation', spec.name)}")
        return argvs

    argvs = plan()
    ingest = step("ingest", argv=argvs["ingest"], preset="cpu-small", timeout=timedelta(hours=1))
    calibrate = step("calibrate", argv=argvs["calibrate"], preset="cpu-large", timeout=timedelta(hours=26))
    waitpred = step("waitpred", argv=argvs["waitpred"], preset="cpu-large", timeout=timedelta(hours=6))
    ingest >> calibrate >> waitpred
