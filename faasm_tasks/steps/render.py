"""Render the knative manifests of an experiment to a YAML file (no cluster needed)."""

from __future__ import annotations

import yaml

from stepkit import storage

from ..common import add_common, load_plan, run_date
from ..targets.knative import render


def add_arguments(p):
    add_common(p, experiment=True, experiment_required=True)
    p.add_argument("--out", help="output URI (default <results>/<date>/<run-id>/manifests/<experiment>-<system>.yaml)")


def run(args) -> int:
    args.target = "knative"
    date = run_date(args)
    plan = load_plan(args)
    docs = render(
        plan, namespace=args.namespace, run_id=args.run_id, release=args.release, registry=args.image_registry
    )
    out = args.out or storage.join(args.results, date, args.run_id, "manifests", f"{plan.name}-{plan.system}.yaml")
    storage.write_bytes(out, yaml.safe_dump_all(docs, sort_keys=False).encode())
    print(f"render: {len(docs)} manifests -> {out}", flush=True)
    return 0
