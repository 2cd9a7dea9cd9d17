"""The results view: a FastAPI app mounted by the Airflow API server at ``/results``.

Routes (all behind Airflow's login: the JWT of the ``_token`` cookie the UI sets at
login, or an ``Authorization: Bearer`` token; the user must be allowed to read the
pipeline's DAG runs):

* ``GET /results/``                 the list of reports of both pipelines (HTML), by DAG run: run id
  (linked to the run's page), the run's state and its unfinished tasks (Airflow's metadata
  database: :func:`airflow_runs`), logical date, trigger and the params that differ from the
  defaults; pick two Mirage runs to compare; mirage_monthly's gate month by month (the verdict's
  numbers from each month's ``gate.json`` and the run of that partition, :func:`partition_runs`);
* ``GET /results/api/reports``      the same list as JSON (paths relative to the storage root);
* ``GET /results/compare?run=<key>&run=<key>``  two Mirage runs' headline metrics side by side, with
  each metric's n and 95 % bootstrap interval and the inputs that differ;
* ``GET /results/dag-run/<dag id>/<run id>``   the reports of one DAG run (the "Results" tab of a
  DAG run in the Airflow UI; a mirage_monthly run's: the gate verdict of its partition, its month);
* ``GET /results/task/<dag id>/<run id>/<task id>``  the report of a report step (the "Report"
  tab of its task instance in the Airflow UI, where the step's "Report" link leads);
* ``GET /results/report/<path>``    a report file below the storage root (``report.html``,
  ``trends.html``, their Markdown and figures) that its marker lists, streamed as stored;
* ``GET /results/summary/<date>/<run id>``  a Faasm run's ``summary.json`` as an HTML table.

A page opened without a login redirects to Airflow's login page and comes back after it.
Storage: the house storage root (``HOUSE_STORAGE_ROOT`` or the ``house_storage_root``
Variable, see ``house.config``), a local path or ``s3://`` (credentials from the usual
AWS environment of the API server).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import logging
import mimetypes
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse

from results_view import results_catalog as catalog

log = logging.getLogger(__name__)

PIPELINES = {
    "mirage_pipeline": "Mirage pipeline",
    "faasm_benchmarks": "Faasm benchmarks",
    "mirage_evaluation": "Mirage evaluation",
    "mirage_monthly": "Mirage monthly",  # the monthly gate's verdicts
    "mirage_service": "Mirage service",  # its missed deadlines
}
#: What a stored report page may load: its own embedded images and inline styles, nothing else.
REPORT_CSP = (
    "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'; "
    "frame-ancestors 'self'; base-uri 'none'; form-action 'none'"
)
#: Inside the Airflow UI the view is an iframe sandboxed without ``allow-top-navigation``, so a
#: ``target=_top`` link to a DAG run's page does nothing there. The UI's pages are one React app
#: on the same origin (its sandbox allows scripts and the same origin): this script moves the
#: app's own history to the link and tells its router, which is what a click inside the app does.
#: Outside a frame the link is an ordinary link. The one script the pages may run (its hash is in
#: the CSP).
TOP_LINK_JS = (
    "document.addEventListener('click',function(e){"
    "var a=e.target.closest&&e.target.closest('a.run-link');"
    "if(!a||window.top===window)return;"
    "var u=new URL(a.href);"
    "try{var t=window.top,h=t.history,i=((h.state&&h.state.idx)||0)+1;"
    "h.pushState({usr:null,key:Math.random().toString(36).slice(2,10),idx:i},'',u.pathname+u.search+u.hash);"
    "t.dispatchEvent(new PopStateEvent('popstate',{state:h.state}));e.preventDefault();}"
    "catch(err){}});"
)
_TOP_LINK_HASH = "sha256-" + base64.b64encode(hashlib.sha256(TOP_LINK_JS.encode()).digest()).decode()
#: The view's own pages: the same, plus the compare form (GET to this view) and the link script.
PAGE_CSP = REPORT_CSP.replace("form-action 'none'", "form-action 'self'") + f"; script-src '{_TOP_LINK_HASH}'"
#: Report steps per pipeline: (task id, report kind) for the task-instance "Report" tab.
REPORT_TASKS = {
    "mirage_pipeline": {"report": "mirage_report"},
    "faasm_benchmarks": {"summarize": "faasm_trends"},
    "mirage_evaluation": {"waitpred": "mirage_evaluation"},
    "mirage_monthly": {"gate": "mirage_gate"},
}
NOT_IN_DB = "not in Airflow's database"
#: The DAG whose runs are partitions (months): its reports are found by the run's partition key.
MONTHLY = "mirage_monthly"

app = FastAPI(
    title="Pipeline results",
    description="Reports of the Mirage and Faasm pipelines from storage",
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)


def storage_root() -> str:
    from house.config import get_config  # the plugins folder is on sys.path

    return get_config().storage_root.rstrip("/")


class NotLoggedIn(Exception):
    pass


async def current_user(request: Request):
    """The logged-in Airflow user, or :class:`NotLoggedIn`."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    auth = request.headers.get("authorization", "")
    token = auth[7:] if auth.lower().startswith("bearer ") else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    try:
        return await resolve_user_from_token(token)
    except HTTPException as exc:
        raise NotLoggedIn(exc.detail) from exc


def allowed_pipelines(user) -> set[str]:
    """The pipelines whose DAG runs ``user`` may read."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

    am = get_auth_manager()
    return {
        p
        for p in PIPELINES
        if am.is_authorized_dag(method="GET", access_entity=DagAccessEntity.RUN, details=DagDetails(id=p), user=user)
    }


@app.exception_handler(NotLoggedIn)
async def _login(request: Request, exc: NotLoggedIn):
    if request.url.path.rstrip("/").endswith("/api/reports") or "text/html" not in request.headers.get("accept", ""):
        return JSONResponse({"detail": f"Not authenticated ({exc})"}, status_code=401)
    from airflow.api_fastapi.app import get_auth_manager

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
    _, reports = await _reports(user)
    # paths are relative to the storage root, which is not shown
    return JSONResponse({"reports": [r.to_dict() for r in reports]})


def _page(title: str, body: str) -> HTMLResponse:
    style = (
        "body{font-family:system-ui,sans-serif;margin:1.2em;color:#222}h1{font-size:1.4em}"
        "table{border-collapse:collapse;font-size:13px;margin:.4em 0 1.2em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}"
        ".muted{color:#777}a{color:#0a58ca}.check.failed{color:#b00020;font-weight:600}"
    )
    doc = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{body}<script>{TOP_LINK_JS}</script></body></html>"
    )
    return HTMLResponse(doc, headers={"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-store"})


def _summary_text(r: catalog.Report) -> str:
    s = r.summary or {}
    # a day with failures says FAILED first: "0 points, 0 failed" must never stand for a day
    # whose every experiment group failed before its first point
    failed = "FAILED: " if s.get("status") == "FAILED" or _positive(s.get("failed")) else ""
    if r.kind == "faasm_summary":
        return f"{failed}{s.get('points', '?')} points, {s.get('failed', '?')} failed"
    if r.kind == "mirage_evaluation":
        c = s.get("criteria") if isinstance(s.get("criteria"), dict) else {}
        cov = c.get("coverage_months") if isinstance(c.get("coverage_months"), dict) else {}
        return (
            f"guard pick {s.get('pick', '?')}; MAE at or below zero wait's: {c.get('mae_at_or_below_zero', '?')}; "
            f"bound coverage per month: "
            + (", ".join(f"{m} {v:.0%}" if isinstance(v, (int, float)) else f"{m} ?" for m, v in cov.items()) or "?")
        )
    if r.kind == "mirage_gate":
        verdict = "PASSED" if s.get("passed") is True else "FAILED" if s.get("passed") is False else "?"
        return f"{verdict}; {s.get('earlier_months', '?')} earlier month(s) compared"
    if r.kind == "faasm_trends":
        return (
            f"{failed}{s.get('days', '?')} days window, {s.get('dates', '?')} days with results, "
            f"{s.get('runs', '?')} runs" + (f", {s.get('failed')} failures in this run" if failed else "")
        )
    return ", ".join(f"{k}: {v}" for k, v in list(s.items())[:4] if not isinstance(v, (dict, list)))


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _changed_text(changed: dict[str, Any]) -> str:
    if not changed:
        return "defaults"
    return ", ".join(
        f"{k}={json.dumps(v.get('value') if isinstance(v, dict) else v, default=str)}"
        for k, v in sorted(changed.items())
    )


#: task states that count as finished (skipped: a group not selected, a branch not taken)
FINISHED = {"success", "skipped"}


def airflow_runs(keys: set[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """What Airflow's metadata database says of these ``(dag_id, run_id)``: the run's ``state``,
    ``run_type`` (its trigger) and ``unfinished``, the task instances not finished (label, state),
    with ``groups``, the task groups they are in (a Faasm experiment x system). The view runs
    inside the api-server, which holds the database; a run the database does not know (deleted,
    another Airflow) is left out, and a database error leaves every run out (logged)."""
    if not keys:
        return {}
    try:
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session
        from sqlalchemy import select
    except ImportError:
        return {}

    def value(x: Any) -> str | None:
        return None if x is None else str(getattr(x, "value", x))

    dag_ids, run_ids = sorted({d for d, _ in keys}), sorted({r for _, r in keys})
    out: dict[tuple[str, str], dict[str, Any]] = {}
    try:
        with create_session() as session:
            for dag_id, run_id, state, run_type in session.execute(
                select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.run_type).where(
                    DagRun.dag_id.in_(dag_ids), DagRun.run_id.in_(run_ids)
                )
            ):
                if (dag_id, run_id) in keys:
                    out[(dag_id, run_id)] = {
                        "state": value(state),
                        "run_type": value(run_type),
                        "unfinished": [],
                        "groups": [],
                    }
            for dag_id, run_id, task_id, map_index, rendered, state in session.execute(
                select(TI.dag_id, TI.run_id, TI.task_id, TI.map_index, TI.rendered_map_index, TI.state)
                .where(TI.dag_id.in_(dag_ids), TI.run_id.in_(run_ids))
                .order_by(TI.task_id, TI.map_index)
            ):
                rec = out.get((dag_id, run_id))
                state = value(state) or "no status"
                if rec is None or state in FINISHED:
                    continue
                label = task_id if map_index is None or map_index < 0 else f"{task_id}[{rendered or map_index}]"
                rec["unfinished"].append((label, state))
                if "." in task_id and task_id.split(".", 1)[0] not in rec["groups"]:
                    rec["groups"].append(task_id.split(".", 1)[0])
    except Exception:  # the list still shows what storage says
        log.exception("results view: could not read DAG run states from the metadata database")
        return {}
    return out


def partition_runs(dag_id: str, keys: set[str]) -> dict[str, dict[str, Any]]:
    """``{partition key: {"run_id", "state"}}`` of ``dag_id``'s runs of these partitions (the latest
    run of each), from Airflow's metadata database; a database error leaves them all out (logged)."""
    if not keys:
        return {}
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select
    except ImportError:
        return {}
    out: dict[str, dict[str, Any]] = {}
    try:
        with create_session() as session:
            for run_id, key, state in session.execute(
                select(DagRun.run_id, DagRun.partition_key, DagRun.state)
                .where(DagRun.dag_id == dag_id, DagRun.partition_key.in_(sorted(keys)))
                .order_by(DagRun.run_after, DagRun.id)
            ):
                out[key] = {"run_id": run_id, "state": None if state is None else str(getattr(state, "value", state))}
    except Exception:  # the list still shows what storage says
        log.exception("results view: could not read %s's partition runs from the metadata database", dag_id)
        return {}
    return out


def partition_of(dag_id: str, run_id: str) -> str | None:
    """The partition key of a DAG run (Airflow's metadata database), or None."""
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session
        from sqlalchemy import select
    except ImportError:
        return None
    try:
        with create_session() as session:
            return session.scalar(
                select(DagRun.partition_key).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id).limit(1)
            )
    except Exception:
        log.exception("results view: could not read the partition of %s %s", dag_id, run_id)
        return None


def _unfinished_text(db: dict[str, Any] | None) -> str:
    if db is None:
        return "?"
    by_state: dict[str, list[str]] = {}
    for label, state in db["unfinished"]:
        by_state.setdefault(state, []).append(label)
    parts = []
    if db["groups"]:
        parts.append(f"experiments/groups not finished: {', '.join(db['groups'])}")
    for state, labels in sorted(by_state.items()):
        shown = ", ".join(labels[:8]) + (f" and {len(labels) - 8} more" if len(labels) > 8 else "")
        parts.append(f"{state}: {shown}")
    return "; ".join(parts) if parts else "none"


def _ui_run_href(dag_id: str, run_id: str) -> str:
    """The DAG run's page in the Airflow UI, relative to the view's root (``/results/``)."""
    return f"../dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def _run_cells(
    run: dict[str, Any] | None,
    key: str | None = None,
    *,
    dag_id: str = "",
    db: dict[tuple[str, str], dict[str, Any]] | None = None,
    prefix: str = "",
) -> str:
    if run is None:  # a run prefix written before the plan recorded its DAG runs
        return (
            f"<td class='run-id muted'>not recorded (storage key {_e(key)})</td><td class='state'></td>"
            "<td class='unfinished'></td><td class='logical-date'></td>"
            "<td class='trigger'></td><td class='params'></td>"
        )
    rid = str(run.get("run_id"))
    info = (db or {}).get((dag_id, rid))
    trigger = (info or {}).get("run_type") or run.get("trigger")
    state = info["state"] if info else "not in Airflow's database"
    link = (
        f"<a class='run-link' target='_top' href='{_e(prefix + _ui_run_href(dag_id, rid))}'>{_e(rid)}</a>"
        if info
        else _e(rid)
    )
    return (
        f"<td class='run-id'>{link}</td><td class='state'>{_e(state)}</td>"
        f"<td class='unfinished'>{_e(_unfinished_text(info))}</td>"
        f"<td class='logical-date'>{_e(run.get('logical_date'))}</td>"
        f"<td class='trigger'>{_e(trigger)}</td>"
        f"<td class='params'>{_e(_changed_text(run.get('changed') or {}))}</td>"
    )


def _href(r: catalog.Report) -> str:
    if r.kind == "faasm_summary":
        return "summary/" + quote(r.run)
    if r.kind == "mirage_evaluation":
        return "evaluation/" + quote(r.run, safe="")
    return "report/" + quote(r.path)


def _report_rows(
    reports: list[catalog.Report], kind: str, prefix: str = "", db: dict[tuple[str, str], dict[str, Any]] | None = None
) -> list[str]:
    rows = []
    for r in reports:
        runs = r.runs or [None]
        for run in runs:
            pick = (
                f"<td><input type='checkbox' name='run' value='{_e(r.run)}' "
                f"aria-label='compare {_e(run.get('run_id') if run else r.run)}'></td>"
                if kind == "mirage_report"
                else ""
            )
            cells = _run_cells(run, r.run, dag_id=r.pipeline, db=db, prefix=prefix)
            rows.append(
                f"<tr data-key='{_e(r.run)}'>{pick}{cells}<td>{_e(r.finished)}</td>"
                f"<td class='summary'>{_e(_summary_text(r))}</td>"
                f"<td><a class='report-link' href='{_e(prefix + _href(r))}'>open</a></td></tr>"
            )
    return rows


def _db_keys(reports: list[catalog.Report]) -> set[tuple[str, str]]:
    return {(r.pipeline, str(x["run_id"])) for r in reports for x in r.runs if x.get("run_id")}


@app.get("/", response_class=HTMLResponse)
async def index(request: Request) -> HTMLResponse:
    user = await current_user(request)
    _, reports = await _reports(user)
    db = await asyncio.to_thread(airflow_runs, _db_keys(reports))
    parts = [
        "<h1>Pipeline results</h1>",
        "<p class='muted'>Reports found under the house storage root, by DAG run: run id (a link to the run), "
        "its state and the tasks that did not finish (from Airflow), logical date, trigger and the params "
        "that differ from the DAG's defaults.</p>",
    ]
    sections = [
        ("mirage_report", "Mirage pipeline: validation reports"),
        ("faasm_trends", "Faasm benchmarks: trend reports"),
        ("faasm_summary", "Faasm benchmarks: run summaries"),
        ("mirage_evaluation", "Mirage evaluation: wait prediction on a site's log"),
    ]
    for kind, title in sections:
        rows = [r for r in reports if r.kind == kind]
        parts.append(f"<h2 id='{kind}'>{html.escape(title)}</h2>")
        if not rows:
            parts.append("<p class='muted'>None yet.</p>")
            continue
        pick = "<th>Compare</th>" if kind == "mirage_report" else ""
        table = (
            f"<table class='reports' data-kind='{kind}'><thead><tr>{pick}<th>DAG run</th><th>Run state</th>"
            "<th>Not finished</th><th>Logical date</th><th>Trigger</th><th>Params (not default)</th>"
            "<th>Report finished</th><th>Summary</th><th>Open</th>"
            "</tr></thead><tbody>" + "".join(_report_rows(rows, kind, db=db)) + "</tbody></table>"
        )
        if kind == "mirage_report":
            table = (
                f"<form id='compare' method='get' action='compare'>{table}"
                "<button type='submit'>Compare the two selected runs</button></form>"
            )
        parts.append(table)
    gates = sorted({r.run for r in reports if r.kind == "mirage_gate"})
    verdicts = {m: await asyncio.to_thread(catalog.gate_verdict, storage_root(), m) for m in gates}
    parts += _gate_section(reports, verdicts, await asyncio.to_thread(partition_runs, MONTHLY, set(gates)))
    parts += _deadline_section(await asyncio.to_thread(catalog.list_deadlines, storage_root()), allowed_pipelines(user))
    return _page("Pipeline results", "\n".join(parts))


def _table_section(anchor: str, title: str, empty: str, head: list[str], body: str) -> list[str]:
    """A titled table of the results page (``data-kind`` is the anchor), or the word for none."""
    out = [f"<h2 id='{anchor}'>{_e(title)}</h2>"]
    if not body:
        return [*out, f"<p class='muted'>{_e(empty)}</p>"]
    ths = "".join(f"<th>{_e(h)}</th>" for h in head)
    return [
        *out,
        f"<table class='reports' data-kind='{anchor}'><thead><tr>{ths}</tr></thead><tbody>{body}</tbody></table>",
    ]


def _num(v: Any, fmt: str) -> str:
    return format(v, fmt) if isinstance(v, (int, float)) and not isinstance(v, bool) else "?"


def _interval(iv: Any, fmt: str) -> str:
    lo, hi = iv if isinstance(iv, (list, tuple)) and len(iv) == 2 else (None, None)
    return f"[{_num(lo, fmt)}, {_num(hi, fmt)}]"


def _gate_verdict_text(r: catalog.Report, verdict: dict[str, Any] | None) -> str:
    """PASSED or FAILED from the stored verdict (its marker's summary when gate.json is unreadable)."""
    passed = verdict.get("passed") if verdict is not None else None
    if not isinstance(passed, bool):
        passed = (r.summary or {}).get("passed")
    word = "PASSED" if passed is True else "FAILED" if passed is False else "?"
    checks = [c for c in (verdict or {}).get("checks") or [] if isinstance(c, dict)]
    if checks:
        failed = sum(1 for c in checks if c.get("failed") is True)
        word += f" ({failed} of {len(checks)} checks failed)" if failed else f" (all {len(checks)} checks held)"
    return word


def _gate_numbers(verdict: dict[str, Any] | None) -> str:
    """The verdict's numbers, as the gate's log gives them: per node size the rule's mean
    interruption hours with their 95 % interval, reactive's and the average's; then every check:
    its value, interval and limit, failed ones first-marked FAIL."""
    if verdict is None:
        return "<span class='muted'>gate.json not readable: open the numbers</span>"
    rule = verdict.get("rule") or "rule"
    numbers = verdict.get("numbers") if isinstance(verdict.get("numbers"), dict) else {}
    checks = [c for c in verdict.get("checks") or [] if isinstance(c, dict)]
    out = []
    for node, x in numbers.items():
        if not isinstance(x, dict):
            continue
        out.append(
            f"<div class='node'>node {_e(node)} (n {_e(x.get('n'))}): {_e(rule)} "
            f"{_num(x.get('rule_interruption_h'), '.2f')} h {_interval(x.get('rule_interruption_ci'), '.2f')}; "
            f"reactive {_num(x.get('reactive_interruption_h'), '.2f')} h; "
            f"{_e(x.get('average'))} {_num(x.get('average_interruption_h'), '.2f')} h</div>"
        )
        for c in checks:
            if str(c.get("node")) != str(node):
                continue
            failed = c.get("failed") is True
            out.append(
                f"<div class='check {'failed' if failed else 'ok'}'>{'FAIL' if failed else 'ok'} vs {_e(c.get('bar'))}: "
                f"{_num(c.get('value'), '+.3f')} {_interval(c.get('interval'), '+.3f')}, "
                f"limit {_num(c.get('limit'), '+.3f')}</div>"
            )
    return "".join(out) or "<span class='muted'>no checks</span>"


def _gate_run_cells(run: dict[str, Any] | None, prefix: str = "") -> str:
    if run is None:
        return f"<td class='run-id muted'>{_e(NOT_IN_DB)}</td><td class='state'></td>"
    link = f"<a class='run-link' target='_top' href='{_e(prefix + _ui_run_href(MONTHLY, run['run_id']))}'>"
    return f"<td class='run-id'>{link}{_e(run['run_id'])}</a></td><td class='state'>{_e(run['state'])}</td>"


def _gate_section(
    reports: list[catalog.Report],
    verdicts: dict[str, dict[str, Any] | None],
    runs: dict[str, dict[str, Any]],
) -> list[str]:
    """mirage_monthly's gate: one row per month judged: the DAG run that judged it (Airflow's run of
    that partition) and its state, the verdict, the rule and margin, the numbers of every check
    (``gate.json``), the months compared, and a link to the numbers page (``gate.md``)."""
    body = ""
    for r in reports:
        if r.kind != "mirage_gate":
            continue
        v = verdicts.get(r.run)
        rule = f"{v.get('rule', '?')}, margin {_num(v.get('margin'), 'g')}" if v else "?"
        earlier = ", ".join(str(m) for m in (v or {}).get("earlier_months") or []) or "none"
        body += (
            f"<tr data-key='{_e(r.run)}'><td class='month'>{_e(r.run)}</td>{_gate_run_cells(runs.get(r.run))}"
            f"<td class='summary verdict'>{_e(_gate_verdict_text(r, v))}</td><td class='rule'>{_e(rule)}</td>"
            f"<td class='numbers'>{_gate_numbers(v)}</td><td class='earlier'>{_e(earlier)}</td>"
            f"<td>{_e(r.finished)}</td><td><a class='report-link' href='{_e(_href(r))}'>open</a></td></tr>"
        )
    title = "Mirage monthly gate: the primary rule, month by month"
    head = ["Month", "DAG run", "Run state", "Verdict", "Rule", "Numbers", "Earlier months", "Judged", "Open"]
    return _table_section("mirage_gate", title, "None yet.", head, body)


def _deadline_section(records: list[dict[str, Any]], allowed: set[str]) -> list[str]:
    """Missed deadlines (``house.deadlines``) of the DAGs the user may read, the latest first."""
    body = "".join(
        f"<tr><td>{_e(d['dag_id'])}</td><td class='run-id'>{_e(d.get('run_id'))}</td>"
        f"<td>{_e(d.get('queued_at'))}</td><td>{_e(d.get('interval'))}</td><td>{_e(d.get('deadline'))}</td>"
        f"<td>{_e(d.get('fired_at'))}</td><td>{_e(d.get('run_state'))}</td></tr>"
        for d in records
        if d.get("dag_id") in allowed
    )
    head = ["DAG", "DAG run", "Queued", "Interval", "Deadline", "Fired", "Run state then"]
    return _table_section("deadlines", "Missed deadlines", "None.", head, body)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


@app.get("/compare", response_class=HTMLResponse)
async def compare(request: Request) -> HTMLResponse:
    user = await current_user(request)
    if "mirage_pipeline" not in allowed_pipelines(user):
        raise HTTPException(403, "not allowed to read mirage_pipeline runs")
    keys = request.query_params.getlist("run")
    if len(keys) != 2:
        raise HTTPException(400, f"pick exactly two runs to compare (got {len(keys)})")
    root = storage_root()
    docs = []
    for key in keys:
        try:
            docs.append(await asyncio.to_thread(catalog.run_metrics, root, key))
        except KeyError:
            raise HTTPException(404, f"no Mirage run with metrics: {key}") from None
    a, b = docs

    def who(d: dict[str, Any]) -> str:
        runs = d["runs"]
        if not runs:
            return f"storage key {d['key']} (DAG run not recorded)"
        r = runs[0]
        more = f" (+{len(runs) - 1} more run(s) of the same configuration)" if len(runs) > 1 else ""
        return f"{r['run_id']} · {r.get('logical_date') or ''} · {r.get('trigger')}{more}"

    head = [
        "<h1>Compare Mirage runs</h1>",
        "<p><a href='./'>All reports</a></p>",
        "<table class='runs'><thead><tr><th></th><th>Run A</th><th>Run B</th></tr></thead><tbody>",
    ]
    for label, fn in (
        ("DAG run", who),
        ("Params (not default)", lambda d: _changed_text(d["runs"][0]["changed"]) if d["runs"] else "?"),
        ("Metrics finished", lambda d: d.get("finished") or ""),
        ("Validation rows", lambda d: _fmt(d.get("n_rows"))),
    ):
        head.append(f"<tr><th>{_e(label)}</th><td>{_e(fn(a))}</td><td>{_e(fn(b))}</td></tr>")
    links = [f"<a href='report/{quote(d['report'])}'>report</a>" if d["report"] else "no report" for d in (a, b)]
    head.append(f"<tr><th>Report</th><td>{links[0]}</td><td>{links[1]}</td></tr></tbody></table>")
    differs = _differences(a, b)
    head.append(
        "<h2>Inputs that differ</h2>"
        + (
            "<ul class='differs'>" + "".join(f"<li>{_e(x)}</li>" for x in differs) + "</ul>"
            if differs
            else "<p class='differs muted'>None recorded: same params and the same trace.</p>"
        )
    )
    rows = []
    for mn in sorted(set(a["headline"]) | set(b["headline"])):
        ma, mb = a["headline"].get(mn) or {}, b["headline"].get(mn) or {}
        ra, rb = a.get("rows", {}).get(mn) or {}, b.get("rows", {}).get(mn) or {}
        for metric in sorted(set(ma) | set(mb)):
            va, vb = ma.get(metric), mb.get(metric)
            diff = vb - va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) else None
            rows.append(
                f"<tr><td>{_e(mn)}</td><td>{_e(metric)}</td><td class='a'>{_e(_fmt(va))}</td>"
                f"<td class='a-ci'>{_e(_ci_text(ra, metric))}</td><td class='a-n'>{_e(_fmt(ra.get('n')))}</td>"
                f"<td class='b'>{_e(_fmt(vb))}</td><td class='b-ci'>{_e(_ci_text(rb, metric))}</td>"
                f"<td class='b-n'>{_e(_fmt(rb.get('n')))}</td><td class='diff'>{_e(_fmt(diff))}</td></tr>"
            )
    boot = a.get("bootstrap") or b.get("bootstrap")
    note = (
        "<p class='muted'>95 % intervals: paired bootstrap percentile intervals of the metrics step"
        + (f" ({_e(boot)} draws)" if boot else "")
        + "; n: validation samples of that model and node size. "
        "With a few samples the intervals are wide: a difference inside both intervals is not evidence.</p>"
    )
    body = (
        (
            "<h2>Headline metrics (all samples)</h2>" + note + "<table class='compare'><thead><tr>"
            "<th>Model @ node size</th><th>Metric</th><th>Run A</th><th>A 95 % interval</th><th>A n</th>"
            "<th>Run B</th><th>B 95 % interval</th><th>B n</th><th>B - A</th></tr></thead><tbody>"
            + "".join(rows)
            + "</tbody></table>"
        )
        if rows
        else "<p class='muted'>No headline metrics recorded.</p>"
    )
    return _page("Compare Mirage runs", "\n".join(head) + body)


#: headline metric -> the metrics step's interval columns (mirage_tasks.evaluation.metrics)
CI_COLUMNS = {
    "mean_interruption_h": "mean_interruption",
    "zero_share": "zero_share",
    "reduction_vs_reactive": "reduction",
    "diff_vs_avg_h": "diff_vs_avg",
}


def _ci_text(row: dict[str, Any], metric: str) -> str:
    col = CI_COLUMNS.get(metric)
    lo, hi = (row.get(f"{col}_ci_lo"), row.get(f"{col}_ci_hi")) if col else (None, None)
    if not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return "not recorded" if row else "no per-sample table"
    return f"[{_fmt(float(lo))}, {_fmt(float(hi))}]"


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between the two runs' inputs: their params as given (the DAG runs' records)
    and the traces their validations replayed (trace fingerprints of the metrics step's inputs)."""
    out = []
    pa = (a["runs"][0].get("params") or {}) if a["runs"] else {}
    pb = (b["runs"][0].get("params") or {}) if b["runs"] else {}
    keys = sorted(k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k))
    for k in keys:
        out.append(f"param {k}: A {json.dumps(pa.get(k), default=str)}, B {json.dumps(pb.get(k), default=str)}")
    ta, tb = a.get("traces") or [], b.get("traces") or []
    if ta and tb and ta != tb:
        why = ""
        if "seed" in keys and not (pa.get("trace") or pb.get("trace")):
            why = (
                ": both validated on a synthetic trace drawn with the run's seed, so changing the seed also "
                "changed the workload; the metrics compare different workloads, not only different models"
            )
        out.append(f"trace: A {', '.join(t[:12] for t in ta)}, B {', '.join(t[:12] for t in tb)} (fingerprints){why}")
    return out


def _reports_of_run(root: str, dag_id: str, run_id: str) -> list[catalog.Report]:
    """The reports a DAG run made or used; a mirage_monthly run's: the gate verdict of its partition (month)."""
    if dag_id == MONTHLY:
        month = partition_of(dag_id, run_id)
        return [r for r in catalog.list_reports(root) if r.pipeline == dag_id and r.run == month] if month else []
    return catalog.runs_of(root, dag_id, run_id)


@app.get("/dag-run/{dag_id}/{run_id}", response_class=HTMLResponse)
async def dag_run_results(dag_id: str, run_id: str, request: Request) -> HTMLResponse:
    """The "Results" tab of a DAG run: the reports it made or used."""
    user = await current_user(request)
    if dag_id not in PIPELINES:
        return _page("Results", f"<p class='muted'>{_e(dag_id)} writes no reports to the results view.</p>")
    if dag_id not in allowed_pipelines(user):
        raise HTTPException(403, f"not allowed to read {dag_id} runs")
    reports = await asyncio.to_thread(_reports_of_run, storage_root(), dag_id, run_id)
    db = (await asyncio.to_thread(airflow_runs, {(dag_id, run_id)})).get((dag_id, run_id))
    parts = [
        f"<h1>{_e(PIPELINES[dag_id])}: results of {_e(run_id)}</h1>",
        "<p><a href='../../'>All reports</a></p>",
        f"<p class='run-state'>Run state: {_e(db['state'] if db else 'not in Airflow database')}; "
        f"not finished: {_e(_unfinished_text(db))}</p>",
    ]
    if not reports:
        parts.append("<p class='muted'>No report of this DAG run yet.</p>")
    for r in reports:
        if r.kind == "mirage_gate":  # a month's verdict: the run's partition, no run record in storage
            v = await asyncio.to_thread(catalog.gate_verdict, storage_root(), r.run)
            parts.append(
                f"<table class='reports' data-kind='{r.kind}'><tbody>"
                f"<tr><th>Report</th><td><a class='report-link' href='../../{_e(_href(r))}'>{_e(r.kind)}</a></td></tr>"
                f"<tr><th>Month</th><td>{_e(r.run)}</td></tr>"
                f"<tr><th>Verdict</th><td class='verdict'>{_e(_gate_verdict_text(r, v))}</td></tr>"
                f"<tr><th>Numbers</th><td class='numbers'>{_gate_numbers(v)}</td></tr></tbody></table>"
            )
            continue
        run = next(x for x in r.runs if x["run_id"] == run_id)
        parts.append(
            f"<table class='reports' data-kind='{r.kind}'><tbody>"
            f"<tr><th>Report</th><td><a class='report-link' href='../../{_e(_href(r))}'>{_e(r.kind)}</a>"
            f"</td></tr><tr><th>Logical date</th><td>{_e(run.get('logical_date'))}</td></tr>"
            f"<tr><th>Trigger</th><td>{_e((db or {}).get('run_type') or run.get('trigger'))}</td></tr>"
            f"<tr><th>Params (not default)</th><td>{_e(_changed_text(run.get('changed') or {}))}</td></tr>"
            f"<tr><th>Summary</th><td>{_e(_summary_text(r))}</td></tr></tbody></table>"
        )
    return _page(f"Results of {run_id}", "\n".join(parts))


@app.get("/task/{dag_id}/{run_id}/{task_id}")
async def task_report(dag_id: str, run_id: str, task_id: str, request: Request) -> Response:
    """The "Report" tab of a task instance: its report, for the steps that write one."""
    user = await current_user(request)
    kind = REPORT_TASKS.get(dag_id, {}).get(task_id)
    if kind is None:
        return _page(
            "Report",
            f"<p class='muted'>Task {_e(task_id)} of {_e(dag_id)} writes no report. "
            f"<a href='../../../dag-run/{quote(dag_id)}/{quote(run_id, safe='')}'>"
            "This run's results</a></p>",
        )
    if dag_id not in allowed_pipelines(user):
        raise HTTPException(403, f"not allowed to read {dag_id} runs")
    reports = [r for r in await asyncio.to_thread(_reports_of_run, storage_root(), dag_id, run_id) if r.kind == kind]
    if not reports:
        return _page("Report", f"<p class='muted'>No committed report of {_e(run_id)} yet.</p>")
    return RedirectResponse(f"../../../report/{quote(reports[0].path)}", status_code=303)


def _pipeline_of(rel: str) -> str:
    return rel.split("/", 1)[0]


@app.get("/report/{rel:path}")
async def report_file(rel: str, request: Request) -> Response:
    user = await current_user(request)
    if _pipeline_of(rel) not in allowed_pipelines(user):
        raise HTTPException(403, "not allowed to read this pipeline's runs")
    try:
        f = await asyncio.to_thread(catalog.open_servable, storage_root(), rel)
    except KeyError:
        raise HTTPException(404, f"no report file {rel}") from None
    ctype = mimetypes.guess_type(rel)[0] or "application/octet-stream"
    if rel.endswith(".md"):
        ctype = "text/plain"
    if ctype.startswith("text/") or ctype.endswith("json"):
        ctype += "; charset=utf-8"
    headers = {"Content-Security-Policy": REPORT_CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}
    if f.size is not None:
        headers["Content-Length"] = str(f.size)
    # in chunks from the open file (Starlette iterates a plain iterator in its thread pool): a
    # 300 MB report costs one chunk of memory per request, not 300 MB
    return StreamingResponse(f.chunks(), media_type=ctype, headers=headers)


#: A stored page the view renders itself is read whole: larger than this, it is refused (413), not read.
RENDER_LIMIT = 8 << 20


@app.get("/evaluation/{name}", response_class=HTMLResponse)
async def evaluation(name: str, request: Request) -> HTMLResponse:
    """A site's log through ``mirage_evaluation``: the wait predictor's page (``waitpred.md``: the
    guard's pick, the candidates out of sample, per month MAE, within 1 h and the bound's coverage),
    rendered as HTML. Raw HTML in the stored Markdown is escaped, never passed through."""
    user = await current_user(request)
    if "mirage_evaluation" not in allowed_pipelines(user):
        raise HTTPException(403, "not allowed to read mirage_evaluation runs")
    if not catalog.RUN_KEY.match(name):
        raise HTTPException(404, f"no evaluation named {name}")
    rel = f"mirage_evaluation/{name}/waitpred/waitpred.md"
    try:
        f = await asyncio.to_thread(catalog.open_servable, storage_root(), rel)
    except KeyError:
        raise HTTPException(404, f"no committed wait prediction for {name}") from None
    try:
        if f.size is not None and f.size > RENDER_LIMIT:
            raise HTTPException(413, f"{rel} is {f.size} bytes, over the view's {RENDER_LIMIT} byte limit")
        data = await asyncio.to_thread(f.f.read, RENDER_LIMIT + 1)
    finally:
        f.close()
    if len(data) > RENDER_LIMIT:
        raise HTTPException(413, f"{rel} is over the view's {RENDER_LIMIT} byte limit")
    from markdown_it import MarkdownIt  # only this page renders Markdown

    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    body = md.render(data.decode("utf-8", errors="replace"))
    raw = f"../report/{quote(f'mirage_evaluation/{name}/waitpred/waitpred.json')}"
    return _page(
        f"Wait prediction: {name}",
        f"<p><a href='../'>All reports</a> · <a href='{_e(raw)}'>waitpred.json</a></p>{body}",
    )


SUMMARY_COLS = [
    "experiment",
    "system",
    "params",
    "repeat",
    "arm",
    "attempt",
    "status",
    "run_time_ms",
    "throughput_ok",
    "p50_us",
    "p99_us",
    "memory_gb_s",
    "error",
]


@app.get("/summary/{date}/{run_id}", response_class=HTMLResponse)
async def summary(date: str, run_id: str, request: Request) -> HTMLResponse:
    user = await current_user(request)
    if "faasm_benchmarks" not in allowed_pipelines(user):
        raise HTTPException(403, "not allowed to read faasm_benchmarks runs")
    rel = f"faasm_benchmarks/{date}/{run_id}/summary/summary.json"
    try:
        raw = await asyncio.to_thread(catalog.read, storage_root(), rel)
    except catalog.TooLarge:
        raise HTTPException(413, f"{rel} is over the {catalog.SUMMARY_LIMIT} bytes the view reads whole") from None
    except KeyError:
        raise HTTPException(404, f"no summary for {date}/{run_id}") from None
    try:
        doc: Any = json.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError(f"a JSON {type(doc).__name__}, not a summary")
    except ValueError as exc:  # a damaged summary is a failure to show, not a missing page
        body = (
            f"<h1>Faasm benchmarks: run {_e(run_id)} on {_e(date)}</h1><p class='failed'><b>FAILED</b>: "
            f"the summary {_e(rel)} cannot be read ({_e(type(exc).__name__)}: {_e(exc)}); rerun summarize "
            "for this run.</p>"
        )
        page = _page(f"Faasm run {run_id}: FAILED", body)
        page.status_code = 422  # the stored file, not the request, is at fault: its cause is on the page
        return page
    points = [p for p in doc.get("points") or [] if isinstance(p, dict)]
    head = "".join(f"<th>{_e(c)}</th>" for c in SUMMARY_COLS)
    body = "".join("<tr>" + "".join(f"<td>{_e(p.get(c))}</td>" for c in SUMMARY_COLS) + "</tr>" for p in points)
    trends = f"../../report/faasm_benchmarks/{quote(date)}/{quote(run_id)}/trends/trends.html"
    failed = doc.get("failed", 0)
    verdict = "<b>FAILED</b>: " if doc.get("status") == "FAILED" or _positive(failed) else ""
    if doc.get("trustworthy") is False:  # the run's A/A control failed (faasm_tasks.trends.aa_control)
        verdict += f"<b>UNTRUSTWORTHY</b> (A/A control: {_e(doc.get('aa_verdict'))}): "
    # every field of the stored document is data: escaped, whatever wrote it
    parts = [
        f"<h1>Faasm benchmarks: run {_e(run_id)} on {_e(date)}</h1>",
        f"<p>{verdict}{len(points)} points, {_e(failed)} failed. "
        f"<a href='{_e(trends)}'>Trend report</a> · <a href='../../'>All reports</a></p>",
    ]
    fails = [
        {
            "what": f"{g.get('experiment')}/{g.get('system')} (whole group)",
            "step": g.get("step"),
            "cause": g.get("error"),
        }
        for g in doc.get("failed_groups") or []
        if isinstance(g, dict)
    ]
    fails += [
        {"what": p.get("uri"), "step": "read", "cause": p.get("error")}
        for p in doc.get("unreadable") or []
        if isinstance(p, dict)
    ]
    if fails:
        rows = "".join(
            f"<tr><td>{_e(f['what'])}</td><td>{_e(f['step'])}</td><td>{_e(f['cause'])}</td></tr>" for f in fails
        )
        parts.append(
            "<h2>Failed without points, or unreadable</h2><table><thead><tr><th>what</th><th>step</th>"
            f"<th>cause</th></tr></thead><tbody>{rows}</tbody></table>"
        )
    parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return _page(f"Faasm run {run_id}", "\n".join(parts))
