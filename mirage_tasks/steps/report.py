"""``python -m mirage_tasks report``: one self-contained HTML (and Markdown) results report.

The page is built by :mod:`mirage_tasks.evaluation.report` from the committed outputs given with
``--in`` (metrics, validate, fidelity, train, datasets). Outputs under ``--out``:
``report.html``, ``report.md``, ``figures/*.png``, then ``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse

from stepkit import Step, StepError, storage

from .. import __version__

#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {"bootstrap": (0, 100_000)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--in",
        dest="inputs",
        nargs="+",
        required=True,
        help="step output prefixes (metrics, validate, fidelity, train, ...)",
    )
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument("--title", default="Mirage: online validation results", help="page title")
    p.add_argument(
        "--bootstrap",
        type=int,
        default=2000,
        help="bootstrap draws when metrics are computed here from validate outputs (2000)",
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed when metrics are computed here (0)")


#: where the plan records each DAG run of a run prefix (mirage_tasks.run.runlog.RUNS_DIR; steps sit
#: below the run layer, so the name is repeated here and tests/mirage/test_report.py checks both agree)
RUNS_DIR = "_runs"


def read_runs(prefix: str) -> list[dict]:
    """The DAG-run records of run prefix ``prefix``, oldest first; [] outside a DAG run."""
    base = storage.join(prefix, RUNS_DIR)
    out = []
    for name in storage.list_files(base):
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            doc = storage.read_json(storage.join(base, name))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("run_id"), str):
            out.append(doc)
    return sorted(out, key=lambda d: str(d.get("recorded") or ""))


def run(args: argparse.Namespace) -> int:
    from ..evaluation.report import KNOWN_STEPS, build, classify

    items = classify(list(args.inputs))
    if not any(i["step"] in KNOWN_STEPS for i in items):
        raise StepError(
            f"none of the inputs is a {', '.join(KNOWN_STEPS)} output "
            f"(got steps {sorted({str(i['step']) for i in items})})"
        )
    params = {"title": args.title, "bootstrap": args.bootstrap, "seed": args.seed}
    step = Step("report", args.out, __version__, params, inputs=list(args.inputs))
    if step.skip():
        return 0
    # the DAG runs this run prefix was made for (the plan's records beside the report folder):
    # the report names them, their size and their params as given, not only the steps' argv
    prefix = storage.normalize(args.out).rstrip("/").rsplit("/", 1)[0]
    page, md, figures, summary = build(
        items, args.title, args.bootstrap, args.seed, runs=read_runs(prefix), prefix=prefix
    )
    for name, png in sorted(figures.items()):
        step.write_bytes(f"figures/{name}", png)
    step.write_bytes("report.md", md.encode())
    step.write_bytes("report.html", page.encode())
    step.commit(summary=summary)
    print(f"report: {step.path('report.html')} ({len(page) / 1e6:.1f} MB, {len(figures)} figure(s))", flush=True)
    return 0
