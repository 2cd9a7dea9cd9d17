"""``train``: fit one Mirage model on a ``merge`` dataset (or a policy on a trained base model).

    python -m mirage_tasks train --model transformer --dataset DATA --out MODEL
        [--preset quick|paper] [--device cpu|cuda] [--seed S] [--param key=value ...]
    python -m mirage_tasks train --model moe_policy --base MOE_MODEL --trace TRACE --out POLICY

Regressors (``transformer``, ``moe``, ``xgboost``, ``random_forest``, and the 0.9-quantile
``xgboost_quantile`` and ``linear_quantile``: the reference baselines script's linear quantile
regressor, scikit-learn ``QuantileRegressor`` with ``highs``) are trained on the
earliest samples of the dataset and validated on the latest (chronological split by
sample, see :mod:`mirage_tasks.models.datasets`; the fitting is
:mod:`mirage_tasks.models.fit`). ``--samples-until`` keeps only the samples whose episodes
end by a time (a validation month's start), ``--sample-fraction`` thins them (learning
curves). ``--hpo-trials``/``--hpo-timeout-s`` first search the hyper-parameters with Optuna
on that split (:mod:`mirage_tasks.models.hpo`, history in ``hpo_trials.json``). The submit
threshold (regressors) or P(submit) threshold (policies) is then chosen on the same
validation split, never on the validation period, by minimising mean interruption +
``--waste-weight`` x wasted node-hours over the dataset's probes
(:mod:`mirage_tasks.models.thresholds`), and stored in ``config.json`` (``decision``); the same
split also decides whether the threshold moves with the load at the decision (``decision.load``:
the backlog in cluster widths or the running jobs' median wait, from the history's last snapshot;
kept only when it lowers the split's objective below the best fixed threshold). Features are ``log1p``-scaled and
standardised with statistics of the training rows only; targets (hours) are centred and
scaled for the neural models. Outputs under ``--out``:

* ``config.json``: kind, architecture, hyper-parameters, scaler, target scaling, the
  decision rule, the dataset's window and the train/validation windows (for leakage
  checks), the weights file name;
* the weights (``model.pt`` / ``model.ubj`` / ``model.skops`` / ``model.json`` / ``policy.pt``);
* ``hpo_trials.json`` with ``--hpo-trials``;
* ``curves.json``: per-epoch (or per-round) training and validation loss and MAE;
* ``metrics.json``: train and validation MAE in hours, the constant-predictor baseline,
  wall time;
* ``_SUCCESS.json`` last.

Neural training checkpoints to ``checkpoints/`` under ``--out``; a killed run started again
with the same flags resumes from the last checkpoint (removed after a successful run).
"""

from __future__ import annotations

import argparse

from stepkit import Step, StepError

from .. import __version__
from ..models import StopRequested, presets as presets_mod
from ..models.registry import FAMILIES, family
from ..models.thresholds import CALIBRATION_VERSION, WASTE_WEIGHT

EXIT_STOPPED = 75  # stopped on request (--stop-after-epochs); rerun to resume
ENVS = ("sim", "toy")  # policy environments: the simulator replaying --trace, or the synthetic toy


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, choices=list(FAMILIES), help="model kind")
    p.add_argument("--out", required=True, help="output prefix (URI) for the model")
    p.add_argument("--dataset", help="merge output (URI with dataset.npz and manifest.json); regressors")
    p.add_argument("--base", help="trained base model (moe for moe_policy, transformer for transformer_policy)")
    p.add_argument("--trace", help="normalised trace (ingest output) the policy's simulator replays")
    p.add_argument(
        "--preset",
        default="quick",
        choices=sorted(presets_mod.PRESETS),
        help="hyper-parameter preset (default quick: minutes on 2 CPU cores)",
    )
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one preset hyper-parameter (repeatable)",
    )
    p.add_argument(
        "--quantile",
        type=float,
        default=None,
        help="xgboost only: fit this quantile with reg:quantileerror instead of the median",
    )
    p.add_argument(
        "--waste-weight",
        type=float,
        default=WASTE_WEIGHT,
        help="hours of service interruption one wasted node-hour (node x overlap) costs when the "
        "decision threshold is chosen on the training period's validation split "
        f"(default {WASTE_WEIGHT}: 6 minutes)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (neural models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--val-fraction", type=float, default=0.2, help="latest share of samples used for validation")
    p.add_argument(
        "--samples-until",
        default=None,
        metavar="ISO",
        help="regressors: use only the dataset's samples whose episodes end by this time (sample start "
        "+ workload span), e.g. the first validation sample start of a month (default: all)",
    )
    p.add_argument(
        "--sample-fraction",
        type=float,
        default=1.0,
        help="regressors: keep this share of those samples, evenly spaced in time (learning curves; 1)",
    )
    p.add_argument(
        "--hpo-trials",
        type=int,
        default=0,
        help="regressors: Optuna trials on the training period's split before the final fit (0: none)",
    )
    p.add_argument(
        "--hpo-timeout-s",
        type=float,
        default=None,
        help="regressors: stop the hyper-parameter search after this many seconds (default: no limit)",
    )
    p.add_argument(
        "--purge-days",
        type=float,
        default=None,
        help="drop training samples starting less than this before the first validation sample "
        "(default: the dataset's workload span, params.workload_days, else 5)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch/xgboost/sklearn (default: the CPUs this process may use)",
    )
    p.add_argument(
        "--env",
        default="sim",
        choices=ENVS,
        help="policies: sim (the trace replayed by the simulator) or toy (synthetic smoke test)",
    )
    p.add_argument(
        "--stop-after-epochs",
        type=int,
        default=None,
        help="stop (exit 75) after this many epochs in this run; rerunning resumes",
    )


def run(args: argparse.Namespace) -> int:
    from ..data.artifacts import require_input
    from ..models.fit import remove_checkpoints, train_policy, train_regressor
    from ..sampling.schedule import cpu_count

    hp = presets_mod.resolve(args.preset, args.model, args.param)
    if args.quantile is not None:
        if "quantile" not in hp:  # the families whose hyper-parameters have one
            have = [k for k, f in FAMILIES.items() if "quantile" in f.presets_of().get(args.preset, {})]
            raise StepError(f"--quantile applies to --model {', '.join(have)} only")
        hp["quantile"] = args.quantile
    if not args.waste_weight >= 0:
        raise StepError(f"--waste-weight must be >= 0, got {args.waste_weight}")
    if args.threads is not None and args.threads < 1:
        raise StepError("--threads must be >= 1")
    common = {
        "seed": args.seed,
        "device": args.device,
        "threads": args.threads or cpu_count(),
        "stop_after": args.stop_after_epochs,
        "preset": args.preset,
    }
    if family(args.model).policy:
        step, base_cfg = _policy_step(args, hp)
        if step is None:
            return 0
        fit = lambda: train_policy(  # noqa: E731
            args.model,
            args.base,
            base_cfg,
            step,
            hp,
            env_kind=args.env,
            trace=args.trace,
            waste_weight=args.waste_weight,
            **common,
        )
    else:
        if not args.dataset:
            raise StepError(f"--dataset is required for --model {args.model}")
        require_input(args.dataset, "--dataset", step="merge")
        until = None
        if args.samples_until is not None:
            from ..data.schema import parse_time

            until = int(parse_time(args.samples_until, "--samples-until").timestamp())
        if args.hpo_trials < 0 or (args.hpo_timeout_s is not None and not args.hpo_timeout_s > 0):
            raise StepError("--hpo-trials must be >= 0 and --hpo-timeout-s > 0")
        if not 0.0 < args.sample_fraction <= 1.0:
            raise StepError(f"--sample-fraction must be in (0, 1], got {args.sample_fraction}")
        params = {
            "model": args.model,
            "preset": args.preset,
            "hp": hp,
            "seed": args.seed,
            "device": args.device,
            "val_fraction": args.val_fraction,
            "purge_days": args.purge_days,
            "waste_weight": args.waste_weight,
            "samples_until": until,
            "sample_fraction": args.sample_fraction,
            "calibration": CALIBRATION_VERSION,
        }
        if args.hpo_trials:
            params["hpo"] = {"trials": args.hpo_trials, "timeout_s": args.hpo_timeout_s}
        step = Step("train", args.out, __version__, params, inputs=[args.dataset])
        if step.skip():
            return 0
        fit = lambda: train_regressor(  # noqa: E731
            args.model,
            args.dataset,
            step,
            hp,
            val_fraction=args.val_fraction,
            purge_days=args.purge_days,
            waste_weight=args.waste_weight,
            samples_until=until,
            sample_fraction=args.sample_fraction,
            hpo_trials=args.hpo_trials,
            hpo_timeout_s=args.hpo_timeout_s,
            **common,
        )
    try:
        result = fit()
    except StopRequested as exc:
        print(f"train: {exc}", flush=True)
        return EXIT_STOPPED
    step.commit(summary=result, release=False)
    remove_checkpoints(step)  # still under the lease: no other writer of this prefix meanwhile
    step.release()
    return 0


def _policy_step(args: argparse.Namespace, hp: dict) -> tuple[Step | None, dict]:
    """The policy's Step (None when it is up to date) and its base model's config."""
    from ..data.artifacts import require_input
    from ..models.loader import read_config

    want = family(args.model).base
    if not args.base:
        raise StepError(f"--base (a trained {want} model) is required for {args.model}")
    require_input(args.base, "--base")
    base_cfg = read_config(args.base)
    if base_cfg["kind"] != want:
        raise StepError(f"{args.base}: is a {base_cfg['kind']} model; {args.model} needs a {want} model")
    inputs = [args.base]
    if args.env == "sim":
        if not args.trace:
            raise StepError("--trace is required for the simulator environment (or use --env toy)")
        require_input(args.trace, "--trace")
        inputs.append(args.trace)
    params = {
        "model": args.model,
        "preset": args.preset,
        "hp": hp,
        "seed": args.seed,
        "device": args.device,
        "env": args.env,
        "waste_weight": args.waste_weight,
        "calibration": CALIBRATION_VERSION,
    }
    step = Step("train", args.out, __version__, params, inputs=inputs)
    return (None if step.skip() else step), base_cfg
