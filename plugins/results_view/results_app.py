"""The results view: a FastAPI app mounted by the Airflow API server at ``/results``.

Routes (all behind Airflow's login: the JWT of the ``_token`` cookie the UI sets at
login, or an ``Authorization: Bearer`` token; the user must be allowed to read the
pipeline's DAG runs):

* ``GET /results/``                 the list of reports of both pipelines (HTML);
* ``GET /results/api/reports``      the same list as JSON;
* ``GET /results/report/<path>``    a report file below the storage root (``report.html``,
  ``trends.html``, their Markdown and figures), served as stored;
* ``GET /results/summary/<date>/<run id>``  a Faasm run's ``summary.json`` as an HTML table.

A page opened without a login redirects to Airflow's login page and comes back after it.
Storage: the house storage root (``HOUSE_STORAGE_ROOT`` or the ``house_storage_root``
Variable, see ``house.config``), a local path or ``s3://`` (credentials from the usual
AWS environment of the API server).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import mimetypes
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from results_view import results_catalog as catalog

log = logging.getLogger(__name__)

PIPELINES = {"mirage_pipeline": "Mirage pipeline", "faasm_benchmarks": "Faasm benchmarks"}
#: What a stored report page may load: its own embedded images and inline styles, nothing else.
REPORT_CSP = ("default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
              "frame-ancestors 'self'; base-uri 'none'; form-action 'none'")

app = FastAPI(title="Pipeline results", description="Reports of the Mirage and Faasm pipelines from storage",
              docs_url=None, redoc_url=None, openapi_url=None)


def storage_root() -> str:
    from house.config import get_config  # noqa: PLC0415 - the plugins folder is on sys.path

    return get_config().storage_root.rstrip("/")


class NotLoggedIn(Exception):
    pass


async def current_user(request: Request):
    """The logged-in Airflow user, or :class:`NotLoggedIn`."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN  # noqa: PLC0415
    from airflow.api_fastapi.core_api.security import resolve_user_from_token  # noqa: PLC0415

    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    try:
        return await resolve_user_from_token(token)
    except HTTPException as exc:
        raise NotLoggedIn(exc.detail) from exc


def allowed_pipelines(user) -> set[str]:
    """The pipelines whose DAG runs ``user`` may read."""
    from airflow.api_fastapi.app import get_auth_manager  # noqa: PLC0415
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails  # noqa: PLC0415

    am = get_auth_manager()
    return {p for p in PIPELINES
            if am.is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=p),
                                    user=user)}


@app.exception_handler(NotLoggedIn)
async def _login(request: Request, exc: NotLoggedIn):
    if request.url.path.rstrip("/").endswith("/api/reports") or "text/html" not in request.headers.get("accept", ""):
        return JSONResponse({"detail": f"Not authenticated ({exc})"}, status_code=401)
    from airflow.api_fastapi.app import get_auth_manager  # noqa: PLC0415

    here = str(request.url.path) + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(get_auth_manager().get_url_login(next_url=here), status_code=303)


async def _reports(user) -> tuple[str, list[catalog.Report]]:
    root = storage_root()
    allowed = allowed_pipelines(user)
    reports = await asyncio.to_thread(catalog.list_reports, root)
    return root, [r for r in reports if r.pipeline in allowed]


@app.get("/api/reports")
async def api_reports(request: Request) -> JSONResponse:
    user = await current_user(request)
    root, reports = await _reports(user)
    return JSONResponse({"storage_root": root, "reports": [r.to_dict() for r in reports]})


def _page(title: str, body: str) -> HTMLResponse:
    style = ("body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}h1{font-size:1.4em}"
             "table{border-collapse:collapse;font-size:13px;margin:.4em 0 1.2em}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
             ".muted{color:#777}a{color:#0a58ca}")
    doc = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{style}</style></head><body>{body}</body></html>")
    return HTMLResponse(doc, headers={"Content-Security-Policy": REPORT_CSP, "Cache-Control": "no-store"})


def _summary_text(r: catalog.Report) -> str:
    s = r.summary or {}
    if r.kind == "faasm_summary":
        return f"{s.get('points', '?')} points, {s.get('failed', '?')} failed"
    if r.kind == "faasm_trends":
        return f"{s.get('days', '?')} days window, {s.get('dates', '?')} days with results, {s.get('runs', '?')} runs"
    return ", ".join(f"{k}: {v}" for k, v in list(s.items())[:4] if not isinstance(v, (dict, list)))


@app.get("/", response_class=HTMLResponse)
async def index(request: Request) -> HTMLResponse:
    user = await current_user(request)
    root, reports = await _reports(user)
    parts = ["<h1>Pipeline results</h1>",
             f"<p class='muted'>Reports found under <code>{html.escape(root)}</code>.</p>"]
    sections = [("mirage_report", "Mirage pipeline: validation reports", "Run"),
                ("faasm_trends", "Faasm benchmarks: trend reports", "Date / run"),
                ("faasm_summary", "Faasm benchmarks: run summaries", "Date / run")]
    for kind, title, col in sections:
        rows = [r for r in reports if r.kind == kind]
        parts.append(f"<h2 id='{kind}'>{html.escape(title)}</h2>")
        if not rows:
            parts.append("<p class='muted'>None yet.</p>")
            continue
        parts.append(f"<table class='reports' data-kind='{kind}'><thead><tr><th>{col}</th><th>Finished</th>"
                     "<th>Summary</th><th>Open</th></tr></thead><tbody>")
        for r in rows:
            if kind == "faasm_summary":
                href = "summary/" + quote(r.run)
            else:
                href = "report/" + quote(r.path)
            parts.append(f"<tr><td>{html.escape(r.run)}</td><td>{html.escape(r.finished or '')}</td>"
                         f"<td>{html.escape(_summary_text(r))}</td>"
                         f"<td><a class='report-link' href='{html.escape(href)}'>open</a></td></tr>")
        parts.append("</tbody></table>")
    return _page("Pipeline results", "\n".join(parts))


def _pipeline_of(rel: str) -> str:
    return rel.split("/", 1)[0]


@app.get("/report/{rel:path}")
async def report_file(rel: str, request: Request) -> Response:
    user = await current_user(request)
    if _pipeline_of(rel) not in allowed_pipelines(user):
        raise HTTPException(403, "not allowed to read this pipeline's runs")
    try:
        data = await asyncio.to_thread(catalog.read, storage_root(), rel)
    except KeyError:
        raise HTTPException(404, f"no report file {rel}") from None
    ctype = mimetypes.guess_type(rel)[0] or "application/octet-stream"
    if rel.endswith(".md"):
        ctype = "text/plain"
    if ctype.startswith("text/") or ctype.endswith("json"):
        ctype += "; charset=utf-8"
    return Response(data, media_type=ctype, headers={"Content-Security-Policy": REPORT_CSP,
                                                     "X-Content-Type-Options": "nosniff",
                                                     "Cache-Control": "no-store"})


SUMMARY_COLS = ["experiment", "system", "params", "repeat", "attempt", "status", "run_time_ms", "throughput_ok",
                "p50_us", "p99_us", "memory_gb_s", "error"]


@app.get("/summary/{date}/{run_id}", response_class=HTMLResponse)
async def summary(date: str, run_id: str, request: Request) -> HTMLResponse:
    user = await current_user(request)
    if "faasm_benchmarks" not in allowed_pipelines(user):
        raise HTTPException(403, "not allowed to read faasm_benchmarks runs")
    rel = f"faasm_benchmarks/{date}/{run_id}/summary/summary.json"
    try:
        doc: dict[str, Any] = json.loads(await asyncio.to_thread(catalog.read, storage_root(), rel))
    except KeyError:
        raise HTTPException(404, f"no summary for {date}/{run_id}") from None
    points = doc.get("points") or []
    head = "".join(f"<th>{html.escape(c)}</th>" for c in SUMMARY_COLS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape('' if p.get(c) is None else str(p.get(c)))}</td>"
                                    for c in SUMMARY_COLS) + "</tr>" for p in points)
    trends = f"../../report/faasm_benchmarks/{quote(date)}/{quote(run_id)}/trends/trends.html"
    parts = [f"<h1>Faasm benchmarks: run {html.escape(run_id)} on {html.escape(date)}</h1>",
             f"<p>{len(points)} points, {doc.get('failed', 0)} failed. "
             f"<a href='{html.escape(trends)}'>Trend report</a> · <a href='../../'>All reports</a></p>",
             f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"]
    return _page(f"Faasm run {run_id}", "\n".join(parts))
