"""No hindsight through the whole chain: ``calibrate`` then ``waitpred`` on a real log (KTH-SP2),
run twice through the step command lines, the second time on the same log with everything after
an instant ``T`` rewritten (every start after ``T`` later, every run going on at ``T`` longer).
Every answer and bound for a job submitted before ``T`` must come out bit-identical: a site
answering then could not have known anything that changed.

``T`` lies a day after the calibration period's end, so jobs of the calibration period are
still waiting or running at ``T``: a fitted part (the simulator's configuration, the quantile
model's labels, the guard's held-back tail, the bound's start offsets) that read their real waits
or run times would change its answers. (The sweep alone, with the configuration fixed, is tested
in test_waitpred.py: it could not see a fitted part reading the future.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from mirage_tasks.data.schema import read_trace, write_trace

CAL = ("1996-11-01", "1996-12-01")
MONTH = "1996-12"
LATER_START_H = 5  # every start after T this much later
LONGER_RUN_H = 3  # every run going on at T this much longer


def _step(*argv: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mirage_tasks", *argv], capture_output=True, text=True, timeout=240, check=False
    )
    assert r.returncode == 0, r.stderr[-3000:]


def _chain(trace: str, out) -> tuple[dict, dict, pd.DataFrame]:
    _step(
        "calibrate",
        "--trace",
        trace,
        "--calibrate-from",
        CAL[0],
        "--calibrate-to",
        CAL[1],
        "--score-from",
        f"{MONTH}-01",
        "--score-to",
        "1997-01-01",
        "--trials",
        "4",
        "--timeout-s",
        "0",
        "--seed",
        "0",
        "--procs-per-node",
        "1",
        "--out",
        str(out / "cal"),
    )
    _step(
        "waitpred",
        "--trace",
        trace,
        "--cluster-config",
        str(out / "cal" / "config.json"),
        "--calibrate-from",
        CAL[0],
        "--calibrate-to",
        CAL[1],
        "--months",
        MONTH,
        "--procs-per-node",
        "1",
        "--out",
        str(out / "wp"),
    )
    doc = json.loads((out / "wp" / "waitpred.json").read_text())
    fitted = {k: doc.get(k) for k in ("pick", "theta0", "bound", "at_cut")}
    return (
        json.loads((out / "cal" / "config.json").read_text()),
        fitted,
        pd.read_parquet(out / "wp" / "predictions.parquet"),
    )


@pytest.fixture(scope="module")
def kth(shared_trace, tmp_path_factory):
    d = tmp_path_factory.mktemp("hindsight")
    _step("ingest", "--trace", str(shared_trace("KTH-SP2-1996-2.1-cln.swf.gz")), "--out", str(d / "trace"))
    return d


def test_nothing_after_an_instant_changes_an_answer_given_before_it(kth):
    df, meta = read_trace(str(kth / "trace"))
    tz = meta.timezone or "UTC"
    cut = pd.Timestamp(CAL[1], tz=tz)
    T = cut + pd.Timedelta(hours=24)
    later = df["start"] >= T
    running = (df["start"] < T) & (df["end"] > T)
    sub_cal = df["submit"] < cut
    # the rewrite reaches the calibration period: some of its jobs were still waiting or running at T
    assert (sub_cal & (later | running)).sum() >= 3
    alt = df.copy()
    alt.loc[later, "start"] += pd.Timedelta(hours=LATER_START_H)
    alt.loc[later, "end"] += pd.Timedelta(hours=LATER_START_H)
    alt.loc[running, "end"] += pd.Timedelta(hours=LONGER_RUN_H)
    alt_dir = kth / "alt" / "trace"
    write_trace(str(alt_dir / "trace.parquet"), alt, meta)

    cfg_a, fit_a, pa = _chain(str(kth / "trace"), kth / "a")
    cfg_b, fit_b, pb = _chain(str(alt_dir), kth / "b")
    assert cfg_a == cfg_b  # the simulator's configuration, fitted at the cut
    assert fit_a == fit_b  # the guard's pick, the bound's offsets and cap
    before = int(T.timestamp())
    ea, eb = pa[pa["submit"] < before], pb[pb["submit"] < before]
    assert len(ea) >= 20 and ea["job_id"].tolist() == eb["job_id"].tolist()
    answers = [c for c in pa.columns if c not in ("real_wait_s",)]
    for c in answers:
        np.testing.assert_array_equal(eb[c].to_numpy(), ea[c].to_numpy(), err_msg=f"{c} of a job submitted before T")
    # the control: the rewrite did reach what the scored jobs' outcomes are
    assert (pa["real_wait_s"].to_numpy() != pb["real_wait_s"].to_numpy()).any()
