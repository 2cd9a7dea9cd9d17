"""Data preparation: deterministic matrices, S3 archives (moto), upload-once."""

from __future__ import annotations

import numpy as np
import pytest
from faasm_testutil import ScriptedServer
from moto_s3 import reset

from faasm_tasks.catalogue import get_experiment, resolve
from faasm_tasks.clients import UploadClient
from faasm_tasks.data import expected_product, matrix_state_objects, prepare, synthetic_sgd, tar_bytes
from stepkit import StepError


def test_matrices_are_deterministic_blocks():
    a = matrix_state_objects(100, 2, seed=42)
    b = matrix_state_objects(100, 2, seed=42)
    assert a == b and len(a) == 33
    assert np.frombuffer(a["matrix_state"], dtype=np.int32).tolist() == [100, 2]
    assert len(a["mat_a_2_3_3"]) == 25 * 25 * 4
    full = np.block(
        [[np.frombuffer(a[f"mat_a_2_{r}_{c}"], dtype=np.float32).reshape(25, 25) for c in range(4)] for r in range(4)]
    )
    fb = np.block(
        [[np.frombuffer(a[f"mat_b_2_{r}_{c}"], dtype=np.float32).reshape(25, 25) for c in range(4)] for r in range(4)]
    )
    assert np.allclose(full @ fb, expected_product(100, 2, 42), rtol=1e-4)
    assert matrix_state_objects(100, 2, seed=43)["mat_a_2_0_0"] != a["mat_a_2_0_0"]
    with pytest.raises(StepError):
        matrix_state_objects(102, 2)


def test_synthetic_sgd_layout():
    d = synthetic_sgd(examples=50, features=20, nnz_per_example=4, seed=1)
    f, n, nnz = np.frombuffer(d["inputs_size"], dtype=np.int32)
    outr = np.frombuffer(d["inputs_outr"], dtype=np.int32)
    assert (f, n) == (20, 50) and outr[-1] == nnz == len(np.frombuffer(d["inputs_vals"]))
    assert set(np.frombuffer(d["outputs"]).tolist()) <= {-1.0, 1.0}


def _store_server():
    store = {}

    def h(method, path, headers, body):
        key = path if path != "/file" else "file:" + headers["FilePath"]
        if method == "PUT":
            store[key] = body
            return 200, b"ok"
        return (200, store[key]) if key in store else (404, b"")

    return h, store


@pytest.fixture
def moto_s3(monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    srv.start()
    host, port = srv.get_host_and_port()
    url = f"http://{host}:{port}"
    reset(url)  # moto's backends are per process: no bucket or object of an earlier test
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1")
    s3.create_bucket(Bucket="faasm-data")
    try:
        yield url, s3
    finally:
        srv.stop()


def test_sgd_and_tf_from_s3_uploaded_once(moto_s3):
    url, s3 = moto_s3
    sgd = synthetic_sgd(examples=30, features=10, nnz_per_example=3)
    s3.put_object(
        Bucket="faasm-data", Key="reuters.tar.gz", Body=tar_bytes({f"reuters/{k}": v for k, v in sgd.items()})
    )
    s3.put_object(
        Bucket="faasm-data",
        Key="custom/tf.tar",
        Body=tar_bytes({"mobilenet_v1_1.0_224.tflite": b"model", "grace_hopper.bmp": b"img", "labels.txt": b"a\nb"}),
    )
    h, store = _store_server()
    with ScriptedServer(h) as srv:
        c = UploadClient(srv.url, timeout_s=10)
        plan = resolve(get_experiment("sgd_reuters_svm"), "wasm", "knative")
        r1 = prepare(plan, c, "s3", endpoint_url=url)
        assert {r["action"] for r in r1} == {"uploaded"} and store["/s/sgd/outputs"] == sgd["outputs"]
        assert {r["action"] for r in prepare(plan, c, "s3", endpoint_url=url)} == {"skipped"}
        tf = resolve(get_experiment("tf_inference_latency"), "native", "knative")
        r3 = prepare(tf, c, "s3", key="custom/tf.tar", endpoint_url=url)
        assert store["/s/tf/mobilenet_v1"] == b"model" and store["file:tfdata/labels.txt"] == b"a\nb"
        assert len(r3) == 3
        with pytest.raises(StepError, match="cannot fetch|lacks"):
            prepare(plan, c, "s3", key="missing.tar", endpoint_url=url)


def test_results_layout_on_s3(moto_s3, monkeypatch):
    from faasm_tasks.results import Attempt, iter_records, point_prefix
    from stepkit import storage

    url, s3 = moto_s3
    s3.create_bucket(Bucket="results")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    import fsspec

    monkeypatch.setattr(fsspec.config, "conf", {"s3": {"client_kwargs": {"endpoint_url": url}}})
    root = "s3://results/bench"
    base = {
        "run_id": "r",
        "date": "2026-11-29",
        "experiment": "e",
        "system": "wasm",
        "target": "knative",
        "params": {"n": 1},
        "repeat": 0,
    }
    prefix = point_prefix(root, "2026-11-29", "r", "e", "wasm", {"n": 1}, 0)
    a1 = Attempt(prefix, dict(base))
    a1.write_text("output.txt", "SUCCESS: x")
    a1.finish(True)
    a2 = Attempt(prefix, dict(base))
    a2.finish(False, "boom")
    assert a1.uri.endswith("attempt-1") and a2.uri.endswith("attempt-2")
    recs = sorted((r["attempt"], r["status"]) for _, r in iter_records(root, "2026-11-29", "r"))
    assert recs == [(1, "succeeded"), (2, "failed")]
    assert storage.read_bytes(a1.uri + "/output.txt") == b"SUCCESS: x"


def test_function_and_matrix_data_through_s3(moto_s3):
    """The manual's ``inv upload`` and ``matrix-upload-s3``/``-download-s3`` through the data bucket."""
    from faasm_tasks.data import matrix_archive_key, matrix_objects_from_s3, needs_function

    url, s3 = moto_s3
    s3.put_object(Bucket="faasm-data", Key="func/python/mat_mul.py", Body=b"def main(): pass\n")
    h, store = _store_server()
    plan = resolve(get_experiment("matrix_multiplication"), "wasm", "knative", {"matrix_size": 100})
    assert needs_function(plan)
    with ScriptedServer(h) as srv:
        c = UploadClient(srv.url, timeout_s=10)
        r1 = prepare(plan, c, "s3", endpoint_url=url, function_source="s3")
        assert store["/p/python/mat_mul"] == b"def main(): pass\n"
        kinds = [(r["kind"], r["action"]) for r in r1]
        assert kinds[0] == ("function", "uploaded") and ("matrix-archive", "uploaded") in kinds
        key = matrix_archive_key("matrix", 100, 2)
        assert key == "matrix/100x100_2.tar" and s3.head_object(Bucket="faasm-data", Key=key)["ContentLength"] > 0
        # what run downloads per size is what the seed gives
        assert matrix_objects_from_s3(plan, 100, "faasm-data", url) == matrix_state_objects(100, 2, 42)
        assert store["/s/python/mat_a_2_0_0"] == matrix_state_objects(100, 2, 42)["mat_a_2_0_0"]
        r2 = prepare(plan, c, "s3", endpoint_url=url, function_source="s3")
        assert {r["action"] for r in r2} == {"skipped"}  # function, archive and state all unchanged
        # native C++ functions are in their images: nothing to upload; wasm needs its .wasm in the bucket
        assert not needs_function(resolve(get_experiment("sgd_reuters_svm"), "native", "knative"))
        with pytest.raises(StepError, match="cannot fetch s3://faasm-data/wasm/sgd/reuters_svm/function.wasm"):
            prepare(
                resolve(get_experiment("sgd_reuters_svm"), "wasm", "knative"),
                c,
                "s3",
                endpoint_url=url,
                function_source="s3",
            )
        with pytest.raises(StepError, match="matrix/200x200_2.tar"):
            matrix_objects_from_s3(plan, 200, "faasm-data", url)
