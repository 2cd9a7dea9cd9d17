"""``python -m mirage_tasks <step> [flags]``: the container contract of the Mirage steps."""

import sys

from stepkit.cli import main

# step name -> (module with add_arguments/run, one-line help). Modules import lazily.
STEPS: dict[str, tuple[str, str]] = {
    "ingest": ("mirage_tasks.steps.ingest", "normalise a Slurm sacct log or SWF trace into Parquet"),
    "synth": ("mirage_tasks.steps.synth", "fit a workload profile to a trace, or generate a synthetic trace"),
    "sample": ("mirage_tasks.steps.sample", "simulate Mirage samples/probes and write one shard of examples"),
    "merge": ("mirage_tasks.steps.merge", "merge sample shards into a chronological dataset with a manifest"),
    "fidelity": ("mirage_tasks.steps.fidelity", "replay a trace window and compare simulated with real waits"),
    "calibrate": (
        "mirage_tasks.steps.calibrate",
        "fit a simulator configuration to a trace window and score it on a later one",
    ),
    "waitpred": (
        "mirage_tasks.steps.waitpred",
        "predict queue waits at submission time (no hindsight) with calibrated bounds, and score them",
    ),
    "train": ("mirage_tasks.steps.train", "train a regressor (moe, transformer, xgboost, random_forest) or a policy"),
    "validate": ("mirage_tasks.steps.validate", "let a model (or reactive/avg) decide online in the simulator"),
    "metrics": ("mirage_tasks.steps.metrics", "interruption metrics per model, node size and load level"),
    "keep-service": (
        "mirage_tasks.steps.keep_service",
        "keep a chain of service jobs alive on a Slurm cluster (model, reactive or avg)",
    ),
    "report": ("mirage_tasks.steps.report", "one self-contained HTML (and Markdown) results report"),
    "gate": ("mirage_tasks.steps.gate", "fail a month whose primary decision rule regressed (mirage_monthly)"),
}

if __name__ == "__main__":
    sys.exit(main("mirage_tasks", STEPS))
