"""A keeper task killed mid-run is retried adopting the Slurm job it had submitted.

The real ``keep-service`` step under the house ``LocalStepOperator`` (``adopt_flag="--adopt-jobs"``,
as ``mirage_service`` declares it), against a fake Slurm client on ``PATH``
(``tests/mirage/fake_slurm``: every job starts at once and runs its limit) and a dict standing
in for the task's state store. The first try announces its job (``stepkit-external: ...``) and
the operator stores the id; the step's process group is then killed (SIGKILL: nothing of it
can clean up). The retry gets the id back, adopts the still-running job as the chain's
predecessor and submits only its successor: one ``svc-reactive-0`` in all, no job cancelled,
and only the chain's current job left in the queue.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest
from conftest import REPO

pytestmark = pytest.mark.timeout(300)

FAKE = REPO / "tests" / "mirage" / "fake_slurm"
sys.path.insert(0, str(FAKE))
import fake as fake_slurm  # noqa: E402


class Store:
    """The task state store's get/set, kept in a dict (the metadata database's stand-in)."""

    def __init__(self):
        self.data: dict = {}

    def get(self, key, default=None):
        return self.data.get(key, default)

    def set(self, key, value):
        self.data[key] = json.loads(json.dumps(value))  # JSON values only, as Airflow's


@pytest.fixture
def slurm(tmp_path, monkeypatch):
    state = tmp_path / "slurm"
    state.mkdir()
    conf = tmp_path / "slurm.conf"
    conf.write_text("# the fake client reads nothing\n")
    monkeypatch.setenv("PATH", f"{FAKE}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(state))
    monkeypatch.setenv("FAKE_SLURM_PYTHON", sys.executable)
    monkeypatch.setenv("HOUSE_RUNNER", "local")
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path / "storage"))
    monkeypatch.setenv("HOUSE_INPUT_ROOTS", str(tmp_path))
    monkeypatch.setenv("HOUSE_NO_VARIABLES", "1")
    return conf


def _operator(conf, out):
    from house.local import LocalStepOperator

    argv = ["keep-service", "--policy", "reactive", "--links", "1", "--service-hours", "1", "--factor", "60"]
    argv += ["--step-s", "60", "--slurm-conf", str(conf), "--out", out]
    return LocalStepOperator(
        task_id="keep_service",
        package="mirage_tasks",
        argv=argv,
        python=sys.executable,
        cwd=str(REPO),
        adopt_flag="--adopt-jobs",
        kill_grace_seconds=2,
    )


def test_a_killed_keeper_try_is_retried_adopting_its_job(slurm, tmp_path):
    from house.local import EXTERNAL_IDS_KEY, StepFailed

    store = Store()
    out = str(tmp_path / "storage" / "keep")
    first = _operator(slurm, out)
    box: dict = {}

    def _try():
        try:
            first.execute({"task_state_store": store})
        except BaseException as exc:  # noqa: BLE001 - the try's failure is what the test inspects
            box["error"] = exc

    t = threading.Thread(target=_try)
    t.start()
    end = time.monotonic() + 120
    while not store.get(EXTERNAL_IDS_KEY):
        assert t.is_alive(), box
        assert time.monotonic() < end, "the first try announced no job in 120 s"
        time.sleep(0.2)
    assert store.get(EXTERNAL_IDS_KEY) == ["1001"]
    os.killpg(first._proc.pid, signal.SIGKILL)  # the try dies mid-run: nothing of it cleans up
    t.join(timeout=60)
    assert isinstance(box.get("error"), StepFailed), box
    assert [j["id"] for j in fake_slurm.live()] == ["1001"]  # the service job runs on

    retry = _operator(slurm, out)
    retry.execute({"task_state_store": store})  # raises if the step failed
    jobs = fake_slurm.jobs()
    assert [j["name"] for j in jobs] == ["svc-reactive-0", "svc-reactive-1"], jobs  # no duplicate submission
    assert store.get(EXTERNAL_IDS_KEY) == ["1001", "1002"]
    assert not fake_slurm.cancelled()
    assert [j["id"] for j in fake_slurm.live()] == ["1002"]  # nothing left behind but the chain's current job
    (link,) = json.loads((tmp_path / "storage" / "keep" / "keeper.json").read_text())["links"]
    assert link["pred"] == "1001" and link["succ"] == "1002", link


def test_adopt_ids_are_checked():
    from house.local import EXTERNAL_PREFIX
    from stepkit import StepError
    from stepkit.external import PREFIX, parse_ids

    assert PREFIX == EXTERNAL_PREFIX  # one announcement format on both sides
    assert parse_ids("12, 13,12,", "--adopt-jobs") == ["12", "13"]
    assert parse_ids(None, "--adopt-jobs") == []
    with pytest.raises(StepError, match=r"--adopt-jobs '12;rm': '12;rm' is not a job id"):
        parse_ids("12;rm", "--adopt-jobs")
