"""The results view's catalogue (local and S3 storage), its links, and its auth (no browser)."""

from __future__ import annotations

import pytest
from moto_s3 import reset
from ui_fixtures import END, MIRAGE_KEY, make_reports

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
    assert by_kind["faasm_summary"].summary == {"points": 7, "failed": 0, "invalid": 0}
    assert b"Mirage fixture report" in catalog.read(f"file://{root}", pages["mirage"])


def test_serves_only_committed_report_files(storage, tmp_path):
    root, pages = storage
    assert catalog.read(str(root), pages["faasm_trends"]).startswith(b"<!doctype html>")
    assert catalog.read(str(root), pages["faasm_trends"].replace("trends.html", "figures/billing.png"))[:4] == b"\x89PNG"
    bad = ["", "../etc/passwd", "mirage_pipeline/../../x/report/report.html", f"mirage_pipeline/{MIRAGE_KEY}/report/"
           "_SUCCESS.json", f"mirage_pipeline/{MIRAGE_KEY}/train/xgboost-n1/metrics.json",
           f"faasm_benchmarks/{END}/x/trends/trends.html", "/etc/passwd", "mirage_pipeline//report/report.html"]
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
    faasm = ["summarize", "--target", "local", "--run-id", "scheduled__2026-11-20T00:00:00+00:00",
             "--results", f"{root}/faasm_benchmarks", "--date", END, "--days", "30"]
    uri = report_uri("faasm_tasks", faasm)
    assert uri == f"{root}/faasm_benchmarks/{END}/scheduled__2026-11-20T00:00:00+00:00/trends/trends.html"
    assert view_url(uri, root, "http://af:8080/") == (
        f"http://af:8080/results/report/faasm_benchmarks/{END}/scheduled__2026-11-20T00%3A00%3A00%2B00%3A00/"
        "trends/trends.html")
    assert view_url(uri, "s3://other") is None
    assert view_url("/srv/st/mirage_pipeline/k/report/report.html", "file:///srv/st/") == (
        "/results/report/mirage_pipeline/k/report/report.html")
    assert report_uri("faasm_tasks", ["run", "--results", "x"]) is None
    assert report_uri("mirage_tasks", ["train", "--out", "x"]) is None
    assert report_uri("faasm_tasks", []) is None


def test_link_on_both_house_operators(monkeypatch, tmp_path):
    monkeypatch.setenv("HOUSE_STORAGE_ROOT", str(tmp_path))
    monkeypatch.setenv("HOUSE_NO_VARIABLES", "1")
    from house.local import LocalStepOperator
    from house.pod import HousePodOperator

    argv = ["summarize", "--run-id", "r1", "--results", f"{tmp_path}/faasm_benchmarks", "--date", END]
    for op in (LocalStepOperator(task_id="summarize", package="faasm_tasks", argv=argv),
               HousePodOperator(task_id="summarize2", package="faasm_tasks", argv=argv, image="x:1",
                                namespace="ns")):
        links = [link for link in op.operator_extra_links if isinstance(link, StepReportLink)]
        assert len(links) == 1 and links[0].name == "Report"
        url = links[0].get_link(op, ti_key=None)
        assert url.endswith(f"/results/report/faasm_benchmarks/{END}/r1/trends/trends.html"), url
    other = LocalStepOperator(task_id="deploy", package="faasm_tasks", argv=["deploy", "--results", "x"])
    assert StepReportLink().get_link(other, ti_key=None) == ""
