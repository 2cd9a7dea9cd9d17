"""The wait predictor's command line on a small simulated log: it scores and writes its
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
    df = pd.DataFrame(
        {
            "job_id": np.arange(len(submit)).astype(str),
            "submit": ts(submit),
            "start": ts(start),
            "end": ts(start + dur),
            "time_limit_s": limit,
            "nodes": jn.astype("int32"),
            "procs": jn.astype("int32"),
            "partition": "p",
            "user": user.astype(str),
            "status": "COMPLETED",
            "priority": pd.array([pd.NA] * len(submit), dtype="Int64"),
        }
    )
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
    rc = wp.main(
        [
            "--trace",
            uri,
            "--cluster-config",
            cfg,
            "--calibrate-from",
            a,
            "--calibrate-to",
            f"{months[0]}-01",
            "--months",
            *months,
            "--out",
            str(out),
        ]
    )
    assert rc == 0, capsys.readouterr().err
    doc = json.loads((out / "waitpred.json").read_text())
    assert doc["pick"] in wp.CANDIDATES and set(doc["out_of_sample"]) == set(wp.PREDICTORS)
    assert "coverage" in doc["out_of_sample"]["guarded"]["pooled"]
    pred = pd.read_parquet(out / "predictions.parquet")
    assert {"guarded", "guarded_bound", "plan", "plan_bound"} <= set(pred.columns)
    md = (out / "waitpred.md").read_text()
    assert "Guard pick" in md
    # the QBETS reference bound beside the predictor's, in the same per-month and per-class tables
    assert "qbets_bound" in pred.columns and pred["qbets_bound"].notna().all()
    g, q = doc["out_of_sample"]["guarded"], doc["qbets"]
    for key in ("months", "size_classes", "limit_classes"):
        assert list(q[key]) == list(g[key]) and all(q[key][k]["n"] == g[key][k]["n"] for k in g[key])
    assert 0.5 <= q["pooled"]["coverage"] <= 1.0 and q["pooled"]["bound_median_h"] > 0
    assert list(doc["criteria"]["qbets_coverage_months"]) == months
    assert md.count("QBETS coverage") == 4  # the month table and the three bound tables
    assert (out / "model.ubj").read_bytes()[:1] == b"{"  # xgboost's UBJ, not a pickle
    # one offset per job-size class: every scored class's start named, its own, its merged
    # neighbours' (a run of classes in size order holding it) or the pooled one
    bd = doc["bound"]
    assert bd["grouping"] == "job-size class" and set(bd["groups"]) == set(wp.CANDIDATES)
    for k, grp in bd["groups"].items():
        assert set(g["size_classes"]) <= set(grp)
        order = sorted(grp, key=wp.size_key)
        for c, v in grp.items():
            own = v["n_known"] >= bd["group_min_known"] and not v["quantile_censored"]
            if own:
                assert v["source"] == "calibrated" and "merged" not in v
            elif "merged" in v:
                run = v["merged"]
                assert c in run and run == order[order.index(run[0]) : order.index(run[0]) + len(run)]
                assert v["source"] == f"merged ({', '.join(run)})"
                assert sum(grp[x]["n_known"] for x in run) >= bd["group_min_known"]
            else:
                assert v["source"] == "pooled fallback" and v["theta0"] == doc["theta0"][k]
    cs = doc["criteria"]["coverage_size_classes"]
    assert cs == {c: g["size_classes"][c]["coverage"] for c in g["size_classes"]}
    lo, hi = doc["criteria"]["coverage_target"]
    assert doc["criteria"]["coverage_size_classes_outside_target"] == [c for c, v in cs.items() if not lo <= v <= hi]
    assert "One offset per job-size class" in md
    # per scored month, whether the pick kept the within-1-h promise, and how the guard checked it
    pr, oos = doc["promise"]["months"], doc["out_of_sample"]
    assert list(pr) == months and doc["guard"]["check"] in md and "Within-1-h promise per scored month" in md
    for mo, r in pr.items():
        d = oos["guarded"]["months"][mo]["within_1h"] - oos["zero"]["months"][mo]["within_1h"]
        assert r["points_vs_zero"] == pytest.approx(100 * d) and r["kept"] == (d >= -doc["params"]["margin"] - 1e-12)
        assert f"| {mo} | {r['n']} |" in md and f"| {r['points_vs_zero']:+.1f} | {'yes' if r['kept'] else 'no'} |" in md
    assert doc["guard"]["candidates"]["zero"]["eligible"] and doc["guard"]["candidates"][doc["pick"]]["eligible"]
    assert doc["guard"]["single_tail_pick"] in wp.CANDIDATES

    # the sample step asks that predictor at every decision time (protocol v2)
    import subprocess
    import sys

    start = (pd.Timestamp(f"{months[0]}-01", tz="UTC") + pd.Timedelta(days=1)).isoformat()
    samples = tmp_path / "samples"
    cmd = [
        sys.executable,
        "-m",
        "mirage_tasks",
        "sample",
        "--trace",
        uri + "/trace.parquet",
        "--cluster-config",
        cfg,
        "--start",
        start,
        "--count",
        "3",
        "--interval-hours",
        "12",
        "--probe-spacing",
        "end",
        "--node",
        "2",
        "--workload-days",
        "4",
        "--warmup-days",
        "1",
        "--waitpred",
        str(out),
        "--out",
        str(samples),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    probes = pd.read_parquet(samples / "probes.parquet")
    assert len(probes) == 27 and probes[["wp_wait_s", "wp_bound_s", "wp_plan_request_s"]].notna().all().all()
    assert (probes["wp_bound_s"] >= probes["wp_wait_s"] - 1e-6).all() and (probes["wp_wait_s"] >= 0).all()
    marker = json.loads((samples / "_SUCCESS.json").read_text())
    assert "waitpred" in json.dumps(marker)
    # merge --waitpred-features appends the answer at each probe to its history (protocol v2's xgboost-wp)
    ds = tmp_path / "ds-wp"
    r = subprocess.run(
        [sys.executable, "-m", "mirage_tasks", "merge", "--in", str(samples), "--out", str(ds), "--waitpred-features"],
        capture_output=True,
        text=True,
        timeout=240,
    )
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
    mk["outputs"] = (
        {k: v for k, v in mk["outputs"].items() if k != "model.ubj"}
        if isinstance(mk["outputs"], dict)
        else [o for o in mk["outputs"] if "model.ubj" not in json.dumps(o)]
    )
    (out / "_SUCCESS.json").write_text(json.dumps(mk))
    (out / "model.ubj").unlink()
    r = subprocess.run(cmd[:-1] + [str(tmp_path / "samples2")], capture_output=True, text=True, timeout=240)
    assert r.returncode == 2 and "--waitpred" in r.stderr and "rerun waitpred" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "samples2").exists()


@pytest.mark.parametrize(
    "flags,needle",
    [
        (["--months", "2031-01"], "--months: no job"),
        (["--months", "2024-13"], "not of the form YYYY-MM"),
        (["--calibrate-from", "1990-01-01", "--calibrate-to", "1990-02-01"], "no job of"),
        (["--level", "1.5"], "--level"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_waitpred_refuses_bad_input_naming_the_flag(trace_uri, tmp_path, capsys, flags, needle):
    uri, cfg = trace_uri
    months = _months(uri)
    base = {
        "--trace": uri,
        "--cluster-config": cfg,
        "--calibrate-from": f"{months[0]}-01",
        "--calibrate-to": f"{months[1]}-01",
        "--months": months[1],
        "--out": str(tmp_path / "o"),
    }
    argv: list[str] = []
    over = dict(zip(flags[::2], flags[1::2]))
    for k, v in {**base, **over}.items():
        argv += [k, v]
    assert wp.main(argv) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_the_online_decider_runs_protocol_v2s_rules_and_xgboost_wp(trace_uri, tmp_path, capsys):
    """``validate`` with the wait predictor: wait-pred and guarantee-10 submit at the first
    decision where their test holds (checked against the decisions it recorded), avg-cal takes the
    probe replay's calibrated offset (never early: at the end; far below: at the predecessor's
    submission), and a model trained on ``merge --waitpred-features`` decides with the channels."""
    import subprocess
    import sys

    from mirage_tasks import __version__
    from stepkit import Step

    uri, cfg = trace_uri
    first = pd.read_parquet(uri + "/trace.parquet")["submit"].min()
    months = _months(uri)
    out = tmp_path / "wp"
    assert (
        wp.main(
            [
                "--trace",
                uri,
                "--cluster-config",
                cfg,
                "--calibrate-from",
                first.strftime("%Y-%m-%d"),
                "--calibrate-to",
                f"{months[1]}-01",
                "--months",
                months[1],
                "--out",
                str(out),
            ]
        )
        == 0
    ), capsys.readouterr().err
    m = [sys.executable, "-m", "mirage_tasks"]
    base = [
        "--trace",
        uri + "/trace.parquet",
        "--cluster-config",
        cfg,
        "--interval-hours",
        "12",
        "--node",
        "2",
        "--workload-days",
        "4",
        "--warmup-days",
        "1",
    ]
    t_train = (pd.Timestamp(f"{months[1]}-01", tz="UTC") + pd.Timedelta(days=1)).isoformat()
    t_val = (pd.Timestamp(f"{months[1]}-01", tz="UTC") + pd.Timedelta(days=12)).isoformat()

    def run(*argv, rc=0):
        r = subprocess.run([*m, *argv], capture_output=True, text=True, timeout=600)
        assert r.returncode == rc, r.stderr[-3000:]
        return r

    run(
        "sample",
        *base,
        "--start",
        t_train,
        "--count",
        "12",
        "--probe-spacing",
        "end",
        "--waitpred",
        str(out),
        "--out",
        str(tmp_path / "s"),
    )
    run("merge", "--in", str(tmp_path / "s"), "--out", str(tmp_path / "ds"), "--waitpred-features")
    run(
        "train",
        "--model",
        "xgboost",
        "--dataset",
        str(tmp_path / "ds"),
        "--out",
        str(tmp_path / "xgboost-wp"),
        "--preset",
        "quick",
        "--param",
        "n_estimators=20",
        "--purge-days",
        "0",
        "--threads",
        "1",
    )
    val = [*base, "--start", t_val, "--count", "3", "--threads", "1"]

    def validate(name, *extra, rc=0):
        r = run(
            "validate", *val, "--model", name, *extra, "--out", str(tmp_path / f"v-{len(extra)}-{name[-6:]}"), rc=rc
        )
        if rc:
            return r.stderr
        d = tmp_path / f"v-{len(extra)}-{name[-6:]}"
        return pd.read_parquet(d / "validation.parquet"), pd.read_parquet(d / "decisions.parquet")

    for rule in ("wait-pred", "guarantee-10"):
        rows, dec = validate(rule, "--waitpred", str(out))
        assert (rows["n_decisions"] > 0).all()
        for _, r in rows.iterrows():
            d = dec[dec["sample"] == r["sample"]].sort_values("time")
            left = (r["pred_end"] - d["time"].to_numpy()) / 3600  # the end pre-simulated = the end it had
            slack = 1 / 6 if rule == "guarantee-10" else 0.0
            hit = d["output"].to_numpy() >= left - slack - 1e-9
            assert list(d["submit"]) == list(hit[: len(d)]) and not hit[:-1].any()
            assert r["forced"] or (hit[-1] and r["decision_time"] == d["time"].iloc[-1])
    assert "needs --waitpred" in validate("wait-pred", rc=2)
    # the model on the predictor's channels: asked with them at every decision, refused without the predictor
    rows, dec = validate(str(tmp_path / "xgboost-wp"), "--waitpred", str(out))
    assert (rows["n_decisions"] > 0).all() and len(dec) == rows["n_decisions"].sum()
    assert "--waitpred" in validate(str(tmp_path / "xgboost-wp"), rc=2)
    # avg-cal with a probe replay's calibration: never early -> at the end; far below -> at the submission
    for thr, col in ((None, "pred_end"), (-1000.0, "pred_submit")):
        ev = tmp_path / f"ev{thr}"
        st = Step("evaluation", str(ev), __version__, {"node": 2, "t": thr})
        st.write_json("evaluation.json", {"params": {"node": 2}, "calibration": {"avg-cal": {"threshold": thr}}})
        st.commit()
        rows, _ = validate("avg-cal", "--calibration", str(ev))
        assert (rows["decision_time"] == rows[col]).all(), (thr, rows[["decision_time", col]])
    bad = tmp_path / "ev-node8"
    st = Step("evaluation", str(bad), __version__, {"node": 8})
    st.write_json("evaluation.json", {"params": {"node": 8}, "calibration": {"avg-cal": {"threshold": 0.0}}})
    st.commit()
    assert "--calibration" in validate("avg-cal", "--calibration", str(bad), rc=2)
    assert "needs --calibration" in validate("wait-pred-cal", "--waitpred", str(out), rc=2)
    # guarantee-cal: asked only at the end-spaced probe times, submitting where the bound minus the time left at
    # the next probe (the end after the last) reaches the replay's margin
    from mirage_tasks.sim.probes import END_OFFSETS_MIN

    offsets_h = sorted({m / 60 for m in END_OFFSETS_MIN if m > 0}, reverse=True)
    for thr in (0.0, 2.0):
        ev = tmp_path / f"evg{thr}"
        st = Step("evaluation", str(ev), __version__, {"node": 2, "t": thr})
        st.write_json("evaluation.json", {"params": {"node": 2}, "calibration": {"guarantee-cal": {"threshold": thr}}})
        st.commit()
        rows, dec = validate("guarantee-cal", "--waitpred", str(out), "--calibration", str(ev))
        assert (rows["n_decisions"] <= len(offsets_h)).all() and (rows["n_decisions"] > 0).all()
        for _, r in rows.iterrows():
            d = dec[dec["sample"] == r["sample"]].sort_values("time")
            left = (r["pred_end"] - d["time"].to_numpy()) / 3600
            # each ask at (a minute at most past) an offset, at most one per offset
            near = [min(offsets_h, key=lambda o: abs(o - x)) for x in left]
            assert all(abs(o - x) <= 1 / 60 + 1e-9 for o, x in zip(near, left)) and len(set(near)) == len(near)
            nxt = [max([o for o in offsets_h if o < x - 1 / 60], default=0.0) for x in left]
            margin = d["output"].to_numpy() - np.array(nxt) - thr  # the next probe's time left: its offset +- 1 min
            sure = np.abs(margin) > 1 / 60
            assert list(d["submit"][sure]) == list(margin[sure] >= 0) and not d["submit"].iloc[:-1].any()
            assert r["forced"] or r["decision_time"] == d["time"].iloc[-1]


def test_waitpred_refuses_a_calibration_period_whose_held_back_jobs_were_still_waiting(tmp_path, capsys):
    # an outage over the last third of the calibration period: every job submitted then started only
    # after its end, so the guard's held-back tail has no wait known at the cut to score candidates on
    rng = np.random.default_rng(0)
    t0, cut = pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-02-01", tz="UTC")
    submit = t0 + pd.to_timedelta(np.sort(rng.integers(0, 50 * 86400, 600)), unit="s")
    out_from = pd.Timestamp("2024-01-20", tz="UTC")
    start = pd.Series(submit).where((submit < out_from) | (submit >= cut), cut + pd.Timedelta(hours=1))
    start = pd.DatetimeIndex(np.maximum(start.to_numpy(), submit.to_numpy()))
    ts = lambda a: pd.DatetimeIndex(a).astype("datetime64[s, UTC]")  # noqa: E731
    n = len(submit)
    df = pd.DataFrame(
        {
            "job_id": np.arange(n).astype(str),
            "submit": ts(submit),
            "start": ts(start),
            "end": ts(start + pd.Timedelta(minutes=30)),
            "time_limit_s": 3600,
            "nodes": 1,
            "procs": 1,
            "partition": "p",
            "user": "u",
            "status": "COMPLETED",
            "priority": pd.array([pd.NA] * n, dtype="Int64"),
        }
    )
    df["nodes"] = df["nodes"].astype("int32")
    df["procs"] = df["procs"].astype("int32")
    uri = str(tmp_path / "trace")
    write_trace(uri + "/trace.parquet", df, TraceMeta(source="self", format="test", timezone="UTC"))
    (tmp_path / "cfg.json").write_text(json.dumps(SimConfig(nodes=16, weight_size=0.0).to_dict()))
    rc = wp.main(
        [
            "--trace",
            uri,
            "--cluster-config",
            str(tmp_path / "cfg.json"),
            "--calibrate-from",
            "2024-01-01",
            "--calibrate-to",
            "2024-02-01",
            "--months",
            "2024-02",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "--calibrate-to" in err and "still waiting at its end" in err, err
    assert not (tmp_path / "o" / "_SUCCESS.json").exists()  # nothing committed


def test_waitpred_reports_the_filled_limits_and_the_jobs_that_never_ran(trace_uri, tmp_path, capsys):
    uri, cfg = trace_uri
    df = pd.read_parquet(uri + "/trace.parquet")
    gone = df.index[5::40]  # cancelled while queued: no start, left at their real start
    df.loc[gone, "end"] = df.loc[gone, "start"]
    df.loc[gone, "start"] = pd.NaT
    df.loc[gone, "status"] = "CANCELLED"
    df.loc[df.index[7::50], "time_limit_s"] = pd.NA  # no requested time
    meta = TraceMeta(source="self", format="test", timezone="UTC", hygiene={"never_ran": {"jobs": len(gone)}})
    trace = str(tmp_path / "trace")
    write_trace(trace + "/trace.parquet", df, meta)
    months = _months(trace)
    out = tmp_path / "out"
    first = df["submit"].min().strftime("%Y-%m-%d")
    argv = ["--trace", trace, "--cluster-config", cfg, "--calibrate-from", first]
    argv += ["--calibrate-to", f"{months[1]}-01", "--months", *months[1:], "--out", str(out)]
    assert wp.main(argv) == 0, capsys.readouterr().err
    doc = json.loads((out / "waitpred.json").read_text())
    h = doc["hygiene"]
    assert h["never_ran"] == len(gone) and h["limit_fill_at_ingest"] is None  # not ingested: filled on read
    fill = h["limit_fill_on_read"]
    assert fill["jobs_without_limit"] == len(df.index[7::50]) == fill["user_history"] + fill["log_default"]
    scored = set(pd.read_parquet(out / "predictions.parquet")["job_id"])
    assert not scored & set(df.loc[gone, "job_id"])  # never scored
    md = (out / "waitpred.md").read_text()
    assert f"{len(df.index[7::50])} jobs requested no time limit" in md and f"{len(gone)} jobs never ran" in md
