"""``python -m mirage_tasks <step> [flags]``: the container contract of the Mirage steps."""

import sys

from stepkit.cli import main

# step name -> (module with add_arguments/run, one-line help). Modules import lazily.
STEPS = {
    "ingest": ("mirage_tasks.ingest", "normalise a Slurm sacct log or SWF trace into Parquet"),
    "synth": ("mirage_tasks.synth", "fit a workload profile to a trace, or generate a synthetic trace"),
    "summary": ("mirage_tasks.summary", "list what a pipeline run produced and where (read-only)"),
    "sample": ("mirage_tasks.sampling", "simulate Mirage samples/probes and write one shard of examples"),
    "merge": ("mirage_tasks.merge", "merge sample shards into a chronological dataset with a manifest"),
    "fidelity": ("mirage_tasks.fidelity", "replay a trace window and compare simulated with real waits"),
    "calibrate": ("mirage_tasks.calibrate", "fit a simulator configuration to a trace window and score it on a later one"),
    "train": ("mirage_tasks.train", "train a regressor (moe, transformer, xgboost, random_forest) or a policy"),
    "validate": ("mirage_tasks.validate", "let a model (or reactive/avg) decide online in the simulator"),
    "metrics": ("mirage_tasks.metrics", "interruption metrics per model, node size and load level"),
    "report": ("mirage_tasks.report", "one self-contained HTML (and Markdown) results report"),
}

if __name__ == "__main__":
    sys.exit(main("mirage_tasks", STEPS))
