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
    # A "Results" entry in the Browse menu showing the list inside the Airflow UI (iframe).
    external_views = [{"name": "Pipeline results", "href": "results/", "destination": "nav",
                       "category": "browse", "url_route": "results"}]
