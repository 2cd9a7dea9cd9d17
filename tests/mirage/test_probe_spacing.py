"""``sample --probe-spacing``: probe times near the predecessor's end, the same online and
offline, carried in the sample outputs' params and in the plan's sample-family key."""

from __future__ import annotations

import json
from datetime import UTC

import numpy as np
import pytest
from hypothesis import given, strategies as st
from test_sim_support import T0, random_trace, write_committed_trace

from mirage_tasks.models.thresholds import calibrate, outcomes
from mirage_tasks.run.runconf import MirageRun
from mirage_tasks.sim import PRESETS, DecisionEpisode, EpisodeSpec, Workload, probe_times, simulate_sample
from mirage_tasks.sim.probes import END_OFFSETS_MIN, PROBE_SPACINGS
from stepkit.cli import main

CFG = PRESETS["ls6"].replace(nodes=16, max_jobs_per_user=3)
SPEC = EpisodeSpec(warmup_days=2, workload_days=5, window=144, step_s=600)
STEPS = {"sample": ("mirage_tasks.steps.sample", ""), "merge": ("mirage_tasks.steps.merge", "")}


def _run(*argv: str) -> int:
    return main("mirage_tasks", STEPS, list(argv))


@given(
    submit_min=st.integers(0, 10**7),
    wait_s=st.integers(0, 10 * 86400),
    run_s=st.integers(0, 48 * 3600),
    spacing=st.sampled_from(PROBE_SPACINGS),
    probes=st.integers(1, 12),
)
def test_probe_times_are_sorted_unique_bounded_and_end_reactive(submit_min, wait_s, run_s, spacing, probes):
    pred_submit = submit_min * 60
    # the ladder also where it is cut at the lower bound (any run time); the reference's spacing on the
    # predecessors the samples hold (they run their whole 48 h limit)
    pred_end = pred_submit + 60 + wait_s + (run_s if spacing == "end" else 48 * 3600)
    ts = probe_times(pred_submit, pred_end, probes, "default", 0.0, spacing)
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert ts[-1] == pred_end == probe_times(pred_submit, pred_end, probes, "reactive", 0.0)[0]
    assert all(pred_submit + 60 <= t <= pred_end for t in ts)
    assert all(t % 60 == 0 for t in ts[:-1])
    if spacing == "end":
        # each probe is the end minus a ladder offset (minute-aligned), or the lower bound where the ladder reaches past it
        want = {max(pred_submit + 60, (pred_end - m * 60) // 60 * 60) for m in END_OFFSETS_MIN if m} - {pred_end}
        assert ts[:-1] == sorted(want) and len(ts) <= len(END_OFFSETS_MIN)
        if pred_end - pred_submit - 60 >= END_OFFSETS_MIN[0] * 60 + 60:  # the whole ladder fits
            assert len(ts) == len(END_OFFSETS_MIN)
            assert [(pred_end - t) // 60 for t in ts] == list(END_OFFSETS_MIN)
    else:
        assert len(ts) <= probes


def test_end_spacing_on_a_48h_predecessor():
    submit, end = 1000 * 60, 1000 * 60 + 5 * 3600 + 48 * 3600 + 17  # waited 5 h; end not minute-aligned
    ts = probe_times(submit, end, 7, "default", 0.0, "end")
    assert [end - t for t in ts] == [m * 60 + 17 for m in END_OFFSETS_MIN[:-1]] + [0]
    # the reference spacing is unchanged: 7 probes 8 h 50 min apart
    assert len(probe_times(submit, end, 7, "default", 0.0)) == 7
    # a predecessor that ends soon after its submission: the ladder is cut at submit + 60 s, no duplicates
    short = probe_times(submit, submit + 45 * 60 + 30, 7, "default", 0.0, "end")
    assert short == [submit + 60, submit + 15 * 60, submit + 35 * 60, submit + 45 * 60 + 30]
    with pytest.raises(ValueError, match="probe spacing"):
        probe_times(submit, end, 7, "default", 0.0, "dense")


@pytest.fixture(scope="module")
def wl() -> Workload:
    return Workload.from_frame(random_trace(11, days=14, nodes=16))


@pytest.mark.parametrize("node", [1, 4])
def test_dense_end_probes_online_equal_offline(wl, node):
    t0 = T0 + 86400 + 3 * 3600
    offline = simulate_sample(wl, CFG, t0, node, SPEC, spacing="end")
    assert len(offline) == len(END_OFFSETS_MIN)
    pred_end = offline[-1].meta["pred_end_without_succ"]
    assert [pr.meta["probe_time"] for pr in offline][-1] == pred_end
    # the dense probes: 30 min, 10 min before the end and the end itself
    for pr in offline[-3:]:
        ep = DecisionEpisode(wl, CFG, t0, node, warmup_days=2, workload_days=5)
        ep.advance_to(pr.meta["probe_time"])
        np.testing.assert_array_equal(ep.history(), pr.history)
        res = ep.submit_successor()
        assert res["succ_start"] == pr.meta["succ_start"] and res["pred_end"] == pr.meta["pred_end"]
        assert res["signed_interruption_h"] == pytest.approx(pr.meta["interruption_s"] / 3600)
    # the shared prefix: the same times give the same labels as the uniform spacing's own probes
    uniform = simulate_sample(wl, CFG, t0, node, SPEC, probes=7)
    assert uniform[-1].meta["interruption_s"] == offline[-1].meta["interruption_s"]


@pytest.fixture(scope="module")
def trace_uri(tmp_path_factory) -> str:
    return write_committed_trace(tmp_path_factory.mktemp("trace"), random_trace(11, days=14, nodes=16))


def test_spacing_is_in_the_params_and_spacings_never_merge(trace_uri, tmp_path):
    common = [
        "--trace",
        trace_uri,
        "--start",
        str(np.datetime64(T0 + 86400, "s")) + "+00:00",
        "--count",
        "3",
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
    uni, end = tmp_path / "uni", tmp_path / "end"
    assert _run("sample", *common, "--probe-spacing", "uniform", "--out", str(uni)) == 0
    assert _run("sample", *common, "--probe-spacing", "end", "--out", str(end)) == 0
    m_uni = json.loads((uni / "_SUCCESS.json").read_text())
    m_end = json.loads((end / "_SUCCESS.json").read_text())
    assert "probe_spacing" not in m_uni["params"]  # the reference's: outputs written before the option stay valid
    assert m_end["params"]["probe_spacing"] == "end" and m_end["summary"]["n_examples"] == 3 * len(END_OFFSETS_MIN)
    stamp = (uni / "_SUCCESS.json").stat().st_mtime_ns
    assert _run("sample", *common, "--out", str(uni), "--probe-spacing", "uniform") == 0  # up to date: skipped
    assert (uni / "_SUCCESS.json").stat().st_mtime_ns == stamp
    # the other spacing into the same folder is not "up to date": it recomputes
    again = tmp_path / "again"
    assert _run("sample", *common, "--probe-spacing", "end", "--out", str(again)) == 0
    assert _run("sample", *common, "--probe-spacing", "uniform", "--out", str(again)) == 0
    assert "probe_spacing" not in json.loads((again / "_SUCCESS.json").read_text())["params"]
    # a merge of the two spacings is refused, nothing written
    assert _run("merge", "--in", str(uni), str(end), "--out", str(tmp_path / "bad")) == 2
    assert not (tmp_path / "bad").exists()
    ds = tmp_path / "ds"
    assert _run("merge", "--in", str(end), "--out", str(ds)) == 0
    man = json.loads((ds / "manifest.json").read_text())
    assert man["params"]["probe_spacing"] == "end"
    # the reactive baseline's mode has no spacing: the flag does not change its output's params
    rx = tmp_path / "rx"
    assert _run("sample", *common, "--baseline", "reactive", "--probe-spacing", "end", "--out", str(rx)) == 0
    assert "probe_spacing" not in json.loads((rx / "_SUCCESS.json").read_text())["params"]
    assert _run("sample", *common, "--probe-spacing", "sparse", "--out", str(tmp_path / "no")) == 2
    assert not (tmp_path / "no").exists()


def test_plan_keys_sample_families_by_spacing():
    from mirage_tasks.run.plan import plan, samples_day, step_parser

    base = dict(
        trace="/data/ls6.log",
        trace_timezone="America/Chicago",
        synth_profile="ls6-a100",
        cluster_config="ls6",
        train_start=None,
        train_count=12,
        val_start=None,
        val_count=3,
        interval_hours=4,
        warmup_days=2,
        workload_days=5,
        probes=7,
        node_sizes=[1, 8],
        shards=1,
        preset="quick",
        device="cpu",
        seed=0,
        train_params={},
        models=["xgboost"],
    )
    from datetime import datetime

    april = datetime(2023, 4, 1, tzinfo=UTC)
    default = step_parser("sample").get_default("probe_spacing")
    fams = {
        s: plan(
            MirageRun.from_params(dict(base, probe_spacing=s)), "/r/p", april, shared="/r/mirage", trace_fp="sha256:aa"
        )
        for s in PROBE_SPACINGS
    }
    absent = plan(MirageRun.from_params(base), "/r/p", april, shared="/r/mirage", trace_fp="sha256:aa")
    assert fams["uniform"]["families"]["1"] != fams["end"]["families"]["1"]
    assert fams["uniform"]["families"]["8"] != fams["end"]["families"]["8"]
    assert absent["families"] == fams[default]["families"]  # no param: the step's default, keyed as such
    for s, p in fams.items():
        for a in p["sample"]:
            assert a[a.index("--probe-spacing") + 1] == s
            assert step_parser("sample").parse_args(a[1:]).probe_spacing == s
    assert absent["sample"] == fams[default]["sample"]  # no param: the run configuration's default, the step's
    shared_trace = {"identity": {"kind": "ingest", "content": "sha256:aa"}, "trace": "/r/mirage/traces/t"}
    d = {
        s: samples_day(MirageRun.from_params(dict(base, probe_spacing=s)), "/r/mirage", shared_trace, "2023-01-10")
        for s in PROBE_SPACINGS
    }
    assert d["uniform"]["partitions"]["1"] != d["end"]["partitions"]["1"]
    assert d["end"]["sample"][0][d["end"]["sample"][0].index("--probe-spacing") + 1] == "end"


def test_calibration_replays_samples_with_uneven_probe_counts():
    """Short predecessors get fewer end-spaced probes (duplicates removed): the replay groups by sample."""
    sample = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    y = np.array([-8.0, -1.0, 3.0, -2.0, 1.0, -4.0, -0.5, 0.2, 5.0])
    score = np.array([-9.0, -0.4, 3.0, -0.3, 1.0, -5.0, -0.6, 0.1, 5.0])
    np.testing.assert_array_equal(outcomes(score, y, sample, -0.5), [-1.0, -2.0, 0.2])
    np.testing.assert_array_equal(outcomes(score, y, sample, np.inf), [3.0, 1.0, 5.0])
    cal = calibrate(score, y, sample, node=1, waste_weight=0.1, default=-0.5)
    assert cal["n_samples"] == 3 and cal["chosen"]["objective"] <= cal["reactive"]["objective"]
