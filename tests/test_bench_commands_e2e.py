"""Every bench command runs as documented, at its smallest size, so none can rot unseen.

* every ``bench/*.py`` answers ``--help`` (its imports resolve after a module moves);
* ``bench/waitpred.py --smoke``, ``bench/sampling.py --smoke``, ``bench/ingest.py --smoke``, ``bench/train.py --smoke`` and
  ``bench/load.py --smoke`` run to the end and print their figures (``bench/simulator.py
  --quick``: tests/test_bench_smoke_e2e.py).

``bench/backfill.py`` runs whole pipelines (an hour, a real Airflow); here it is checked by
``--help`` only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, TRACES, shared_trace_path

#: Every script in bench/ is a command (the lab's campaign drivers: tests/lab/test_campaign_commands_e2e.py).
BENCHES = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))  # _steprun: a helper


def _run(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    p = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{args}: rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.mark.parametrize("name", BENCHES)
def test_bench_command_answers_help(name):
    p = _run([f"bench/{name}", "--help"], timeout=300)
    assert "usage:" in p.stdout


def test_waitpred_bench_smoke(tmp_path):
    shared_trace_path("KTH-SP2-1996-2.1-cln.swf.gz")
    out = tmp_path / "w.json"
    p = _run(["bench/waitpred.py", "--smoke", "--json", str(out)])
    s = json.loads(out.read_text())
    assert s["jobs"] > 500 and s["sweep_cpu_s"] > 0 and s["replay_cpu_s"] > 0
    assert "scored at submission" in p.stdout and "the replay of the same months" in p.stdout


def test_sampling_bench_smoke(tmp_path):
    log = shared_trace_path("ls6-a100.log.gz")
    out = tmp_path / "s.json"
    p = _run(["bench/sampling.py", "--smoke", "--log", str(log), "--json", str(out)])
    s = json.loads(out.read_text())
    assert s["count"] == 6 and s["workers"] == 2
    for node in (1, 8):
        assert s[f"node{node}"]["examples"] == 42  # 6 samples x 7 probes
        # the step's own CPU and, with the subreaper, at least what its workers spent sampling
        assert s[f"node{node}"]["cpu_s"] >= s[f"node{node}"]["step_sampling_cpu_s"] > 0
    assert "both node sizes:" in p.stdout and "load average" in p.stdout


def test_ingest_bench_smoke():
    shared_trace_path("ls6-a100.log.gz")
    p = _run(["bench/ingest.py", "--smoke", "--traces", str(TRACES)])
    row = next(line for line in p.stdout.splitlines() if line.startswith("ls6-a100.log.gz"))
    assert "skipped" not in row and int(row.split()[1]) > 20000


def test_train_bench_smoke(tmp_path):
    p = _run(["bench/train.py", "--smoke", "--threads", "1", "--workdir", str(tmp_path)])
    rows = [line for line in p.stdout.splitlines() if line.startswith(("| xgboost", "| random_forest"))]
    assert len(rows) == 2 and not any("failed" in r for r in rows)
    assert "synthetic (40 samples" in p.stdout


def test_load_bench_smoke(tmp_path):
    out = tmp_path / "load.json"
    p = _run(["bench/load.py", "--smoke", "--json-out", str(out)], timeout=300)
    r = json.loads(out.read_text())
    assert r["endpoint"] in ("nginx", "python") and len(r["ramps"]) == 1
    point = r["ramps"][0]["rates"][0]
    # whether a shared machine sustained it is not asserted; that the point ran and was counted is
    assert point["rate"] == 1000 and point["scheduled"] == 1000 and point["sent"] + point["missed"] == 1000
    assert point["throughput_ok"] > 0 and sum(point["errors"].values()) == 0
    assert "summary:" in p.stdout
