"""The wait predictor's command line on a small simulated log (issue 27): it scores and writes its
outputs, and refuses bad input naming the flag before anything is written. (The unit tests of the
plan, the sweep, the bounds and the guard: test_waitpred.py.)"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_waitpred import _log

from mirage_tasks.calibration import waitpred as wp
from mirage_tasks.data.schema import TraceMeta, write_trace
from mirage_tasks.sim import SimConfig


@pytest.fixture(scope="module")
def trace_uri(tmp_path_factory):
    d = tmp_path_factory.mktemp("wp")
    submit, start, dur, jn, limit, user = _log(seed=5, n=900, days=60)  # busy, not overloaded
    ts = lambda a: pd.to_datetime(a, unit="s", utc=True).astype("datetime64[s, UTC]")  # noqa: E731
    df = pd.DataFrame({"job_id": np.arange(len(submit)).astype(str), "submit": ts(submit), "start": ts(start),
                       "end": ts(start + dur), "time_limit_s": limit, "nodes": jn.astype("int32"),
                       "procs": jn.astype("int32"), "partition": "p", "user": user.astype(str),
                       "status": "COMPLETED", "priority": pd.array([pd.NA] * len(submit), dtype="Int64")})
    uri = str(d / "trace")
    write_trace(uri + "/trace.parquet", df, TraceMeta(source="self", format="test", timezone="UTC"))
    (d / "cfg.json").write_text(json.dumps(SimConfig(nodes=16, weight_size=0.0).to_dict()))
    return uri, str(d / "cfg.json")


def _months(uri):
    df = pd.read_parquet(uri + "/trace.parquet")
    return sorted(df["submit"].dt.strftime("%Y-%m").unique())


def test_waitpred_scores_and_writes_its_outputs(trace_uri, tmp_path, capsys):
    uri, cfg = trace_uri
    first = pd.read_parquet(uri + "/trace.parquet")["submit"].min()
    a, b = first.strftime("%Y-%m-%d"), (first + pd.Timedelta(days=10)).strftime("%Y-%m-%d")
    m = (first + pd.Timedelta(days=10)).strftime("%Y-%m")
    months = [x for x in _months(uri) if x > m] or [m]
    b = max(b, f"{months[0]}-01") if months[0] != m else b
    out = tmp_path / "out"
    rc = wp.main(["--trace", uri, "--cluster-config", cfg, "--calibrate-from", a, "--calibrate-to", f"{months[0]}-01",
                  "--months", *months, "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "waitpred.json").read_text())
    assert doc["pick"] in wp.CANDIDATES and set(doc["out_of_sample"]) == set(wp.PREDICTORS)
    assert "coverage" in doc["out_of_sample"]["guarded"]["pooled"]
    pred = pd.read_parquet(out / "predictions.parquet")
    assert {"guarded", "guarded_bound", "plan", "plan_bound"} <= set(pred.columns)
    assert "Guard pick" in (out / "waitpred.md").read_text()
    assert (out / "model.ubj").read_bytes()[:1] == b"{"  # xgboost's UBJ, not a pickle

    # the sample step asks that predictor at every decision time (protocol v2)
    import subprocess
    import sys

    start = (pd.Timestamp(f"{months[0]}-01", tz="UTC") + pd.Timedelta(days=1)).isoformat()
    samples = tmp_path / "samples"
    cmd = [sys.executable, "-m", "mirage_tasks", "sample", "--trace", uri + "/trace.parquet", "--cluster-config", cfg, "--start", start,
           "--count", "3", "--interval-hours", "12", "--probe-spacing", "end", "--node", "2", "--workload-days", "4",
           "--warmup-days", "1", "--waitpred", str(out), "--out", str(samples)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    probes = pd.read_parquet(samples / "probes.parquet")
    assert len(probes) == 27 and probes[["wp_wait_s", "wp_bound_s", "wp_plan_request_s"]].notna().all().all()
    assert (probes["wp_bound_s"] >= probes["wp_wait_s"] - 1e-6).all() and (probes["wp_wait_s"] >= 0).all()
    marker = json.loads((samples / "_SUCCESS.json").read_text())
    assert "waitpred" in json.dumps(marker)
    # merge --waitpred-features appends the answer at each probe to its history (protocol v2's xgboost-wp)
    ds = tmp_path / "ds-wp"
    r = subprocess.run([sys.executable, "-m", "mirage_tasks", "merge", "--in", str(samples), "--out", str(ds),
                        "--waitpred-features"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    man = json.loads((ds / "manifest.json").read_text())
    assert man["feature_names"][-4:] == ["wp_wait_h", "wp_bound_h", "wp_gap_h", "wp_overlap_h"]
    with np.load(ds / "dataset.npz") as z:
        X, shard = z["X"], np.load(samples / "shard.npz")["X"]
    assert X.shape == (*shard.shape[:2], shard.shape[2] + 4) and np.array_equal(X[:, :, :-4], shard)
    w = probes["wp_wait_s"].to_numpy() / 3600
    d = w - (probes["pred_end_without_succ"] - probes["probe_time"]).to_numpy() / 3600
    want = np.c_[w, probes["wp_bound_s"] / 3600, np.maximum(d, 0), np.maximum(-d, 0)]
    assert np.allclose(X[:, 0, -4:], want, atol=1e-4) and np.array_equal(X[:, 0, -4:], X[:, -1, -4:])
    assert (d < 0).any()  # the overlap part is exercised (a signed channel would lose it to the scaler)
    # a waitpred output without its model (an older version's: its marker does not list one) is refused
    # naming the flag, before anything is written
    mk = json.loads((out / "_SUCCESS.json").read_text())
    assert "model.ubj" in json.dumps(mk["outputs"])
    mk["outputs"] = {k: v for k, v in mk["outputs"].items() if k != "model.ubj"} if isinstance(
        mk["outputs"], dict) else [o for o in mk["outputs"] if "model.ubj" not in json.dumps(o)]
    (out / "_SUCCESS.json").write_text(json.dumps(mk))
    (out / "model.ubj").unlink()
    r = subprocess.run(cmd[:-1] + [str(tmp_path / "samples2")], capture_output=True, text=True, timeout=240)
    assert r.returncode == 2 and "--waitpred" in r.stderr and "rerun waitpred" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "samples2").exists()


@pytest.mark.parametrize("flags,needle", [
    (["--months", "2031-01"], "--months: no job"),
    (["--months", "2024-13"], "not of the form YYYY-MM"),
    (["--calibrate-from", "1990-01-01", "--calibrate-to", "1990-02-01"], "no job of"),
    (["--level", "1.5"], "--level"),
    (["--seed", "-1"], "--seed"),
])
def test_waitpred_refuses_bad_input_naming_the_flag(trace_uri, tmp_path, capsys, flags, needle):
    uri, cfg = trace_uri
    months = _months(uri)
    base = {"--trace": uri, "--cluster-config": cfg, "--calibrate-from": f"{months[0]}-01",
            "--calibrate-to": f"{months[1]}-01", "--months": months[1], "--out": str(tmp_path / "o")}
    argv: list[str] = []
    over = dict(zip(flags[::2], flags[1::2]))
    for k, v in {**base, **over}.items():
        argv += [k, v]
    assert wp.main(argv) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
