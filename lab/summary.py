"""``python -m lab summary --run PREFIX``: what a pipeline run produced, and where.

Reads the success markers below a run prefix (one per committed step output) and prints
one line per output with its step, summary figures and location, plus the headline
tables that steps leave as Markdown (``*.md``). Read-only; writes nothing.
"""

from __future__ import annotations

import argparse
import json

from stepkit import MARKER, StepError, storage


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", required=True, help="a pipeline run's storage prefix")
    p.add_argument(
        "--show-md",
        action="append",
        default=[],
        help="also print Markdown files with this name (repeatable), e.g. fit_report.md",
    )


def collect(run_uri: str) -> list[tuple[str, dict]]:
    """(output prefix, marker) for every committed output below ``run_uri``, sorted by path."""
    found = []
    for rel in storage.list_files(run_uri):
        if rel == MARKER or rel.endswith("/" + MARKER):
            prefix = (
                storage.join(run_uri, rel[: -len(MARKER)].rstrip("/")) if rel != MARKER else storage.normalize(run_uri)
            )
            found.append((prefix, storage.read_json(storage.join(run_uri, rel))))
    return sorted(found, key=lambda x: (x[1].get("finished", ""), x[0]))


def run(args: argparse.Namespace) -> int:
    if not storage.exists(args.run):
        raise StepError(f"--run {args.run}: nothing there")
    outputs = collect(args.run)
    if not outputs:
        raise StepError(f"--run {args.run}: no committed step outputs (no {MARKER} below it)")
    print(f"Run outputs under {storage.normalize(args.run)}:")
    for prefix, marker in outputs:
        summary = ", ".join(f"{k}={v}" for k, v in marker.get("summary", {}).items() if not isinstance(v, dict | list))
        print(f"  {marker.get('step', '?'):<12} {prefix}")
        if summary:
            print(f"  {'':<12} {summary}")
        for name in args.show_md:
            if name in marker.get("outputs", {}):
                print()
                print(storage.read_bytes(storage.join(prefix, name)).decode())
    print(json.dumps({"run": storage.normalize(args.run), "outputs": len(outputs)}))
    return 0
