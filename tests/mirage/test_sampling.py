"""Episodes, probes, decision-time features and the sample/merge steps."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from step_cli import DAY, run_step
from test_sim_support import T0, random_trace, write_committed_trace

from mirage_tasks.data.times import iso
from mirage_tasks.sim import (
    PRESETS,
    DecisionEpisode,
    EpisodeSpec,
    Workload,
    build_episode,
    features,
    probe_times,
    simulate_sample,
)
from stepkit import MARKER
from stepkit.cli import main

CFG = PRESETS["ls6"].replace(nodes=16, max_jobs_per_user=3)
SPEC = EpisodeSpec(warmup_days=2, workload_days=5, window=144, step_s=600)


@pytest.fixture(scope="module")
def wl() -> Workload:
    return Workload.from_frame(random_trace(11, days=14, nodes=16))


@pytest.fixture(scope="module")
def trace_uri(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("trace")
    return write_committed_trace(d, random_trace(11, days=14, nodes=16))


def test_probe_times_follow_the_reference_rule():
    ts = probe_times(1000 * 60, 1000 * 60 + 48 * 3600 + 17, 7, "default", 0)
    assert len(ts) == 7 and ts[0] == 1001 * 60 and ts[-1] == 1000 * 60 + 48 * 3600 + 17
    assert all(t % 60 == 0 for t in ts[:-1]) and ts == sorted(ts)
    assert probe_times(0, 1000 * 60, 7, "reactive", 5) == [1000 * 60]
    assert probe_times(0, 1000 * 60, 7, "avg", 600.0 + 59) == [990 * 60]
    assert probe_times(0, 1000 * 60, 7, "avg", 10**7) == [60]  # never before pred submit + 1 min


@pytest.mark.parametrize("node", [1, 4])
def test_online_submission_equals_the_offline_forked_probe(wl, node):
    t0 = T0 + 86400 + 3 * 3600
    offline = simulate_sample(wl, CFG, t0, node, SPEC, probes=7)
    assert len(offline) == 7
    for pr in offline:
        ep = DecisionEpisode(wl, CFG, t0, node, warmup_days=2, workload_days=5)
        assert ep.now == pr.meta["pred_submit"]
        ep.advance_to(pr.meta["probe_time"])
        hist = ep.history()
        assert ep.history_full
        np.testing.assert_array_equal(hist, pr.history)
        res = ep.submit_successor()
        assert res["succ_start"] == pr.meta["succ_start"]
        assert res["pred_start"] == pr.meta["pred_start"] and res["pred_end"] == pr.meta["pred_end"]
        assert res["signed_interruption_h"] == pytest.approx(pr.meta["interruption_s"] / 3600)
        assert res["backfilled"] == pr.meta["backfilled"]
        assert res["queue_len"] == pr.meta["queue_len"] and res["avg_wait_s"] == pr.meta["avg_wait_s"]


def test_episode_fork_and_step_api(wl):
    t0 = T0 + 2 * 86400
    ep = DecisionEpisode(wl, CFG, t0, 2)
    ep.advance(3600)
    twin = ep.fork()
    a = ep.submit_successor()
    twin.advance(0)
    b = twin.submit_successor()
    assert a == b
    with pytest.raises(RuntimeError):
        ep.advance(60)
    late = DecisionEpisode(wl, CFG, t0, 2)
    while not late.pred_ended:
        late.advance(600)
    r = late.result() if late.submitted else late.submit_successor()
    assert r["succ_submit"] >= r["pred_end"] and r["signed_interruption_h"] >= 0


def test_features_are_taken_at_the_decision_not_after(wl):
    t0 = T0 + 86400
    probes = simulate_sample(wl, CFG, t0, 4, SPEC, probes=7)
    pr = probes[3]
    t = pr.meta["probe_time"]
    # the last row is the snapshot at the last 600 s mark at or before t
    sim, pred = build_episode(wl, CFG, t0, 4, SPEC)
    sim.run_until(t // 600 * 600)
    snap = features.snapshot(sim)
    np.testing.assert_allclose(pr.history[-1, :34], snap[:34].astype(np.float32))
    np.testing.assert_allclose(pr.history[-1, 42:], snap[42:].astype(np.float32))
    # pred tuple: 48 h limit, 4 nodes, the wait it had, its run time so far
    ps = pr.meta["pred_start"]
    if ps <= t:
        want = [2880, 4, ps - pr.meta["pred_submit"], min(t - ps, 48 * 3600)]
    else:
        want = [2880, 4, t - pr.meta["pred_submit"], 0]
    np.testing.assert_allclose(pr.history[:, 34:38], np.tile(want, (144, 1)))
    np.testing.assert_allclose(pr.history[:, 38:42], np.tile([2880, 4, 0, 0], (144, 1)))
    # nothing after t leaks in: drop every job submitted after t and the history is unchanged
    keep = wl.submit <= t
    cut = Workload(**{k: (v[keep] if isinstance(v, np.ndarray) else v) for k, v in wl.__dict__.items()})
    again = simulate_sample(cut, CFG, t0, 4, SPEC, probes=7)[3]
    assert again.meta["probe_time"] == t
    np.testing.assert_array_equal(again.history, pr.history)
    assert len(features.FEATURE_NAMES) == pr.history.shape[1] == 44


def _run(*argv) -> int:
    return main(
        "mirage_tasks",
        {"sample": ("mirage_tasks.steps.sample", ""), "merge": ("mirage_tasks.steps.merge", "")},
        list(argv),
    )


def test_sample_and_merge_steps(trace_uri, tmp_path):
    common = [
        "--trace",
        trace_uri,
        "--start",
        pd.Timestamp(T0 + 86400, unit="s", tz="UTC").isoformat(),
        "--count",
        "5",
        "--interval-hours",
        "4",
        "--node",
        "2",
        "--nodes",
        "16",
        "--cluster-config",
        "ls6",
        "--max-jobs-per-user",
        "3",
    ]
    outs = []
    for i in range(2):
        out = str(tmp_path / f"s{i}")
        assert _run("sample", *common, "--shard", f"{i}/2", "--out", out, "--workers", str(1 + i)) == 0
        outs.append(out)
    assert _run("sample", *common, "--shard", "1/2", "--out", outs[1]) == 0  # skipped: up to date
    ds = str(tmp_path / "ds")
    assert _run("merge", "--in", outs[1], outs[0], "--out", ds) == 0
    z = np.load(tmp_path / "ds" / "dataset.npz")
    man = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    n = 5 * 7
    assert z["X"].shape == (n, 144, 44) and z["X"].dtype == np.float32 and z["y"].dtype == np.float32
    assert list(z["sample"]) == [k for k in range(5) for _ in range(7)]
    assert (np.diff(z["probe_time"].reshape(5, 7), axis=1) > 0).all()
    assert (z["sample_start"] == T0 + 86400 + z["sample"] * 4 * 3600).all() and (z["node"] == 2).all()
    for key in (
        "feature_names",
        "window",
        "step_s",
        "n_examples",
        "n_samples",
        "node",
        "shapes",
        "sample_start_min",
        "sample_start_max",
        "data_end",
        "trace_fingerprint",
        "params",
        "shards",
    ):
        assert key in man
    assert man["n_examples"] == n and man["n_samples"] == 5 and man["window"] == 144 and man["step_s"] == 600
    assert man["feature_names"] == features.FEATURE_NAMES and len(man["shards"]) == 2
    assert pd.Timestamp(man["data_end"]) == pd.Timestamp(T0 + 86400 + 4 * 4 * 3600 + 5 * 86400, unit="s", tz="UTC")
    probes = pd.read_parquet(tmp_path / "ds" / "probes.parquet")
    assert len(probes) == n
    np.testing.assert_allclose(z["y"], probes["interruption_s"] / 3600, rtol=1e-6)
    for col in (
        "sample_start",
        "probe_time",
        "pred_start",
        "pred_end",
        "succ_start",
        "backfilled",
        "avg_wait_s",
        "queue_len",
    ):
        assert col in probes
    assert (probes["succ_start"] - probes["pred_end"] == probes["interruption_s"]).all()
    # the reactive baseline equals the last default probe of each sample
    rx = str(tmp_path / "rx")
    assert _run("sample", *common, "--baseline", "reactive", "--out", rx) == 0
    zr = np.load(tmp_path / "rx" / "shard.npz")
    np.testing.assert_array_equal(zr["y"], z["y"].reshape(5, 7)[:, -1])
    # shards of different runs do not merge
    assert _run("merge", "--in", outs[0], rx, "--out", str(tmp_path / "bad")) == 2
    assert not (tmp_path / "bad" / MARKER).exists()


def test_sample_rejects_bad_arguments(trace_uri, tmp_path):
    base = ["sample", "--trace", trace_uri, "--start", "2023-11-15", "--count", "2", "--out", str(tmp_path / "x")]
    assert _run(*base, "--node", "1") == 2  # no cluster size
    assert _run(*base, "--node", "32", "--nodes", "16") == 2  # probe larger than the cluster
    assert _run(*base, "--node", "1", "--nodes", "16", "--shard", "2/2") == 2


def test_ls6_samples_online_equals_offline(ls6_log, tmp_path):
    """On the real ls6 trace with the shipped preset: probes agree online and offline."""
    ingest = main(
        "mirage_tasks",
        {"ingest": ("mirage_tasks.steps.ingest", "")},
        ["ingest", "--trace", str(ls6_log), "--out", str(tmp_path / "ls6"), "--timezone", "America/Chicago"],
    )
    assert ingest == 0
    from mirage_tasks.data.schema import read_trace

    df, _ = read_trace(str(tmp_path / "ls6"))
    wl = Workload.from_frame(df)
    # 2022-12-20T20:00, node 8: a successor submitted while its predecessor waits moves the
    # predecessor's start (its reservation keeps a backfilled job off the nodes); the label
    # must come from the probe's own simulation, exactly as online.
    for day, idx in (("2023-02-10", (1, 6)), ("2022-12-20T20:00", (0, 3))):
        t0 = int(pd.Timestamp(day, tz="UTC").timestamp())
        offline = simulate_sample(wl, PRESETS["ls6"], t0, 8, SPEC, probes=7)
        assert all(p.meta["history_full"] for p in offline)
        for pr in (offline[i] for i in idx):
            ep = DecisionEpisode(wl, PRESETS["ls6"], t0, 8)
            ep.advance_to(pr.meta["probe_time"])
            np.testing.assert_array_equal(ep.history(), pr.history)
            res = ep.submit_successor()
            assert (res["pred_start"], res["succ_start"]) == (pr.meta["pred_start"], pr.meta["succ_start"])
            assert res["signed_interruption_h"] * 3600 == pytest.approx(pr.meta["interruption_s"])


def test_reference_preset_reproduces_the_reference_ls6_baselines(ls6_log, tmp_path):
    """The 'reference' preset (88 nodes, empty start, minute ticks) reproduces the reactive
    baseline measured on the unmodified SC'23 code over March 2023 (notes, section 10): mean
    0.45 h / 142 low-load samples of 156 for 1 node, 1.02 h / 127 for 8 nodes."""
    rc = main(
        "mirage_tasks",
        {"ingest": ("mirage_tasks.steps.ingest", "")},
        ["ingest", "--trace", str(ls6_log), "--out", str(tmp_path / "ls6"), "--timezone", "America/Chicago"],
    )
    assert rc == 0
    from mirage_tasks.data.schema import read_trace

    wl = Workload.from_frame(read_trace(str(tmp_path / "ls6"))[0])
    t0 = int(pd.Timestamp("2023-03-01", tz="UTC").timestamp())
    for node, want_mean, want_low in ((1, 0.45, 142), (8, 1.02, 127)):
        y = (
            np.array(
                [
                    simulate_sample(
                        wl, PRESETS["reference"], t0 + k * 4 * 3600, node, SPEC, 1, "reactive", with_features=False
                    )[0].meta["interruption_s"]
                    for k in range(156)
                ]
            )
            / 3600
        )
        assert abs(y.mean() - want_mean) < 0.15 and abs(int((y <= 2).sum()) - want_low) <= 5
        assert y.min() >= 0  # reactive: never an overlap


# ---------------------------------------------------------------------- bad inputs: exit 2 naming the flag, nothing written


def test_jobs_larger_than_the_cluster_are_said_when_sampled(tmp_path, capsys):
    """The simulator leaves out jobs larger than the cluster: sample says so, with the count and
    the largest size, instead of sampling without them silently."""
    tr = write_committed_trace(tmp_path / "t", random_trace(4, days=8, nodes=16))
    rc, err = run_step(
        capsys,
        "sample",
        "--trace",
        tr,
        "--start",
        iso(T0 + DAY),
        "--count",
        "1",
        "--probes",
        "2",
        "--window",
        "12",
        "--node",
        "1",
        "--nodes",
        "2",
        "--workers",
        "1",
        "--out",
        tmp_path / "s",
    )
    assert rc == 0, err[-2000:]
    assert "more nodes than the 2-node cluster" in err and "leaves them out of every sample" in err, err[-2000:]
