"""End-to-end ``dag.test()`` runs of ``mirage_pipeline`` in local mode (real child processes).

``dag.test()`` does not raise when a task fails: every test checks ``dr.state``.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import REPO, bundle_dags, fake_bundle, load_dag, task_states

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
#: Run prefixes are <logical date>-<configuration key>; traces and samples are shared, content-keyed.
PREFIX_GLOB = "mirage_pipeline/2026-11-29T120000Z-*"


def _one(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


def _trace_dir(root: Path) -> Path:
    return _one(root, "mirage/traces/*")


#: The trace tests stop after the trace: everything downstream is marked success unrun.
AFTER_TRACE = "sample|merge|train_cpu|train_gpu|policy_cpu|policy_gpu|validate|fidelity|metrics|report"


def _require(module: str) -> None:
    if not (REPO / "mirage_tasks" / "steps" / f"{module}.py").exists():
        pytest.skip(f"mirage_tasks/steps/{module}.py is not there yet (the `{module}` step CLI)")


@pytest.fixture
def storage(local_storage) -> Path:
    return local_storage


def _dag():
    return load_dag("mirage_pipeline")


_states = task_states


def _assert_trace(out: Path, step: str) -> dict:
    assert (out / "trace.parquet").is_file(), sorted(p.name for p in out.iterdir()) if out.exists() else out
    marker = json.loads((out / "_SUCCESS.json").read_text())
    assert marker["step"] == step
    return marker


def test_ls6_slice(storage, traces_dir):
    """Ingest one week of the real Lonestar6 log."""
    _require("ingest")
    trace = traces_dir / "ls6-a100.log.gz"
    if not trace.exists():
        pytest.skip(f"{trace} is absent")
    conf = {
        "trace": str(trace),
        "trace_timezone": "America/Chicago",
        "window_from": "2022-11-01T00:00:00+00:00",
        "window_to": "2022-11-08T00:00:00+00:00",
    }
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=conf, mark_success_pattern=AFTER_TRACE)
    assert dr.state == "success", _states(dr)
    marker = _assert_trace(_trace_dir(storage), "ingest")
    # the params reached the CLI: window and time zone are part of the step's fingerprint
    assert marker["params"]["from"] == conf["window_from"]
    assert marker["params"]["to"] == conf["window_to"]
    assert marker["params"]["timezone"] == "America/Chicago"

    import pyarrow.parquet as pq

    table = pq.read_table(_trace_dir(storage) / "trace.parquet")
    assert 0 < table.num_rows < 24_000  # a slice, not the whole log
    assert table.num_rows == marker["summary"]["rows_kept"]


def test_synthetic_default(storage):
    """No trace given: the packaged ls6 profile generates one; a rerun reuses the prefix."""
    _require("synth")
    dag = _dag()
    conf = {"window_from": "2024-01-01T00:00:00+00:00", "window_to": "2024-01-02T00:00:00+00:00"}
    dr = dag.test(logical_date=LOGICAL_DATE, run_conf=conf, mark_success_pattern=AFTER_TRACE)
    assert dr.state == "success", _states(dr)
    out = _trace_dir(storage)
    first = _assert_trace(out, "synth")
    assert first["params"]

    # A second run for the same logical date writes to the same prefix and skips the work.
    stamp = (out / "trace.parquet").stat().st_mtime_ns
    dr = dag.test(logical_date=LOGICAL_DATE + timedelta(0), run_conf=conf, mark_success_pattern=AFTER_TRACE)
    assert dr.state == "success", _states(dr)
    assert (out / "trace.parquet").stat().st_mtime_ns == stamp
    assert json.loads((out / "_SUCCESS.json").read_text())["fingerprint"] == first["fingerprint"]
    # the plan recorded which DAG run used the prefix, and the params unlike the defaults
    records = [json.loads(p.read_text()) for p in _one(storage, PREFIX_GLOB).glob("_runs/*.json")]
    assert records and {r["run_type"] for r in records} == {"manual"}, records
    rec = records[0]
    assert rec["dag_id"] == "mirage_pipeline" and rec["run_id"] and rec["logical_date"].startswith("2026-11-29T12:00")
    assert rec["changed"]["window_from"] == {"value": conf["window_from"], "default": None}
    assert "seed" not in rec["changed"] and rec["params"]["seed"] == 0


def test_failing_step_fails_the_run(storage, tmp_path):
    """A step rejecting its input (exit 2) fails task and run at once, despite retries, and leaves no marker."""
    _require("ingest")
    dag = _dag()
    assert dag.get_task("prepare_trace").retries >= 1  # dag.test() would wait out the retry delay
    inputs = storage / "inputs"  # a form's trace is read only under the storage root or the shipped traces
    inputs.mkdir(parents=True)
    missing = inputs / "no-such-trace.log"
    dr = dag.test(logical_date=LOGICAL_DATE, run_conf={"trace": str(missing)}, mark_success_pattern=AFTER_TRACE)
    assert dr.state == "failed", _states(dr)
    # the plan fingerprints the trace first: it fails at once (no retry), nothing is written
    assert _states(dr)["plan.commands"] == "failed" and _states(dr)["prepare_trace"] == "upstream_failed"
    assert not list(storage.glob("mirage/traces/*/_SUCCESS.json"))
    # a trace that is there but unreadable: ingest exits 2, the task fails without retries
    bad = inputs / "bad.swf"
    bad.write_text("; not a trace\nthis is not a job line\n")
    dr = dag.test(logical_date=LOGICAL_DATE, run_conf={"trace": str(bad)}, mark_success_pattern=AFTER_TRACE)
    assert dr.state == "failed", _states(dr)
    assert _states(dr)["prepare_trace"] == "failed"
    assert not list(storage.glob("mirage/traces/*/_SUCCESS.json"))


TEST_BUNDLE_DAGS = """
from datetime import timedelta
from airflow.sdk import DAG, task
from house import MAP_LABEL, default_args, mapped_items, step, step_partial

with DAG("house_timeout", schedule=None, default_args=default_args(retries=0), tags=["pipeline"]):
    step("hang", package="fakesteps", argv=["hang"], timeout=timedelta(seconds=4), kill_grace_seconds=2)

with DAG("house_mapped", schedule=None, default_args=default_args(retries=0), tags=["pipeline"]):
    @task(multiple_outputs=True)  # each key its own XCom: plan["name"]
    def plan_run():
        return {"name": "joined"}

    @task
    def shard_argvs():  # Airflow maps over a return value, never over a dict key of one
        return [["write", str(i), "{{ ds }}"] for i in range(3)]

    @task
    def labelled_items():  # each argv with its label: what the grid shows for the instance
        return mapped_items([["write", f"l{i}"] for i in range(2)], [f"part {i} · node 8" for i in range(2)])

    plan = plan_run()
    mapped = step_partial("shard", package="fakesteps", timeout=timedelta(minutes=1)).expand(argv=shard_argvs())
    labelled = step_partial("labelled", package="fakesteps", timeout=timedelta(minutes=1),
                            map_index_template=MAP_LABEL).expand_kwargs(labelled_items())
    joined = step("join", package="fakesteps", argv=["write", plan["name"], "{{ ds }}"], timeout=timedelta(minutes=1))
    mapped >> joined
"""

FAKE_STEPS = """
import os, subprocess, sys, time
from pathlib import Path

out = Path(os.environ["FAKE_OUT"])
mode = sys.argv[1]
if mode == "hang":
    g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    (out / "pids").write_text(f"{os.getpid()} {g.pid}")
    time.sleep(300)
elif mode == "write":
    (out / sys.argv[2]).write_text(" ".join(sys.argv[2:]))
"""


@pytest.fixture
def test_bundle(tmp_path, monkeypatch):
    """A DAG bundle with the DAGs above and a fake task package ``fakesteps``."""
    code_root, dags, out = fake_bundle(
        tmp_path,
        monkeypatch,
        package="fakesteps",
        main_source=FAKE_STEPS,
        dags_source=TEST_BUNDLE_DAGS,
        bundle="house-test-bundle",
    )
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    monkeypatch.setenv("HOUSE_CODE_ROOT", str(code_root))
    monkeypatch.setenv("FAKE_OUT", str(out))
    return bundle_dags(dags), out


def test_step_timeout_kills_the_child(test_bundle):
    """execution_timeout under dag.test() stops a hanging step and its grandchild."""
    from test_local_runner import _wait_dead

    dags, out = test_bundle
    start = time.monotonic()
    dr = dags["house_timeout"].test(logical_date=LOGICAL_DATE)
    assert dr.state == "failed", _states(dr)
    assert time.monotonic() - start < 200  # the step sleeps 300 s unless the timeout kills it
    for pid in map(int, (out / "pids").read_text().split()):
        assert _wait_dead(pid), f"process {pid} survived the task timeout"


def test_mapped_step_and_xcom_argv(test_bundle):
    """A mapped step (argv lists from an upstream task), one mapped over argvs with their labels, and
    XComArg items inside a templated argv."""
    dags, out = test_bundle
    dr = dags["house_mapped"].test(logical_date=LOGICAL_DATE)
    assert dr.state == "success", _states(dr)
    # mapped argv values are passed as given (not templated); a plain step's argv is templated
    assert sorted(p.name for p in out.iterdir()) == ["0", "1", "2", "joined", "l0", "l1"]
    labels = {ti.map_index: ti.rendered_map_index for ti in dr.get_task_instances() if ti.task_id == "labelled"}
    assert labels == {0: "part 0 · node 8", 1: "part 1 · node 8"}
    assert (out / "0").read_text() == "0 {{ ds }}"
    assert (out / "joined").read_text() == "joined 2026-11-29"


def test_airflow_variable_sets_storage_root(tmp_path, monkeypatch):
    """With no HOUSE_STORAGE_ROOT, the Airflow Variable ``house_storage_root`` is used at run time."""
    _require("synth")
    from airflow.models.variable import Variable

    # dag.test() parses (caching Variable lookups) and runs tasks in this process; a
    # running task must read the Variable afresh.
    root = tmp_path / "from-variable"
    fallback = tmp_path / "default-root"  # never the repository's var/, even if this test fails
    monkeypatch.setattr("house.config.DEFAULT_STORAGE_ROOT", fallback)
    monkeypatch.delenv("HOUSE_STORAGE_ROOT", raising=False)
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    Variable.set("house_storage_root", str(root))
    try:
        conf = {"window_from": "2024-01-01T00:00:00+00:00", "window_to": "2024-01-01T06:00:00+00:00"}
        dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=conf, mark_success_pattern=AFTER_TRACE)
    finally:
        Variable.delete("house_storage_root")
    assert dr.state == "success", _states(dr)
    _assert_trace(_trace_dir(root), "synth")
    assert not fallback.exists()


#: A whole run, every step for real, sized to take a few minutes on 2 cores.
SMALL_RUN = {
    # 12 h apart: the training split drops samples within workload_days of its own validation
    "train_count": 30,
    "interval_hours": 12,
    "val_count": 3,
    "node_sizes": [1],
    "shards": 2,
    "probes": 4,
    "train_params": {
        "transformer": ["epochs=2"],
        "moe": ["epochs=1", "expert_epochs=1", "n_experts=2"],
        "xgboost": ["n_estimators=20"],
        "random_forest": ["n_estimators=10"],
        "xgboost_quantile": ["n_estimators=20"],
        "transformer_policy": ["epochs=1", "episodes_per_epoch=2", "eval_episodes=2", "parallel_envs=2"],
        "moe_policy": ["epochs=1", "episodes_per_epoch=2", "eval_episodes=2", "parallel_envs=2"],
    },
}


@pytest.mark.timeout(900)
def test_whole_pipeline_on_the_synthetic_trace(storage):
    """trace -> sample -> merge -> train (8 models) -> validate (+ baselines) -> metrics -> report."""
    import pandas as pd

    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=SMALL_RUN)
    states = _states(dr)
    assert dr.state == "success", states
    assert "train_gpu" not in states and "policy_gpu" not in states  # no GPU nodes declared (HOUSE_GPUS)
    run = _one(storage, PREFIX_GLOB)
    manifest = json.loads((run / "datasets" / "node1" / "manifest.json").read_text())
    assert manifest["n_samples"] == 30 and manifest["n_examples"] == 30 * 4
    for model in (
        "xgboost",
        "random_forest",
        "xgboost_quantile",
        "linear_quantile",
        "transformer",
        "moe",
        "transformer_policy",
        "moe_policy",
    ):
        assert json.loads((run / "models" / model / "node1" / "_SUCCESS.json").read_text())["step"] == "train"
    rows = pd.read_parquet(run / "metrics" / "samples.parquet")
    assert set(rows["model"]) == {
        "xgboost",
        "random_forest",
        "xgboost_quantile",
        "linear_quantile",
        "transformer",
        "moe",
        "transformer_policy",
        "moe_policy",
        "reactive",
        "avg",
    }
    assert (rows.groupby("model").size() == 3).all()
    html = (run / "report" / "report.html").read_text()
    assert "data:image/png;base64," in html and "fidelity" in html.lower()
    # Validation starts after every training workload ended (the plan's windows).
    val_start = pd.Timestamp(rows["sample_start"].min(), unit="s", tz="UTC")
    assert pd.Timestamp(manifest["data_end"]) <= val_start
    # Samples are trace-day partitions shared by every run (30 samples 12 h apart: 15 days).
    assert len(list(storage.glob("mirage/samples/node1-*/day=*/_SUCCESS.json"))) == 15
    # Each mapped instance carries the plan's label for its argv (what the grid shows).
    labels = {(ti.task_id, ti.map_index): ti.rendered_map_index for ti in dr.get_task_instances() if ti.map_index >= 0}
    assert labels[("merge", 0)] == "node 1" and labels[("train_cpu", 0)] == "xgboost · node 1"
    assert labels[("policy_cpu", 0)] == "transformer_policy · node 1"
    assert sorted(v for (t, _), v in labels.items() if t == "sample") == [
        "node 1 · 2023-01-22..2023-01-29 (8 d)",
        "node 1 · 2023-01-30..2023-02-05 (7 d)",
    ]  # the demo window
    assert labels[("validate", len([k for k in labels if k[0] == "validate"]) - 1)] == "avg · node 1 · shard 1/2"

    # A second trigger with the same params does no work: same prefix, every step skips.
    markers = {p: p.stat().st_mtime_ns for p in storage.rglob("_SUCCESS.json")}
    dr = _dag().test(logical_date=LOGICAL_DATE, run_conf=SMALL_RUN)
    states = _states(dr)
    assert dr.state == "success", states
    assert states["sample"] == "skipped"  # no day missing: the mapped step has no instance
    assert {p: p.stat().st_mtime_ns for p in storage.rglob("_SUCCESS.json")} == markers
