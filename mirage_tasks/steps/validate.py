"""``python -m mirage_tasks validate``: a model (or a baseline) decides online, in the simulator.

Sample ``k`` (``0 <= k < --count``) starts at ``--start + k * --interval-hours`` exactly as
in ``sample`` (:mod:`mirage_tasks.sampling.schedule`); shard ``I/S`` takes the samples with
``k % S == I``. Each sample is one :class:`~mirage_tasks.sim.episode.DecisionEpisode`: the
clock starts at the predecessor's submission and moves in steps of ``--decide-every-minutes``. At every step whose history
window is full the model is asked once; the successor is submitted at the first "submit"
(``--decide-within trained``, the default: a model is asked only as long before the
predecessor's pre-simulated end as its training probes reach, the last 24 h for ``sample
--probe-spacing end`` data, the replay's first decision; ``all``: from the first full window)

* regressors: ``threshold <= predicted signed interruption <= high_h``, the threshold being
  the model's own ``decision.low_h`` (chosen by ``train`` on its training period's validation
  split, :mod:`mirage_tasks.models.thresholds`) unless ``--threshold-h`` overrides it; when the
  calibration chose the load-aware form (``decision.load``), the test is ``prediction - slope x
  z(load) >= low_h`` with the load read from the last snapshot of the decision's history (the
  same function as the calibration's offline replay; ``--threshold-h`` drops the load term);
* policies: P(submit) >= the model's calibrated ``decision.threshold`` (moved by ``decision.load``
  the same way when present; greedy, the default;
  > 0.5 for a policy without one) or, with ``--stochastic``, a draw with probability
  P(submit) from a generator seeded by ``(--seed, k)``,

and is forced the moment the predecessor ends (never later). The baselines follow the
``sample`` step's rules exactly: ``reactive`` submits at the predecessor's end, ``avg`` at
the end minus the mean wait of the last 100 started jobs when the predecessor started
(from the same pre-simulation :func:`~mirage_tasks.sim.episode.probe_times` uses).

Protocol v2's rules decide online too, each as the probe replay scores it but at every decision
of the grid: ``avg-cal`` (where the mean wait minus the time left reaches the replay's calibrated
offset), ``wait-pred`` (the predicted wait for the successor submitted now reaches the time
left), ``wait-pred-cal`` (the same past the replay's calibrated margin), ``guarantee-10`` (the
90 % bound reaches the time left at the next decision) and ``guarantee-cal`` (the bound minus the
time left at the next probe reaches the replay's conformal margin; asked only at the end-spaced
probe times, where that margin was calibrated). ``--waitpred URI`` (the ``waitpred``
output the samples were drawn with) is the predictor they ask on the simulator's queue; a model
trained on ``merge --waitpred-features`` (``xgboost-wp``) needs it too and gets the channels
appended at every decision. ``--calibration URI`` (a committed probe-replay output of the same
node size) gives avg-cal's offset and wait-pred-cal's and guarantee-cal's margins.

The guards, the decision rule and the episodes are :mod:`mirage_tasks.evaluation.validate`.

Leakage guard: a model whose training data reach past the first validation sample start
(``data.data_end`` / ``data.train_data_end`` of its ``config.json``, copied from the
dataset manifest) is refused.

Outputs under ``--out``:

* ``validation.parquet``: one row per sample, ordered by sample index (see :data:`ROW_COLUMNS`);
  times are int64 epoch seconds (UTC), durations in hours;
* ``decisions.parquet``: every model evaluation (sample, time, output, submit);
* ``validate.json``: parameters, model and data windows, counts, timing; then ``_SUCCESS.json``.
"""

from __future__ import annotations

import argparse
import logging
import time

from stepkit import Step, StepError, read_marker, storage

from .. import __version__
from ..data.artifacts import DECISIONS_FILE, ROWS_FILE, VALIDATE_INFO_FILE
from ..data.times import hours_to_s
from ..sampling.schedule import add_schedule_arguments, check_schedule, resolve_workers, sample_tasks
from ..sim import decision_rules as dr
from ..sim.config import add_config_arguments
from ..sim.probes import add_ask_arguments, resolve_decide_at

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_schedule_arguments(p)
    p.add_argument(
        "--model",
        required=True,
        help="trained model (train output URI), or a decision rule: " + ", ".join(dr.names_at("validate")),
    )
    p.add_argument(
        "--waitpred",
        default=None,
        metavar="URI",
        help="a committed waitpred output, asked at every decision: needed by decision rules "
        + ", ".join(dr.needing("waitpred", "validate"))
        + " and a model trained on merge --waitpred-features",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="URI",
        help="a committed probe-replay output of the same node size: avg-cal's offset and the wait "
        "predictor's margins as it calibrated them (needed by decision rules "
        + ", ".join((*dr.needing("avg-calibration", "validate"), *dr.needing("margin-calibration", "validate")))
        + ")",
    )
    p.add_argument("--name", default=None, help="model name in the rows (default: the kind or the baseline)")
    p.add_argument("--decide-every-minutes", type=float, default=10.0, help="minutes between decisions (10)")
    add_ask_arguments(p, "every decision of the --decide-every-minutes grid")
    p.add_argument(
        "--threshold-h",
        type=float,
        default=None,
        help="regressors: submit when the predicted signed interruption is >= this (default: the "
        "model's own decision.low_h, calibrated by train on its training period; -0.5 h for "
        "models without one)",
    )
    p.add_argument("--stochastic", action="store_true", help="policies: sample the action instead of argmax")
    p.add_argument(
        "--argmax",
        action="store_true",
        help="policies: greedy by the likelier action (P(submit) > 0.5) instead of the policy's "
        "calibrated P(submit) threshold",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --stochastic (per sample: (seed, k))")
    p.add_argument(
        "--window", type=int, default=None, help="snapshots per history (default: the model's; 144 for baselines)"
    )
    p.add_argument("--step-s", type=int, default=None, help="seconds between snapshots (default: the model's; 600)")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch/OpenMP threads per process (default 1: one history per model call)",
    )
    p.add_argument(
        "--allow-node-mismatch",
        action="store_true",
        help="validate a model trained for another --node size (refused by default)",
    )
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..data.artifacts import parquet_bytes, require_input
    from ..data.schema import parse_time, read_trace
    from ..data.times import iso
    from ..evaluation.validate import (
        CALIBRATED_RULES,
        PREDICTOR_RULES,
        ROW_COLUMNS,
        RULES,
        make_rows,
        resolve_model,
        run_tasks,
        sampling_warnings,
    )
    from ..sim.config import config_from_args
    from ..sim.workload import Workload

    shard_i, shard_n = check_schedule(args)
    require_input(args.trace, "--trace")
    if args.model not in RULES:
        require_input(args.model, "--model")
    if args.model in PREDICTOR_RULES and not args.waitpred:
        raise StepError(f"--model {args.model} needs --waitpred URI (the waitpred output the samples were drawn with)")
    rule_threshold = None
    if args.model in CALIBRATED_RULES:
        if not args.calibration:
            raise StepError(
                f"--model {args.model} needs --calibration URI (a probe-replay output of --node {args.node})"
            )
        rule_threshold = calibrated_threshold(args.calibration, args.model, args.node)
    elif args.calibration:
        raise StepError(f"--calibration applies to {' and '.join(CALIBRATED_RULES)} only, not --model {args.model}")
    if args.waitpred:
        require_input(args.waitpred, "--waitpred", "waitpred")
    if args.argmax and args.stochastic:
        raise StepError("--argmax and --stochastic exclude each other")
    if args.decide_every_minutes <= 0:
        raise StepError("--decide-every-minutes must be > 0")
    if (args.window is not None and args.window < 1) or (args.step_s is not None and args.step_s < 1):
        raise StepError("--window and --step-s must be >= 1")
    every_s = int(round(args.decide_every_minutes * 60))
    start = parse_time(args.start, "--start")
    tasks = sample_tasks(int(start.timestamp()), args.count, args.interval_hours, (shard_i, shard_n))
    t_first = int(start.timestamp())
    t_last = t_first + (args.count - 1) * hours_to_s(args.interval_hours)
    last_end = t_last + int(round(args.workload_days * 86400))

    m = resolve_model(
        args.model,
        node=args.node,
        stochastic=args.stochastic,
        window=args.window,
        step_s=args.step_s,
        allow_node_mismatch=args.allow_node_mismatch,
        first_start=t_first,
        last_end=last_end,
        waitpred=bool(args.waitpred),
    )
    kind, model_cfg, window, step_s, warnings = m["kind"], m["config"], m["window"], m["step_s"], m["warnings"]
    if args.waitpred and not (kind in PREDICTOR_RULES or m.get("uses_waitpred")):
        raise StepError(f"--waitpred: --model {args.model} does not ask the wait predictor")
    inputs = (
        [args.trace]
        + ([args.model] if model_cfg is not None else [])
        + [x for x in (args.waitpred, args.calibration) if x]
    )
    name = args.name or kind

    df, meta = read_trace(args.trace)
    cfg = config_from_args(args, meta.machine_nodes)
    if args.node > cfg.nodes:
        raise StepError(f"--node {args.node} exceeds the {cfg.nodes}-node cluster")
    if model_cfg is not None:
        warnings += sampling_warnings(model_cfg, cfg.to_dict(), args.warmup_days, args.workload_days)
    params = {
        "model": name,
        "model_kind": kind,
        "start": start.isoformat(),
        "count": args.count,
        "interval_hours": args.interval_hours,
        "warmup_days": args.warmup_days,
        "workload_days": args.workload_days,
        "node": args.node,
        "decide_every_s": every_s,
        "threshold_h": args.threshold_h,
        "stochastic": bool(args.stochastic),
        "seed": args.seed,
        **({"argmax": True} if args.argmax else {}),
        "shard": [shard_i, shard_n],
        "window": window,
        "step_s": step_s,
        "config": cfg.to_dict(),
    }
    if args.waitpred:  # new parameters only when used: earlier outputs keep their keys
        params["waitpred"] = True
    if args.model in CALIBRATED_RULES:
        params["rule_threshold_h"] = rule_threshold
    within_s = m.get("trained_span_s") if args.decide_within == "trained" else None
    if within_s is not None:  # only where it bounds the asks: outputs of uniform models stay valid
        params["decide_within_s"] = within_s
    try:
        at_probes = resolve_decide_at(args.decide_at, m.get("trained_offsets_s"), args.model) == "probes"
    except ValueError as exc:
        raise StepError(str(exc)) from None
    if at_probes:
        params["decide_at"] = "probes: sample --probe-spacing end's times (minute-aligned), the end excluded"
    step = Step("validate", args.out, __version__, params, inputs=inputs)
    if step.skip():
        return 0
    wl = Workload.from_frame(df, cfg.procs_per_node or None)  # as `sample` builds it
    if len(wl) == 0:
        raise StepError(f"{args.trace}: no usable jobs")
    if model_cfg is not None:
        fp = model_cfg["data"].get("trace_fingerprint")
        if fp and wl.fingerprint and fp != wl.fingerprint:
            warnings.append(
                f"the model was trained on another trace (fingerprint {fp}, validating on {wl.fingerprint})"
            )
    for w in warnings:
        log.warning("validate: %s", w)
    if tasks and (
        tasks[0][1] - window * step_s < wl.submit[0] or tasks[-1][1] + args.workload_days * 86400 > wl.submit[-1]
    ):
        warnings.append(f"samples reach outside the trace's submits ({iso(wl.submit[0])} .. {iso(wl.submit[-1])})")
        log.warning("validate: %s", warnings[-1])
    workers = resolve_workers(args.workers)
    threads = args.threads or 1
    waitpred = None
    if args.waitpred:
        from ..calibration.atprobe import WaitAtProbe

        waitpred = WaitAtProbe.load(args.waitpred, wl, meta.timezone or "UTC")
    setup = {
        "kind": kind,
        "model_uri": args.model,
        "node": args.node,
        "warmup_days": args.warmup_days,
        "workload_days": args.workload_days,
        "window": window,
        "step_s": step_s,
        "every_s": every_s,
        "threshold_h": args.threshold_h,
        "stochastic": bool(args.stochastic),
        "seed": args.seed,
        "threads": threads,
        "argmax": bool(args.argmax),
        "waitpred": waitpred,
        "rule_threshold_h": rule_threshold,
        "within_s": within_s,
        "at_probes": at_probes,
    }
    t = time.perf_counter()
    results = run_tasks(wl, cfg, setup, tasks, workers, part=f"shard {shard_i}/{shard_n}")
    wall = time.perf_counter() - t
    rows, decisions = make_rows(results, name, kind, args.node)
    step.write_bytes(ROWS_FILE, parquet_bytes(rows))
    step.write_bytes(DECISIONS_FILE, parquet_bytes(decisions))
    marker = read_marker(args.model) if model_cfg is not None else None
    no_full = int((rows["n_decisions"] == 0).sum()) if model_cfg is not None else 0
    if no_full:
        warnings.append(f"{no_full} sample(s) never had a full history window before the forced submission")
    info = {
        "params": params,
        "trace_fingerprint": wl.fingerprint,
        "n_samples": len(rows),
        "wall_s": round(wall, 3),
        "workers": workers,
        "episode_s_mean": round(float(np.mean([r[3] for r in results])), 4) if results else None,
        "model_uri": storage.normalize(args.model) if model_cfg is not None else None,
        "model_fingerprint": marker.get("fingerprint") if marker else None,
        "model_data": {
            k: v
            for k, v in (model_cfg or {}).get("data", {}).items()
            if k not in ("feature_names", "sample_params", "split")
        }
        or None,
        "leakage_check": m["leakage"],
        "warnings": warnings,
        "columns": ROW_COLUMNS,
    }
    step.write_json(VALIDATE_INFO_FILE, info)
    summary = {"model": name, "node": args.node, "n_samples": len(rows), "wall_s": round(wall, 3)}
    if len(rows):
        summary.update(
            {
                "mean_signed_h": float(rows["signed_interruption_h"].mean()),
                "mean_interruption_h": float(rows["interruption_h"].mean()),
                "zero_share": float((rows["signed_interruption_h"] <= 0).mean()),
                "forced_share": float(rows["forced"].mean()),
            }
        )
    step.commit(summary=summary)
    print(
        f"validate {name} node {args.node}: {len(rows)} samples in {wall:.1f} s ({workers} worker(s)); "
        + (
            f"mean interruption {summary['mean_interruption_h']:.2f} h, zero share {summary['zero_share']:.0%}, "
            f"forced {summary['forced_share']:.0%}"
            if len(rows)
            else "no samples"
        ),
        flush=True,
    )
    return 0


def calibrated_threshold(uri: str, rule: str, node: int) -> float | None:
    """``rule``'s threshold (h; None: never early) in the probe-replay output at ``uri`` (its
    ``evaluation.json`` calibration), refused naming ``--calibration`` where missing or of another
    node size."""
    from ..data.artifacts import require_input

    require_input(uri, "--calibration", "evaluation")
    try:
        doc = storage.read_json(storage.join(uri, "evaluation.json"))
    except FileNotFoundError:
        raise StepError(f"--calibration {uri}: no evaluation.json (not a probe-replay output)") from None
    got = int((doc.get("params") or {}).get("node", -1))
    if got != int(node):
        raise StepError(f"--calibration {uri}: calibrated for --node {got}, validating --node {node}")
    cal = (doc.get("calibration") or {}).get(rule)
    if not isinstance(cal, dict) or "threshold" not in cal:
        raise StepError(f"--calibration {uri}: no {rule} calibration in it (sampled without --waitpred?)")
    return None if cal["threshold"] is None else float(cal["threshold"])
