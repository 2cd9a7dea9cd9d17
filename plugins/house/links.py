"""Operator extra link of the house steps: "Report", to the step's report in the results view.

Airflow 3 computes the link on the worker when the task finishes (from the rendered
``argv``) and stores it as an XCom; the UI shows it as a button on the task instance.
Steps with a report:

* ``mirage_tasks report ... --out <prefix>``         -> ``<prefix>/report.html``
* ``faasm_tasks summarize --results R --run-id I --date D`` -> ``R/D/I/trends/trends.html``

Any other step gets no link (an empty URL). The link points into the results view
(``plugins/results_view``) at ``<[api] base_url>/results/report/<path below the storage root>``.
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
    uri = uri[len("file://"):] if uri.startswith("file://") else uri
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


def view_url(uri: str, storage_root: str, base_url: str = "") -> str | None:
    """The results-view URL of a report stored at ``uri``; None when it is outside the storage root."""
    root = _strip(storage_root)
    uri = _strip(uri)
    if not uri.startswith(root + "/"):
        return None
    rel = uri[len(root) + 1:]
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
            from airflow.sdk import conf  # noqa: PLC0415

            base_url = conf.get("api", "base_url", fallback="") or ""
        except Exception:  # noqa: BLE001 - no configuration: a root-relative link still works in the UI
            base_url = ""
        return view_url(uri, house_config.get_config().storage_root, base_url) or ""
