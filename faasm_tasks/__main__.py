"""``python -m faasm_tasks <step> [flags]``: the container contract of the Faasm benchmark steps."""

import sys

from stepkit.cli import main

# step name -> (module with add_arguments/run, one-line help). Modules import lazily.
STEPS: dict[str, tuple[str, str]] = {
    "preflight": (
        "faasm_tasks.steps.preflight",
        "before the first group: can the target run the selected "
        "experiments at all (local: built functions, redis-server)",
    ),
    "deploy": ("faasm_tasks.steps.deploy", "deploy the target for an experiment (knative or local)"),
    "wait-ready": ("faasm_tasks.steps.wait_ready", "wait until the deployment is ready (conditions, not sleeps)"),
    "upload-data": ("faasm_tasks.steps.upload_data", "upload functions and state once (skips same checksum)"),
    "run": ("faasm_tasks.steps.run", "run an experiment's points; one attempt folder per point and repeat"),
    "collect": ("faasm_tasks.steps.collect", "stop billing, store samples, attach billing summaries"),
    "teardown": ("faasm_tasks.steps.teardown", "hard, idempotent teardown: services, pods, Redis queue and run keys"),
    "verify-clean": ("faasm_tasks.steps.verify_clean", "prove the teardown: no processes/pods, ports, run keys"),
    "summarize": (
        "faasm_tasks.steps.summarize",
        "one summary table (JSON, CSV) of a run's attempts and the "
        "trend report (HTML, Markdown) of the last --days days",
    ),
    "check": (
        "faasm_tasks.steps.check",
        "fail (exit 1) when a point regressed past a threshold vs the trailing median",
    ),
    "aa-rate": (
        "faasm_tasks.steps.aa_rate",
        "the A/A control's false-difference rate over simulated (or stored) days of A/A measurements",
    ),
    "billing-agent": (
        "faasm_tasks.steps.billing_agent",
        "per-node billing sampler (the knative target's DaemonSet): psutil samples to the run's results prefix",
    ),
    "render": ("faasm_tasks.steps.render", "render the knative manifests to files (no cluster needed)"),
    "experiments": ("faasm_tasks.steps.experiments", "list or validate the experiment catalogue"),
}

if __name__ == "__main__":
    sys.exit(main("faasm_tasks", STEPS))
