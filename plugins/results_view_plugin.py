"""The Airflow plugin of the results view: the FastAPI app at ``/results`` and its menu entry.

Airflow's plugin manager imports every ``.py`` file of the plugins folder; this one
registers :class:`ResultsViewPlugin` (the package ``results_view/`` is in ``.airflowignore``,
so the loader imports it only as a package). The view itself is in ``results_view.results_app``.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from results_view.results_app import app

URL_PREFIX = "/results"


class ResultsViewPlugin(AirflowPlugin):
    name = "results_view"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Pipeline results"}]
    # Inside the Airflow UI (each an iframe in its layout): a "Pipeline results" entry in the
    # Browse menu (the list); a "Results" tab on every DAG run (that run's reports); a "Report"
    # tab on every task instance (a report step's report; other tasks say they write none),
    # where the steps' "Report" extra link leads (house.links). The UI fills in {DAG_ID},
    # {RUN_ID} and {TASK_ID}; hrefs are relative to the UI's base URL. Each view needs its own
    # url_route: Airflow keeps the first view of a route and drops the others with only a warning
    # in the api-server log (the run tab sharing "results" with the menu entry never appeared).
    external_views = [
        {
            "name": "Pipeline results",
            "href": "results/",
            "destination": "nav",
            "category": "browse",
            "url_route": "results",
        },
        {
            "name": "Results",
            "href": "results/dag-run/{DAG_ID}/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "run-results",
        },
        {
            "name": "Report",
            "href": "results/task/{DAG_ID}/{RUN_ID}/{TASK_ID}",
            "destination": "task_instance",
            "url_route": "report",
        },
    ]
