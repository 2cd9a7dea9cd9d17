"""Results in the Airflow UI: the reports of both pipelines, read from the house storage root.

``results_catalog`` finds and reads reports (fsspec), ``results_app`` serves them (FastAPI,
behind Airflow's login); ``plugins/results_view_plugin.py`` registers the app and a menu entry. Operator
extra links to a task's report are in ``house.links``.
"""
