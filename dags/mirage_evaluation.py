"""Queue-wait prediction at submission time on your own log, from the trigger form (issue 27).

Fill in the log's description and trigger: ``plan`` checks it (a field that cannot be used fails
the run at once, naming it) and builds the command lines with the same functions as
``bench/mirage_eval.py --waitpred-only`` (``mirage_tasks.run.evalplan``); then

1. ``ingest`` reads the raw log (a Slurm ``sacct`` export or an SWF file, path or URI);
2. ``calibrate`` fits the simulator's machine size and priority weights on the calibration period
   (never larger than ``machine_nodes`` or the log's stated size); its figures are replay fidelity;
3. ``waitpred`` fits the candidates on the calibration period and scores every job submitted in
   the scored months, each from what was known at its submission: point predictions, a 90 % upper
   bound with its coverage per month, and the guard's pick beside zero wait.

With ``mode`` ``full`` it also runs the decision evaluation of docs/results/protocol.md on the
calibrated simulator, per node size: ``sample`` (training samples and the scored months' samples),
``merge``, ``train`` (each model), ``evaluate`` (the probe replay against reactive, avg, avg-cal
and the oracles, with paired intervals), each a mapped step (``max_train``/``max_score`` cap the
samples for a quick look; 0 is the protocol's). In ``waitpred`` mode those four are skipped.

Outputs: ``<storage root>/mirage_evaluation/<name>/{trace,cal,waitpred}`` (and
``samples-*``, ``datasets``, ``models``, ``eval`` in ``full`` mode); ``waitpred.md`` and
``waitpred.json`` hold the tables. A rerun with the same description skips every step. From a
shell, the same::

    python bench/mirage_eval.py --waitpred-only --log-file mysite.json
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from airflow.sdk import DAG, Param, task

from house import default_args, get_config, steps_for

step, step_partial = steps_for("mirage_tasks")
LOCAL = get_config().runner == "local"
#: the form's example: the KTH SP2 log beside a local checkout (../shared/traces)
_KTH = Path(__file__).resolve().parents[2] / "shared" / "traces" / "KTH-SP2-1996-2.1-cln.swf.gz"

with DAG(
    dag_id="mirage_evaluation",
    description="Wait prediction at submission time on a log you describe (calibrate, waitpred)",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=2,
    default_args=default_args(owner="mirage"),
    tags=["mirage", "ml"],
    params={
        "name": Param("KTH-SP2", type="string", pattern="^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                      description="a short name for the log (its output folder)"),
        "trace": Param(str(_KTH) if LOCAL and _KTH.exists() else "", type="string", minLength=1,
                       description="the raw log: a Slurm sacct export or an SWF file (path or URI)"),
        "timezone": Param(None, type=["null", "string"],
                          description="the log's time zone (sacct; empty: an SWF header's, else UTC)"),
        "procs_per_node": Param(1, type=["null", "integer"], minimum=1, maximum=4096,
                                description="processors per node, for logs that record processors only (SWF)"),
        "machine_nodes": Param(None, type=["null", "integer"], minimum=1,
                               description="the machine's size in nodes where the log does not say (SWF headers do)"),
        "calibrate_from": Param("1996-10-08", type="string", format="date", description="calibration period start"),
        "calibrate_to": Param("1997-01-01", type="string", format="date", description="calibration period end (exclusive)"),
        "months": Param(["1997-01", "1997-02", "1997-03"], type="array", minItems=1, maxItems=24,
                        items={"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$"},
                        description="scored months YYYY-MM, after the calibration period"),
        "trials": Param(40, type="integer", minimum=1, maximum=400, description="calibration trials (40)"),
        "timeout_s": Param(300, type="integer", minimum=10, maximum=86400,
                           description="calibration time budget, seconds (300)"),
        "mode": Param("waitpred", enum=["waitpred", "full"],
                      description="waitpred: the wait predictor only; full: also the decision evaluation per node size"),
        "node_sizes": Param([1, 8], type="array", minItems=1, maxItems=8, items={"type": "integer", "minimum": 1},
                            description="service node sizes of the decision evaluation (full mode)"),
        "max_train": Param(0, type="integer", minimum=0, maximum=100000,
                           description="cap on training samples (full mode; 0: the protocol's, one every 6 h)"),
        "max_score": Param(0, type="integer", minimum=0, maximum=100000,
                           description="cap on scored samples (full mode; 0: every 6 h of the scored months)"),
    },
) as dag:

    @task(multiple_outputs=True)
    def plan(params=None) -> dict:
        """The log description checked, and the three command lines."""
        from airflow.sdk.exceptions import AirflowFailException
        from house import storage_prefix
        from mirage_tasks.run import evalplan

        p = dict(params or {})
        doc = {"name": p["name"], "trace": p["trace"], "calibrate": [p["calibrate_from"], p["calibrate_to"]],
               "months": list(p["months"]), "timezone": p.get("timezone") or None,
               "procs_per_node": p.get("procs_per_node"), "machine_nodes": p.get("machine_nodes"),
               "nodes": list(p.get("node_sizes") or [1, 8])}
        try:
            spec = evalplan.LogSpec.from_dict(doc, source="the trigger form")
        except evalplan.SpecError as exc:
            raise AirflowFailException(str(exc)) from exc
        budget = evalplan.Budget(trials=int(p["trials"]), timeout_s=float(p["timeout_s"]),
                                 max_train=int(p.get("max_train") or 0), max_score=int(p.get("max_score") or 0))
        root = storage_prefix("mirage_evaluation")
        argvs: dict = dict(evalplan.waitpred_argvs(spec, root, budget))
        try:
            stages = evalplan.decision_stages(spec, root, budget) if p.get("mode") == "full" else {}
        except evalplan.SpecError as exc:
            raise AirflowFailException(str(exc)) from exc
        for k in ("sample", "merge", "train", "evaluate"):
            argvs[k] = stages.get(k, [])  # waitpred mode: nothing to map, the four are skipped
        print(f"log {spec.name}: outputs under {storage_prefix('mirage_evaluation', spec.name)}; mode "
              f"{p.get('mode')}: " + ", ".join(f"{len(argvs[k])} {k}" for k in ("sample", "merge", "train", "evaluate")))
        return argvs

    argvs = plan()
    ingest = step("ingest", argv=argvs["ingest"], preset="cpu-small", timeout=timedelta(hours=1))
    calibrate = step("calibrate", argv=argvs["calibrate"], preset="cpu-large", timeout=timedelta(hours=26))
    waitpred = step("waitpred", argv=argvs["waitpred"], preset="cpu-large", timeout=timedelta(hours=6))
    ingest >> calibrate >> waitpred

    @task
    def stage(plan_out: dict, name: str) -> list:
        """One stage's argv lists from the plan (a mapped step maps over a task's return value)."""
        return plan_out[name]

    full = {k: stage.override(task_id=f"{k}_argvs")(argvs, k) for k in ("sample", "merge", "train", "evaluate")}
    sample = step_partial("sample", preset="cpu-large", timeout=timedelta(hours=12)).expand(argv=full["sample"])
    merge = step_partial("merge", preset="cpu-small", timeout=timedelta(hours=2)).expand(argv=full["merge"])
    train = step_partial("train", preset="cpu-large", timeout=timedelta(hours=12)).expand(argv=full["train"])
    evaluate = step_partial("evaluate", preset="cpu-large", timeout=timedelta(hours=6)).expand(argv=full["evaluate"])
    calibrate >> sample >> merge >> train >> evaluate
