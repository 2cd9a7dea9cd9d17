"""Operator extra link of the house steps: "Report", to the step's report in the results view.

Airflow 3 computes the link on the worker when the task finishes (from the rendered
``argv``) and stores it as an XCom; the UI shows it as a button on the task instance.
Steps with a report:

* ``mirage_tasks report ... --out <prefix>``         -> ``<prefix>/report.html``
* ``faasm_tasks summarize --results R --run-id I --date D`` -> ``R/D/I/trends/trends.html``

Any other step gets no link (an empty URL). The link opens the report inside the Airflow
UI's layout: the task instance's "Report" tab (``<[api] base_url>/dags/<dag>/runs/<run>/tasks/
<task>/plugin/report``, an external view of ``plugins/results_view_plugin.py`` that shows the
results view's page for that task in a frame). Without a task instance key it points into the
results view itself: ``<base_url>/results/report/<path below the storage root>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseOperatorLink

from house import config as house_config

VIEW_PREFIX = "/results"


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _strip(uri: str) -> str:
    """A storage URI without ``file://`` and trailing slashes (``s3://`` kept)."""
    uri = uri[len("file://") :] if uri.startswith("file://") else uri
    return uri.rstrip("/")


def report_uri(package: str, argv: Sequence[Any]) -> str | None:
    """The report page a step writes, from its command line; None for steps without one."""
    args = [str(a) for a in argv or ()]
    if not args:
        return None
    if package == "mirage_tasks" and args[0] == "report":
        out = _flag(args, "--out")
        return f"{_strip(out)}/report.html" if out else None
    if package == "faasm_tasks" and args[0] == "summarize":
        results, run_id, date = _flag(args, "--results"), _flag(args, "--run-id"), _flag(args, "--date")
        if results and run_id and date:
            return f"{_strip(results)}/{date}/{run_id}/trends/trends.html"
    return None


def ui_tab_url(dag_id: str, run_id: str, task_id: str, base_url: str = "", map_index: int = -1) -> str:
    """The Airflow UI page of a task instance's "Report" tab (the results view in the UI's layout)."""
    task = f"tasks/{quote(task_id, safe='')}" + (
        f"/mapped/{int(map_index)}" if map_index is not None and int(map_index) >= 0 else ""
    )
    return f"{base_url.rstrip('/')}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/{task}/plugin/report"


def view_url(uri: str, storage_root: str, base_url: str = "") -> str | None:
    """The results-view URL of a report stored at ``uri``; None when it is outside the storage root."""
    root = _strip(storage_root)
    uri = _strip(uri)
    if not uri.startswith(root + "/"):
        return None
    rel = uri[len(root) + 1 :]
    return f"{base_url.rstrip('/')}{VIEW_PREFIX}/report/{quote(rel)}"


class StepReportLink(BaseOperatorLink):
    """The "Report" button of the ``report`` (Mirage) and ``summarize`` (Faasm) steps."""

    name = "Report"

    def get_link(self, operator, *, ti_key) -> str:
        argv = getattr(operator, "argv", None)
        if argv is None or not isinstance(argv, (list, tuple)):
            argv = getattr(operator, "arguments", None) or []
        if not isinstance(argv, (list, tuple)):
            return ""
        uri = report_uri(getattr(operator, "package", ""), argv)
        if not uri:
            return ""
        try:
            from airflow.sdk import conf

            base_url = conf.get("api", "base_url", fallback="") or ""
        except Exception:  # noqa: BLE001 - no configuration: a root-relative link still works in the UI
            base_url = ""
        direct = view_url(uri, house_config.get_config().storage_root, base_url)
        if not direct:
            return ""
        if ti_key is None:
            return direct
        return ui_tab_url(ti_key.dag_id, ti_key.run_id, ti_key.task_id, base_url, getattr(ti_key, "map_index", -1))
