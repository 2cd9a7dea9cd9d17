"""``python -m lab.campaigns.mirage_eval``, the driver (the shell twin of the mirage_evaluation DAG), without its
steps: their command lines recorded or replaced by a stand-in, so each case runs in a second.
Two descriptions of one log name are refused before anything runs, a failed log fails the
driver and is counted, and SIGTERM stops exactly the steps it started."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO
from proctree import all_gone, tree, wait_for


def _driver():
    return importlib.import_module("lab.campaigns.mirage_eval")


def _describe(path, name, trace):
    path.write_text(
        json.dumps({"name": name, "trace": trace, "calibrate": ["1996-10-01", "1996-12-01"], "months": ["1997-01"]})
    )
    return str(path)


def _drive(mod, monkeypatch, tmp_path, files, failing_trace):
    """Run the driver's main on ``files`` with every step recorded; the ingest of
    ``failing_trace`` fails as a step does (SystemExit naming it)."""
    ran: list[list[str]] = []

    def run(argv, log):
        ran.append(list(argv))
        if argv[0] == "ingest" and argv[argv.index("--trace") + 1] == failing_trace:
            raise SystemExit(f"step failed (rc 2): ingest {failing_trace}; log {log}")

    monkeypatch.setattr(mod, "run", run)
    monkeypatch.setattr(
        sys, "argv", ["mirage_eval.py", "--root", str(tmp_path / "r"), "--waitpred-only", "--log-file", *files]
    )
    return mod.main(), ran


def test_two_descriptions_of_one_name_are_refused_naming_both(tmp_path, monkeypatch, capsys):
    """The first description's failure was dropped (the results were keyed by name, the second
    replaced the first) and the driver exited 0; now nothing runs and both files are named."""
    mod = _driver()
    a = _describe(tmp_path / "a.json", "site", "/nowhere/a.swf")
    b = _describe(tmp_path / "b.json", "site", "/nowhere/b.swf")
    with pytest.raises(SystemExit) as e:
        _drive(mod, monkeypatch, tmp_path, [a, b], failing_trace="/nowhere/a.swf")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "two log descriptions name the log 'site'" in err and a in err and b in err
    assert not (tmp_path / "r").exists()


def test_a_failed_log_fails_the_driver_and_is_counted(tmp_path, monkeypatch, capsys):
    mod = _driver()
    a = _describe(tmp_path / "a.json", "a", "/nowhere/a.swf")
    b = _describe(tmp_path / "b.json", "b", "/nowhere/b.swf")
    rc, ran = _drive(mod, monkeypatch, tmp_path, [a, b], failing_trace="/nowhere/a.swf")
    out = capsys.readouterr().out
    assert rc == 1 and "mirage_eval: 1 of 2 log(s) done, 1 failed: a" in out
    assert [x[0] for x in ran].count("waitpred") == 1  # b ran to its end, a stopped at its ingest
    assert set(json.loads((tmp_path / "r" / "run.json").read_text())["failed"]) == {"a"}


#: a step stand-in: starts a helper that would "commit" after LATE_S, says it started, and on
#: SIGTERM exits 143 without stopping its helper (a step that leaks: its group is killed for it)
STEP = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    d = os.environ["DRIVER_TEST_DIR"]
    late = ("import time, sys; time.sleep(float(sys.argv[2])); open(sys.argv[1], 'w').write('late')")
    subprocess.Popen([sys.executable, "-c", late, os.path.join(d, "committed"), os.environ["LATE_S"]])
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))
    open(os.path.join(d, "started"), "w").write(str(os.getpid()))
    time.sleep(600)
""")

#: the driver as the shell runs it (``python -m lab.campaigns.mirage_eval``), its steps the stand-in
WRAPPER = textwrap.dedent("""
    import runpy, sys
    from mirage_tasks.run import evalplan
    step = sys.argv[1]
    evalplan.command = lambda argv: ["-c", step, argv[0]]
    sys.argv = ["lab.campaigns.mirage_eval", *sys.argv[2:]]
    runpy.run_module("lab.campaigns.mirage_eval", run_name="__main__", alter_sys=True)
""")


def test_sigterm_stops_the_step_it_started_and_says_so(tmp_path):
    """A stopped driver orphaned its running step, whose work committed later; now SIGTERM stops
    that step's whole process group, nothing commits afterwards, and the exit (143) names it."""
    late_s = 3.0
    env = dict(os.environ, DRIVER_TEST_DIR=str(tmp_path), LATE_S=str(late_s), PYTHONPATH=str(REPO))
    desc = _describe(tmp_path / "a.json", "a", "/nowhere/a.swf")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, STEP, "--root", str(tmp_path / "r"), "--waitpred-only", "--log-file", desc],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (tmp_path / "started").exists() or proc.poll() is not None, "the step to start", 60)
        assert proc.poll() is None, proc.communicate()
        everything = tree(proc.pid)
        assert len(everything) >= 3  # the driver, the step, its helper
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, (proc.returncode, out, err)
    step_pid = (tmp_path / "started").read_text()
    assert f"stopped 1 running step(s) it had started: a: ingest (pid {step_pid}): exited 143" in err, err
    assert "Traceback" not in err, err
    all_gone(everything)
    time.sleep(late_s + 1)
    assert not (tmp_path / "committed").exists()
