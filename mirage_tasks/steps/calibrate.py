"""``python -m mirage_tasks calibrate``: fit a simulator configuration to a trace.

    python -m mirage_tasks calibrate --trace T --calibrate-from A --calibrate-to B \\
        --score-from C --score-to D --out URI [--trials N] [--timeout-s S] [--seed K]
        [--lead-in-days 7] [--start-config PRESET|FILE] [--procs-per-node P]

Searches a :class:`~mirage_tasks.sim.config.SimConfig` on the jobs submitted in
``[A, B)`` (see :mod:`mirage_tasks.calibration.calibrate` for what is read from the trace,
what is searched and the objective), then scores the chosen configuration on the jobs
submitted in ``[C, D)``, a later window that must not overlap the first. Times are ISO;
a time without an offset is read in the trace's own time zone (months are the trace's).
Both windows are replayed month by month, each month from a warm start
``--lead-in-days`` before it.

Outputs (committed atomically, ``_SUCCESS.json`` last):

* ``config.json``: the chosen configuration alone, usable as ``--cluster-config`` by
  every step;
* ``calibration.json``: ``config``, ``in_sample`` and ``out_of_sample`` (pooled fidelity
  figures: ``mae_h``, ``zero_mae_h``, ``within_1h``, ``zero_within_1h``, ``within_10m``,
  ``spearman``, ``daily_corr``, ...), per-month blocks of each, the same figures for the
  default configuration a new user would write (``default_in_sample``,
  ``default_out_of_sample``), what was read from the trace (``trace_facts``), the search
  space, budget and outcome, ``beats_zero_wait`` and ``warnings``;
* ``trials.parquet``: every trial's parameters and figures;
* ``calibration.md``: the report, with a plain warning when the chosen configuration does
  not beat the zero-wait predictor out of sample.
"""

from __future__ import annotations

import argparse
import io
import logging

import pandas as pd

from stepkit import Step, StepError

from .. import __version__
from ..calibration.atcut import as_known
from ..calibration.calibrate import calibrate, default_config, machine_warning, replay_months
from ..calibration.fidelity import metrics, summarize
from ..calibration.summary import _block, beats_zero, mae_reduction, markdown, zero_comparison
from ..data.schema import read_trace
from ..data.times import window_outside_trace
from ..sim.config import SimConfig, load_config
from ..sim.workload import Workload

log = logging.getLogger(__name__)


#: Each numeric flag's range (inclusive), checked before anything is read (:func:`stepkit.cli.check_flag_values`).
BOUNDS = {
    "trials": (1, 100_000),
    "timeout_s": (0, 7 * 86400),
    "lead_in_days": (0, 366),
    "procs_per_node": (1, 1_000_000),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument(
        "--calibrate-from",
        required=True,
        help="first submit time of the calibration window (ISO; without an offset: the trace's time zone)",
    )
    p.add_argument("--calibrate-to", required=True, help="end of the calibration window, exclusive (ISO)")
    p.add_argument(
        "--score-from", required=True, help="first submit time of the scoring window (ISO), at or after --calibrate-to"
    )
    p.add_argument("--score-to", required=True, help="end of the scoring window, exclusive (ISO)")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument(
        "--trials", type=int, default=60, help="search trials (60): the budget; the result depends only on it"
    )
    p.add_argument(
        "--timeout-s",
        type=float,
        default=0.0,
        help="opt-in wall limit in seconds (0, the default: none): when reached before --trials have run, "
        "the step fails naming it and the trials run, and writes nothing",
    )
    p.add_argument("--seed", type=int, default=0, help="search seed (0)")
    p.add_argument(
        "--search-fairshare",
        action="store_true",
        help="also search Slurm's multifactor priority with fair share (its weight and usage half-life)",
    )
    p.add_argument(
        "--lead-in-days",
        type=float,
        default=7.0,
        help="each month is replayed from a warm start this many days before it (7)",
    )
    p.add_argument(
        "--start-config", default=None, help="a preset or JSON configuration to try among the first trials (e.g. ls6)"
    )
    p.add_argument(
        "--procs-per-node",
        type=int,
        default=None,
        help="processors per node, for traces that record processors but no node counts (SWF)",
    )
    p.add_argument(
        "--machine-nodes",
        type=int,
        default=None,
        help="the machine's size in nodes, where the log does not state it (an SWF header's MaxNodes "
        "does); the simulated machine is never larger",
    )


def _time(value: str, flag: str, tz: str) -> pd.Timestamp:
    try:
        ts = pd.Timestamp(value)
    except (ValueError, TypeError) as exc:
        raise StepError(f"{flag} {value!r} is not an ISO date/time") from exc
    return (ts.tz_localize(tz) if ts.tzinfo is None else ts).tz_convert("UTC")


def run(args: argparse.Namespace) -> int:
    if args.trials < 1:
        raise StepError("--trials must be >= 1")
    if args.timeout_s < 0:
        raise StepError("--timeout-s must be >= 0")
    if args.lead_in_days < 0:
        raise StepError("--lead-in-days must be >= 0")
    df, meta = read_trace(args.trace)
    tz = meta.timezone or "UTC"
    a = _time(args.calibrate_from, "--calibrate-from", tz)
    b = _time(args.calibrate_to, "--calibrate-to", tz)
    c = _time(args.score_from, "--score-from", tz)
    d = _time(args.score_to, "--score-to", tz)
    if b <= a:
        raise StepError("--calibrate-to must be after --calibrate-from")
    if d <= c:
        raise StepError("--score-to must be after --score-from")
    if c < b:
        raise StepError(
            f"--score-from {c.isoformat()} lies inside the calibration window (before --calibrate-to "
            f"{b.isoformat()}): the scoring window must be later and disjoint"
        )
    if args.machine_nodes is not None and args.machine_nodes < 1:
        raise StepError(f"--machine-nodes must be >= 1, got {args.machine_nodes}")
    machine = args.machine_nodes or meta.machine_nodes
    start = SimConfig.from_dict(load_config(args.start_config)) if args.start_config else None
    wl = Workload.from_frame(df, args.procs_per_node)
    ia, ib, ic, id_ = (int(x.timestamp()) for x in (a, b, c, d))
    if len(wl.submit) == 0:
        raise StepError(f"{args.trace}: the trace holds no jobs")
    first, last = int(wl.submit.min()), int(wl.submit.max())
    for lo, hi, flags in ((ia, ib, "--calibrate-from/--calibrate-to"), (ic, id_, "--score-from/--score-to")):
        why = window_outside_trace(first, last, lo, hi, flags, args.trace)
        if why:
            raise StepError(why)
        n = int(((wl.submit >= lo) & (wl.submit < hi)).sum())
        if n == 0:
            raise StepError(f"{flags}: no job of the trace was submitted in that window")
    biggest = int(wl.nodes[(wl.submit >= ic) & (wl.submit < id_)].max())
    lead = int(round(args.lead_in_days * 86400))
    params = {
        "windows": [a.isoformat(), b.isoformat(), c.isoformat(), d.isoformat()],
        "trials": args.trials,
        "seed": args.seed,
        "lead_in_s": lead,
        "start_config": start.to_dict() if start else None,
        "procs_per_node": args.procs_per_node,
    }
    if args.machine_nodes:
        params["machine_nodes"] = args.machine_nodes
    if args.search_fairshare:  # only when asked: the runs that do not ask keep their keys
        params["search_fairshare"] = True
    step = Step("calibrate", args.out, __version__, params, inputs=[args.trace])
    if step.skip():
        return 0
    res = calibrate(
        wl,
        ia,
        ib,
        tz=tz,
        lead_in_s=lead,
        trials=args.trials,
        timeout_s=args.timeout_s or None,
        seed=args.seed,
        machine_nodes=machine,
        start=start,
        procs_per_node=args.procs_per_node or 0,
        fairshare=args.search_fairshare,
    )
    cfg = res.config
    if biggest > cfg.nodes:  # a job of the scoring window larger than the fitted cluster: never drop it silently
        log.warning(
            "calibrate: the scoring window has a %d-node job; the cluster is raised from %d to %d nodes",
            biggest,
            cfg.nodes,
            biggest,
        )
        cfg = cfg.replace(nodes=biggest)
    dflt = default_config(res.facts).replace(dispatch_latency_s=0, procs_per_node=args.procs_per_node or 0)
    dflt = dflt.replace(nodes=max(dflt.nodes, biggest))
    log.info(
        "calibrate: search done (%d trials); scoring the chosen and the default configuration on both "
        "windows, month by month",
        len(res.trials),
    )
    # in sample as the search saw it: the log as it stood at the end of the calibration window
    wl_cut, _ = as_known(wl, ib)
    ins = replay_months(wl_cut, cfg, ia, ib, lead, tz, cut=ib)
    log.info("calibrate: in-sample replay done; out of sample next")
    oos = replay_months(wl, cfg, ic, id_, lead, tz)
    log.info("calibrate: out-of-sample replay done; the default configuration next")
    d_in = replay_months(wl_cut, dflt, ia, ib, lead, tz, cut=ib)
    d_oos = replay_months(wl, dflt, ic, id_, lead, tz)
    s_in, s_oos = summarize(ins, tz), summarize(oos, tz)
    m_in, m_oos = s_in["pooled"], s_oos["pooled"]
    warnings = [w for w in (machine_warning(res.facts),) if w]
    if machine and cfg.nodes > machine:
        warnings.append(
            f"the scoring window has a {biggest}-node job, larger than the stated {machine}-node machine: "
            f"the simulated machine was raised to {cfg.nodes} nodes to hold it"
        )
    for label, m in (("out of sample", m_oos), ("in sample", m_in)):
        if not beats_zero(m):
            warnings.append(
                f"{label}, the calibrated simulator does NOT beat predicting zero wait for every job: "
                + zero_comparison(m)
                + ("; do not use its waits as predictions" if label[0] == "o" else "")
            )
    doc = {
        "trace": args.trace,
        "trace_fingerprint": wl.fingerprint,
        "timezone": tz,
        "lead_in_days": args.lead_in_days,
        "windows": {
            "calibrate_from": a.isoformat(),
            "calibrate_to": b.isoformat(),
            "score_from": c.isoformat(),
            "score_to": d.isoformat(),
        },
        "config": cfg.to_dict(),
        "in_sample": _block(m_in),
        "out_of_sample": _block(m_oos),
        "in_sample_months": {k: _block(v) for k, v in s_in["months"].items()},
        "out_of_sample_months": {k: _block(v) for k, v in s_oos["months"].items()},
        "out_of_sample_node_classes": {k: _block(v) for k, v in s_oos["node_classes"].items()},
        "default_config": dflt.to_dict(),
        "default_in_sample": _block(metrics(d_in, tz)),
        "default_out_of_sample": _block(metrics(d_oos, tz)),
        "beats_zero_wait": beats_zero(m_oos),
        "mae_reduction_vs_zero": {"in_sample": mae_reduction(m_in), "out_of_sample": mae_reduction(m_oos)},
        "trace_facts": res.facts.to_dict(),
        "search": {
            "library": "optuna (TPE)",
            "trials": args.trials,
            "trials_run": int(len(res.trials)),
            "timeout_s": args.timeout_s,
            "seed": args.seed,
            "elapsed_s": res.elapsed_s,
            "stopped_by": res.stopped_by,
            "best_objective": res.best_value,
            "space": res.space,
            **({"fairshare": True} if args.search_fairshare else {}),
            "objective": "mae_h/zero_mae_h + (1 - within_1h) + 0.25 * (1 - daily_corr), in sample",
        },
        "warnings": warnings,
    }
    step.write_json("config.json", cfg.to_dict())
    step.write_json("calibration.json", doc)
    buf = io.BytesIO()
    res.trials.to_parquet(buf, index=False)
    step.write_bytes("trials.parquet", buf.getvalue())
    step.write_bytes("calibration.md", markdown(doc).encode())
    step.commit(
        summary={
            "in_sample": doc["in_sample"],
            "out_of_sample": doc["out_of_sample"],
            "beats_zero_wait": doc["beats_zero_wait"],
        }
    )
    print(
        f"calibrate: {len(res.trials)} trials in {res.elapsed_s} s; out of sample MAE {m_oos['mae_h']:.2f} h "
        f"(zero-wait {m_oos['zero_mae_h']:.2f} h), within 1 h {m_oos['within_1h']:.1%} (zero-wait "
        f"{m_oos['zero_within_1h']:.1%}), Spearman {m_oos['spearman']:.2f}, daily corr {m_oos['daily_corr']:.2f}",
        flush=True,
    )
    for msg in warnings:
        print(f"calibrate: WARNING: {msg}", flush=True)
    return 0
