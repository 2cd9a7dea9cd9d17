"""The trigger forms of the Mirage DAGs can be submitted as documented: every param's schema
accepts its default (what the form shows), the form's JSON (empty fields as null) and every
example configuration in docs/dags.md (the DAGs' page; README.md too, should it show one) and the
Makefile (``ParamsDict.validate()``)."""

from __future__ import annotations

import copy
import json
import re
import subprocess

import pytest
from conftest import DAGS, REPO

DAG_IDS = ("mirage_pipeline", "mirage_samples")


@pytest.fixture(scope="module")
def dags():
    from airflow.dag_processing.dagbag import DagBag

    out = {}
    for dag_id in DAG_IDS:
        bag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py"))
        assert not bag.import_errors, bag.import_errors
        out[dag_id] = bag.dags[dag_id]
    return out


def _validate(dag, conf: dict) -> dict:
    params = copy.deepcopy(dag.params)
    unknown = set(conf) - set(params.keys())
    assert not unknown, f"{dag.dag_id}: unknown params {unknown}"
    for k, v in conf.items():
        params[k] = v
    return params.validate()


def docs_examples() -> list[tuple[str, dict]]:
    """``<!-- conf: DAG_ID -->`` followed by a fenced json block, in README.md or docs/dags.md."""
    text = "\n".join((REPO / name).read_text() for name in ("README.md", "docs/dags.md"))
    found = re.findall(r"<!-- conf: (\w+) -->\s*```json\n(.*?)```", text, flags=re.S)
    return [(dag_id, json.loads(body)) for dag_id, body in found]


def make_value(name: str, **variables: str) -> str:
    """The Makefile variable ``name`` as make expands it (``variables`` set on the command line)."""
    out = subprocess.run(
        [
            "make",
            "-s",
            "--no-print-directory",
            "-f",
            str(REPO / "Makefile"),
            "--eval",
            f"print-value: ; @:$(info $({name}))",
            "print-value",
            *[f"{k}={v}" for k, v in variables.items()],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def makefile_examples() -> list[tuple[str, dict]]:
    """The Makefile's run configurations, expanded by make: the demo with a trace and on the
    synthetic trace, and the ls6 results run."""
    confs = [make_value("DEMO_CONF", TRACE="/data/t.log"), make_value("DEMO_CONF"), make_value("LS6_CONF")]
    return [("mirage_pipeline", json.loads(c)) for c in confs]


@pytest.mark.parametrize("dag_id", DAG_IDS)
def test_defaults_and_the_forms_json_validate(dags, dag_id):
    dag = dags[dag_id]
    dag.params.validate()  # the defaults, as the form shows them
    # the form sends empty optional fields as null: every nullable param takes it
    nullable = {k: None for k, p in dag.params.items() if "null" in (p.schema.get("type") or [])}
    assert "trace" in nullable
    assert _validate(dag, nullable)["trace"] is None


def test_trace_is_not_required_in_the_form(dags):
    for dag in dags.values():
        schema = dag.params.get_param("trace").schema
        assert "null" in schema["type"] and dag.params.get_param("trace").value is None


def test_docs_and_makefile_examples_validate(dags):
    examples = docs_examples() + makefile_examples()
    assert {d for d, _ in docs_examples()} == set(DAG_IDS), "docs/dags.md: one example per Mirage DAG at least"
    for dag_id, conf in examples:
        _validate(dags[dag_id], conf)


def test_bad_values_are_refused(dags):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        _validate(dags["mirage_samples"], {"node_sizes": [0]})
    with pytest.raises(ParamValidationError):
        _validate(dags["mirage_pipeline"], {"models": ["lstm"]})


def test_heavy_steps_are_limited_to_the_cpus_locally(dags):
    import os

    from house import MAP_LABEL

    cpus = len(os.sched_getaffinity(0))
    heavy = {"mirage_pipeline": ("sample", "train_cpu", "policy_cpu", "validate"), "mirage_samples": ("sample",)}
    for dag_id, task_ids in heavy.items():
        for task_id in task_ids:
            t = dags[dag_id].get_task(task_id)
            assert t.max_active_tis_per_dag == cpus, (dag_id, task_id)
            env = t.partial_kwargs["env"] if hasattr(t, "partial_kwargs") else t.env
            assert env["OMP_NUM_THREADS"] == "1", (dag_id, task_id)  # one CPU each, locally
            assert t.map_index_template == MAP_LABEL, (dag_id, task_id)  # the plan's label of each instance


def test_samples_dag_is_partitioned_and_publishes_an_asset(dags):
    from airflow.sdk import CronPartitionTimetable

    dag = dags["mirage_samples"]
    assert isinstance(dag.timetable, CronPartitionTimetable)
    assert [a.name for a in dag.get_task("publish").outlets] == ["mirage_samples"]
    # partitioned runs have no logical date: nothing may template {{ ds }}
    assert "ds }}" not in (DAGS / "mirage_samples.py").read_text()


def _schema(param) -> dict:
    return {"default": param.value, "description": param.description, **param.schema}


def test_every_param_has_a_title_and_a_description(dags):
    for dag_id, dag in dags.items():
        for name, param in dag.params.items():
            param = dag.params.get_param(name)
            assert param.schema.get("title"), (dag_id, name)
            assert param.description and len(param.description) > 20, (dag_id, name)
    assert list(dags["mirage_pipeline"].params)[0] == "size"  # the first field of the form
    assert dags["mirage_pipeline"].params["size"] == "demo"  # submitting the form unchanged: minutes


def test_both_forms_come_from_the_one_run_configuration(dags):
    """Each DAG's params are exactly what mirage_tasks.run.runconf renders (no hand-written Param), and
    a param both DAGs show is identical in both, except that in the pipeline a param the run size
    sets is empty by default (null: the size's value) and says so."""
    from mirage_tasks.run.runconf import FIELDS, PIPELINE_FORM, SAMPLES_FORM, SIZED, form, size_note

    pipe, samp = dags["mirage_pipeline"].params, dags["mirage_samples"].params
    assert list(pipe) == list(PIPELINE_FORM) == list(FIELDS) and list(samp) == list(SAMPLES_FORM)
    rendered = form(PIPELINE_FORM, choices={"device": ["cpu"]})  # no GPU nodes declared here
    assert {k: _schema(pipe.get_param(k)) for k in pipe} == rendered
    assert {k: _schema(samp.get_param(k)) for k in samp} == form(SAMPLES_FORM)
    shared = set(pipe) & set(samp)
    assert shared == set(SAMPLES_FORM)
    for name in shared:
        a, b = _schema(pipe.get_param(name)), _schema(samp.get_param(name))
        if name in SIZED:
            assert (a.pop("default"), a.pop("type"), a.pop("description")) == (
                None,
                ["null", b.pop("type")],
                f"{b.pop('description')} {size_note(name)}",
            ), name
            b.pop("default")
        assert a == b, name
    assert samp.get_param("interval_hours").schema["maximum"] == 24  # the one spec: no more drift


def test_the_sample_family_params_mean_the_same_in_both_dags(dags):
    """A pipeline run reads mirage_samples' partitions only when the family params agree: the
    samples form's defaults are what every pipeline size but demo resolves to."""
    from mirage_tasks.run.plan import FAMILY_PARAMS
    from mirage_tasks.run.runconf import MirageRun

    samp = dags["mirage_samples"].params
    assert list(samp) == list(FAMILY_PARAMS)
    for size in ("month", "paper", "scheduled"):
        run = MirageRun.from_params({"size": size}).as_dict()
        assert {k: run[k] for k in FAMILY_PARAMS} == samp.dump(), size


#: the DAG files whose forms come from a typed configuration of the task package
FORM_DAGS = ("mirage_pipeline", "mirage_samples", "mirage_service", "mirage_evaluation")


def test_parsing_the_mirage_dags_imports_only_the_light_configuration():
    """The DAG files build their forms from mirage_tasks.run.runconf (and run.forms, whose
    service form reads the decision-rule registry) at parse time: that pulls in stdlib-only
    modules of the task package, never numpy, pandas, torch or pyarrow."""
    import os
    import sys

    from conftest import PLUGINS

    probe = (
        "import runpy, sys\n"
        f"for f in {tuple(str(DAGS / f'{d}.py') for d in FORM_DAGS)!r}:\n"
        "    runpy.run_path(f)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mirage_tasks', 'stepkit', 'faasm_tasks')))\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch', 'pyarrow', 'sklearn', 'xgboost') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO)]), "HOUSE_NO_VARIABLES": "1"}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", probe], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    modules, heavy = out.stdout.strip().splitlines()[-2:]
    assert set(json.loads(modules.replace("'", '"'))) <= {
        "mirage_tasks",
        "mirage_tasks.run",
        "mirage_tasks.run.runconf",
        "mirage_tasks.run.forms",
        "mirage_tasks.data",
        "mirage_tasks.data.times",
        "mirage_tasks.models",
        "mirage_tasks.models.registry",
        "mirage_tasks.sim",
        "mirage_tasks.sim.probes",
        "mirage_tasks.sim.decision_rules",
    }
    assert heavy == "[]"
