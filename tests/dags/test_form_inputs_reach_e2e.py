"""A trigger form's path or URI is data, not reach (``stepkit.reach``), through the real DAGs.

Whoever may trigger a DAG fills in its form, and the worker that reads what the form names holds
the storage credentials and sits inside the cluster network. So ``mirage_evaluation``'s ``trace``
naming a secret file outside the allowed roots, ``/proc/self/environ`` or an internal ``http://``
URL must fail the run at ``plan``, naming the param, with the secret in no task log and no
request made; the same for ``mirage_pipeline`` (whose plan fingerprints the trace, i.e. reads
it). And where the plan's check is not the last word, the step refuses by itself: every step the
house factory starts carries the allowed roots (``STEPKIT_INPUT_ROOTS``). ``dag.test()`` does not
raise when a task fails: every test checks the run's and the tasks' states.
"""

from __future__ import annotations

import http.server
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from conftest import load_dag, task_states

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("airflow_db")]

LOGICAL_DATE = datetime(2026, 12, 1, tzinfo=UTC)
SECRET = "root:$6$f0rmS3cretHASH$abcdef:19000:0:99999:7:::"


@pytest.fixture
def secret(tmp_path) -> Path:
    """A shadow-like secret outside the storage root and the shipped traces."""
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    return path


@pytest.fixture
def http_server():
    """A server on 127.0.0.1 recording every request (the form must make none)."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # http.server's name
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(SECRET.encode())

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", hits
    finally:
        server.shutdown()
        server.server_close()


def _logs(airflow_home: Path, capfd, caplog) -> str:
    """Everything the run printed or logged: captured output, log records, task log files."""
    out = capfd.readouterr()
    files = (
        "".join(p.read_text(errors="replace") for p in (airflow_home / "logs").rglob("*") if p.is_file())
        if (airflow_home / "logs").is_dir()
        else ""
    )
    return out.out + out.err + caplog.text + files


def _evaluation_conf(trace: str) -> dict:
    return {
        "name": "reach",
        "trace": trace,
        "timezone": None,
        "procs_per_node": 1,
        "machine_nodes": None,
        "calibrate_from": "2023-11-15",
        "calibrate_to": "2023-12-01",
        "months": ["2023-12"],
        "trials": 2,
        "timeout_s": 30,
    }


@pytest.mark.parametrize("which", ["secret", "environ", "http"])
def test_mirage_evaluation_refuses_a_trace_outside_the_roots(
    which, local_storage, secret, http_server, airflow_home, capfd, caplog
):
    url, hits = http_server
    trace = {"secret": str(secret), "environ": "/proc/self/environ", "http": f"{url}/internal/secret"}[which]
    caplog.set_level("INFO")
    dr = load_dag("mirage_evaluation").test(logical_date=LOGICAL_DATE, run_conf=_evaluation_conf(trace))
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["plan"] == "failed", states
    assert states["ingest"] in ("upstream_failed", "None"), states  # nothing was read or fetched
    logs = _logs(airflow_home, capfd, caplog)
    assert "param trace" in logs and "refused" in logs, logs[-3000:]
    assert "f0rmS3cret" not in logs and "root:$6$" not in logs
    assert hits == []
    assert not (local_storage / "mirage_evaluation" / "reach").exists()


def test_mirage_evaluation_refuses_a_symlink_in_the_storage_root_leading_out(
    local_storage, secret, airflow_home, capfd, caplog
):
    link = local_storage / "inputs" / "trace.swf"
    link.parent.mkdir(parents=True)
    link.symlink_to(secret)
    caplog.set_level("INFO")
    dr = load_dag("mirage_evaluation").test(logical_date=LOGICAL_DATE, run_conf=_evaluation_conf(str(link)))
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["plan"] == "failed", states
    logs = _logs(airflow_home, capfd, caplog)
    assert "param trace" in logs and "symbolic link" in logs, logs[-3000:]
    assert "f0rmS3cret" not in logs


def test_mirage_pipeline_refuses_before_fingerprinting_the_trace(
    local_storage, http_server, airflow_home, capfd, caplog
):
    url, hits = http_server
    caplog.set_level("INFO")
    dr = load_dag("mirage_pipeline").test(
        logical_date=LOGICAL_DATE,
        run_conf={"trace": f"{url}/sacct.log"},
        mark_success_pattern="sample|merge|train_cpu|train_gpu|policy_cpu|policy_gpu|validate|fidelity|metrics|report",
    )
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["plan.commands"] == "failed", states
    assert "param trace" in _logs(airflow_home, capfd, caplog)
    assert hits == []


def test_every_local_step_carries_the_allowed_roots(local_storage, monkeypatch):
    """The step's own refusal (stepkit.storage) needs the roots: the local runner sets them at run time,
    last, so a DAG's own ``env`` cannot widen them."""
    from house.local import LocalStepOperator
    from stepkit import reach

    monkeypatch.setenv(reach.ENV, "/")  # a worker's own environment does not widen them either
    op = LocalStepOperator(task_id="t", package="mirage_tasks", argv=["ingest"], env={reach.ENV: "/"})
    roots = reach.parse_roots(op.child_env()[reach.ENV])
    assert roots[0] == str(local_storage) and "/" not in roots


def test_every_pod_carries_the_allowed_roots(monkeypatch):
    from datetime import timedelta

    from house import config as house_config
    from house.pod import pod_kwargs

    monkeypatch.setenv("HOUSE_RUNNER", "kubernetes")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", "s3://bucket/house")
    monkeypatch.delenv("HOUSE_INPUT_ROOTS", raising=False)
    cfg = house_config.get_config()
    env = {
        e.name: e.value
        for e in pod_kwargs("mirage_tasks", house_config.PRESETS["cpu-small"], timedelta(hours=1), cfg)["env_vars"]
    }
    assert env[house_config.INPUT_ROOTS_ENV] == "s3://bucket/house"  # a pod sees no checkout: the bucket only
    monkeypatch.setenv("HOUSE_INPUT_ROOTS", "s3://bucket/traces")
    cfg = house_config.get_config()
    assert cfg.input_roots() == ["s3://bucket/house", "s3://bucket/traces"]


@pytest.mark.parametrize(
    "param, value",
    [
        ("model", "secret"),
        ("waitpred", "http"),
        ("slurm_conf", "/proc/self/environ"),
        ("guarantee_samples", "file:///etc"),
    ],
)
def test_mirage_service_refuses_its_uris_outside_the_roots(
    param, value, local_storage, secret, http_server, airflow_home, capfd, caplog
):
    url, hits = http_server
    value = {"secret": str(secret), "http": f"{url}/waitpred"}.get(value, value)
    caplog.set_level("INFO")
    dr = load_dag("mirage_service").test(logical_date=LOGICAL_DATE, run_conf={param: value})
    states = task_states(dr)
    assert str(dr.state) == "failed" and states["check_conf"] == "failed", states
    assert states["keep_service"] in ("upstream_failed", "None"), states
    logs = _logs(airflow_home, capfd, caplog)
    assert f"param {param}" in logs and "refused" in logs, logs[-3000:]
    assert "f0rmS3cret" not in logs and hits == []
