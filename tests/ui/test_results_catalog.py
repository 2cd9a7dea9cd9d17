"""The results view's catalogue (local and S3 storage), its links, and its auth (no browser)."""

from __future__ import annotations

from datetime import UTC

import pytest
from moto_s3 import reset
from ui_fixtures import DEFAULTS, END, MIRAGE_KEY, MIRAGE_KEY_B, MIRAGE_RUNS, make_reports

from house.links import StepReportLink, report_uri, view_url
from results_view import results_catalog as catalog


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    root = tmp_path_factory.mktemp("storage")
    pages = make_reports(root, tmp_path_factory.mktemp("state"))
    return root, pages


def test_lists_both_pipelines_reports(storage):
    root, pages = storage
    reports = catalog.list_reports(str(root))
    by_kind = {r.kind: r for r in reports}
    assert set(by_kind) == {"mirage_report", "faasm_trends", "faasm_summary"}
    assert by_kind["mirage_report"].path == pages["mirage"] and by_kind["mirage_report"].run == MIRAGE_KEY
    assert by_kind["faasm_trends"].path == pages["faasm_trends"]
    assert by_kind["faasm_summary"].run == pages["faasm_run"]
    assert by_kind["faasm_summary"].summary == {
        "points": 7,
        "failed": 0,
        "invalid": 0,
        "failed_points": 0,
        "failed_groups_count": 0,
        "unreadable_count": 0,
        "status": "ok",
        "aa_verdict": "none",  # the fixture's day measured no A/A arms
        "trustworthy": True,
    }
    assert b"Mirage fixture report" in catalog.read(f"file://{root}", pages["mirage"])


def test_serves_only_committed_report_files(storage, tmp_path):
    root, pages = storage
    assert catalog.read(str(root), pages["faasm_trends"]).startswith(b"<!doctype html>")
    assert (
        catalog.read(str(root), pages["faasm_trends"].replace("trends.html", "figures/billing.png"))[:4] == b"\x89PNG"
    )
    bad = [
        "",
        "../etc/passwd",
        "mirage_pipeline/../../x/report/report.html",
        f"mirage_pipeline/{MIRAGE_KEY}/report/_SUCCESS.json",
        f"mirage_pipeline/{MIRAGE_KEY}/train/xgboost-n1/metrics.json",
        f"faasm_benchmarks/{END}/x/trends/trends.html",
        "/etc/passwd",
        "mirage_pipeline//report/report.html",
    ]
    for rel in bad:
        with pytest.raises(KeyError):
            catalog.read(str(root), rel)
    # an uncommitted report (no marker) is neither listed nor served
    (tmp_path / "mirage_pipeline" / "k" / "report").mkdir(parents=True)
    (tmp_path / "mirage_pipeline" / "k" / "report" / "report.html").write_text("half")
    assert catalog.list_reports(str(tmp_path)) == []
    with pytest.raises(KeyError):
        catalog.read(str(tmp_path), "mirage_pipeline/k/report/report.html")


def test_lists_reports_on_s3(storage, monkeypatch):
    moto = pytest.importorskip("moto")
    import fsspec

    root, pages = storage
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        reset(f"http://{host}:{port}")  # moto's backends are per process: start empty
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{host}:{port}")
        fsspec.config.conf.pop("s3", None)
        # fsspec caches filesystems by their arguments, not the environment: an S3 filesystem an
        # earlier test made for another (now stopped) endpoint would be handed to the catalog
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("results-bucket")
        fs.put(str(root) + "/", "results-bucket/house/", recursive=True)
        fs.invalidate_cache()
        reports = catalog.list_reports("s3://results-bucket/house")
        assert {r.path for r in reports} >= {pages["mirage"], pages["faasm_trends"]}
        assert b"Mirage fixture report" in catalog.read("s3://results-bucket/house", pages["mirage"])
    finally:
        server.stop()
    del moto


def test_report_link_from_step_argv():
    root = "s3://bucket/house"
    mirage = ["report", "--in", "a", "b", "--out", f"{root}/mirage_pipeline/{MIRAGE_KEY}/report", "--title", "t"]
    assert report_uri("mirage_tasks", mirage) == f"{root}/mirage_pipeline/{MIRAGE_KEY}/report/report.html"
    faasm = [
        "summarize",
        "--target",
        "local",
        "--run-id",
        "scheduled__2026-11-20T00:00:00+00:00",
        "--results",
        f"{root}/faasm_benchmarks",
        "--date",
        END,
        "--days",
        "30",
    ]
    uri = report_uri("faasm_tasks", faasm)
    assert uri == f"{root}/faasm_benchmarks/{END}/scheduled__2026-11-20T00:00:00+00:00/trends/trends.html"
    assert view_url(uri, root, "http://af:8080/") == (
        f"http://af:8080/results/report/faasm_benchmarks/{END}/scheduled__2026-11-20T00%3A00%3A00%2B00%3A00/"
        "trends/trends.html"
    )
    assert view_url(uri, "s3://other") is None
    assert view_url("/srv/st/mirage_pipeline/k/report/report.html", "file:///srv/st/") == (
        "/results/report/mirage_pipeline/k/report/report.html"
    )
    assert report_uri("faasm_tasks", ["run", "--results", "x"]) is None
    assert report_uri("mirage_tasks", ["train", "--out", "x"]) is None
    assert report_uri("faasm_tasks", []) is None


def test_link_on_both_house_operators(monkeypatch, tmp_path):
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path))
    monkeypatch.setenv("HOUSE_NO_VARIABLES", "1")
    from house.local import LocalStepOperator
    from house.pod import HousePodOperator

    argv = ["summarize", "--run-id", "r1", "--results", f"{tmp_path}/faasm_benchmarks", "--date", END]
    for op in (
        LocalStepOperator(task_id="summarize", package="faasm_tasks", argv=argv),
        HousePodOperator(task_id="summarize2", package="faasm_tasks", argv=argv, image="x:1", namespace="ns"),
    ):
        links = [link for link in op.operator_extra_links if isinstance(link, StepReportLink)]
        assert len(links) == 1 and links[0].name == "Report"
        url = links[0].get_link(op, ti_key=None)
        assert url.endswith(f"/results/report/faasm_benchmarks/{END}/r1/trends/trends.html"), url
    # with a task instance: the task's "Report" tab inside the Airflow UI (the results view in a frame)
    from types import SimpleNamespace

    key = SimpleNamespace(
        dag_id="faasm_benchmarks", run_id="manual__2026-11-30T10:00:00+00:00", task_id="summarize", map_index=-1
    )
    url = links[0].get_link(op, ti_key=key)
    assert url.endswith(
        "/dags/faasm_benchmarks/runs/manual__2026-11-30T10%3A00%3A00%2B00%3A00/tasks/summarize/plugin/report"
    ), url
    other = LocalStepOperator(task_id="deploy", package="faasm_tasks", argv=["deploy", "--results", "x"])
    assert StepReportLink().get_link(other, ti_key=None) == ""


def test_lists_runs_by_dag_run_with_trigger_and_changed_params(storage):
    root, pages = storage
    mirage = {r.run: r for r in catalog.list_reports(str(root)) if r.kind == "mirage_report"}
    assert set(mirage) == {MIRAGE_KEY, MIRAGE_KEY_B}
    [a], [b] = mirage[MIRAGE_KEY].runs, mirage[MIRAGE_KEY_B].runs
    assert a["run_id"] == MIRAGE_RUNS[MIRAGE_KEY] and a["trigger"] == "scheduled"
    assert a["logical_date"].startswith("2023-03-01T00:00:00")
    assert a["changed"] == {
        "models": {"value": ["xgboost", "random_forest"], "default": DEFAULTS["models"]},
        "train_count": {"value": 42, "default": 684},
    }
    assert b["trigger"] == "manual" and b["changed"] == {"seed": {"value": 7, "default": 0}}
    faasm = next(r for r in catalog.list_reports(str(root)) if r.kind == "faasm_trends")
    assert faasm.runs == [
        {"run_id": pages["faasm_run"].split("/", 1)[1], "logical_date": END, "trigger": "scheduled", "changed": {}}
    ]
    assert catalog.trigger_of("backfill__2023-03-01T00:00:00+00:00") == "backfill"
    assert catalog.trigger_of("my-run") == "unknown"
    # a DAG run's reports, and the comparison's inputs
    assert [r.path for r in catalog.runs_of(str(root), "mirage_pipeline", MIRAGE_RUNS[MIRAGE_KEY_B])] == [
        pages["mirage_b"]
    ]
    m = catalog.run_metrics(str(root), MIRAGE_KEY_B)
    assert m["headline"]["xgboost@1"]["mean_interruption_h"] == 2.5 and m["report"] == pages["mirage_b"]
    for bad in ("../x", "", "a/b", MIRAGE_KEY + "-nope"):
        with pytest.raises(KeyError):
            catalog.run_metrics(str(root), bad)


def test_record_run_changed_params(tmp_path):
    from datetime import datetime

    from mirage_tasks.run.runlog import changed_params, record_name, record_run

    assert changed_params({"a": 1, "b": [1, 2], "c": None}, {"a": 1, "b": [1], "c": None}) == {
        "b": {"value": [1, 2], "default": [1]}
    }
    assert record_name("manual__2026-11-30T09:15:00+00:00") != record_name("manual__2026-11-30T09_15_00_00_00")
    uri = record_run(
        str(tmp_path),
        dag_id="d",
        run_id="r/1",
        run_type="backfill",
        logical_date=datetime(2023, 3, 1, tzinfo=UTC),
        params={"x": 2},
        defaults={"x": 1},
    )
    import json

    doc = json.loads(open(uri).read())
    assert doc["run_type"] == "backfill" and doc["changed"] == {"x": {"value": 2, "default": 1}}
    assert "/_runs/" in uri and "/r/1" not in uri


def _escape_tree(tmp_path):
    """A committed report folder whose files and folders are symbolic links out of (or within) the root."""
    import json
    import os

    root = tmp_path / "root"
    secret = tmp_path / "outside"
    secret.mkdir()
    (secret / "shadow").write_text("root:$6$secret-hash")
    (secret / "report").mkdir()
    (secret / "report" / "report.html").write_text("outside report")
    (secret / "report" / "_SUCCESS.json").write_text(json.dumps({"finished": "x"}))
    ok = root / "mirage_pipeline" / "good" / "report"
    ok.mkdir(parents=True)
    (ok / "_SUCCESS.json").write_text(json.dumps({"finished": "x"}))
    (ok / "report.md").write_text("# fine")
    (ok / "report.html").symlink_to(secret / "shadow")  # a file link out of the root, marker beside it
    (ok / "figures").symlink_to(secret)  # a folder link out of the root
    (secret / "x.png").write_bytes(b"\x89PNG....")
    inner = root / "mirage_pipeline" / "inner" / "report"
    inner.mkdir(parents=True)
    (inner / "_SUCCESS.json").symlink_to(ok / "_SUCCESS.json")  # a link inside the root: refused too
    (inner / "report.html").write_text("inner")
    (root / "mirage_pipeline" / "linked").symlink_to(secret, target_is_directory=True)  # a linked run folder
    clean = root / "mirage_pipeline" / "clean" / "report"
    clean.mkdir(parents=True)
    (clean / "_SUCCESS.json").write_text(json.dumps({"finished": "x"}))
    (clean / "report.html").write_text("<p>clean</p>")
    fifo = root / "mirage_pipeline" / "good" / "report" / "report.md.fifo"
    os.mkfifo(fifo)
    return root, secret


def test_symlinks_out_of_the_root_are_never_served(tmp_path):
    root, _ = _escape_tree(tmp_path)
    for r in (str(root), f"file://{root}"):
        assert catalog.read(r, "mirage_pipeline/good/report/report.md") == b"# fine"
        for rel in (
            "mirage_pipeline/good/report/report.html",  # link to a file outside
            "mirage_pipeline/good/report/figures/x.png",  # through a folder link
            "mirage_pipeline/inner/report/report.html",  # its marker is a link
            "mirage_pipeline/linked/report/report.html",
        ):  # a linked run folder
            with pytest.raises(KeyError):
                catalog.read(r, rel)
        with pytest.raises(KeyError):
            catalog.read_plain(r, "mirage_pipeline/good/report/report.md.fifo")  # not a regular file
        with pytest.raises(KeyError):
            catalog.read_plain(r, "mirage_pipeline/good/report")  # a folder
    # the listing shows only the report whose marker and page are regular files inside the root
    assert [x.path for x in catalog.list_reports(str(root))] == ["mirage_pipeline/clean/report/report.html"]
    # a root that is itself a link is fine (the links below it are what is refused)
    alias = tmp_path / "alias"
    alias.symlink_to(root, target_is_directory=True)
    assert catalog.read(str(alias), "mirage_pipeline/good/report/report.md") == b"# fine"


def test_s3_serves_plain_objects_only(storage, monkeypatch):
    pytest.importorskip("moto")
    import fsspec

    root, pages = storage
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        reset(f"http://{host}:{port}")
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://{host}:{port}")
        fsspec.config.conf.pop("s3", None)
        fsspec.get_filesystem_class("s3").clear_instance_cache()
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("plain-objects")
        fs.pipe("plain-objects/house/mirage_pipeline/k/report/_SUCCESS.json", b"{}")
        fs.pipe("plain-objects/house/mirage_pipeline/k/report/report.html/inner", b"x")  # report.html is a "folder"
        fs.pipe("plain-objects/house/mirage_pipeline/k/report/report.md", b"# md")
        fs.invalidate_cache()
        assert catalog.read("s3://plain-objects/house", "mirage_pipeline/k/report/report.md") == b"# md"
        with pytest.raises(KeyError):
            catalog.read("s3://plain-objects/house", "mirage_pipeline/k/report/report.html")
        with pytest.raises(KeyError):
            catalog.read_plain("s3://plain-objects/house", "../plain-objects/house/mirage_pipeline/k/report/report.md")
    finally:
        server.stop()
