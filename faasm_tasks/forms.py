"""The typed configuration of the daily Faasm benchmark: the ``faasm_benchmarks`` trigger form is
built from :class:`Deployment` (what is deployed where), :class:`Measurement` (how each point
is measured) and :class:`Check` (the trend window and the regression check's thresholds), in
that order (:func:`stepkit.forms.class_params`; the choices only the catalogue knows, the
experiments, systems and releases, are given where the form is built). Stdlib only (the DAG
file loads it at parse time).

* ``repeats``: trials per point (and per arm of the A/A control). The default is the fewest
  values with a 95 % order-statistic interval of the median (:data:`MIN_REPEATS`,
  ``faasm_tasks.stats.min_n_for_median()``); the ratio intervals need 3. Fewer is allowed and
  then the report says "no interval" for each figure that lacks one;
* ``time_budget_min``: the run step's budget (0: the experiment's own, from the workload
  registry, which is also the DAG's run timeout and so the upper bound);
* ``seed``: the seed of each run step's shuffled order (empty: derived from the run id, the
  experiment and the system: :func:`faasm_tasks.order.default_seed`);
* ``aa_control`` and ``aa_system``: the A/A control, ``aa_system`` measured as two arms A and
  A' in the same deployment (native by default: the cheaper), whose ratio must contain 1.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepkit.forms import param

#: ``faasm_tasks.stats.min_n_for_median()`` at 95 % (a test holds the two together; the stats
#: module needs scipy, which the DAG file does not import).
MIN_REPEATS = 6


@dataclass(frozen=True)
class Measurement:
    repeats: int = param(
        MIN_REPEATS,
        "integer",
        "Repeats per point",
        "Trials of every point (and of each A/A arm), measured in one randomized interleaved order. "
        f"{MIN_REPEATS} is the fewest with a 95 % interval of the median; with fewer the report "
        "shows figures without an interval.",
        minimum=1,
        maximum=100,
    )
    time_budget_min: int = param(
        0,
        "integer",
        "Run time budget (min)",
        "Minutes each experiment's run step may measure; trials that would pass it are left out "
        "(spread over the points by the randomized order, and listed in the report). 0: the "
        "experiment's own budget (its run timeout), which also caps a larger value.",
        minimum=0,
    )
    seed: int | None = param(
        None,
        "integer",
        "Order seed",
        "Seed of the randomized order of each run step's trials, recorded in its report. Empty: "
        "derived from the run id (and the experiment and system), so a retry measures in the same order.",
        nullable=True,
        minimum=0,
        maximum=2**32 - 1,  # stepkit.cli.SEED_MAX: what every step accepts as a seed
    )
    aa_control: bool = param(
        True,
        "boolean",
        "A/A control",
        "Measure one system twice (arms A and A', same deployment, interleaved): their ratio "
        "interval must contain 1, or the day is marked untrustworthy and the regression check "
        "does not judge it.",
    )
    aa_system: str = param(
        "native",
        "string",
        "A/A system",
        "The system measured as the A/A control's two arms (native: the cheaper).",
    )


@dataclass(frozen=True)
class Deployment:
    target: str = param(
        "local",
        "string",
        "Target",
        "local: this host (wasm on wasmtime against native runc containers); knative: the cluster "
        "(the default under HOUSE_RUNNER=kubernetes)",
        enum=["local", "knative"],
    )
    release: str = param(
        "0.1.3",
        "string",
        "Faasm release",
        "image names and tags to deploy: 0.1.3 (the experiments manual's: faasm/knative-worker) or "
        "0.6.7 (faasm/worker)",
    )
    replicas: str = param(
        "per-point",
        "string",
        "Replicas (SGD, matrix)",
        "per-point: redeploy with N replicas for each N_WORKERS value and run with N workers (the "
        "manual); fixed: the catalogue's replica counts",
        enum=["per-point", "fixed"],
    )
    tf_sweep: str = param(
        "default",
        "string",
        "TF throughput sweep",
        "default: the manual's (max delay 30 s .. 2 s); extended: the longer faasm-experiments sweep "
        "(wasm down to 25 ms). Knative only: the local target runs its own small sweep and refuses "
        "extended at deploy",
        enum=["default", "extended"],
    )
    experiments: list = param(
        [],
        "array",
        "Experiments",
        "Which catalogue experiments to run (at least one).",
        items={"type": "string"},
        minItems=1,
        uniqueItems=True,
    )
    systems: list = param(
        [],
        "array",
        "Systems",
        "wasm (Faasm) and/or native containers.",
        items={"type": "string"},
        minItems=1,
        uniqueItems=True,
    )


@dataclass(frozen=True)
class Check:
    trend_days: int = param(
        30,
        "integer",
        "Trend window (days)",
        "Days of results in the trend report and the regression check's history.",
        minimum=1,
    )
    p99_increase_pct: float = param(
        25,
        "number",
        "Check: p99 latency increase (%)",
        "Fail when a point's p99 is more than this % above its trailing median (negative: off).",
    )
    throughput_drop_pct: float = param(
        20,
        "number",
        "Check: throughput drop (%)",
        "Fail when a point's throughput is more than this % below its trailing median (negative: off).",
    )
    run_time_increase_pct: float = param(
        50,
        "number",
        "Check: run time increase (%)",
        "Fail when an SGD / matrix point's run time is more than this % above its trailing median (negative: off).",
    )
