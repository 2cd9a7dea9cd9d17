"""The trigger forms of the Mirage DAGs can be submitted as documented: every param's schema
accepts its default (what the form shows), the form's JSON (empty fields as null) and every
example configuration in the README and the Makefile (``ParamsDict.validate()``)."""

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


def readme_examples() -> list[tuple[str, dict]]:
    """``<!-- conf: DAG_ID -->`` followed by a fenced json block, in README.md."""
    text = (REPO / "README.md").read_text()
    found = re.findall(r"<!-- conf: (\w+) -->\s*```json\n(.*?)```", text, flags=re.S)
    return [(dag_id, json.loads(body)) for dag_id, body in found]


def make_value(name: str, **variables: str) -> str:
    """The Makefile variable ``name`` as make expands it (``variables`` set on the command line)."""
    out = subprocess.run(["make", "-s", "--no-print-directory", "-f", str(REPO / "Makefile"),
                          "--eval", f"print-value: ; @:$(info $({name}))", "print-value",
                          *[f"{k}={v}" for k, v in variables.items()]],
                         cwd=REPO, capture_output=True, text=True, check=True)
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


def test_readme_and_makefile_examples_validate(dags):
    examples = readme_examples() + makefile_examples()
    assert {d for d, _ in readme_examples()} == set(DAG_IDS), "README: one example per Mirage DAG at least"
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

    cpus = len(os.sched_getaffinity(0))
    heavy = {"mirage_pipeline": ("sample", "train_cpu", "policy_cpu", "validate"), "mirage_samples": ("sample",)}
    for dag_id, task_ids in heavy.items():
        for task_id in task_ids:
            t = dags[dag_id].get_task(task_id)
            assert t.max_active_tis_per_dag == cpus, (dag_id, task_id)
            env = t.partial_kwargs["env"] if hasattr(t, "partial_kwargs") else t.env
            assert env["OMP_NUM_THREADS"] == "1", (dag_id, task_id)  # one CPU each, locally
            assert t.map_index_template and "step_label" in t.map_index_template or "node_label" in t.map_index_template


def test_samples_dag_is_partitioned_and_publishes_an_asset(dags):
    from airflow.sdk import CronPartitionTimetable

    dag = dags["mirage_samples"]
    assert isinstance(dag.timetable, CronPartitionTimetable)
    assert [a.name for a in dag.get_task("publish").outlets] == ["mirage_samples"]
    # partitioned runs have no logical date: nothing may template {{ ds }}
    assert "ds }}" not in (DAGS / "mirage_samples.py").read_text()


def test_the_sample_family_params_mean_the_same_in_both_dags(dags):
    """mirage_samples and mirage_pipeline each show the params that name a sample family (a
    pipeline run reads mirage_samples' partitions only when they agree): same defaults, same
    choices, so a run with the defaults of one reads what the other wrote."""
    from mirage_tasks.plan import FAMILY_PARAMS

    pipe, samp = dags["mirage_pipeline"].params, dags["mirage_samples"].params
    for name in FAMILY_PARAMS:
        a, b = pipe.get_param(name), samp.get_param(name)
        assert a.value == b.value, name
        sa = {k: v for k, v in a.schema.items() if k not in ("description", "maximum")}
        sb = {k: v for k, v in b.schema.items() if k not in ("description", "maximum")}
        assert sa == sb, name
