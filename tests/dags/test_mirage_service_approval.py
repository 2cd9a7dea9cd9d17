"""mirage_service asks a person before it submits to a site's Slurm (house.approvals): the plan it
shows (mirage_tasks.run.service_plan), the criterion that tells make slurm's local cluster from a
site's, the approval step's place in the DAG, its record of each answer, and that the local path
asks nothing (the step skipped, keep_service run as before)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import DAGS


def _local_conf(checkout: Path, text: str | None = None) -> Path:
    """make slurm's slurm.conf in ``checkout`` (rendered as make slurm renders it, unless ``text``)."""
    from mirage_tasks.run.forms import LOCAL_SLURM_CONF

    conf = checkout / LOCAL_SLURM_CONF
    conf.parent.mkdir(parents=True, exist_ok=True)
    if text is None:
        from lab.slurm.slurmconf import Paths, render
        from mirage_tasks.sim.config import PRESETS

        text = render(PRESETS["ls6"], 60, Paths(str(conf.parent)), 6817, (7001, 7078))
    conf.write_text(text)
    return conf


SITE = "ClusterName=frontera\nSlurmctldHost=ctl1(10.4.0.2)\nSlurmctldHost=ctl2(10.4.0.3)\n"


# ---------------------------------------------------------------- the criterion


def test_make_slurms_cluster_needs_no_approval(tmp_path):
    from mirage_tasks.run.service_plan import local_demo_slurm

    conf = _local_conf(tmp_path)
    why = local_demo_slurm("var/slurm/slurm.conf", local_runner=True, code_root=tmp_path)
    assert why and "make slurm" in why and "localhost(127.0.0.1)" in why, why
    # the same file named by its absolute path
    assert local_demo_slurm(str(conf), local_runner=True, code_root=tmp_path)


@pytest.mark.parametrize(
    "case",
    ["kubernetes", "another file", "site file at make slurm's path", "no controller", "missing", "remote by name"],
)
def test_anything_else_is_a_sites_slurm_and_asks(tmp_path, case):
    from mirage_tasks.run.service_plan import local_demo_slurm

    slurm_conf, local = "var/slurm/slurm.conf", True
    if case == "kubernetes":  # a pod reads the mounted site Secret, whatever the file here says
        _local_conf(tmp_path)
        local = False
    elif case == "another file":  # a loopback controller, but not make slurm's file
        _local_conf(tmp_path)
        other = tmp_path / "site" / "slurm.conf"
        other.parent.mkdir()
        other.write_text("SlurmctldHost=localhost(127.0.0.1)\n")
        slurm_conf = str(other)
    elif case == "site file at make slurm's path":
        _local_conf(tmp_path, SITE)
    elif case == "no controller":
        _local_conf(tmp_path, "ClusterName=mirage\n")
    elif case == "remote by name":
        _local_conf(tmp_path, "SlurmctldHost=login1\n")
    assert local_demo_slurm(slurm_conf, local_runner=local, code_root=tmp_path) is None


def test_a_mixed_controller_list_asks(tmp_path):
    from mirage_tasks.run.service_plan import local_demo_slurm

    _local_conf(tmp_path, "SlurmctldHost=localhost(127.0.0.1)\nSlurmctldHost=backup(10.0.0.9)\n")
    assert local_demo_slurm("var/slurm/slurm.conf", local_runner=True, code_root=tmp_path) is None


# ---------------------------------------------------------------- the plan


def test_the_plan_says_what_where_how_long_and_which_rule(tmp_path):
    from mirage_tasks.run.forms import ServiceRun
    from mirage_tasks.run.service_plan import service_plan

    site = tmp_path / "site.conf"
    site.write_text(SITE)
    run = ServiceRun.from_params(
        {
            "policy": "avg-cal",
            "avg_cal_samples": "s3://b/samples",
            "node": 4,
            "links": 3,
            "service_hours": 48,
            "partition": "normal",
            "account": "proj-17",
            "slurm_conf": str(site),
            "approval_hours": 6,
        }
    )
    text = service_plan(run, code_root=tmp_path)
    # what: the keeper's own sbatch line (4 exclusive nodes, 48 h = 2880 min), the job count
    assert (
        "sbatch --parsable --account=proj-17 --partition=normal --job-name=svc-avg-cal-0 -N 4 --exclusive "
        "--time=2880 --output=/dev/null --chdir=/tmp '--wrap=exec sleep 172800'" in text
    ), text
    assert "4 jobs of 4 whole node(s), each 48 h" in text and "svc-avg-cal-3" in text
    # where: cluster and controllers read from the conf, partition, account
    assert "cluster: `frontera`" in text and "ctl1(10.4.0.2), ctl2(10.4.0.3)" in text
    assert "partition: `normal`" in text and "account charged: `proj-17`" in text
    # how long: 4 x 48 h end to end, 768 node-hours at most
    assert "about 192 h of service" in text and "(8.0 days)" in text and "768 node-hours" in text
    # which rule, with its input, described by the registry
    assert "`avg-cal`:" in text and "avg-cal samples `s3://b/samples`" in text
    assert "within 6 h counts as **Reject**" in text


def test_the_plan_says_the_defaults_and_an_unreadable_conf(tmp_path):
    from mirage_tasks.run.forms import ServiceRun
    from mirage_tasks.run.service_plan import service_plan

    run = ServiceRun.from_params({"policy": "reactive", "slurm_conf": "/etc/slurm/slurm.conf", "factor": 60})
    text = service_plan(run, code_root=tmp_path)
    assert "partition: the cluster's default" in text and "the submitting user's default" in text
    assert "not readable here" in text
    assert "--time=48 " in text and "each 0.8 h" in text  # 48 trace hours at x60: 48 real minutes
    assert "x60: a test cluster" in text
    assert "`reactive`: submit when the predecessor ends" in text


def test_the_request_is_the_plan_or_why_none(tmp_path):
    from mirage_tasks.run.service_plan import service_approval

    _local_conf(tmp_path)
    defaults = {"slurm_conf": "var/slurm/slurm.conf"}
    why = service_approval({}, local_runner=True, code_root=tmp_path, defaults=defaults)
    assert isinstance(why, str) and "make slurm" in why
    ask = service_approval({"links": 2}, local_runner=False, code_root=tmp_path, defaults=defaults)
    assert set(ask) == {"subject", "body", "hours"} and ask["hours"] == 24.0
    assert "Submit 3 Slurm jobs of 1 node(s) x 48 h (model)" in ask["subject"], ask
    with pytest.raises(ValueError, match="approval_hours"):
        service_approval({"approval_hours": -1}, local_runner=False, code_root=tmp_path)


# ---------------------------------------------------------------- the DAG


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS / "mirage_service.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mirage_service"]


def test_the_approval_comes_before_keep_service(dag):
    approve, keep = dag.task_dict["approve"], dag.task_dict["keep_service"]
    assert approve.task_type == "HouseApproval"
    assert approve.upstream_task_ids == {"check_conf"} and keep.upstream_task_ids == {"approve"}
    assert keep.trigger_rule == "none_failed"  # a skipped approval (nothing asked) lets it run
    assert approve.defaults == ["Reject"]  # no answer in time: rejected
    assert approve.record.endswith(".approval.json") and "house_storage_prefix(dag.dag_id)" in approve.record
    # the approval's hours are a typed param of the form, and not a flag of the step
    assert "approval_hours" in dag.params
    assert not any("approval" in str(a) for a in keep.argv), keep.argv


def test_the_local_path_skips_the_approval_and_runs_keep_service(
    airflow_db, local_storage, tmp_path, monkeypatch, capfd
):
    """make slurm's cluster: nothing asked, the approval step skipped, keep_service runs (here the
    untouched form's policy model without a model: the step refuses at once, exit 2, naming --model)."""
    from conftest import load_dag, task_states

    checkout = tmp_path / "checkout"
    _local_conf(checkout)
    monkeypatch.setenv("HOUSE_CODE_ROOT", str(checkout))
    dr = load_dag("mirage_service").test(run_conf={})
    states = task_states(dr)
    assert states["check_conf"] == "success" and states["approve"] == "skipped", states
    assert states["keep_service"] == "failed", states  # it ran: the step's own refusal
    said = "".join(capfd.readouterr())
    assert "--model" in said, said[-3000:]
    assert not list(local_storage.rglob("*.approval.json"))


# ---------------------------------------------------------------- the answer and its record


class _TI:
    dag_id, run_id, task_id, map_index = "mirage_service", "manual__2026-12-07T10:00:00+00:00", "approve", -1

    def __init__(self):
        self.xcom = {}

    def xcom_push(self, key, value):
        self.xcom[key] = value


def _answer(dag, tmp_path, event):
    approve = dag.task_dict["approve"]
    record = tmp_path / "out" / "manual__run.approval.json"
    approve.record = str(record)
    site = tmp_path / "site.conf"
    site.write_text(SITE)
    params = {k: dag.params[k] for k in dag.params} | {"slurm_conf": str(site), "comment": None}
    ti = _TI()
    return approve.execute_complete({"ti": ti, "task": approve, "params": params}, event), record, ti


def test_an_approval_is_recorded_and_keep_service_runs(dag, tmp_path, capfd):
    from datetime import UTC, datetime

    at = datetime(2026, 12, 7, 10, 5, tzinfo=UTC)
    event = {
        "chosen_options": ["Approve"],
        "params_input": {"comment": "budget ok"},
        "responded_at": at,
        "responded_by_user": {"id": "ana", "name": "Ana"},
        "timedout": False,
    }
    ret, record, ti = _answer(dag, tmp_path, event)
    assert ret["chosen_options"] == ["Approve"] and not ti.xcom  # nothing skipped
    rec = json.loads(record.read_text())
    assert rec["decision"] == "approved" and rec["by"] == {"id": "ana", "name": "Ana"}
    assert rec["at"] == at.isoformat() and rec["comment"] == "budget ok"
    assert rec["run_id"] == _TI.run_id and "sbatch --parsable" in rec["plan"] and rec["within_h"] == 24.0
    assert "Decision: approved by Ana" in "".join(capfd.readouterr())  # and in the task's log


def test_a_rejection_skips_keep_service_and_is_recorded(dag, tmp_path):
    from datetime import UTC, datetime

    from airflow.sdk.exceptions import DownstreamTasksSkipped

    event = {
        "chosen_options": ["Reject"],
        "params_input": {"comment": "not this month"},
        "responded_at": datetime(2026, 12, 7, 11, 0, tzinfo=UTC),
        "responded_by_user": {"id": "bo", "name": "Bo"},
        "timedout": False,
    }
    with pytest.raises(DownstreamTasksSkipped) as skipped:
        _answer(dag, tmp_path, event)
    assert skipped.value.tasks == ["keep_service"]
    rec = json.loads((tmp_path / "out" / "manual__run.approval.json").read_text())
    assert rec["decision"] == "rejected" and rec["by"]["name"] == "Bo" and rec["comment"] == "not this month"


def test_no_answer_in_time_is_a_recorded_rejection(dag, tmp_path):
    from datetime import UTC, datetime

    from airflow.sdk.exceptions import DownstreamTasksSkipped

    # what Airflow's scheduler resumes the task with when the time is up: the default, by nobody
    event = {
        "chosen_options": ["Reject"],
        "params_input": {"comment": None},
        "responded_at": datetime(2026, 12, 8, 10, 0, tzinfo=UTC),
        "responded_by_user": None,
        "timedout": True,
    }
    with pytest.raises(DownstreamTasksSkipped):
        _answer(dag, tmp_path, event)
    rec = json.loads((tmp_path / "out" / "manual__run.approval.json").read_text())
    assert rec["decision"] == "timed out" and rec["by"] is None and rec["comment"] is None
