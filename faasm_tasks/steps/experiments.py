"""List (and thereby validate) the experiment catalogue, or print one experiment's points."""

from __future__ import annotations

import json

from ..catalogue import get_experiment, load_catalogue, resolve


def add_arguments(p):
    p.add_argument("--catalogue-dir", action="append", default=[])
    p.add_argument("--show", help="print the resolved points of this experiment")
    p.add_argument("--system", choices=["wasm", "native"], default="native")
    p.add_argument("--target", choices=["local", "knative"], default="knative")


def run(args) -> int:
    if args.show:
        plan = resolve(get_experiment(args.show, args.catalogue_dir), args.system, args.target)
        print(json.dumps({"deployment": plan.deployment, "driver": plan.driver, "points": plan.points}, indent=2))
        return 0
    for name, exp in sorted(load_catalogue(args.catalogue_dir).items()):
        n = {s: len(resolve(exp, s, "knative").points) for s in exp["systems"]}
        print(f"{name:<26} {exp['workload']:<10} points {n}  ({exp['_source']})")
    return 0
