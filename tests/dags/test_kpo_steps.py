"""House steps through the real ``KubernetesPodOperator`` against the Kubernetes API stand-in.

``HOUSE_RUNNER=kubernetes``: the house factory builds ``HousePodOperator`` (KPO), the
unmodified provider talks HTTP to ``tests/kubeapi`` through the ``kubernetes_default``
connection, and each pod runs ``python -m fake_tasks ...`` as a local process. Checked:
argv, env and Secret references arrive intact, logs reach the task log, pods are deleted,
a failing step fails its task, ``activeDeadlineSeconds`` kills an overrunning pod, and a
retried task reattaches to (or replaces) the pod of an earlier try the way the operator
documents (``durable``/``reattach_on_restart``: a running pod with the task's labels is
reused; a terminated one is deleted and a new pod created), and the external ids a step announces
(``stepkit.external``) are kept in the task's state store while its pod runs: a retry whose
earlier pod was killed passes them to the new pod (``adopt_flag``), one that finds the earlier
pod still running adopts that pod (house.pod).

``dag.test()`` does not raise when a task fails: every test checks ``dr.state``.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from datetime import UTC, datetime

import pytest
from conftest import REPO, bundle_dags, fake_bundle, task_states
from kubeapi.fixtures import IMAGE_ENV
from kubeapi.server import KubeAPIServer

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
NS = "house-kpo"
SECRET = "house-storage-credentials"
SECRET_DATA = {"AWS_ACCESS_KEY_ID": "AKIA-kpo-test", "AWS_SECRET_ACCESS_KEY": "kpo secret/with=chars"}

FAKE_MAIN = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path

    out = Path(os.environ["FAKE_OUT"])
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "echo":
        keys = ["FAKE_OUT", "MODE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "PYTHONUNBUFFERED",
                "HOUSE_STORAGE_ROOT", "AIRFLOW_HOME", "HOUSE_BUNDLE_NAME", "HOUSE_BUNDLE_VERSION"]
        record = {"argv": args, "env": {k: os.environ.get(k) for k in keys}, "cwd": os.getcwd(),
                  "python": sys.executable}
        (out / "echo.json").write_text(json.dumps(record))
        print("step says hello from the pod", flush=True)
        print("argv=" + json.dumps(args), flush=True)
    elif mode == "fail":
        print("about to fail with", args[0], file=sys.stderr, flush=True)
        sys.exit(int(args[0]))
    elif mode == "hang":
        print("hanging", flush=True)
        time.sleep(300)
    elif mode == "slow":               # the pod an earlier (crashed) try left running
        print("reattached pod running", flush=True)
        deadline = time.time() + float(args[0])
        while time.time() < deadline and not (out / "release").exists():
            time.sleep(0.05)
        (out / "slow-done").write_text(os.environ.get("HOSTNAME", ""))
        print("reattached pod done", flush=True)
    elif mode == "submit":             # starts an external job (a file under jobs/) unless it adopts one
        from stepkit.external import announce, parse_ids

        jobs = out / "jobs"
        jobs.mkdir(exist_ok=True)
        adopted = parse_ids(args[args.index("--adopt") + 1], "--adopt") if "--adopt" in args else []
        with open(out / "tries.jsonl", "a") as f:
            f.write(json.dumps({"pod": os.environ.get("HOSTNAME"), "adopted": adopted}) + "\\n")
        if adopted:
            job = adopted[0]
            print("adopted", job, flush=True)
        else:
            job = f"job-{len(list(jobs.iterdir())) + 1}"
            (jobs / job).write_text("running")
            with open(out / "submitted", "a") as f:
                f.write(job + "\\n")
            announce("fake", [job])
        deadline = time.time() + float(args[0])
        while time.time() < deadline and not (out / "release").exists():
            time.sleep(0.05)
        (jobs / job).unlink()          # the job is done: nothing of it left
        print("job", job, "done", flush=True)
""")

TEST_DAGS = textwrap.dedent("""
    import os
    from datetime import timedelta
    from airflow.sdk import DAG
    from house import default_args, step

    OUT = os.environ["FAKE_OUT"]
    REPO = os.environ["FAKE_REPO"]  # the step imports this checkout's stepkit

    with DAG("kpo_echo", schedule=None, default_args=default_args(retries=0), tags=["pipeline"]):
        step("echo", package="fake_tasks", timeout=timedelta(minutes=2), env={"FAKE_OUT": OUT, "MODE": "templated {{ ds }}"},
             argv=["echo", "{{ ds }}", "two words", "--flag=x", "quote\\'s", ""])

    with DAG("kpo_fail", schedule=None, default_args=default_args(retries=0), tags=["pipeline"]):
        step("fail", package="fake_tasks", timeout=timedelta(minutes=2), env={"FAKE_OUT": OUT}, argv=["fail", "2"])

    with DAG("kpo_deadline", schedule=None, default_args=default_args(retries=0), tags=["pipeline"]):
        # execution_timeout (2 min) would fire much later: the pod's own deadline kills it first
        step("hang", package="fake_tasks", timeout=timedelta(minutes=2), env={"FAKE_OUT": OUT}, argv=["hang"],
             pod_overrides={"active_deadline_seconds": 2})

    with DAG("kpo_retry", schedule=None, default_args=default_args(retries=0), tags=["pipeline"]):
        step("slow", package="fake_tasks", timeout=timedelta(minutes=2), env={"FAKE_OUT": OUT}, argv=["slow", "0"])

    with DAG("kpo_adopt", schedule=None, default_args=default_args(retries=1, retry_delay=timedelta(seconds=1)),
             tags=["pipeline"]):
        step("submit", package="fake_tasks", timeout=timedelta(minutes=2), env={"FAKE_OUT": OUT, "PYTHONPATH": REPO}, argv=["submit", "60"],
             adopt_flag="--adopt")
""")


@pytest.fixture
def kpo_env(tmp_path, monkeypatch):
    """A DAG bundle, the fake task package, the stand-in with the namespace and the storage Secret."""
    _, dags, out = fake_bundle(
        tmp_path,
        monkeypatch,
        package="fake_tasks",
        main_source=FAKE_MAIN,
        dags_source=TEST_DAGS,
        bundle="kpo-test-bundle",
    )
    monkeypatch.setenv("FAKE_OUT", str(out))
    monkeypatch.setenv("FAKE_REPO", str(REPO))
    monkeypatch.setenv("HOUSE_RUNNER", "kubernetes")
    monkeypatch.setenv("HOUSE_IMAGE_FAKE", "registry.example.org/house/fake-tasks:0.0.1")
    monkeypatch.setenv("HOUSE_NAMESPACE", NS)
    monkeypatch.setenv("HOUSE_STORAGE_SECRET", SECRET)
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path / "storage"))
    with KubeAPIServer(workdir=tmp_path / "code", base_env=IMAGE_ENV) as api:
        path = api.write_kubeconfig(tmp_path / "kubeconfig.json")
        monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", api.connection_json(path))
        api.create("", "v1", "namespaces", "", {"metadata": {"name": NS}})
        api.create("", "v1", "secrets", NS, {"metadata": {"name": SECRET}, "stringData": dict(SECRET_DATA)})

        yield api, bundle_dags(dags), out


_states = task_states


def _assert_clean(api: KubeAPIServer) -> None:
    """Every pod this test created is gone; only the namespace and its Secret remain; and the
    operator needed no more than the worker Role of ``deploy/rbac/airflow-worker.yaml``."""
    assert not api.list("pods", NS), [p["metadata"]["name"] for p in api.list("pods", NS)]
    assert_worker_rbac_allows(api.requests)
    assert api.objects_left() == [f"Namespace {NS}", f"Secret {NS}/{SECRET}"]
    assert sorted(api.pods_deleted) == sorted(f"{NS}/{p['metadata']['name']}" for p in api.pods_created)


def assert_worker_rbac_allows(requests: list[tuple[str, str]]) -> None:
    """Every request the operator made lies in the step namespace and is allowed by the worker Role."""
    import yaml
    from kubeapi.rbac import access_of, denied

    docs = list(yaml.safe_load_all((REPO / "deploy" / "rbac" / "airflow-worker.yaml").read_text()))
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert requests
    spaces = {a.namespace for a in map(lambda r: access_of(*r), requests) if a is not None}
    assert spaces == {NS}, spaces  # a Role grants nothing outside its namespace
    assert denied(role["rules"], requests) == []


def test_argv_env_secret_and_logs_arrive(kpo_env, capfd):
    api, dags, out = kpo_env
    dr = dags["kpo_echo"].test(logical_date=LOGICAL_DATE)
    assert dr.state == "success", _states(dr)

    record = json.loads((out / "echo.json").read_text())
    assert record["argv"] == ["2026-11-29", "two words", "--flag=x", "quote's", ""]  # templated, intact
    env = record["env"]
    assert env["MODE"] == "templated 2026-11-29"
    assert env["AWS_ACCESS_KEY_ID"] == SECRET_DATA["AWS_ACCESS_KEY_ID"]  # from the Secret, by reference
    assert env["AWS_SECRET_ACCESS_KEY"] == SECRET_DATA["AWS_SECRET_ACCESS_KEY"]
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["AIRFLOW_HOME"] is None  # the pod sees only its own environment
    # the run's bundle (a LocalDagBundle in a folder that is no git checkout: no version to name)
    assert (env["HOUSE_BUNDLE_NAME"], env["HOUSE_BUNDLE_VERSION"]) == ("kpo-test-bundle", "unversioned")
    assert record["cwd"] == str(api.workdir)

    (pod,) = api.pods_created
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-m", "fake_tasks"]
    assert {"secretRef": {"name": SECRET}} in container["envFrom"]
    assert not any("AWS" in e["name"] for e in container.get("env", []))  # never a value in the spec
    assert pod["spec"]["activeDeadlineSeconds"] == 120 + 120
    assert pod["metadata"]["labels"]["dag_id"] == "kpo_echo" and pod["metadata"]["labels"]["task_id"] == "echo"
    # the operator followed the log (follow=true, timestamps) and wrote it to the task log
    assert any("/log?" in path and "follow=True" in path for _, path in api.requests)
    captured = capfd.readouterr()
    assert "step says hello from the pod" in captured.out + captured.err
    _assert_clean(api)


def test_failing_step_fails_its_task(kpo_env, capfd):
    api, dags, out = kpo_env
    dr = dags["kpo_fail"].test(logical_date=LOGICAL_DATE)
    assert dr.state == "failed", _states(dr)
    assert _states(dr)["fail"] == "failed"
    captured = capfd.readouterr()
    assert "about to fail with 2" in captured.out + captured.err  # the pod's stderr reached the task log
    (pod,) = api.pods_created
    _assert_clean(api)


def test_deadline_kills_an_overrunning_pod(kpo_env):
    api, dags, out = kpo_env
    start = time.monotonic()
    dr = dags["kpo_deadline"].test(logical_date=LOGICAL_DATE)
    assert dr.state == "failed", _states(dr)
    assert time.monotonic() - start < 60  # the 2-minute execution_timeout did not do it
    (pod,) = api.pods_created
    assert pod["spec"]["activeDeadlineSeconds"] == 2
    events = [e["reason"] for e in api.list("events", NS) if e["involvedObject"]["name"] == pod["metadata"]["name"]]
    assert "DeadlineExceeded" in events
    assert api.runs[(NS, pod["metadata"]["name"])].proc.poll() is not None  # the process is dead
    _assert_clean(api)


def _earlier_try_pod(api: KubeAPIServer, dag, argv: list[str], task_id: str = "slow") -> str:
    """A pod as an earlier try of ``task_id`` would have left it (same labels, try_number=1)."""
    from kubernetes.client import ApiClient

    op = dag.get_task(task_id)
    run_id = _run_id()

    class TI:
        dag_id, task_id, map_index, try_number = dag.dag_id, op.task_id, -1, 1

    TI.run_id = run_id
    context = {
        "ti": TI(),
        "task_instance": TI(),
        "run_id": run_id,
        "dag": dag,
        "task": op,
        "ds": "2026-11-29",
        "params": {},
    }
    pod = ApiClient().sanitize_for_serialization(op.build_pod_request_obj(context, dry_run=True))
    pod["metadata"]["name"] = f"{task_id}-earlier-try"
    pod["spec"]["containers"][0]["args"] = argv
    selector = op._build_find_pod_label_selector(context)
    api.create("", "v1", "pods", NS, pod)
    # the operator's own label search finds it
    assert [
        p["metadata"]["name"] for p in api.list_objects("", "v1", "pods", NS, {"labelSelector": selector})["items"]
    ] == [f"{task_id}-earlier-try"]
    return f"{task_id}-earlier-try"


def _run_id() -> str:
    """The run id ``dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)`` gives its run."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    return DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)


def test_retry_reattaches_to_a_running_pod(kpo_env, capfd):
    """A pod still running from a crashed try is reused: no second pod, its log and result are taken."""
    api, dags, out = kpo_env
    dag = dags["kpo_retry"]
    name = _earlier_try_pod(api, dag, ["slow", "60"])

    def release():  # let the pod finish once a new try follows its log
        while not any(f"/pods/{name}/log" in path for _, path in api.requests):
            time.sleep(0.05)
        (out / "release").write_text("")

    threading.Thread(target=release, daemon=True).start()
    dr = dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)  # run_id as in _run_id()
    assert dr.state == "success", _states(dr)
    assert [p["metadata"]["name"] for p in api.pods_created] == [name]  # nothing new was created
    assert (out / "slow-done").read_text() == name
    captured = capfd.readouterr()
    assert "reattached pod done" in captured.out + captured.err
    _assert_clean(api)


def test_retry_replaces_a_terminated_pod(kpo_env):
    """A finished (failed) pod of an earlier try is deleted and a fresh pod runs the step."""
    api, dags, out = kpo_env
    dag = dags["kpo_retry"]
    name = _earlier_try_pod(api, dag, ["fail", "1"])
    deadline = time.monotonic() + 20
    while api.get("pods", NS, name)["status"]["phase"] != "Failed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    dr = dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)
    assert dr.state == "success", _states(dr)
    names = [p["metadata"]["name"] for p in api.pods_created]
    assert names[0] == name and len(names) == 2
    assert (out / "slow-done").read_text() == names[1]  # the new pod did the work
    _assert_clean(api)


def _kept_ids(dag_id: str) -> list[str] | None:
    """The ``external_ids`` the task state store holds for the run of ``dag_id`` (None: no entry)."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session

    from house.external import EXTERNAL_IDS_KEY

    with create_session() as session:
        row = session.query(TaskStateStoreModel).filter_by(dag_id=dag_id, key=EXTERNAL_IDS_KEY).one_or_none()
        return None if row is None else json.loads(row.value)


def _tries(out) -> list[dict]:
    return [json.loads(line) for line in (out / "tries.jsonl").read_text().splitlines()]


def test_a_retry_after_a_killed_pod_passes_the_announced_ids_to_its_new_pod(kpo_env):
    """The step announces its job; the ids reach the task state store while the pod runs; the pod
    is then killed (SIGKILL: the step cannot clean up) and the task fails. The retry's new pod gets
    ``--adopt job-1`` and adopts the job: one submission in all, nothing left behind."""
    api, dags, out = kpo_env
    box: dict = {}

    def kill_once_kept():
        end = time.monotonic() + 60
        while _kept_ids("kpo_adopt") is None and time.monotonic() < end:
            time.sleep(0.1)
        box["kept"] = _kept_ids("kpo_adopt")
        (first,) = api.pods_created
        box["killed"] = first["metadata"]["name"]
        api.runs[(NS, box["killed"])].proc.kill()  # mid-run: the job is still running
        while len(api.pods_created) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        (out / "release").write_text("")  # the adopted job may finish

    killer = threading.Thread(target=kill_once_kept, daemon=True)
    killer.start()
    dr = dags["kpo_adopt"].test(logical_date=LOGICAL_DATE)
    killer.join(timeout=5)
    assert dr.state == "success", _states(dr)
    assert box["kept"] == ["job-1"], box  # in the store while the first pod still ran
    first, second = api.pods_created
    assert first["metadata"]["name"] == box["killed"]
    assert first["spec"]["containers"][0]["args"] == ["submit", "60"]
    assert second["spec"]["containers"][0]["args"] == ["submit", "60", "--adopt", "job-1"]
    assert [t["adopted"] for t in _tries(out)] == [[], ["job-1"]]
    assert (out / "submitted").read_text().split() == ["job-1"]  # no duplicate submission
    assert not list((out / "jobs").iterdir())  # the adopted job finished: none orphaned
    assert _kept_ids("kpo_adopt") == ["job-1"]
    assert [ti.try_number for ti in dr.get_task_instances()] == [2]
    _assert_clean(api)


def test_a_retry_adopts_the_still_running_pod_of_an_earlier_try(kpo_env):
    """The earlier try's worker died, its pod did not: the retry reattaches to that pod (no new
    pod, no adopt flag: the step that started the job goes on), reads its log from the start and
    keeps the job it announced."""
    api, dags, out = kpo_env
    dag = dags["kpo_adopt"]
    name = _earlier_try_pod(api, dag, ["submit", "60"], task_id="submit")
    deadline = time.monotonic() + 20
    while not (out / "submitted").exists():  # the earlier pod has started its job
        assert time.monotonic() < deadline, api.runs[(NS, name)].lines
        time.sleep(0.05)

    def release():  # the job finishes once the retry follows the pod's log
        while not any(f"/pods/{name}/log" in path for _, path in api.requests):
            time.sleep(0.05)
        (out / "release").write_text("")

    threading.Thread(target=release, daemon=True).start()
    dr = dag.test(logical_date=LOGICAL_DATE, run_after=LOGICAL_DATE)  # run_id as in _run_id()
    assert dr.state == "success", _states(dr)
    assert [p["metadata"]["name"] for p in api.pods_created] == [name]  # the pod was adopted, none created
    assert [t["adopted"] for t in _tries(out)] == [[]]  # one step process in all
    assert (out / "submitted").read_text().split() == ["job-1"]
    assert not list((out / "jobs").iterdir())
    assert _kept_ids("kpo_adopt") == ["job-1"]  # read from the adopted pod's log
    _assert_clean(api)
