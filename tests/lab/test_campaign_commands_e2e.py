"""Every campaign driver in lab/campaigns/ runs as documented (``python -m lab.campaigns.<name>``
from the repository root), so none can rot unseen: each answers ``--help`` (its imports resolve
after a module moves), refuses a bad flag with exit 2 naming it before it starts anything, and
``fairshare_fidelity --smoke`` runs to the end and writes its page. The others run whole
campaigns (hours): tests/lab/test_mirage_eval_e2e.py runs mirage_eval's smoke size."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, shared_trace_path

CAMPAIGNS = sorted(p.stem for p in (REPO / "lab" / "campaigns").glob("*.py") if not p.name.startswith("_"))


def _cmd(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def _run(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    p = _cmd(args, timeout)
    assert p.returncode == 0, f"{args}: rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def test_every_campaign_is_found():
    assert {"keeper_campaign", "mirage_eval", "ls6_months", "ls6_policy_fix", "fairshare_fidelity"} <= set(CAMPAIGNS)


@pytest.mark.parametrize("name", CAMPAIGNS)
def test_campaign_answers_help(name):
    p = _run(["-m", f"lab.campaigns.{name}", "--help"], timeout=300)
    assert "usage:" in p.stdout


CASES = [
    ("ls6_months", ["--root", "{file}"], "--root"),
    ("ls6_months", ["--nodes", "0"], "--nodes"),
    ("ls6_months", ["--interval-hours", "nan"], "--interval-hours"),
    ("ls6_months", ["--curve-fractions", "2"], "--curve-fractions"),
    ("ls6_policy_fix", ["--root", "{file}"], "--root"),
]


@pytest.mark.parametrize("name,argv,flag", CASES, ids=[f"{b}:{f}:{a[-1]}" for b, a, f in CASES])
def test_a_bad_flag_exits_2_naming_it(tmp_path, name, argv, flag):
    f = tmp_path / "a-file"
    f.write_text("x")
    argv = [a.format(file=f) for a in argv]
    p = _cmd(["-m", f"lab.campaigns.{name}", *argv], timeout=300)
    assert p.returncode == 2, p.stderr[-2000:]
    assert flag in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


def test_fairshare_fidelity_campaign_smoke(tmp_path):
    log = shared_trace_path("ls6-a100.log.gz")
    out, doc = tmp_path / "summary.json", tmp_path / "page.md"
    p = _run(
        [
            "-m",
            "lab.campaigns.fairshare_fidelity",
            "--smoke",
            "--log",
            str(log),
            "--resamples",
            "200",
            "--json",
            str(out),
            "--write-doc",
            str(doc),
        ]
    )
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads(out.read_text())
    assert set(s["configs"]) == {"recorded", "age_size", "fairshare-3000"} and s["jobs"] > 1000
    for c in s["configs"].values():
        assert 0 < c["mae_h"] < s["zero_wait_mae_h"]
    pair = s["pairs"][0]
    assert pair["mae_h_diff_ci"][0] <= pair["mae_h_diff"] <= pair["mae_h_diff_ci"][1]
    assert "| fairshare-3000 - age_size |" in doc.read_text() and "zero-wait MAE" in p.stdout
    z = s["at_submission"]
    assert z["jobs"] == s["jobs"] and {"age_size:plan_s", "fairshare-3000:plan_s"} <= set(z["plans"])
    assert {(q["a"], q["b"]) for q in z["pairs"]} >= {
        ("fairshare-3000:plan_s", "zero"),
        ("fairshare-3000:plan_s", "age_size:plan_s"),
    }
    assert "## At submission" in doc.read_text()
