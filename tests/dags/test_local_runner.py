"""The local runner: ``python -m <package> <argv>`` as a child process of the worker."""

from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

#: A fake task package: ``python -m fakesteps <mode> [args]``.
FAKE_MAIN = textwrap.dedent("""
    import os, subprocess, sys, time
    from pathlib import Path

    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "echo":
        print("argv=" + " ".join(args), flush=True)
        print("cwd=" + os.getcwd(), flush=True)
        print("env=" + os.environ.get("MODE", ""), flush=True)
    elif mode == "handshake":          # proves lines reach the log while the child runs
        flag = Path(args[0])
        print("ready", flush=True)
        deadline = time.time() + 20
        while not flag.exists():
            if time.time() > deadline:
                print("nobody saw 'ready' while I was running", file=sys.stderr, flush=True)
                sys.exit(3)
            time.sleep(0.05)
        print("done", flush=True)
    elif mode == "fail":
        for i in range(100):
            print(f"err {i}", file=sys.stderr)
        print("out line", flush=True)
        sys.exit(int(args[0]))
    elif mode == "fail-stdout":        # the cause printed to stdout, nothing on stderr
        for i in range(10):
            print(f"point {i} ok")
        print("failed: invoke: ConnectionError 127.0.0.1:8080 refused", flush=True)
        sys.exit(1)
    elif mode == "fail-silent":
        sys.exit(1)
    elif mode == "hang":               # a child that starts a grandchild, then hangs
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        Path(args[0]).write_text(f"{os.getpid()} {grandchild.pid}")
        print("hanging", flush=True)
        time.sleep(300)
    elif mode == "stubborn":           # ignores SIGTERM: needs the SIGKILL escalation
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path(args[0]).write_text(str(os.getpid()))
        print("stubborn", flush=True)
        time.sleep(300)
""")


@pytest.fixture
def code_root(tmp_path: Path) -> Path:
    pkg = tmp_path / "code" / "fakesteps"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(FAKE_MAIN)
    return tmp_path / "code"


class RecordingLog:
    """Stands in for the task logger; calls ``on_line`` for every line as it arrives."""

    def __init__(self, on_line=None):
        self.lines: list[tuple[str, str]] = []
        self.on_line = on_line

    def _record(self, level, msg, *args, **_):
        text = msg % args if args else msg
        self.lines.append((level, text))
        if self.on_line:
            self.on_line(text)

    def info(self, msg, *args, **kw):
        self._record("info", msg, *args, **kw)

    def warning(self, msg, *args, **kw):
        self._record("warning", msg, *args, **kw)

    def error(self, msg, *args, **kw):
        self._record("error", msg, *args, **kw)

    def text(self) -> str:
        return "\n".join(t for _, t in self.lines)


def make_op(code_root: Path, argv, monkeypatch=None, on_line=None, **kwargs):
    from house.local import LocalStepOperator

    op = LocalStepOperator(task_id="t", package="fakesteps", argv=argv, cwd=str(code_root), **kwargs)
    log = RecordingLog(on_line)
    # BaseOperator.log is a read-only property; shadow it on the instance's class
    op.__class__ = type("RecordedLocalStepOperator", (LocalStepOperator,), {"log": log})
    return op, log


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a parent that is not us."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _wait_dead(pid: int, seconds: float = 10) -> bool:
    deadline = time.time() + seconds
    while time.time() < deadline:
        if _dead(pid):
            return True
        time.sleep(0.05)
    return False


def test_runs_package_with_argv_env_and_cwd(code_root):
    op, log = make_op(code_root, ["echo", "a b", 3], env={"MODE": "fast"})
    op.execute({})
    text = log.text()
    assert "[stdout] argv=a b 3" in text
    assert f"[stdout] cwd={code_root}" in text
    assert "[stdout] env=fast" in text


def test_streams_lines_while_running(code_root, tmp_path):
    flag = tmp_path / "seen-ready"

    def on_line(text):
        if text == "[stdout] ready":
            flag.touch()

    op, log = make_op(code_root, ["handshake", str(flag)], on_line=on_line)
    op.execute({})
    texts = [t for _, t in log.lines]
    assert texts.index("[stdout] ready") < texts.index("[stdout] done")


@pytest.mark.parametrize("code", [1, 2, 7])
def test_failure_raises_with_stderr_tail(code_root, code):
    from airflow.sdk.exceptions import AirflowFailException

    from house.local import StepFailed

    op, log = make_op(code_root, ["fail", str(code)], stderr_tail_lines=5)
    with pytest.raises(StepFailed) as err:
        op.execute({})
    assert err.value.returncode == code
    # exit code 2 = bad input or parameters (step contract): no retry can help
    assert isinstance(err.value, AirflowFailException) == (code == 2)
    msg = str(err.value)
    assert f"exit code {code}" in msg
    assert "err 99" in msg and "err 95" in msg and "err 94" not in msg
    assert "out line" not in msg
    # the full stderr still went to the log
    assert "[stderr] err 0" in log.text() and "[stdout] out line" in log.text()


def test_failure_quotes_stdout_when_stderr_is_empty(code_root):
    from house.local import StepFailed

    op, _ = make_op(code_root, ["fail-stdout"], stderr_tail_lines=3)
    with pytest.raises(StepFailed) as err:
        op.execute({})
    msg = str(err.value)
    assert "last 3 stdout lines:" in msg
    assert msg.rstrip().endswith("failed: invoke: ConnectionError 127.0.0.1:8080 refused")
    assert "point 8 ok" in msg and "point 7 ok" not in msg
    assert "no stderr output" not in msg


def test_failure_without_any_output_says_so(code_root):
    from house.local import StepFailed

    op, _ = make_op(code_root, ["fail-silent"])
    with pytest.raises(StepFailed, match="exit code 1.*no output on stderr or stdout"):
        op.execute({})


def test_execution_timeout_kills_process_group(code_root, tmp_path):
    """Airflow's execution_timeout (SIGALRM -> AirflowTaskTimeout) stops child and grandchild."""
    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout

    pids = tmp_path / "pids"
    op, log = make_op(code_root, ["hang", str(pids)], kill_grace_seconds=3)
    start = time.time()
    with pytest.raises(AirflowTaskTimeout), timeout(2):
        op.execute({})
    assert time.time() - start < 30  # timeout 2 s + grace 3 s; without the kill it hangs (margin: busy machines)
    child, grandchild = map(int, pids.read_text().split())
    assert _wait_dead(child), f"child {child} survived"
    assert _wait_dead(grandchild), f"grandchild {grandchild} survived"
    assert "stopping step process group" in log.text()


def test_on_kill_escalates_to_sigkill(code_root, tmp_path):
    from house.local import StepFailed

    pidfile = tmp_path / "pid"
    op, log = make_op(code_root, ["stubborn", str(pidfile)], kill_grace_seconds=1)
    errors: list[BaseException] = []

    def run():
        try:
            op.execute({})
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.time() + 20
    while not pidfile.exists() or op._proc is None:
        assert time.time() < deadline, "child did not start"
        time.sleep(0.05)
    time.sleep(0.2)  # let it install its SIGTERM handler
    op.on_kill()
    worker.join(20)
    assert not worker.is_alive()
    assert _wait_dead(int(pidfile.read_text()))
    assert errors and isinstance(errors[0], StepFailed)
    assert "killed by signal 9" in str(errors[0])
    assert "SIGKILL" in log.text()


def test_string_argv_rejected(code_root):
    op, _ = make_op(code_root, "echo a")
    with pytest.raises(TypeError, match="list"):
        op.execute({})


def test_argv_is_templated(code_root):
    from airflow.sdk import DAG

    from house.local import LocalStepOperator

    with DAG("templated", schedule=None):
        op = LocalStepOperator(
            task_id="t", package="fakesteps", argv=["echo", "{{ ds }}", "{{ params.x }}"], cwd=str(code_root)
        )
    op.render_template_fields({"ds": "2026-11-29", "params": {"x": "y"}})
    assert op.argv == ["echo", "2026-11-29", "y"]
    assert op.command()[1:] == ["-m", "fakesteps", "echo", "2026-11-29", "y"]


def test_mapped_items_label_each_instance(code_root):
    """``expand_kwargs(mapped_items(argvs, labels))`` with ``MAP_LABEL``: each instance runs its argv
    and its label is the one given beside it (what the grid shows), nothing read from the argv."""
    from airflow.sdk import DAG

    from house import MAP_LABEL, mapped_items, step_partial

    items = mapped_items([["echo", "a"], ["echo", "b"]], ["first · node 1", "second"])
    assert items == [
        {"argv": ["echo", "a"], "map_label": "first · node 1"},
        {"argv": ["echo", "b"], "map_label": "second"},
    ]
    with pytest.raises(ValueError, match="2 argvs but 1 labels"):
        mapped_items([["echo"], ["echo"]], ["one"])
    with DAG("labelled", schedule=None) as dag:
        step_partial("m", package="fakesteps", map_index_template=MAP_LABEL, cwd=str(code_root)).expand_kwargs(items)
    mapped = dag.get_task("m")
    assert mapped.map_index_template == MAP_LABEL
    for item in items:
        op = mapped.unmap(item)
        assert op.command()[-2:] == item["argv"]
        assert dag.get_template_env().from_string(MAP_LABEL).render(task=op) == item["map_label"]


def test_child_runs_from_the_code_root_without_path_hacks(monkeypatch, code_root):
    """The task packages are installed: the runner adds nothing to PYTHONPATH."""
    from house.local import LocalStepOperator

    monkeypatch.setenv("HOUSE_CODE_ROOT", str(code_root))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    op = LocalStepOperator(task_id="t", package="fakesteps", argv=["echo"])
    env = op.child_env()
    assert env["PYTHONPATH"] == "/elsewhere"
    assert env["PYTHONUNBUFFERED"] == "1"
