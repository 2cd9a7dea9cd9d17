"""``python -m mirage_tasks validate``: a model (or a baseline) decides online, in the simulator.

Sample ``k`` (``0 <= k < --count``) starts at ``--start + k * --interval-hours`` exactly as
in ``sample``; shard ``I/S`` takes the samples with ``k % S == I``. Each sample is one
:class:`~mirage_tasks.sim.episode.DecisionEpisode`: the clock starts at the predecessor's
submission and moves in steps of ``--decide-every-minutes``. At every step whose history
window is full the model is asked once; the successor is submitted at the first "submit"

* regressors: ``--threshold-h <= predicted signed interruption <= high_h`` (the model's
  decision rule upper bound, 500 h by default), i.e. unless more than 30 minutes of
  overlap are predicted;
* policies: P(submit) > 0.5 (greedy, the default) or, with ``--stochastic``, a draw with
  probability P(submit) from a generator seeded by ``(--seed, k)``,

and is forced the moment the predecessor ends (never later). The baselines follow the
``sample`` step's rules exactly: ``reactive`` submits at the predecessor's end, ``avg`` at
the end minus the mean wait of the last 100 started jobs when the predecessor started
(from the same pre-simulation :func:`~mirage_tasks.sim.episode.probe_times` uses).

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
import math
import os
import time
from typing import Any

import numpy as np
import pandas as pd

from stepkit import Step, StepError, read_marker, storage

from . import __version__
from .features import FEATURE_NAMES
from .sampling import parquet_bytes, parse_shard, pool_context
from .schema import parse_time
from .schema import read_trace
from .sim.config import SimConfig, add_config_arguments, config_from_args
from .sim.episode import DecisionEpisode, probe_times
from .sim.workload import Workload

log = logging.getLogger(__name__)

BASELINE_MODELS = ("reactive", "avg")
ROWS_FILE = "validation.parquet"
DECISIONS_FILE = "decisions.parquet"
INFO_FILE = "validate.json"
HIGH_H_DEFAULT = 500.0

# column -> meaning (units); the order of the Parquet columns
ROW_COLUMNS: dict[str, str] = {
    "model": "model name (--name, default: the model kind or the baseline)",
    "model_kind": "reactive | avg | transformer | moe | xgboost | random_forest | *_policy",
    "node": "nodes of the predecessor and the successor",
    "sample": "global sample index k (start = --start + k * interval)",
    "sample_start": "sample start t0 (epoch s)",
    "pred_submit": "predecessor submission = t0 + warm-up (epoch s)",
    "pred_start": "predecessor start (epoch s)",
    "pred_end": "predecessor end = start + 48 h (epoch s)",
    "decision_time": "successor submission (epoch s)",
    "succ_start": "successor start (epoch s)",
    "signed_interruption_h": "succ_start - pred_end (h); > 0 gap, < 0 overlap",
    "interruption_h": "max(signed, 0) (h)",
    "overlap_h": "max(-signed, 0) (h)",
    "wasted_node_h": "node x overlap_h (node-hours)",
    "backfilled": "the successor started through backfill",
    "model_output": "model output at the submit decision: hours (regressor) or P(submit) (policy); "
                    "NaN when forced or for baselines",
    "n_decisions": "model evaluations in the episode (baselines: 0)",
    "forced": "submitted at the predecessor's end because it ended (reactive: always; avg: when its "
              "time is the end itself)",
    "queue_len": "pending jobs at the decision",
    "avg_wait_s": "mean wait of the last 100 started jobs at the decision (s)",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="normalised trace (ingest output prefix or .parquet)")
    p.add_argument("--model", required=True, help="trained model (train output URI), or 'reactive' / 'avg'")
    p.add_argument("--name", default=None, help="model name in the rows (default: the kind or the baseline)")
    p.add_argument("--start", required=True, help="first validation sample start (ISO; UTC if no offset)")
    p.add_argument("--count", type=int, required=True, help="number of samples (all shards together)")
    p.add_argument("--interval-hours", type=float, default=4.0, help="hours between sample starts (4)")
    p.add_argument("--warmup-days", type=float, default=2.0, help="predecessor submitted this long after the start (2)")
    p.add_argument("--workload-days", type=float, default=5.0, help="trace jobs submitted within this span are replayed (5)")
    p.add_argument("--node", type=int, required=True, help="nodes of the predecessor and successor jobs")
    p.add_argument("--decide-every-minutes", type=float, default=10.0, help="minutes between decisions (10)")
    p.add_argument("--threshold-h", type=float, default=-0.5,
                   help="regressors: submit when the predicted signed interruption is >= this (-0.5 h)")
    p.add_argument("--stochastic", action="store_true", help="policies: sample the action instead of argmax")
    p.add_argument("--seed", type=int, default=0, help="seed of --stochastic (per sample: (seed, k))")
    p.add_argument("--shard", default="0/1", help="I/S: this run computes samples k with k %% S == I (0/1)")
    p.add_argument("--window", type=int, default=None,
                   help="snapshots per history (default: the model's; 144 for baselines)")
    p.add_argument("--step-s", type=int, default=None, help="seconds between snapshots (default: the model's; 600)")
    p.add_argument("--workers", type=int, default=1, help="processes (0 = all local cores)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch/OpenMP threads per process (default 1: one history per model call)")
    p.add_argument("--allow-node-mismatch", action="store_true",
                   help="validate a model trained for another --node size (refused by default)")
    p.add_argument("--out", required=True, help="output prefix URI")
    add_config_arguments(p)


# ----------------------------------------------------------------------------- guards

def _iso(epoch: float) -> str:
    return pd.Timestamp(int(epoch), unit="s", tz="UTC").isoformat()


def _to_epoch(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, (int, float, np.integer, np.floating)):
        return int(value)
    t = pd.Timestamp(str(value))
    t = t.tz_localize("UTC") if t.tzinfo is None else t
    return int(t.timestamp())


def training_data_end(cfg: dict[str, Any]) -> tuple[int, str]:
    """(epoch, key) of the latest trace time the model's training data depend on.

    The dataset's ``data_end`` (its last sample start + workload span) covers the rows
    used for training and for model selection (validation split, early stopping, the
    policy's evaluation episodes); ``train_data_end`` covers the training rows. The later
    one counts. A config recording neither is refused: leakage could not be ruled out."""
    data = cfg.get("data") or {}
    found = [(e, k) for k in ("data_end", "train_data_end") if (e := _to_epoch(data.get(k))) is not None]
    env = cfg.get("env") or {}
    if isinstance(env.get("validation"), dict) and env["validation"].get("start_max") is not None:
        span = float(env["validation"].get("workload_days", 0.0))
        found.append((_to_epoch(env["validation"]["start_max"]) + int(span * 86400), "env.validation"))
    if isinstance(env.get("train"), dict) and env["train"].get("start_max") is not None:
        span = float(env["train"].get("workload_days", 0.0))
        found.append((_to_epoch(env["train"]["start_max"]) + int(span * 86400), "env.train"))
    if not found:
        raise StepError("leakage guard: the model's config.json records no training data window "
                        "(data.data_end / data.train_data_end); cannot rule out overlap with validation")
    return max(found)


def check_leakage(model_uri: str, cfg: dict[str, Any], first_start: int, last_end: int) -> dict[str, Any]:
    end, key = training_data_end(cfg)
    data = cfg.get("data") or {}
    doc = {"model_data_end": _iso(end), "model_data_end_key": key, "dataset": data.get("dataset"),
           "train_sample_start_min": data.get("sample_start_min"), "train_sample_start_max": data.get("sample_start_max"),
           "validation_start": _iso(first_start), "validation_end": _iso(last_end)}
    if end > first_start:
        lo = data.get("sample_start_min")
        lo = _iso(lo) if isinstance(lo, (int, float)) else lo
        raise StepError(
            f"leakage guard: model {model_uri} was trained on data up to {_iso(end)} ({key}; dataset "
            f"{data.get('dataset')}, samples from {lo}), later than the first validation sample start "
            f"{_iso(first_start)} (validation window {_iso(first_start)} .. {_iso(last_end)}). "
            f"Validate from {_iso(end)} or later, or train on data ending before {_iso(first_start)}.")
    return doc


# ----------------------------------------------------------------------------- deciders

class _Model:
    """The decision rule on top of a loaded DecisionFunction."""

    def __init__(self, fn: Any, threshold_h: float, stochastic: bool, seed: int):
        self.fn, self.threshold_h, self.stochastic, self.seed = fn, threshold_h, stochastic, seed
        self.is_policy = bool(fn.is_policy)
        self.high_h = float((fn.decision_rule or {}).get("high_h", HIGH_H_DEFAULT)) if not self.is_policy else 0.0

    def rng(self, k: int) -> np.random.Generator | None:
        return np.random.default_rng([self.seed, k]) if (self.is_policy and self.stochastic) else None

    def ask(self, hist: np.ndarray, rng: np.random.Generator | None) -> tuple[bool, float]:
        if self.is_policy:  # greedy without rng, a draw with probability P(submit) with it
            d = self.fn.decide(hist[None], rng=rng)
            return bool(d.submit[0]), float(d.raw[0])
        raw = float(self.fn.decide(hist[None]).raw[0])
        return (self.threshold_h <= raw <= self.high_h), raw


def run_episode(ep: DecisionEpisode, decider: Any, kind: str, every_s: int, k: int) -> tuple[dict, list[dict]]:
    """Drive one episode; returns (result extras, decision trace)."""
    trace: list[dict] = []
    output = math.nan
    n = 0
    if kind == "reactive":
        while ep.pred_end is None:
            ep.advance(every_s)
        ep.advance_to(ep.pred_end)
    elif kind == "avg":
        # the pre-simulation of `sample --baseline avg`: the queue as the predecessor starts
        pre = ep.fork()
        pre.sim.stop_history()
        pstart = pre.sim.run_until_started(pre.pred)
        avg = pre.sim.avg_wait_s()
        pend = pstart + pre.sim.j_dur[pre.pred]
        del pre
        (t,) = probe_times(ep.pred_submit, pend, 1, "avg", avg)
        ep.advance_to(t)
    else:
        rng = decider.rng(k)
        while not ep.pred_ended:
            if ep.history_full:
                submit, raw = decider.ask(ep.history(), rng)
                n += 1
                trace.append({"sample": k, "time": ep.now, "output": raw, "submit": bool(submit)})
                if submit:
                    output = raw
                    break
            nxt = ep.now + every_s
            pe = ep.pred_end
            ep.advance_to(pe if pe is not None and pe < nxt else nxt)
    forced = bool(ep.pred_ended)  # reactive: always; avg: only when its time is the end itself
    res = ep.submit_successor()
    return {**res, "model_output": output if not forced else math.nan, "n_decisions": n, "forced": forced}, trace


def _local_cores() -> int:
    """Cores this process may use (a pod's CPU set, not the whole machine's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# worker state (set before forking, or by the initializer)
_W: dict = {}


def _init(wl: Workload, cfg: SimConfig, setup: dict) -> None:
    _W.clear()
    _W.update(wl=wl, cfg=cfg, **setup)
    kind = setup["kind"]
    if kind in BASELINE_MODELS:
        _W["decider"] = None
        return
    threads = int(setup.get("threads") or 1)
    # One history per call: extra threads only cost (xgboost's per-call thread start-up
    # dominates a single-row prediction on a busy machine). Effective if set before the
    # OpenMP runtime loads, i.e. in a fresh worker process.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if kind not in ("xgboost", "random_forest"):
        import torch

        torch.set_num_threads(threads)
    from .models.loader import load_model

    fn = load_model(setup["model_uri"], device="cpu")
    _W["decider"] = _Model(fn, setup["threshold_h"], setup["stochastic"], setup["seed"])


def _one(task: tuple[int, int]) -> tuple[int, dict, list[dict], float]:
    k, t0 = task
    t = time.perf_counter()
    ep = DecisionEpisode(_W["wl"], _W["cfg"], t0, _W["node"], _W["warmup_days"], _W["workload_days"],
                         _W["window"], _W["step_s"])
    res, trace = run_episode(ep, _W["decider"], _W["kind"], _W["every_s"], k)
    return k, res, trace, time.perf_counter() - t


def run_tasks(wl: Workload, cfg: SimConfig, setup: dict, tasks: list[tuple[int, int]],
              workers: int = 1) -> list[tuple[int, dict, list[dict], float]]:
    """Episodes of ``tasks`` = [(k, t0)], in parallel if asked; ordered by k."""
    if workers <= 1 or len(tasks) <= 1:
        _init(wl, cfg, setup)
        out = []
        for i, task in enumerate(tasks):
            out.append(_one(task))
            if (i + 1) % 10 == 0:
                log.info("validate: %d/%d samples", i + 1, len(tasks))
        return out
    with pool_context().Pool(workers, initializer=_init, initargs=(wl, cfg, setup)) as pool:
        out = list(pool.imap_unordered(_one, tasks, chunksize=1))
    out.sort(key=lambda r: r[0])
    return out


def make_rows(results: list[tuple[int, dict, list[dict], float]], name: str, kind: str,
              node: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, decisions = [], []
    for k, r, trace, _ in results:
        s = float(r["signed_interruption_h"])
        rows.append({
            "model": name, "model_kind": kind, "node": int(node), "sample": int(k),
            "sample_start": int(r["sample_start"]), "pred_submit": int(r["pred_submit"]),
            "pred_start": int(r["pred_start"]), "pred_end": int(r["pred_end"]),
            "decision_time": int(r["succ_submit"]), "succ_start": int(r["succ_start"]),
            "signed_interruption_h": s, "interruption_h": s if s > 0 else 0.0, "overlap_h": -s if s < 0 else 0.0,
            "wasted_node_h": node * -s if s < 0 else 0.0, "backfilled": bool(r["backfilled"]),
            "model_output": float(r["model_output"]), "n_decisions": int(r["n_decisions"]),
            "forced": bool(r["forced"]), "queue_len": int(r["queue_len"]), "avg_wait_s": float(r["avg_wait_s"]),
        })
        decisions.extend(trace)
    df = pd.DataFrame(rows, columns=list(ROW_COLUMNS))
    dec = pd.DataFrame(decisions, columns=["sample", "time", "output", "submit"])
    dec = dec.astype({"sample": "int64", "time": "int64", "output": "float64", "submit": "bool"})
    return df, dec


# ----------------------------------------------------------------------------- the step

def run(args: argparse.Namespace) -> int:
    shard_i, shard_n = parse_shard(args.shard)
    if args.count < 1 or args.node < 1:
        raise StepError("--count and --node must be >= 1")
    if args.interval_hours <= 0 or args.warmup_days < 0 or args.workload_days <= args.warmup_days:
        raise StepError("need --interval-hours > 0 and --workload-days > --warmup-days >= 0")
    if args.decide_every_minutes <= 0:
        raise StepError("--decide-every-minutes must be > 0")
    if (args.window is not None and args.window < 1) or (args.step_s is not None and args.step_s < 1):
        raise StepError("--window and --step-s must be >= 1")
    every_s = int(round(args.decide_every_minutes * 60))
    start = parse_time(args.start, "--start")
    t_first = int(start.timestamp())
    step_interval = int(round(args.interval_hours * 3600))
    t_last = t_first + (args.count - 1) * step_interval
    last_end = t_last + int(round(args.workload_days * 86400))

    model_cfg: dict[str, Any] | None = None
    inputs = [args.trace]
    warnings: list[str] = []
    if args.model in BASELINE_MODELS:
        kind = args.model
        if args.stochastic:
            raise StepError("--stochastic applies to policies only")
        window = args.window or 144
        step_s = args.step_s or 600
        leakage = None
    else:
        from .models.loader import read_config

        model_cfg = read_config(args.model)
        kind = model_cfg["kind"]
        if args.stochastic and not kind.endswith("_policy"):
            raise StepError(f"--stochastic applies to policies only; {args.model} is a {kind} regressor")
        data = model_cfg["data"]
        window, step_s = int(data["window"]), int(data["step_s"])
        if (args.window and args.window != window) or (args.step_s and args.step_s != step_s):
            raise StepError(f"{args.model}: the model was trained on histories of {window} x {step_s} s; "
                            f"--window/--step-s must match or be left out")
        if list(data["feature_names"]) != FEATURE_NAMES:
            raise StepError(f"{args.model}: the model's features ({len(data['feature_names'])}) are not this "
                            f"simulator's ({len(FEATURE_NAMES)}); it was trained on another feature layout")
        if data.get("node") is not None and int(data["node"]) != args.node and not args.allow_node_mismatch:
            raise StepError(f"{args.model}: trained for {data['node']}-node jobs, validated with --node {args.node} "
                            f"(pass --allow-node-mismatch to do it anyway)")
        leakage = check_leakage(args.model, model_cfg, t_first, last_end)
        mode = (model_cfg.get("decision") or {}).get("eval_mode")
        if kind.endswith("_policy") and mode == "sample" and not args.stochastic:
            warnings.append("the policy was trained and selected sampling its actions (eval_mode sample); it is "
                            "validated greedily (P(submit) > 0.5) as asked; --stochastic --seed S validates it "
                            "the way it was selected")
        inputs.append(args.model)
    name = args.name or kind

    df, meta = read_trace(args.trace)
    cfg = config_from_args(args, meta.machine_nodes)
    if args.node > cfg.nodes:
        raise StepError(f"--node {args.node} exceeds the {cfg.nodes}-node cluster")
    if model_cfg is not None:
        sp = model_cfg["data"].get("sample_params") or {}
        if sp.get("config") and sp["config"] != cfg.to_dict():
            diff = sorted(k for k in set(sp["config"]) | set(cfg.to_dict()) if sp["config"].get(k) != cfg.to_dict().get(k))
            warnings.append(f"cluster configuration differs from the model's training data in {diff}")
        for key, val in (("warmup_days", args.warmup_days), ("workload_days", args.workload_days)):
            if key in sp and float(sp[key]) != float(val):
                warnings.append(f"{key} {val} differs from the model's training data ({sp[key]})")
    params = {
        "model": name, "model_kind": kind, "start": start.isoformat(), "count": args.count,
        "interval_hours": args.interval_hours, "warmup_days": args.warmup_days,
        "workload_days": args.workload_days, "node": args.node, "decide_every_s": every_s,
        "threshold_h": args.threshold_h, "stochastic": bool(args.stochastic), "seed": args.seed,
        "shard": [shard_i, shard_n], "window": window, "step_s": step_s, "config": cfg.to_dict(),
    }
    step = Step("validate", args.out, __version__, params, inputs=inputs)
    if step.skip():
        return 0
    wl = Workload.from_frame(df, cfg.procs_per_node or None)  # as `sample` builds it
    if len(wl) == 0:
        raise StepError(f"{args.trace}: no usable jobs")
    if model_cfg is not None:
        fp = model_cfg["data"].get("trace_fingerprint")
        if fp and wl.fingerprint and fp != wl.fingerprint:
            warnings.append(f"the model was trained on another trace (fingerprint {fp}, validating on {wl.fingerprint})")
    for w in warnings:
        log.warning("validate: %s", w)
    tasks = [(k, t_first + k * step_interval) for k in range(shard_i, args.count, shard_n)]
    if tasks and (tasks[0][1] - window * step_s < wl.submit[0] or tasks[-1][1] + args.workload_days * 86400 > wl.submit[-1]):
        warnings.append(f"samples reach outside the trace's submits ({_iso(wl.submit[0])} .. {_iso(wl.submit[-1])})")
        log.warning("validate: %s", warnings[-1])
    workers = _local_cores() if args.workers == 0 else max(1, args.workers)
    threads = args.threads or 1
    setup = {"kind": kind, "model_uri": args.model, "node": args.node, "warmup_days": args.warmup_days,
             "workload_days": args.workload_days, "window": window, "step_s": step_s, "every_s": every_s,
             "threshold_h": args.threshold_h, "stochastic": bool(args.stochastic), "seed": args.seed,
             "threads": threads}
    t = time.perf_counter()
    results = run_tasks(wl, cfg, setup, tasks, workers)
    wall = time.perf_counter() - t
    rows, decisions = make_rows(results, name, kind, args.node)
    step.write_bytes(ROWS_FILE, parquet_bytes(rows))
    step.write_bytes(DECISIONS_FILE, parquet_bytes(decisions))
    marker = read_marker(args.model) if model_cfg is not None else None
    no_full = int((rows["n_decisions"] == 0).sum()) if model_cfg is not None else 0
    if no_full:
        warnings.append(f"{no_full} sample(s) never had a full history window before the forced submission")
    info = {
        "params": params, "trace_fingerprint": wl.fingerprint, "n_samples": len(rows), "wall_s": round(wall, 3),
        "workers": workers, "episode_s_mean": round(float(np.mean([r[3] for r in results])), 4) if results else None,
        "model_uri": storage.normalize(args.model) if model_cfg is not None else None,
        "model_fingerprint": marker.get("fingerprint") if marker else None,
        "model_data": {k: v for k, v in (model_cfg or {}).get("data", {}).items()
                       if k not in ("feature_names", "sample_params", "split")} or None,
        "leakage_check": leakage, "warnings": warnings, "columns": ROW_COLUMNS,
    }
    step.write_json(INFO_FILE, info)
    summary = {"model": name, "node": args.node, "n_samples": len(rows), "wall_s": round(wall, 3)}
    if len(rows):
        summary.update({
            "mean_signed_h": float(rows["signed_interruption_h"].mean()),
            "mean_interruption_h": float(rows["interruption_h"].mean()),
            "zero_share": float((rows["signed_interruption_h"] <= 0).mean()),
            "forced_share": float(rows["forced"].mean()),
        })
    step.commit(summary=summary)
    print(f"validate {name} node {args.node}: {len(rows)} samples in {wall:.1f} s ({workers} worker(s)); "
          + (f"mean interruption {summary['mean_interruption_h']:.2f} h, zero share {summary['zero_share']:.0%}, "
             f"forced {summary['forced_share']:.0%}" if len(rows) else "no samples"), flush=True)
    return 0


def load_rows(uri: str) -> tuple[pd.DataFrame, dict, dict]:
    """(rows, validate.json, marker) of a committed validate output."""
    import pyarrow.parquet as pq

    marker = read_marker(uri)
    if marker is None:
        raise StepError(f"{uri}: no _SUCCESS.json (the validate step did not finish)")
    if marker.get("step") != "validate":
        raise StepError(f"{uri}: not a validate output (step {marker.get('step')!r})")
    with storage.open_read(storage.join(uri, ROWS_FILE)) as f:
        rows = pq.read_table(f).to_pandas()
    info = storage.read_json(storage.join(uri, INFO_FILE))
    return rows, info, marker
