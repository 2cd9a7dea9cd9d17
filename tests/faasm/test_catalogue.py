import json
import os

import pytest

from faasm_tasks.catalogue import expand, get_experiment, load_catalogue, resolve, slug, validate
from stepkit import StepError


def test_packaged_experiments_validate_and_carry_seed_parameters():
    cat = load_catalogue()
    assert set(cat) >= {"sgd_reuters_svm", "matrix_multiplication", "tf_inference_latency", "tf_inference_throughput"}
    sgd = resolve(cat["sgd_reuters_svm"], "wasm", "knative")
    assert {p["sync_interval"] for p in sgd.points} == {60000}
    assert [p["n_workers"] for p in sgd.points] == list(range(5, 55, 5))
    mm = resolve(cat["matrix_multiplication"], "native", "knative")
    assert [p["matrix_size"] for p in mm.points] == [100, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]
    assert {p["splits"] for p in mm.points} == {2} and len({p["n_workers"] for p in mm.points}) == 1
    lat = resolve(cat["tf_inference_latency"], "native", "knative")
    assert lat.driver.threads == 1 and lat.driver.connections == 1
    assert lat.driver.warmup_s == 10 and lat.driver.kind == "load"  # every default applied once
    assert [(p["cold_start_interval"], p["duration_s"]) for p in lat.points] == [(5, 480), (50, 300), (500, 180)]
    assert {p["max_delay_ms"] for p in lat.points} == {5} and {p["cold_start_delay_ms"] for p in lat.points} == {800}
    latw = resolve(cat["tf_inference_latency"], "wasm", "knative")
    assert [(p["cold_start_interval"], p["duration_s"]) for p in latw.points] == [(500, 200)]
    tpt = resolve(cat["tf_inference_throughput"], "native", "knative")
    assert tpt.driver.connections == 100 and tpt.driver.threads == (os.cpu_count() or 1)  # "auto": this host
    assert sorted({p["cold_start_interval"] for p in tpt.points}) == [5, 10, 20, 40, 80]
    # the manual's sweep (37d81e8a9): (30000, 180) .. (2000, 100); the longer one is a variant
    manual = [(30000, 180), (20000, 160), (10000, 140), (5000, 120), (3000, 100), (2000, 100)]
    assert len(tpt.points) == 5 * 6 and {"max_delay_ms", "duration_s"} <= set(tpt.points[0])
    assert [(p["max_delay_ms"], p["duration_s"]) for p in tpt.points[:6]] == manual
    tptw = resolve(cat["tf_inference_throughput"], "wasm", "knative")
    assert [(p["cold_start_interval"], p["max_delay_ms"], p["duration_s"]) for p in tptw.points] == [
        (500, d, s) for d, s in manual
    ]
    ext = resolve(cat["tf_inference_throughput"], "native", "knative", variant="extended")
    assert len(ext.points) == 5 * 7 and ext.points[6]["max_delay_ms"] == 1000
    extw = resolve(cat["tf_inference_throughput"], "wasm", "knative", variant="extended")
    assert extw.points[-1]["max_delay_ms"] == 25 and len(extw.points) == 14
    with pytest.raises(StepError, match="--sweep-variant 'nope'.*default, extended"):
        resolve(cat["tf_inference_throughput"], "wasm", "knative", variant="nope")
    assert tpt.deployment["native_services"][0]["replicas"] == 30


def test_replicas_follow_n_workers_per_point():
    """The manual redeploys per N_WORKERS value: N wasm workers / N native containers."""
    from faasm_tasks.catalogue import replicas_for

    cat = load_catalogue()
    for system in ("wasm", "native"):
        sgd = resolve(cat["sgd_reuters_svm"], system, "knative")
        deps = [replicas_for(sgd, p) for p in sgd.points]
        if system == "wasm":
            assert [d["worker_replicas"] for d in deps] == list(range(5, 55, 5))
        else:
            assert [d["native_services"][0]["replicas"] for d in deps] == list(range(5, 55, 5))
            assert {d["worker_replicas"] for d in deps} == {1}
        mm = resolve(cat["matrix_multiplication"], system, "knative")
        assert {str(replicas_for(mm, p)) for p in mm.points} == {str(replicas_for(mm, mm.points[0]))}
    tf = resolve(cat["tf_inference_throughput"], "wasm", "knative")
    assert replicas_for(tf, tf.points[0]) == tf.deployment  # no replicas_from: the fixed deployment
    local = resolve(cat["sgd_reuters_svm"], "wasm", "local")
    assert replicas_for(local, local.points[0]) == local.deployment


def test_cold_start_delay_is_a_parameter():
    exp = get_experiment("tf_inference_latency")
    plan = resolve(exp, "native", "knative", {"cold_start_delay_ms": 1000})
    assert {p["cold_start_delay_ms"] for p in plan.points} == {1000}


def test_local_overrides_shrink_the_sweep():
    plan = resolve(get_experiment("matrix_multiplication"), "native", "local")
    assert [p["matrix_size"] for p in plan.points] == [100, 200] and plan.deployment["worker_replicas"] == 2


def test_invalid_experiment_rejected():
    bad = {
        "name": "x",
        "workload": "sgd",
        "user": "u",
        "function": "f",
        "systems": ["wasm"],
        "driver": {"kind": "load"},
        "sweep": {"wasm": [{"param": "a", "values": []}]},
        "deploy": {"wasm": {"worker_replicas": 0}},
        "data": {"kind": "none"},
    }
    with pytest.raises(StepError) as e:
        validate(bad)
    msg = str(e.value)
    assert "worker_replicas" in msg and "values" in msg


def test_user_catalogue_dir_adds_and_overrides(tmp_path, monkeypatch):
    doc = {
        "name": "noop_latency",
        "workload": "inference",
        "user": "demo",
        "function": "noop",
        "systems": ["native"],
        "driver": {"kind": "load", "mode": "open", "connections": 2, "timeout_s": 1},
        "sweep": {"native": [{"param": "duration_s", "values": [1]}]},
        "deploy": {"native": {"worker_replicas": 1}},
        "data": {"kind": "none"},
    }
    (tmp_path / "noop.json").write_text(json.dumps(doc))
    monkeypatch.setenv("FAASM_CATALOGUE_DIR", str(tmp_path))
    assert "noop_latency" in load_catalogue()
    (tmp_path / "broken.yaml").write_text("name: [unclosed")
    with pytest.raises(StepError):
        load_catalogue()


def test_expand_and_slug():
    pts = expand([{"param": "a", "values": [1, 2]}, {"points": [{"b": 1, "c": "x"}, {"b": 2, "c": "y"}]}])
    assert len(pts) == 4 and pts[0] == {"a": 1, "b": 1, "c": "x"}
    assert slug({"b": 2, "a": "x y"}) == "a-x-y_b-2"
    with pytest.raises(StepError):
        expand([{"param": "a", "values": [1]}, {"points": [{"a": 2}]}])
