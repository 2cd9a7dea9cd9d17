"""The lab wing: what produces the results pages and research campaigns, not what a DAG runs.

It may import the product (``mirage_tasks``, ``faasm_tasks``, ``stepkit``); the product never
imports it. See lab/README.md for what lives here and how each piece is run.
"""
