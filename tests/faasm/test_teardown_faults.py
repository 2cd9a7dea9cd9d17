"""Kill-at-every-stage tests of the local target (real redis-server, workers, sampler).

Each test injects a fault, checks that ``verify-clean`` says NOT clean while something of
the run is left, runs ``teardown``, then checks independently of the package (the process
table and the ports) that nothing of the run is left and that ``verify-clean`` says clean.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from faasm_testutil import ROOT, cli, needs_local_target
from proctree import wait_for

pytestmark = [needs_local_target, pytest.mark.timeout(240)]


_RUNS: list[Run] = []


@pytest.fixture(autouse=True)
def _no_leftovers():
    """Whatever a failing test leaves behind is stopped (by run label) before the next test."""
    yield
    from faasm_tasks import procs

    while _RUNS:
        run = _RUNS.pop()
        procs.stop(procs.find_labelled(run.label), run.label, 5)


class Run:
    def __init__(self, tmp_path, run_id: str):
        _RUNS.append(self)
        self.tmp = tmp_path
        self.state = str(tmp_path / "state")
        self.results = f"file://{tmp_path}/results"
        self.run_id = run_id
        self.common = ["--target", "local", "--run-id", run_id, "--results", self.results, "--date", "2026-11-29"]

    @property
    def label(self) -> str:
        from faasm_tasks.procs import run_label

        return run_label(self.state, self.run_id)

    def cli(self, step, *args, check=True, env=None, timeout=120):
        if env:
            old = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
        try:
            return cli(step, *self.common, *args, state_dir=self.state, check=check, timeout=timeout)
        finally:
            if env:
                for k, v in old.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)

    def popen(self, step, *args, env=None):
        e = dict(os.environ, FAASM_TASKS_STATE_DIR=self.state, PYTHONPATH=ROOT, **(env or {}))
        return subprocess.Popen(
            [sys.executable, "-m", "faasm_tasks", step, *self.common, *args, "--log-level", "WARNING"],
            cwd=ROOT,
            env=e,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def left(self) -> list[dict]:
        """What of the run is alive, found by the test itself: processes with the run label
        in their environment or title, and what they listen on."""
        out = []
        for p in psutil.process_iter(["pid", "status"]):
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            try:
                env = p.environ().get("FAASM_TASKS_RUN")
                title = " ".join(p.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if env == self.label or f"faasm-run={self.label}" in title:
                out.append({"pid": p.pid, "cmd": title[:120]})
        return out

    def verify(self) -> subprocess.CompletedProcess:
        return self.cli("verify-clean", check=False)

    def teardown_and_check(self, extra: list[str] = (), **kw) -> dict:
        before = self.verify()
        assert before.returncode == 1 and "NOT clean" in before.stderr, (before.stdout, before.stderr)
        td = self.cli("teardown", "--timeout", "10", *extra, **kw)
        assert "teardown: done" in td.stdout
        assert self.left() == [], self.left()
        after = self.verify()
        assert after.returncode == 0 and "verify-clean: clean" in after.stdout, after.stderr
        print(
            f"\nFAULT {os.environ.get('PYTEST_CURRENT_TEST', '').split(' ')[0]}\n  before teardown: "
            f"{before.stderr.strip()}\n  left after teardown: {self.left()}\n  after: {after.stdout.strip()}"
        )
        return {"verify_before": before.stderr.strip(), "teardown": td.stdout.strip()}


def _records(run: Run) -> list[dict]:
    from faasm_tasks.results import iter_records

    return [r for _, r in iter_records(run.results, "2026-11-29", run.run_id)]


@pytest.mark.parametrize("kill_at", [1, 2, 4])
def test_deploy_killed_mid_spawn(tmp_path, kill_at):
    """deploy SIGKILLed right after starting its n-th process, before recording it."""
    run = Run(tmp_path, f"spawn{kill_at}")
    p = run.cli(
        "deploy",
        "--experiment",
        "sgd_reuters_svm",
        "--workers",
        "3",
        check=False,
        env={"FAASM_TASKS_FAULT": f"spawned:{kill_at}"},
    )
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
    assert len(run.left()) == kill_at
    st = json.load(open(os.path.join(run.state, run.run_id, "local", "state.json")))
    assert len(st["procs"]) == kill_at - 1  # the last one never made it into the state file
    run.teardown_and_check()


@pytest.mark.parametrize("damage", ["file removed", "folder removed", "truncated", "not json"])
def test_state_file_lost(tmp_path, damage):
    run = Run(tmp_path, "lost")
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "2")
    run.cli("wait-ready", "--timeout", "60")
    path = os.path.join(run.state, run.run_id, "local", "state.json")
    if damage == "file removed":
        os.unlink(path)
    elif damage == "folder removed":
        import shutil

        shutil.rmtree(os.path.join(run.state, run.run_id))
    elif damage == "truncated":
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    else:
        open(path, "w").write("[1, 2")
    assert len(run.left()) == 4
    out = run.teardown_and_check()
    assert "4 process" in out["verify_before"] or out["verify_before"].count("still running") == 4


def test_planted_state_file_cannot_kill_another_process(tmp_path):
    """A state file (and journal, and sampler file) listing someone else's pid, with its true
    start time and command line: teardown must leave that process alone."""
    run = Run(tmp_path, "planted")
    victim = subprocess.Popen(["sleep", "300"])
    try:
        pv = psutil.Process(victim.pid)
        rec = {
            "role": "worker",
            "pid": victim.pid,
            "port": 1,
            "cmd": pv.cmdline(),
            "log": "/dev/null",
            "create_time": pv.create_time(),
        }
        local = os.path.join(run.state, run.run_id, "local")
        billing = os.path.join(run.state, run.run_id, "billing")
        os.makedirs(local, mode=0o700)
        os.makedirs(billing, mode=0o700)
        json.dump(
            {"status": "deployed", "procs": [rec], "redis_url": "redis://127.0.0.1:1", "workers": 1},
            open(os.path.join(local, "state.json"), "w"),
        )
        open(os.path.join(local, "spawns.jsonl"), "w").write(json.dumps(rec) + "\n")
        json.dump(rec, open(os.path.join(billing, "sampler.json"), "w"))
        td = run.cli("teardown", "--timeout", "5")
        assert "teardown: done" in td.stdout
        time.sleep(0.2)
        assert victim.poll() is None and pv.is_running(), "teardown killed a process that is not the run's"
        assert run.verify().returncode == 0
    finally:
        victim.kill()
        victim.wait()


def test_worker_killed_during_sgd_call_fails_the_point_fast(tmp_path):
    run = Run(tmp_path, "wkill")
    try:
        run.cli("deploy", "--experiment", "sgd_reuters_svm")
        run.cli("wait-ready", "--timeout", "60")
        run.cli("upload-data", "--experiment", "sgd_reuters_svm")
        # 1000 epochs: the call would take many minutes; its bound is the catalogue's cap (3600 s)
        p = run.popen("run", "--experiment", "sgd_reuters_svm", "--set", "epochs=1000", "--no-billing")
        wait_for(lambda: any(r["status"] == "running" for r in _records(run)), "the attempt to start", deadline_s=60)
        time.sleep(1.5)  # the call is in flight
        st = json.load(open(os.path.join(run.state, run.run_id, "local", "state.json")))
        worker = next(r for r in st["procs"] if r["role"] == "worker")
        os.kill(worker["pid"], signal.SIGKILL)
        t_kill = time.monotonic()
        out, err = p.communicate(timeout=60)
        elapsed = time.monotonic() - t_kill
        assert p.returncode == 1, (out, err)
        assert elapsed < 15, f"the point took {elapsed:.1f} s to fail after the worker died"
        rec = _records(run)[0]
        assert rec["status"] == "failed" and "died" in rec["outcome"]["error"], rec["outcome"]
        assert rec["metrics"]["budget_s"] == 3600  # min(cap, 60 s + 120 s per epoch): the liveness check acted
        print(f"worker killed -> point failed in {elapsed:.2f} s")
    finally:
        out = run.teardown_and_check() if run.left() else None
    assert out is not None


def test_billing_sampler_killed_during_a_point_fails_it_naming_the_signal(tmp_path):
    """The sampler ``run`` started dies (SIGKILL, as the OOM killer would): the point in
    flight fails promptly, its record naming the sampler and the signal (its host metrics
    would be missing), and the step exits 1; teardown then leaves nothing."""
    run = Run(tmp_path, "skill")
    try:
        run.cli("deploy", "--experiment", "sgd_reuters_svm")
        run.cli("wait-ready", "--timeout", "60")
        run.cli("upload-data", "--experiment", "sgd_reuters_svm")
        # 1000 epochs: the call would take many minutes; the sampler's death must end it first
        p = run.popen("run", "--experiment", "sgd_reuters_svm", "--set", "epochs=1000")
        wait_for(lambda: any(r["status"] == "running" for r in _records(run)), "the attempt to start", deadline_s=60)
        ctl_path = os.path.join(run.state, run.run_id, "billing", "sampler.json")
        wait_for(lambda: os.path.exists(ctl_path), "the sampler to be recorded", deadline_s=60)
        os.kill(json.load(open(ctl_path))["pid"], signal.SIGKILL)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, (out, err)
        rec = _records(run)[0]
        assert rec["status"] == "failed", rec["outcome"]
        assert "billing sampler pid" in rec["outcome"]["error"] and "SIGKILL" in rec["outcome"]["error"], rec
    finally:
        out = run.teardown_and_check() if run.left() else None
    assert out is not None


def test_load_driver_killed(tmp_path):
    """``run`` SIGKILLed during an open-loop load point with two driver processes: the forks
    exit with their parent (the load driver watches it) or are found by their run label and
    stopped by teardown; the deployment is left for teardown; collect marks the attempt
    interrupted."""
    run = Run(tmp_path, "lkill")
    run.cli("deploy", "--experiment", "tf_inference_throughput")
    run.cli("wait-ready", "--timeout", "60")
    run.cli("upload-data", "--experiment", "tf_inference_throughput")
    p = run.popen(
        "run",
        "--experiment",
        "tf_inference_throughput",
        "--set",
        "duration_s=120",
        "--threads",
        "2",
        "--mode",
        "open",
        "--rate",
        "20",
    )
    wait_for(lambda: any(r["status"] == "running" for r in _records(run)), "the attempt to start", deadline_s=60)
    wait_for(
        lambda: len(run.left()) >= 4 + 3, "the load driver's processes", deadline_s=30
    )  # 4 deployed + run + 2 forks
    p.kill()
    p.wait()
    assert len(run.left()) >= 4  # the deployment outlives the killed step (the forks may exit with it)
    collect = run.cli("collect")
    assert "collect:" in collect.stdout
    rec = _records(run)[0]
    assert rec["status"] == "failed" and rec["outcome"]["interrupted"] is True
    assert rec["outcome"]["error"].startswith("interrupted")
    run.teardown_and_check()


def test_collect_killed_sampler_left_and_its_file_lost(tmp_path):
    from faasm_tasks import billing

    run = Run(tmp_path, "ckill")
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "1")
    s = billing.start_sampler(run.state, run.run_id, interval=0.2)
    assert s["action"] == "started"
    p = run.cli("collect", check=False, env={"FAASM_TASKS_FAULT": "collect:1"})
    assert p.returncode == -signal.SIGKILL
    assert psutil.pid_exists(s["pid"])
    os.unlink(os.path.join(run.state, run.run_id, "billing", "sampler.json"))
    out = run.teardown_and_check()
    assert "billing-sampler" in out["verify_before"]
    assert not psutil.pid_exists(s["pid"]) or psutil.Process(s["pid"]).status() == psutil.STATUS_ZOMBIE


def test_sampler_alone_is_not_clean(tmp_path):
    """verify-clean sees a sampler of the run even with no deployment at all."""
    from faasm_tasks import billing

    run = Run(tmp_path, "sampler")
    billing.start_sampler(run.state, run.run_id, interval=0.2)
    run.teardown_and_check()


ALIAS_BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefghi", "bcdefghij")
)


def test_teardown_never_reads_the_catalogue(tmp_path):
    """A catalogue replaced by an alias bomb and a broken file after deploy: teardown stops
    everything and deletes the run-state keys deploy recorded, reading no catalogue file."""
    run = Run(tmp_path, "badcat")
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "1")
    bad = tmp_path / "catalogue"
    bad.mkdir()
    (bad / "broken.yaml").write_text("name: [unclosed\n")
    (bad / "bomb.yaml").write_text(ALIAS_BOMB)
    out = run.teardown_and_check(env={"FAASM_CATALOGUE_DIR": str(bad)}, extra=["--catalogue-dir", str(bad)])
    assert "catalogue" not in out["teardown"]
    (report,) = (tmp_path / "results").glob("2026-11-29/badcat/_ops/teardown-*.json")
    assert json.loads(report.read_text())["input_problems"] == []
    assert json.loads(report.read_text())["run_state_keys"] == [
        "sgd_params",
        "sgd_weights",
        "sgd_mask",
        "sgd_errors",
        "sgd_step_*",
    ]
    # an unknown experiment or a bad date does not stop it either
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "1")
    td = cli(
        "teardown",
        "--target",
        "local",
        "--run-id",
        run.run_id,
        "--results",
        run.results,
        "--date",
        "29/11/2026",
        "--experiment",
        "nosuch",
        state_dir=run.state,
    )
    assert "teardown: done" in td.stdout and run.left() == []


def test_state_folder_must_be_private(tmp_path):
    from faasm_tasks.procs import private_dir
    from stepkit import StepError

    good = private_dir(str(tmp_path / "a" / "b"))
    assert oct(os.stat(good).st_mode & 0o777) == "0o700"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with pytest.raises(StepError, match="must be private"):
        private_dir(str(shared))
    os.symlink(good, tmp_path / "link")
    with pytest.raises(StepError, match="not a directory"):
        private_dir(str(tmp_path / "link"))
    if os.getuid() == 0:
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        os.chown(other, 65534, 65534)
        with pytest.raises(StepError, match="belongs to uid 65534"):
            private_dir(str(other))
    common = ["--target", "local", "--run-id", "x", "--results", str(tmp_path / "r")]
    p = cli("deploy", *common, "--experiment", "sgd_reuters_svm", state_dir=str(shared), check=False)
    assert p.returncode == 2 and "must be private" in p.stderr
    assert not os.listdir(shared)
    # teardown still does its work (by run label), and says what is wrong
    p = cli("teardown", *common, state_dir=str(shared))
    assert "must be private" in p.stdout and "teardown: done" in p.stdout


def _recorded_pids(run: Run) -> list[int]:
    """Every pid the deploy wrote down (the journal's started entries)."""
    from faasm_tasks import procs

    return [r["pid"] for r in procs.journal_read(os.path.join(run.state, run.run_id, "local"))]


@pytest.mark.parametrize("fault", ["spawned:1:TERM", "spawned:4:TERM", "deployed:1:TERM"])
def test_sigterm_of_deploy_stops_what_it_started(tmp_path, fault):
    """deploy gets a SIGTERM right after starting redis (1), after its first worker (4: redis,
    upload, two workers) and after the whole deployment came up: it stops exactly the processes
    it started, says how many, exits 143, and nothing of the run is left. Before, it printed
    "the processes it started were stopped" and left redis, the uploader and the workers."""
    from proctree import all_gone

    run = Run(tmp_path, "term" + fault.split(":")[1])
    p = run.cli(
        "deploy", "--experiment", "sgd_reuters_svm", "--workers", "3", check=False, env={"FAASM_TASKS_FAULT": fault}
    )
    pids = _recorded_pids(run)
    started = 5 if fault.startswith("deployed") else int(fault.split(":")[1])
    assert len(pids) == started, (pids, p.stderr)
    assert p.returncode == 143, (p.returncode, p.stderr)
    assert f"terminated by SIGTERM; the {started} process(es) it started were stopped" in p.stderr, p.stderr
    all_gone([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)], deadline_s=10)
    assert run.left() == [], run.left()
    assert run.verify().returncode == 0
    # the group is counted failed: the deploy's failure report names the SIGTERM
    ops = os.path.join(str(tmp_path), "results", "2026-11-29", run.run_id, "_ops")
    fails = [json.load(open(os.path.join(ops, n))) for n in os.listdir(ops) if n.startswith("deploy-")]
    assert [f["error"] for f in fails] == ["Terminated: terminated by SIGTERM"], fails
    # and the task's retry deploys afresh (the state no longer claims a deployment)
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "1")
    run.cli("teardown", "--timeout", "10")
    assert run.left() == []


def test_sigterm_from_outside_mid_deploy_leaves_nothing(tmp_path):
    """A SIGTERM from outside (Airflow stopping the task) while deploy starts its workers."""
    from proctree import all_gone, wait_for

    run = Run(tmp_path, "outside")
    p = run.popen("deploy", "--experiment", "sgd_reuters_svm", "--workers", "6")
    wait_for(lambda: any(r.get("role") == "worker" for r in _journal(run)), "deploy's first worker")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and "it started were stopped" in err, (p.returncode, err)
    all_gone([psutil.Process(pid) for pid in _recorded_pids(run) if psutil.pid_exists(pid)], deadline_s=10)
    assert run.left() == [], run.left()


def test_an_already_deployed_run_is_not_stopped_by_a_second_deploy(tmp_path):
    """Exactly what it started: a deploy that found the deployment up started nothing, so a
    SIGTERM after it stops nothing (the processes belong to the first deploy, then teardown)."""
    run = Run(tmp_path, "again")
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "1")
    before = run.left()
    p = run.cli(
        "deploy",
        "--experiment",
        "sgd_reuters_svm",
        "--workers",
        "1",
        check=False,
        env={"FAASM_TASKS_FAULT": "deployed:1:TERM"},
    )
    assert p.returncode == 143 and "it had started no process" in p.stderr, p.stderr
    assert run.left() == before
    run.cli("teardown", "--timeout", "10")
    assert run.left() == []


def _journal(run: Run) -> list[dict]:
    from faasm_tasks import procs

    return procs.journal_read(os.path.join(run.state, run.run_id, "local"))


def test_sigterm_of_run_stops_its_sampler_and_leaves_the_deployment_to_teardown(tmp_path):
    """``run`` (as the DAG runs it, ``--keep-billing``) gets a SIGTERM mid-point: it stops the
    billing sampler it started, says so and that the deployment is teardown's, exits 143; what is
    left is exactly the deployment (redis, upload, the worker), which teardown then removes."""
    from proctree import all_gone

    run = Run(tmp_path, "rterm")
    run.cli("deploy", "--experiment", "sgd_reuters_svm", "--workers", "1")
    run.cli("wait-ready", "--timeout", "60")
    run.cli("upload-data", "--experiment", "sgd_reuters_svm")
    deployment = sorted(d["pid"] for d in run.left())
    p = run.popen("run", "--experiment", "sgd_reuters_svm", "--set", "epochs=1000", "--keep-billing")
    wait_for(lambda: any(r["status"] == "running" for r in _records(run)), "the attempt to start", deadline_s=60)
    ctl_path = os.path.join(run.state, run.run_id, "billing", "sampler.json")
    wait_for(lambda: os.path.exists(ctl_path), "the sampler to be recorded", deadline_s=60)
    sampler = psutil.Process(json.load(open(ctl_path))["pid"])
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143, (p.returncode, err)
    assert f"the billing sampler it started (pid {sampler.pid}): stopped" in err, err
    assert "the deployment (workers it restarted included) is left for teardown" in err, err
    all_gone([sampler], deadline_s=10)
    from faasm_tasks import procs

    left = {d["pid"]: procs.role_of(psutil.Process(d["pid"])) for d in run.left() if psutil.pid_exists(d["pid"])}
    assert set(deployment) <= set(left), (deployment, left)
    # the rest is the worker's native container of the call in flight: the deployment's, not run's
    assert not {pid: r for pid, r in left.items() if r in ("run", "billing-sampler")}, left
    run.teardown_and_check()
