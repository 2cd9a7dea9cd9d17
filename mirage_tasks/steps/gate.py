"""``python -m mirage_tasks gate``: fail a month whose primary decision rule regressed.

``mirage_monthly`` runs it after each month's ``mirage_pipeline`` run (run id
``samples_complete__<YYYY-MM>``). The plan of every pipeline run records which DAG run used its
prefix (``<runs>/<prefix>/_runs/<run>.json``, :mod:`mirage_tasks.run.runlog`), so the gate
finds the month's committed ``metrics`` output, and the earlier months', by run id; the
judgement is :mod:`mirage_tasks.evaluation.gate` (the rule against reactive, the calibrated
average and the earlier months, each on the month's interval, with ``--margin``).

Only months strictly before ``--month`` are read (at most ``--history-months`` of them, the
most recent): a later month's output is never opened, so a backfill of old months judges each
one as it would have been judged then.

Output under ``--out``: ``gate.json`` (the verdict: every check with its numbers, the
months compared) and ``gate.md``, then ``_SUCCESS.json``. Exit 0 when the month passed, **1**
when it regressed (the numbers in the log), 2 on bad input (a month without committed
metrics, metrics without the rule's rows). A rerun with the same inputs skips and gives the
committed verdict's exit code again, so a retry never turns a failed gate into a pass.
"""

from __future__ import annotations

import argparse
import json
import re

from stepkit import Step, StepError, storage
from stepkit.step import require_committed

from .. import __version__

#: Each numeric flag's range (inclusive), checked before anything is read.
BOUNDS = {"margin": (0.0, 10.0), "history_months": (1, 120)}
#: The run id mirage_monthly gives the pipeline run of a month (``mirage_tasks.run.plan.month_run``).
RUN_ID = re.compile(r"^samples_complete__(\d{4}-(?:0[1-9]|1[0-2]))$")
GATE_JSON, GATE_MD = "gate.json", "gate.md"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", required=True, help="the pipeline runs' root, <storage root>/mirage_pipeline")
    p.add_argument("--month", required=True, help="the month judged, YYYY-MM")
    p.add_argument("--rule", default="xgboost", help="the primary decision rule (a validated model; xgboost)")
    p.add_argument(
        "--margin",
        type=float,
        default=0.10,
        help="how much worse than a bar (a fraction: 0.10 = 10%%) the whole interval must be to fail (0.10)",
    )
    p.add_argument("--history-months", type=int, default=12, help="earlier months compared, most recent first (12)")
    p.add_argument("--out", required=True, help="output prefix URI of the verdict")


def month_prefixes(runs: str) -> dict[str, list[str]]:
    """``{month: [run prefix, ...]}`` of every pipeline run recorded with a monthly run id.

    Reads only the small ``_runs`` records; no metrics are opened here."""
    fs, base = storage.filesystem(runs)
    if not fs.exists(base):
        raise StepError(f"--runs {runs}: nothing there (no mirage_pipeline run has been planned)")
    out: dict[str, list[str]] = {}
    for path in sorted(fs.glob(base.rstrip("/") + "/*/_runs/*.json")):
        rel = path[len(base.rstrip("/")) + 1 :]
        prefix_name = rel.split("/", 1)[0]
        try:
            doc = json.loads(storage.read_bytes(storage.join(runs, rel)))
        except (ValueError, OSError) as exc:
            raise StepError(f"{storage.join(runs, rel)}: unreadable run record ({exc})") from exc
        m = RUN_ID.match(str(doc.get("run_id", ""))) if isinstance(doc, dict) else None
        if m:
            out.setdefault(m.group(1), []).append(storage.join(runs, prefix_name))
    return out


def committed_metrics(prefixes: list[str]) -> str | None:
    """The committed ``metrics`` output among ``prefixes`` (the latest finished when several)."""
    found = []
    for prefix in prefixes:
        uri = storage.join(prefix, "metrics")
        if storage.exists(storage.join(uri, "_SUCCESS.json")):
            found.append((storage.read_json(storage.join(uri, "_SUCCESS.json")).get("finished", ""), uri))
    return max(found)[1] if found else None


def read_month(uri: str, rule: str) -> dict:
    from ..evaluation.gate import month_numbers

    require_committed(uri, "metrics")
    where = storage.join(uri, "metrics.json")
    try:
        doc = json.loads(storage.read_bytes(where))
    except ValueError as exc:
        raise StepError(f"{where}: not JSON ({exc})") from exc
    return month_numbers(doc, rule, where)


def run(args: argparse.Namespace) -> int:
    from ..evaluation.gate import judge, lines

    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", args.month):
        raise StepError(f"--month {args.month!r}: expected YYYY-MM")
    if not 0 <= args.margin < 10:
        raise StepError(f"--margin {args.margin}: expected a fraction in [0, 10)")
    months = month_prefixes(args.runs)
    this = committed_metrics(months.get(args.month, []))
    if this is None:
        raise StepError(
            f"month {args.month}: no committed metrics under {args.runs} for run samples_complete__{args.month} "
            "(did its mirage_pipeline run finish?)"
        )
    # strictly earlier months only, the most recent first; a later month is never opened
    earlier_months = sorted((m for m in months if m < args.month), reverse=True)
    earlier_uris = {}
    for m in earlier_months:
        uri = committed_metrics(months[m])
        if uri is not None:
            earlier_uris[m] = uri
        if len(earlier_uris) == args.history_months:
            break
    params = {"month": args.month, "rule": args.rule, "margin": args.margin, "history_months": args.history_months}
    step = Step("gate", args.out, __version__, params, inputs=[this, *earlier_uris.values()])
    if step.skip():
        verdict = storage.read_json(step.path(GATE_JSON))
        print("\n".join(lines(verdict, args.rule)), flush=True)
        return 0 if verdict["passed"] else 1
    numbers = read_month(this, args.rule)
    earlier = {m: read_month(uri, args.rule) for m, uri in earlier_uris.items()}
    verdict = judge(args.month, numbers, earlier, args.margin)
    verdict.update({"rule": args.rule, "metrics": this, "earlier_metrics": earlier_uris})
    text = lines(verdict, args.rule)
    step.write_json(GATE_JSON, verdict)
    step.write_bytes(GATE_MD, ("\n".join(["```", *text, "```"]) + "\n").encode())
    step.commit(summary={"month": args.month, "passed": verdict["passed"], "earlier_months": len(earlier)})
    print("\n".join(text), flush=True)
    return 0 if verdict["passed"] else 1
