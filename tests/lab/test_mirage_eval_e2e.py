"""``python -m lab.campaigns.mirage_eval --smoke`` runs the protocol's whole chain on KTH-SP2 at its smallest size
(ingest, calibrate, sample, merge, train, the probe-replay evaluation, the guarded wait predictor)
and ``--write-doc`` writes a page with its tables, verdicts and a trade-off figure."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, shared_trace_path

#: the whole chain at its smallest size runs 2-4 minutes on 2 quiet cores; on a shared, busy machine
#: (the suite beside a CPU hog and other suites) it took over 15
pytestmark = pytest.mark.timeout(2400)


def test_mirage_eval_smoke_and_page(tmp_path):
    shared_trace_path("KTH-SP2-1996-2.1-cln.swf.gz")  # skips with the reason where ../shared/traces is absent
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    root = tmp_path / "eval"
    p = subprocess.run(
        [sys.executable, "-m", "lab.campaigns.mirage_eval", "--smoke", "--root", str(root)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "mirage_eval: CPU" in p.stdout
    run = json.loads((root / "run.json").read_text())
    assert run["failed"] == {} and run["cpu_s_children"] > 0
    for n in (1, 8):
        doc = json.loads((root / "KTH-SP2" / "eval" / f"node{n}" / "evaluation.json").read_text())
        methods = {r["method"] for r in doc["rows"]}
        assert {"reactive", "avg", "avg-cal", "avg-load", "xgboost", "linear_quantile", "oracle"} <= methods
        objective = {r["method"]: r["objective"] for r in doc["rows"]}
        assert objective["oracle"] <= min(objective.values()) + 1e-12
    wpj = json.loads((root / "KTH-SP2" / "waitpred" / "waitpred.json").read_text())
    from mirage_tasks.calibration.waitpred import CANDIDATES

    assert wpj["pick"] in CANDIDATES and "coverage" in wpj["out_of_sample"]["guarded"]["pooled"]
    _kill_the_evaluation_at_a_random_point(root / "KTH-SP2", env)
    page = tmp_path / "page" / "clusters.md"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.campaigns.mirage_eval",
            "--root",
            str(root),
            "--logs",
            "KTH-SP2",
            "--write-doc",
            str(page),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    text = page.read_text()
    assert "## KTH-SP2" in text and "Verdicts, plainly" in text and "Wait predictor at submission" in text
    assert "| KTH-SP2 | 1997-01 | 1 | xgboost |" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "page" / "clusters" / "KTH-SP2-node1.png").stat().st_size > 1000


def test_mirage_eval_protocol_v2_smoke_and_page(tmp_path):
    """--protocol v2 on a root of its own (a test of its own, so the two chains run side by side): the
    samples carry the predictor's answer at each probe, the fresh month is scored, the page states the
    criteria."""
    shared_trace_path("KTH-SP2-1996-2.1-cln.swf.gz")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    root = tmp_path / "eval"
    p = subprocess.run(
        [sys.executable, "-m", "lab.campaigns.mirage_eval", "--smoke", "--protocol", "v2", "--root", str(root)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "KTH-SP2: ingest rc=0" in p.stdout
    for n in (1, 8):
        doc = json.loads((root / "KTH-SP2" / "v2-eval-fresh" / f"node{n}" / "evaluation.json").read_text())
        assert {r["month"] for r in doc["rows"]} == {"1997-04"}
        assert {
            "wait-pred",
            "wait-pred-cal",
            "guarantee-10",
            "guarantee-cal",
            "policy-stop",
            "reactive",
            "avg-cal",
            "xgboost",
            "xgboost-wp",
        } <= {r["method"] for r in doc["rows"]}
        assert doc["calibration"]["guarantee-cal"]["level"] == 0.1 and "guarantee-aci" in {
            r["method"] for r in doc["rows"]
        }
        assert doc["calibration"]["primary"]["rule"] in ("xgboost", "xgboost-wp", "wait-pred-cal", "guarantee-10")
        assert "xgboost-wp" in doc["calibration"]["primary"]["chosen_from"]
    page = tmp_path / "page" / "v2.md"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.campaigns.mirage_eval",
            "--protocol",
            "v2",
            "--root",
            str(root),
            "--logs",
            "KTH-SP2",
            "--write-doc",
            str(page),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    text = page.read_text()
    assert "## Fresh months" in text and "(primary)" in text
    assert "**guarantee-10 (the predictor's 90 % bound as given) holds the stated 10 %" in text
    assert "**guarantee-cal (its margin by split conformal calibration" in text and "; margin " in text
    assert "**guarantee-aci (guarantee-cal with its level adapted" in text and "; level from " in text
    assert "as committed at `` " not in text and "as committed at `?`" not in text  # the protocol's commit named
    assert "| KTH-SP2 | 1 | 1997-04 |" in text and "## Seen months" in text
    assert "## The policy that learns" in text and "## The online decider beside the probe replay" in text
    assert "| KTH-SP2 | 1 | xgboost-uniform |" in text  # the models' answers by time left
    assert "| | | | | xgboost-wp |" in text or "**xgboost-wp** (primary)" in text
    assert "xgboost-wp +" in text or "xgboost-wp -" in text  # its share of the gap to oracle-wait
    for rule in (
        "avg-cal",
        "wait-pred",
        "wait-pred-cal",
        "guarantee-10",
        "guarantee-cal",
        "xgboost-wp",
        "xgboost-all",
        "xgboost-wp-all",
        "xgboost-probes",
        "xgboost-wp-probes",
    ):  # online beside the replay
        assert f"| KTH-SP2 | 8 | {rule} | " in text, rule
    # the end-spaced models are asked only in their last 24 h: none submits earlier online
    for rule in ("xgboost", "xgboost-wp"):
        (row,) = [ln for ln in text.splitlines() if ln.startswith(f"| KTH-SP2 | 8 | {rule} | ")]
        assert row.split("|")[8].strip() == "0%", row
    assert "| KTH-SP2 | 1 | xgboost-all |" in text  # the answers by time left: the model asked all along
    # asked at its training probes' times, the online decider is the replay: objectives equal
    for n in (1, 8):
        for rule in ("xgboost-probes", "guarantee-cal"):  # guarantee-cal: asked where its margin was calibrated
            (row,) = [ln for ln in text.splitlines() if ln.startswith(f"| KTH-SP2 | {n} | {rule} | ")]
            cells = [c.strip() for c in row.split("|")]
            assert cells[5] == cells[6], row


def test_a_log_described_in_a_file_waitpred_only(tmp_path):
    """A user's own log: a description file beside it, no code edit, the wait predictor alone."""
    src = shared_trace_path("KTH-SP2-1996-2.1-cln.swf.gz")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "log.swf.gz").symlink_to(src)
    (tmp_path / "site" / "mysite.yaml").write_text(
        "name: mysite\ntrace: log.swf.gz\ncalibrate: [1996-12-01, 1997-01-01]\nmonths: [1997-01]\nprocs_per_node: 1\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    root = tmp_path / "eval"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.campaigns.mirage_eval",
            "--log-file",
            str(tmp_path / "site" / "mysite.yaml"),
            "--waitpred-only",
            "--cal-trials",
            "3",
            "--root",
            str(root),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert not (root / "mysite" / "samples-train").exists()  # waitpred only: no sampling
    doc = json.loads((root / "mysite" / "waitpred" / "waitpred.json").read_text())
    assert doc["params"]["months"] == ["1997-01"] and doc["n_scored"] > 1000
    page = tmp_path / "wp.md"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.campaigns.mirage_eval",
            "--log-file",
            str(tmp_path / "site" / "mysite.yaml"),
            "--waitpred-only",
            "--root",
            str(root),
            "--write-doc",
            str(page),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert "## mysite" in page.read_text() and "Targets (1 of 1 logs scored)" in page.read_text()
    # a description with a mistake is refused naming the file and the field, before anything runs
    (tmp_path / "site" / "bad.json").write_text(
        '{"name": "bad", "trace": "log.swf.gz", "calibrate": ["1997-01-01", "1996-12-01"], "months": ["1997-01"]}'
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.campaigns.mirage_eval",
            "--log-file",
            str(tmp_path / "site" / "bad.json"),
            "--waitpred-only",
            "--root",
            str(root),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and "bad.json: field 'calibrate'" in p.stderr
    # a calibration that reaches its opt-in wall limit fails, and nothing uses it: which trials ran
    # would depend on the machine's speed (a calibrate run stops at the first trial past the limit)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.campaigns.mirage_eval",
            "--log-file",
            str(tmp_path / "site" / "mysite.yaml"),
            "--waitpred-only",
            "--cal-trials",
            "4",
            "--cal-timeout-s",
            "0.001",
            "--root",
            str(
                tmp_path / "budget"
            ),  # the first root's calibration is committed: a rerun of other inputs there is refused
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert p.returncode == 1, p.stdout[-2000:]
    assert "--timeout-s 0.001: the calibration reached its wall limit after 1 of 4 trials" in p.stdout, p.stdout[-2000:]
    assert "mysite: calibrate rc=2" in p.stdout and "mysite: waitpred" not in p.stdout


def _kill_the_evaluation_at_a_random_point(log_dir, env):
    """The probe-replay evaluation rerun with other parameters over its committed output, stopped by
    SIGTERM at a random point once it scores: exit 143, no process, no lease, the output byte for byte
    as it was."""
    from proctree import all_gone, tree

    out = log_dir / "eval" / "node1"
    digest = lambda: {  # noqa: E731
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.rglob("*")) if p.is_file()
    }
    before = digest()
    cmd = shlex.split((log_dir / "logs" / "eval-node1.log").read_text().splitlines()[0][2:])
    cmd[cmd.index("--bootstrap") + 1] = "100000"  # other parameters, and long enough to be caught scoring
    seed = random.randrange(10**6)
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any("probe replay: month" in ln for ln in lines):
            ln = proc.stderr.readline()
            assert ln or proc.poll() is None, "".join(lines)[-3000:]
            lines.append(ln)
        time.sleep(random.Random(seed).uniform(0.0, 0.2))  # the scoring takes a second or two
        everything = tree(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode in (143, 0), (seed, ("".join(lines) + err)[-3000:])  # 0: it had finished first
        assert "Traceback" not in err, err[-3000:]
        all_gone(everything)
        assert not (out / "_LEASE.json").exists()
        if proc.returncode == 143:
            assert digest() == before
    finally:
        if proc.poll() is None:
            proc.kill()
