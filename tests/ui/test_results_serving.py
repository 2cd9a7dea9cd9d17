"""The results view serves only what the storage's own writers wrote, escapes what it renders and
streams files: the catalogue and the app's routes, in-process (no browser; the login
is replaced by a test user allowed to read both pipelines)."""

from __future__ import annotations

import asyncio
import json
import os
import tracemalloc

import pytest

from results_view import results_catalog as catalog
from stepkit import Step

pytestmark = pytest.mark.timeout(180)


def _report(root, key: str = "k", files: dict[str, bytes] | None = None) -> str:
    """A Mirage report folder committed by a real :class:`Step` (its marker lists its outputs)."""
    out = str(root / "mirage_pipeline" / key / "report")
    step = Step("report", out, "test", {"k": key})
    for rel, data in (files or {"report.html": b"<p>report</p>", "report.md": b"# report"}).items():
        step.write_bytes(rel, data)
    step.commit({"title": "t"})
    return out


def test_a_hard_link_to_a_file_outside_storage_is_refused(tmp_path):
    root = tmp_path / "root"
    out = _report(root)
    secret = tmp_path / "outside" / "shadow"
    secret.parent.mkdir()
    secret.write_text("SECRET-HARDLINK")
    page = os.path.join(out, "report.html")
    os.unlink(page)
    os.link(secret, page)  # same inode as the secret: O_NOFOLLOW cannot see it
    assert os.stat(page).st_nlink == 2
    with pytest.raises(KeyError):
        catalog.read(str(root), "mirage_pipeline/k/report/report.html")
    with pytest.raises(KeyError):
        catalog.read_plain(str(root), "mirage_pipeline/k/report/report.html")
    assert catalog.list_reports(str(root)) == []  # nor listed (its page is no plain file)
    assert catalog.read(str(root), "mirage_pipeline/k/report/report.md") == b"# report"


def test_only_files_the_marker_lists_are_served(tmp_path):
    root = tmp_path / "root"
    out = _report(root, files={"report.html": b"<p>report</p>", "figures/a.png": b"\x89PNG-a"})
    assert catalog.read(str(root), "mirage_pipeline/k/report/figures/a.png") == b"\x89PNG-a"
    # dropped in after the commit: matches the servable names, but the report step did not write it
    (root / "mirage_pipeline" / "k" / "report" / "report.md").write_text("# planted")
    (root / "mirage_pipeline" / "k" / "report" / "figures" / "b.png").write_bytes(b"\x89PNG-planted")
    for rel in ("report.md", "figures/b.png"):
        with pytest.raises(KeyError):
            catalog.read(str(root), f"mirage_pipeline/k/report/{rel}")
    # replaced after the commit (another size than the marker recorded): refused too
    with open(os.path.join(out, "report.html"), "wb") as f:
        f.write(b"<p>replaced by someone else</p>")
    with pytest.raises(KeyError):
        catalog.read(str(root), "mirage_pipeline/k/report/report.html")
    # a marker without an output list (older writers): its folder's servable names, as before
    legacy = root / "mirage_pipeline" / "old" / "report"
    legacy.mkdir(parents=True)
    (legacy / "_SUCCESS.json").write_text(json.dumps({"finished": "x"}))
    (legacy / "report.md").write_text("# old")
    assert catalog.read(str(root), "mirage_pipeline/old/report/report.md") == b"# old"


@pytest.fixture
def app_env(tmp_path, monkeypatch):
    """The results app with storage ``tmp_path/root`` and a logged-in user allowed both pipelines."""
    from results_view import results_app

    root = tmp_path / "root"
    root.mkdir()

    async def user(request):
        return object()

    monkeypatch.setattr(results_app, "current_user", user)
    monkeypatch.setattr(results_app, "allowed_pipelines", lambda u: set(results_app.PIPELINES))
    monkeypatch.setattr(results_app, "storage_root", lambda: str(root))
    return results_app, root


def _client(app):
    from fastapi.testclient import TestClient

    return TestClient(app)


def test_summary_fields_are_escaped(app_env):
    app, root = app_env
    evil = "<script>alert('x')</script><img src=x onerror=alert(1)>"
    out = str(root / "faasm_benchmarks" / "2026-11-30" / "manual__r1" / "summary")
    step = Step("summarize", out, "test", {})
    step.write_json(
        "summary.json",
        {
            "failed": evil,
            "points": [{"experiment": evil, "status": "<b>ok</b>", "error": "</td></tr></table><h1>x</h1>"}],
        },
    )
    step.commit({"points": 1, "failed": evil})
    with _client(app.app) as c:
        page = c.get("/summary/2026-11-30/manual__r1").text
        index = c.get("/").text
    for text in (page, index):  # the one script of a page is the view's own link script
        assert text.count("<script>") == 1 and f"<script>{app.TOP_LINK_JS}</script>" in text
        assert "<script>alert" not in text and "<img" not in text and "onerror=alert(1)>" not in text
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<h1>x</h1>" not in page and "&lt;b&gt;ok&lt;/b&gt;" in page


def test_a_large_report_is_streamed_in_bounded_memory(app_env):
    app, root = app_env
    big = 64 * 1024 * 1024
    out = str(root / "mirage_pipeline" / "big" / "report")
    step = Step("report", out, "test", {})
    with open(step.record("report.html"), "wb") as f:  # written by the step, in pieces
        chunk = b"<p>" + b"x" * (1024 * 1024 - 7) + b"</p>\n"
        for _ in range(big // len(chunk)):
            f.write(chunk)
    step.commit({})
    size = os.path.getsize(os.path.join(out, "report.html"))

    class Req:
        headers: dict = {}

    from fastapi.responses import StreamingResponse

    resp = asyncio.run(app.report_file("mirage_pipeline/big/report/report.html", Req()))
    assert isinstance(resp, StreamingResponse)
    assert resp.headers["content-length"] == str(size)

    async def drain() -> int:
        total = 0
        async for piece in resp.body_iterator:  # what Starlette sends, chunk by chunk
            total += len(piece)
        return total

    tracemalloc.start()
    try:
        total = asyncio.run(drain())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert total == size
    assert peak < 8 * 1024 * 1024, f"peak {peak} bytes while streaming {size}"
    with _client(app.app) as c:  # and over HTTP: the whole file, with its headers
        r = c.get("/report/mirage_pipeline/big/report/report.html")
    assert r.status_code == 200 and len(r.content) == size and "nosniff" in r.headers["x-content-type-options"]


def test_every_external_view_has_its_own_url_route():
    """Airflow keeps one view per ``url_route`` and drops the others with only a log warning (the
    DAG run's Results tab shared "results" with the Browse entry and never appeared); the browser
    test is tests/ui/test_run_results_e2e.py."""
    from results_view_plugin import ResultsViewPlugin

    routes = [v["url_route"] for v in ResultsViewPlugin.external_views]
    assert len(routes) == len(set(routes)), routes
    assert {v["destination"] for v in ResultsViewPlugin.external_views} == {"nav", "dag_run", "task_instance"}


def test_a_sites_wait_prediction_is_listed_and_rendered_with_its_tables(app_env):
    """mirage_evaluation's output (its tables were on disk only) is a report of the view: listed with
    the guard's pick and the coverage per month, and its page rendered, stored HTML escaped."""
    app, root = app_env
    out = str(root / "mirage_evaluation" / "mysite" / "waitpred")
    step = Step("waitpred", out, "test", {})
    page = (
        "# Wait prediction at submission: mysite.swf\n\nGuard pick: **qrf**.\n\n"
        "| month | n | coverage |\n|---|---|---|\n| 1997-01 | 120 | 88.0% |\n\n<script>alert(1)</script>\n"
    )
    step.write_bytes("waitpred.md", page.encode())
    step.write_json("waitpred.json", {"pick": "qrf"})
    step.write_bytes("predictions.parquet", b"not served")
    step.commit(
        {
            "pick": "qrf",
            "criteria": {"mae_at_or_below_zero": True, "coverage_months": {"1997-01": 0.88, "1997-02": None}},
        }
    )
    with _client(app.app) as c:
        index = c.get("/").text
        shown = c.get("/evaluation/mysite")
        raw = c.get("/report/mirage_evaluation/mysite/waitpred/waitpred.json")
        hidden = c.get("/report/mirage_evaluation/mysite/waitpred/predictions.parquet")
        missing = c.get("/evaluation/other")
    assert "data-kind='mirage_evaluation'" in index and "evaluation/mysite" in index
    assert "guard pick qrf" in index and "1997-01 88%" in index and "1997-02 ?" in index
    assert shown.status_code == 200
    assert "<table>" in shown.text and "<td>1997-01</td>" in shown.text and "<strong>qrf</strong>" in shown.text
    assert (
        shown.text.count("<script>") == 1
        and "<script>alert(1)</script>" not in shown.text
        and "&lt;script&gt;alert(1)&lt;/script&gt;" in shown.text
    )
    assert raw.status_code == 200 and raw.json() == {"pick": "qrf"}
    assert hidden.status_code == 404 and missing.status_code == 404


def test_a_day_of_failed_groups_says_failed_on_the_page_and_the_index(app_env):
    """A day whose every group failed at deploy has no point: the view must not read "0 points, 0 failed"."""
    app, root = app_env
    out = str(root / "faasm_benchmarks" / "2026-11-30" / "manual__r2" / "summary")
    step = Step("summarize", out, "test", {})
    groups = [
        {
            "experiment": "sgd_reuters_svm",
            "system": s,
            "step": "deploy",
            "error": "StepError: the functions are not built: run `make functions` first",
        }
        for s in ("wasm", "native")
    ]
    step.write_json(
        "summary.json",
        {
            "points": [],
            "failed": 2,
            "status": "FAILED",
            "failed_groups": groups,
            "unreadable": [{"uri": "file:///r/run.json", "error": "unreadable (JSONDecodeError)"}],
        },
    )
    step.commit({"points": 0, "failed": 2, "status": "FAILED"})
    with _client(app.app) as c:
        page = c.get("/summary/2026-11-30/manual__r2").text
        index = c.get("/").text
    assert "<b>FAILED</b>: 0 points, 2 failed" in page and "sgd_reuters_svm/native (whole group)" in page
    assert "run `make functions` first" in page and "file:///r/run.json" in page
    assert "FAILED: 0 points, 2 failed" in index


def test_a_damaged_summary_file_is_shown_as_failed(app_env):
    app, root = app_env
    out = str(root / "faasm_benchmarks" / "2026-11-30" / "manual__r3" / "summary")
    step = Step("summarize", out, "test", {})
    step.write_bytes("summary.json", b'{"points": [{"experiment": "sgd')  # truncated
    step.commit({"points": 1, "failed": 0})
    with _client(app.app) as c:
        r = c.get("/summary/2026-11-30/manual__r3")
    assert r.status_code == 422 and "FAILED" in r.text and "cannot be read" in r.text, r.text


def test_huge_markers_and_summaries_are_refused_not_read_whole(app_env, monkeypatch):
    """A marker or a summary of hundreds of MB was read whole into memory per request: the view reads
    at most its limit (+1 byte) and says 413 (summary) or leaves the folder out (marker)."""
    app, root = app_env
    monkeypatch.setattr(catalog, "SUMMARY_LIMIT", 1 << 20)
    monkeypatch.setattr(catalog, "MARKER_LIMIT", 64 << 10)
    out = str(root / "faasm_benchmarks" / "2026-11-30" / "manual__big" / "summary")
    step = Step("summarize", out, "test", {})
    step.write_bytes("summary.json", b'{"points": [], "pad": "' + b"x" * (3 << 20) + b'"}')
    step.commit({"points": 0, "failed": 0})
    # a marker padded far past any real one: its folder is no report
    _report(root, "padded")
    marker = root / "mirage_pipeline" / "padded" / "report" / "_SUCCESS.json"
    doc = json.loads(marker.read_text())
    doc["pad"] = "y" * (1 << 20)
    marker.write_text(json.dumps(doc))
    reads: list[int] = []
    real = catalog._bounded
    monkeypatch.setattr(catalog, "_bounded", lambda f, rel, limit: reads.append(limit) or real(f, rel, limit))
    with _client(app.app) as c:
        r = c.get("/summary/2026-11-30/manual__big")
        index = c.get("/").text
        padded = c.get("/report/mirage_pipeline/padded/report/report.html")
    assert r.status_code == 413 and "reads whole" in r.text
    assert "padded" not in index and padded.status_code == 404
    assert reads and None not in reads


def _gate_months(root) -> None:
    """January passed and February failed, judged by the real gate step on the months' metrics
    made by the real metrics step (ui_fixtures.make_gate_months)."""
    from ui_fixtures import GATE_FAIL, GATE_PASS, make_gate_months

    from mirage_tasks.__main__ import STEPS
    from stepkit.cli import main

    make_gate_months(root)
    for month, rc in ((GATE_PASS, 0), (GATE_FAIL, 1)):
        out = str(root / "mirage_monthly" / "gate" / month)
        argv = ["gate", "--runs", str(root / "mirage_pipeline"), "--month", month, "--out", out]
        assert main("mirage_tasks", STEPS, argv) == rc


def test_gate_table_shows_each_months_verdict_with_its_numbers_and_run(app_env, monkeypatch, capsys):
    """The gate table reads each month's committed gate.json: the verdict, the rule and margin, per
    node size the rule's hours with their interval beside reactive's and avg's, every check's value,
    interval and limit (failed ones marked), the months compared; and the mirage_monthly run of that
    month (Airflow's run of the partition) with its state and a link. That run's Results tab and its
    gate task's Report tab show the month's verdict."""
    app, root = app_env
    _gate_months(root)
    capsys.readouterr()
    runs = {"2023-02": {"run_id": "asset_triggered__feb", "state": "failed"}}
    monkeypatch.setattr(app, "partition_runs", lambda dag_id, keys: {k: v for k, v in runs.items() if k in keys})
    monkeypatch.setattr(app, "partition_of", lambda dag_id, run_id: "2023-02" if run_id.endswith("feb") else None)
    with _client(app.app) as c:
        index = c.get("/").text
        tab = c.get("/dag-run/mirage_monthly/asset_triggered__feb").text
        other = c.get("/dag-run/mirage_monthly/manual__none").text
        report = c.get("/task/mirage_monthly/asset_triggered__feb/gate", follow_redirects=False)
    gate = index[index.index("data-kind='mirage_gate'") :].split("</table>")[0]
    feb = gate[gate.index("data-key='2023-02'") :].split("</tr>")[0]
    jan = gate[gate.index("data-key='2023-01'") :].split("</tr>")[0]
    assert "FAILED (6 of 6 checks failed)" in feb and "PASSED (all 6 checks held)" in jan
    assert "<td class='rule'>xgboost, margin 0.1</td>" in feb
    # the numbers as the gate's log gives them (the fixture's February: the rule 61 % worse than reactive)
    assert "node 1 (n 30): xgboost 3.56 h [" in feb and "; reactive 2.21 h; avg 1.99 h" in feb
    assert "FAIL vs reactive: -0.611 [" in feb and "limit -0.100" in feb
    assert "FAIL vs avg: +1.569 [" in feb and "FAIL vs earlier months: -0.611" in feb
    assert "ok vs reactive: +0.257 [" in jan and "FAIL" not in jan
    assert "2022-11, 2022-12, 2023-01" in feb and "<td class='earlier'>2022-11, 2022-12</td>" in jan
    assert "href='../dags/mirage_monthly/runs/asset_triggered__feb'>asset_triggered__feb</a>" in feb
    assert "<td class='state'>failed</td>" in feb and "not in Airflow&#x27;s database" in jan
    assert "report/mirage_monthly/gate/2023-02/gate.md" in feb
    assert "FAILED (6 of 6 checks failed)" in tab and "FAIL vs reactive: -0.611" in tab
    assert "No report of this DAG run yet" in other
    assert report.status_code == 303 and report.headers["location"].endswith(
        "report/mirage_monthly/gate/2023-02/gate.md"
    )
    # a gate.json changed after its commit is not read: the marker's verdict, no numbers
    verdict = root / "mirage_monthly" / "gate" / "2023-02" / "gate.json"
    doc = json.loads(verdict.read_text())
    verdict.write_text(json.dumps(dict(doc, passed=True)))  # another size than its marker records
    with _client(app.app) as c:
        index = c.get("/").text
    feb = index[index.index("data-key='2023-02'") :].split("</tr>")[0]
    assert "<td class='summary verdict'>FAILED</td>" in feb and "gate.json not readable" in feb


def test_gate_verdicts_and_missed_deadlines_are_listed(app_env, monkeypatch):
    """mirage_monthly's gate (a committed gate/<month>) and house.deadlines' records
    (_deadlines/<dag>/<run>.json) are on the index; a record of a DAG the user may not read,
    a record in the wrong DAG's folder and an unreadable one are not."""
    app, root = app_env
    for month, passed in (("2023-02", True), ("2023-03", False)):
        step = Step("gate", str(root / "mirage_monthly" / "gate" / month), "test", {"month": month})
        step.write_bytes("gate.md", f"gate {month}: {'PASSED' if passed else 'FAILED'}\n".encode())
        step.write_json("gate.json", {"passed": passed})
        step.commit({"month": month, "passed": passed, "earlier_months": 1})
    records = root / "_deadlines"
    (records / "faasm_benchmarks").mkdir(parents=True)
    (records / "mirage_service").mkdir()
    (records / "faasm_benchmarks" / "manual__late.json").write_text(
        json.dumps(
            {
                "dag_id": "faasm_benchmarks",
                "run_id": "manual__late",
                "run_state": "running",
                "queued_at": "2026-12-07T08:00:00Z",
                "deadline": "2026-12-07T08:00:10+00:00",
                "interval": "0:00:10",
                "fired_at": "2026-12-07T08:00:12+00:00",
            }
        )
    )
    (records / "faasm_benchmarks" / "stray.json").write_text(json.dumps({"dag_id": "mirage_service", "run_id": "x"}))
    (records / "faasm_benchmarks" / "broken.json").write_text("{")
    (records / "mirage_service" / "keeper.json").write_text(
        json.dumps({"dag_id": "mirage_service", "run_id": "manual__keeper<script>", "fired_at": "2026-12-06"})
    )
    with _client(app.app) as c:
        index = c.get("/").text
        gate_md = c.get("/report/mirage_monthly/gate/2023-03/gate.md")
    assert "data-kind='mirage_gate'" in index
    assert "<td class='summary verdict'>FAILED</td>" in index and "<td class='summary verdict'>PASSED</td>" in index
    assert gate_md.status_code == 200 and "gate 2023-03: FAILED" in gate_md.text
    assert "data-kind='deadlines'" in index and "manual__late" in index and "0:00:10" in index
    assert "manual__keeper&lt;script&gt;" in index and "stray" not in index and ">x<" not in index
    # a user who may read faasm_benchmarks only sees its deadlines alone
    monkeypatch.setattr(app, "allowed_pipelines", lambda u: {"faasm_benchmarks"})
    with _client(app.app) as c:
        index = c.get("/").text
        refused = c.get("/report/mirage_monthly/gate/2023-03/gate.md")
    assert "manual__late" in index and "manual__keeper" not in index and "data-kind='mirage_gate'" not in index
    assert refused.status_code == 403


def test_an_untrustworthy_day_says_so_and_shows_the_arms(app_env):
    app, root = app_env
    out = str(root / "faasm_benchmarks" / "2026-11-30" / "manual__aa" / "summary")
    step = Step("summarize", out, "test", {})
    step.write_json(
        "summary.json",
        {
            "failed": 0,
            "status": "ok",
            "trustworthy": False,
            "aa_verdict": "fail",
            "points": [{"experiment": "matrix_multiplication", "system": "native", "arm": "A'", "status": "succeeded"}],
        },
    )
    step.commit({"points": 1, "failed": 0})
    with _client(app.app) as c:
        page = c.get("/summary/2026-11-30/manual__aa").text
    assert "<b>UNTRUSTWORTHY</b> (A/A control: fail)" in page
    assert "<th>arm</th>" in page and "<td>A&#x27;</td>" in page
