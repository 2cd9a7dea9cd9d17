"""``python -m mirage_tasks metrics``: interruption metrics per model, node size and load level.

The computation is :mod:`mirage_tasks.evaluation.metrics`. Outputs under ``--out``: ``metrics.json``,
``metrics.parquet``, ``metrics.csv``, ``metrics.md`` (one row per model, node size and
level) and ``samples.parquet`` (every validation row with its load level), then
``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse
import io

from stepkit import Step, StepError

from .. import __version__
from ..data.artifacts import METRICS_CSV, METRICS_JSON, METRICS_MD, METRICS_SAMPLES, METRICS_TABLE

#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {"bootstrap": (0, 100_000)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in", dest="inputs", nargs="+", required=True, help="validate output prefixes")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument(
        "--bootstrap", type=int, default=2000, help="bootstrap draws for the 95%% intervals (2000; 0 = none)"
    )
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed (0)")


def run(args: argparse.Namespace) -> int:
    from ..data.artifacts import parquet_bytes
    from ..evaluation.metrics import (
        COLUMNS,
        LOW_MAX_H,
        MEDIUM_MAX_H,
        compute,
        load_inputs,
        markdown,
        never_submits,
        records,
    )

    if args.bootstrap < 0:
        raise StepError("--bootstrap must be >= 0")
    df, runs = load_inputs(list(args.inputs))
    params = {
        "bootstrap": args.bootstrap,
        "seed": args.seed,
        "levels": {"low_max_h": LOW_MAX_H, "medium_max_h": MEDIUM_MAX_H},
    }
    step = Step("metrics", args.out, __version__, params, inputs=list(args.inputs))
    if step.skip():
        return 0
    table, samples, counts = compute(df, args.bootstrap, args.seed)
    doc = {
        "params": params,
        "level_counts": counts,
        "rows": records(table),
        # learned models whose every submission was forced at the predecessor's end
        "never_submits": never_submits(table),
        "runs": [{k: v for k, v in r.items() if k != "params"} for r in runs],
        "columns": COLUMNS,
    }
    step.write_json(METRICS_JSON, doc)
    step.write_bytes(METRICS_TABLE, parquet_bytes(table))
    buf = io.StringIO()
    table.to_csv(buf, index=False, float_format="%.6g")
    step.write_bytes(METRICS_CSV, buf.getvalue().encode())
    step.write_bytes(METRICS_MD, markdown(table, counts).encode())
    step.write_bytes(METRICS_SAMPLES, parquet_bytes(samples))
    headline = {
        f"{r['model']}@{r['node']}": {
            "mean_interruption_h": r["mean_interruption_h"],
            "zero_share": r["zero_share"],
            "reduction_vs_reactive": r["reduction_vs_reactive"],
        }
        for r in doc["rows"]
        if r["level"] == "all"
    }
    step.commit(summary={"n_rows": int(len(samples)), "level_counts": counts, "headline": headline})
    print(markdown(table[table["level"] == "all"], counts, title="# metrics (all samples)"), flush=True)
    return 0
