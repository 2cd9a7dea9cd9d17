"""Online validation: a model (or a baseline) decides in the simulator, sample by sample.

The library behind ``python -m mirage_tasks validate`` (:mod:`mirage_tasks.steps.validate`):
the leakage guard, the decision rule on top of a loaded model, one decision episode
(:func:`run_episode`), the worker pool over samples (:func:`run_tasks`) and the result rows
(:func:`make_rows`, columns :data:`ROW_COLUMNS`).

Beside the models and the sampling's baselines, protocol v2's rules decide online too
(:data:`RULES`): ``avg-cal`` (avg with the probe replay's calibrated offset), ``wait-pred``,
``wait-pred-cal`` and ``guarantee-10`` (the wait predictor asked at every decision on the
simulator's queue, :class:`~mirage_tasks.calibration.atprobe.WaitAtProbe`), ``guarantee-cal``
(guarantee's test with the replay's conformal margin, asked at the end-spaced probe times its
margin was calibrated at, the slack taken at the next of them), and a model trained
on the predictor's channels (``xgboost-wp``) gets them appended to its history at every decision.
The time left ``D`` is the probe replay's: to the predecessor's end as pre-simulated at its
submission without the successor (the episode runs the same simulation until the successor is
submitted, so it is the end the predecessor then has).
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import Any

import numpy as np
import pandas as pd

from stepkit import StepError
from stepkit.pool import run_pool

from ..data.times import iso
from ..models.registry import family
from ..models.thresholds import submit_mask
from ..sampling.schedule import pool_context
from ..sim import decision_rules as dr
from ..sim.config import SimConfig
from ..sim.episode import DecisionEpisode, probe_times
from ..sim.probes import BASELINES, trained_offsets_s, trained_span_s
from ..sim.workload import Workload

log = logging.getLogger(__name__)

HIGH_H_DEFAULT = 500.0
#: protocol v2's rules that ask the wait predictor (``--waitpred``) at every decision
PREDICTOR_RULES = dr.needing("waitpred", "validate")
#: rules whose threshold is a probe replay's calibration (``--calibration``): avg-cal's offset and
#: wait-pred-cal's margin, as the replay chose them on the training period's validation split
CALIBRATED_RULES = (*dr.needing("avg-calibration", "validate"), *dr.needing("margin-calibration", "validate"))
#: every rule ``--model`` names without a trained model
RULES = dr.names_at("validate")
THRESHOLD_H_DEFAULT = -0.5  # models whose config records no decision rule (trained before calibration)

# column -> meaning (units); the order of the Parquet columns
ROW_COLUMNS: dict[str, str] = {
    "model": "model name (--name, default: the model kind or the baseline)",
    "model_kind": f"{' | '.join(dr.names_at('validate'))} | transformer | moe | xgboost | random_forest | *_policy",
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


# ----------------------------------------------------------------------------- guards


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
        raise StepError(
            "leakage guard: the model's config.json records no training data window "
            "(data.data_end / data.train_data_end); cannot rule out overlap with validation"
        )
    return max(found)


def check_leakage(model_uri: str, cfg: dict[str, Any], first_start: int, last_end: int) -> dict[str, Any]:
    end, key = training_data_end(cfg)
    data = cfg.get("data") or {}
    doc = {
        "model_data_end": iso(end),
        "model_data_end_key": key,
        "dataset": data.get("dataset"),
        "train_sample_start_min": data.get("sample_start_min"),
        "train_sample_start_max": data.get("sample_start_max"),
        "validation_start": iso(first_start),
        "validation_end": iso(last_end),
    }
    if end > first_start:
        lo = data.get("sample_start_min")
        lo = iso(lo) if isinstance(lo, (int, float)) else lo
        raise StepError(
            f"leakage guard: model {model_uri} was trained on data up to {iso(end)} ({key}; dataset "
            f"{data.get('dataset')}, samples from {lo}), later than the first validation sample start "
            f"{iso(first_start)} (validation window {iso(first_start)} .. {iso(last_end)}). "
            f"Validate from {iso(end)} or later, or train on data ending before {iso(first_start)}."
        )
    return doc


# ----------------------------------------------------------------------------- deciders


class _Model:
    """The decision rule on top of a loaded DecisionFunction."""

    def __init__(
        self,
        fn: Any,
        threshold_h: float | None,
        stochastic: bool,
        seed: int,
        argmax: bool = False,
        waitpred: Any = None,
        within_s: int | None = None,
        at_probes: bool = False,
    ):
        self.fn, self.stochastic, self.seed, self.argmax = fn, stochastic, seed, argmax
        self.waitpred = waitpred  # the predictor whose channels the model was trained on (xgboost-wp)
        # asked only this long before the predecessor's (pre-simulated) end: its training probes' span
        # (mirage_tasks.sim.probes.trained_span_s); None: at every decision of the grid
        self.within_s = within_s
        # asked only at its training probes' times before the predecessor's end (decide-at probes)
        self.at_probes = at_probes
        self.is_policy = bool(fn.is_policy)
        rule = fn.decision_rule or {}
        # --threshold-h overrides; else the model's own (calibrated) low_h; None = never before the end
        self.threshold_h = threshold_h if threshold_h is not None else rule.get("low_h", THRESHOLD_H_DEFAULT)
        # the calibrated load-aware shift of low_h (decision.load); a --threshold-h override is a fixed threshold
        self.load = rule.get("load") if threshold_h is None else None
        self.high_h = float(rule.get("high_h", HIGH_H_DEFAULT)) if not self.is_policy else 0.0

    def rng(self, k: int) -> np.random.Generator | None:
        return np.random.default_rng([self.seed, k]) if (self.is_policy and self.stochastic) else None

    def ask(self, hist: np.ndarray, rng: np.random.Generator | None) -> tuple[bool, float]:
        if self.is_policy:  # greedy without rng, a draw with probability P(submit) with it
            d = self.fn.decide(hist[None], rng=rng)
            if self.argmax and rng is None:  # the likelier action, ignoring the calibrated threshold
                return bool(d.raw[0] > 0.5), float(d.raw[0])
            return bool(d.submit[0]), float(d.raw[0])
        raw = float(self.fn.predict(hist[None])[0])
        if self.threshold_h is None:
            return False, raw
        # the same test as the calibration's offline replay (models.thresholds.submit_mask)
        ok = bool(submit_mask(np.array([raw]), hist[None], self.threshold_h, self.load)[0])
        return (ok and raw <= self.high_h), raw


class _Rule:
    """A rule without a trained model (:data:`RULES`): its calibrated threshold (h; None: never early)
    and, for the predictor's rules, the predictor."""

    def __init__(self, kind: str, threshold_h: float | None, waitpred: Any):
        self.kind, self.threshold_h, self.waitpred = kind, threshold_h, waitpred

    def ask(self, ep: DecisionEpisode, left_s: float, every_s: int) -> tuple[bool, float]:
        """(submit, the predictor's answer in h) with ``left_s`` to the predecessor's end and
        ``every_s`` to the next decision."""
        from ..calibration.atprobe import submits

        ans = self.waitpred(ep.sim, ep.node, ep.spec.service_s)
        if self.kind == dr.GUARANTEE_SIM:
            return submits(dr.GUARANTEE, ans, left_s, every_s), ans["wp_bound_s"] / 3600.0
        if self.kind == dr.GUARANTEE_CAL:
            return submits(dr.GUARANTEE_CAL, ans, left_s, every_s, self.threshold_h), ans["wp_bound_s"] / 3600.0
        margin = 0.0 if self.kind == dr.WAIT_PRED else self.threshold_h
        return submits(dr.WAIT_PRED, ans, left_s, every_s, margin), ans["wp_wait_s"] / 3600.0


def _pre_simulated(ep: DecisionEpisode) -> tuple[int, float]:
    """(predecessor end, mean wait at its start) as pre-simulated at its submission without the
    successor: the sampling's ``pred_end_without_succ`` and ``avg_wait_at_pred_start_s``."""
    pre = ep.fork()
    pre.sim.stop_history()
    pstart = pre.sim.run_until_started(pre.pred)
    avg = pre.sim.avg_wait_s()
    pend = pstart + pre.sim.j_dur[pre.pred]
    del pre
    return int(pend), float(avg)


def _decide_on_grid(
    ep: DecisionEpisode, every_s: int, k: int, trace: list[dict], ask: Any, from_t: float | None = None
) -> tuple[float, int]:
    """Ask ``ask() -> (submit, raw)`` every ``every_s`` once the history window is full (and from
    ``from_t`` on, when given), until it submits or the predecessor ends; each answer is appended
    to ``trace``. Returns (the raw output at the submission, NaN if none; the number of decisions)."""
    n = 0
    while not ep.pred_ended:
        if ep.history_full and (from_t is None or ep.now >= from_t):
            submit, raw = ask()
            n += 1
            trace.append({"sample": k, "time": ep.now, "output": raw, "submit": bool(submit)})
            if submit:
                return raw, n
        nxt = ep.now + every_s
        pe = ep.pred_end
        ep.advance_to(pe if pe is not None and pe < nxt else nxt)
    return math.nan, n


def _decide_at(ep: DecisionEpisode, times: list[int], k: int, trace: list[dict], ask: Any) -> tuple[float, int]:
    """Ask at each of ``times`` (epoch s; those before the history window fills are skipped) until
    it submits or the predecessor ends, as :func:`_decide_on_grid` does on its grid."""
    n = 0
    for t in sorted(times):
        pe = ep.pred_end
        if ep.pred_ended or (pe is not None and t >= pe):
            break
        if t > ep.now:
            ep.advance_to(t)
        if ep.pred_ended:
            break
        if ep.history_full and ep.now >= t:
            submit, raw = ask()
            n += 1
            trace.append({"sample": k, "time": ep.now, "output": raw, "submit": bool(submit)})
            if submit:
                return raw, n
    while not ep.pred_ended:  # no submission: to the predecessor's end (forced)
        pe = ep.pred_end
        ep.advance_to(pe if pe is not None else ep.now + 600)
    return math.nan, n


def run_episode(ep: DecisionEpisode, decider: Any, kind: str, every_s: int, k: int) -> tuple[dict, list[dict]]:
    """Drive one episode; returns (result extras, decision trace)."""
    trace: list[dict] = []
    output = math.nan
    n = 0
    if kind == dr.REACTIVE:
        while ep.pred_end is None:
            ep.advance(every_s)
        ep.advance_to(ep.pred_end)
    elif kind == dr.AVG:
        # the pre-simulation of `sample --baseline avg`: the queue as the predecessor starts
        pend, avg = _pre_simulated(ep)
        (t,) = probe_times(ep.pred_submit, pend, 1, "avg", avg)
        ep.advance_to(t)
    elif kind == dr.AVG_CAL:
        # the probe replay's avg-cal: submit where the mean wait minus the time left reaches the offset
        pend, avg = _pre_simulated(ep)
        lead = avg - decider.threshold_h * 3600.0 if decider.threshold_h is not None else 0.0
        ep.advance_to(max(ep.pred_submit, int(pend - lead)) if lead > 0 else pend)
    elif kind == dr.GUARANTEE_CAL:  # at the probe times its margin was calibrated at, as the replay asks
        pend, _ = _pre_simulated(ep)
        times = probe_times(ep.pred_submit, pend, 1, "default", 0.0, "end")[:-1]

        def ask_cal() -> tuple[bool, float]:  # the slack is the time left at the next probe (the end after the last)
            nxt = min([t for t in times if t > ep.now], default=pend)
            return decider.ask(ep, pend - ep.now, nxt - ep.now)

        output, n = _decide_at(ep, times, k, trace, ask_cal)
    elif kind in PREDICTOR_RULES:
        pend, _ = _pre_simulated(ep)
        output, n = _decide_on_grid(ep, every_s, k, trace, lambda: decider.ask(ep, pend - ep.now, every_s))
    else:
        rng = decider.rng(k)
        pend = (
            _pre_simulated(ep)[0]
            if (decider.waitpred is not None or decider.within_s is not None or decider.at_probes)
            else None
        )

        def ask() -> tuple[bool, float]:
            hist = ep.history()
            if decider.waitpred is not None:  # a model on the predictor's channels (xgboost-wp)
                from ..calibration.atprobe import channels

                ans = decider.waitpred(ep.sim, ep.node, ep.spec.service_s)
                ch = channels(ans["wp_wait_s"], ans["wp_bound_s"], (pend - ep.now) / 3600.0)
                hist = np.concatenate([hist, np.broadcast_to(ch, (hist.shape[0], ch.shape[1]))], axis=1)
            return decider.ask(hist, rng)

        if decider.at_probes:  # at the training probes' times only (the sampling's own
            # minute-aligned placement), as the replay asks; the last, the end itself, is the forced one
            times = probe_times(ep.pred_submit, pend, 1, "default", 0.0, "end")[:-1]
            output, n = _decide_at(ep, times, k, trace, ask)
        else:
            output, n = _decide_on_grid(
                ep, every_s, k, trace, ask, None if decider.within_s is None else pend - decider.within_s
            )
    forced = bool(ep.pred_ended)  # reactive: always; avg: only when its time is the end itself
    res = ep.submit_successor()
    return {**res, "model_output": output if not forced else math.nan, "n_decisions": n, "forced": forced}, trace


# worker state (set before forking, or by the initializer)
_W: dict = {}


def _init(wl: Workload, cfg: SimConfig, setup: dict) -> None:
    _W.clear()
    _W.update(wl=wl, cfg=cfg, **setup)
    kind = setup["kind"]
    if kind in BASELINES:
        _W["decider"] = None
        return
    if kind in RULES:
        _W["decider"] = _Rule(kind, setup.get("rule_threshold_h"), setup.get("waitpred"))
        return
    threads = int(setup.get("threads") or 1)
    # One history per call: extra threads only cost (xgboost's per-call thread start-up
    # dominates a single-row prediction on a busy machine). Effective if set before the
    # OpenMP runtime loads, i.e. in a fresh worker process.
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if family(kind).torch:
        import torch

        torch.set_num_threads(threads)
    from ..models.loader import load_model

    fn = load_model(setup["model_uri"], device="cpu")
    _W["decider"] = _Model(
        fn,
        setup["threshold_h"],
        setup["stochastic"],
        setup["seed"],
        bool(setup.get("argmax")),
        setup.get("waitpred"),
        setup.get("within_s"),
        bool(setup.get("at_probes")),
    )


def _one(task: tuple[int, int]) -> tuple[int, dict, list[dict], float]:
    k, t0 = task
    t = time.perf_counter()
    ep = DecisionEpisode(
        _W["wl"], _W["cfg"], t0, _W["node"], _W["warmup_days"], _W["workload_days"], _W["window"], _W["step_s"]
    )
    res, trace = run_episode(ep, _W["decider"], _W["kind"], _W["every_s"], k)
    return k, res, trace, time.perf_counter() - t


def run_tasks(
    wl: Workload, cfg: SimConfig, setup: dict, tasks: list[tuple[int, int]], workers: int = 1, part: str = ""
) -> list[tuple[int, dict, list[dict], float]]:
    """Episodes of ``tasks`` = [(k, t0)], in parallel if asked; ordered by k. A worker that
    dies ends the run (:class:`stepkit.pool.WorkerDied` naming the sample and ``part``)."""
    if workers <= 1 or len(tasks) <= 1:
        _init(wl, cfg, setup)
        out = []
        for i, task in enumerate(tasks):
            out.append(_one(task))
            if (i + 1) % 10 == 0:
                log.info("validate: %d/%d samples", i + 1, len(tasks))
        return out
    from ..sampling.sample import describe_sample

    out = run_pool(
        _one,
        tasks,
        workers,
        initializer=_init,
        initargs=(wl, cfg, setup),
        describe=lambda t: describe_sample(t, part),
        name="validate",
        context=pool_context(),
    )
    out.sort(key=lambda r: r[0])
    return out


def make_rows(
    results: list[tuple[int, dict, list[dict], float]], name: str, kind: str, node: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    rows, decisions = [], []
    for k, r, trace, _ in results:
        s = float(r["signed_interruption_h"])
        rows.append(
            {
                "model": name,
                "model_kind": kind,
                "node": int(node),
                "sample": int(k),
                "sample_start": int(r["sample_start"]),
                "pred_submit": int(r["pred_submit"]),
                "pred_start": int(r["pred_start"]),
                "pred_end": int(r["pred_end"]),
                "decision_time": int(r["succ_submit"]),
                "succ_start": int(r["succ_start"]),
                "signed_interruption_h": s,
                "interruption_h": s if s > 0 else 0.0,
                "overlap_h": -s if s < 0 else 0.0,
                "wasted_node_h": node * -s if s < 0 else 0.0,
                "backfilled": bool(r["backfilled"]),
                "model_output": float(r["model_output"]),
                "n_decisions": int(r["n_decisions"]),
                "forced": bool(r["forced"]),
                "queue_len": int(r["queue_len"]),
                "avg_wait_s": float(r["avg_wait_s"]),
            }
        )
        decisions.extend(trace)
    df = pd.DataFrame(rows, columns=list(ROW_COLUMNS))
    dec = pd.DataFrame(decisions, columns=["sample", "time", "output", "submit"])
    dec = dec.astype({"sample": "int64", "time": "int64", "output": "float64", "submit": "bool"})
    return df, dec


# ----------------------------------------------------------------------------- the model under test


def resolve_model(
    model: str,
    *,
    node: int,
    stochastic: bool,
    window: int | None,
    step_s: int | None,
    allow_node_mismatch: bool,
    first_start: int,
    last_end: int,
    waitpred: bool = False,
) -> dict[str, Any]:
    """What ``validate --model`` names, checked against the run: kind, config, history shape, leakage.

    Returns ``{"kind", "config" (None for a baseline), "window", "step_s", "leakage", "warnings"}``,
    and for a model ``"uses_waitpred"`` and ``"trained_span_s"`` (how long before the predecessor's
    end its training probes reach, :func:`~mirage_tasks.sim.probes.trained_span_s`).
    """
    from ..sim.features import FEATURE_NAMES

    if model in RULES:
        if stochastic:
            raise StepError("--stochastic applies to policies only")
        return {
            "kind": model,
            "config": None,
            "window": window or 144,
            "step_s": step_s or 600,
            "leakage": None,
            "warnings": [],
        }
    from ..models.loader import read_config

    cfg = read_config(model)
    kind = cfg["kind"]
    policy = family(kind).policy
    if stochastic and not policy:
        raise StepError(f"--stochastic applies to policies only; {model} is a {kind} regressor")
    data = cfg["data"]
    w, s = int(data["window"]), int(data["step_s"])
    if (window and window != w) or (step_s and step_s != s):
        raise StepError(
            f"{model}: the model was trained on histories of {w} x {s} s; --window/--step-s must match or be left out"
        )
    from ..calibration import atprobe

    wp = atprobe.uses_features(data["feature_names"])
    if wp and not waitpred:
        raise StepError(
            f"{model}: trained with the wait predictor's channels (merge --waitpred-features): give "
            "--waitpred (the waitpred output its samples were drawn with) so that every decision asks it"
        )
    if (
        list(data["feature_names"])[: len(data["feature_names"]) - (len(atprobe.FEATURES) if wp else 0)]
        != FEATURE_NAMES
    ):
        raise StepError(
            f"{model}: the model's features ({len(data['feature_names'])}) are not this "
            f"simulator's ({len(FEATURE_NAMES)}); it was trained on another feature layout"
        )
    if data.get("node") is not None and int(data["node"]) != node and not allow_node_mismatch:
        raise StepError(
            f"{model}: trained for {data['node']}-node jobs, validated with --node {node} "
            f"(pass --allow-node-mismatch to do it anyway)"
        )
    leakage = check_leakage(model, cfg, first_start, last_end)
    warnings = []
    if policy and (cfg.get("decision") or {}).get("eval_mode") == "sample" and not stochastic:
        warnings.append(
            "the policy was trained and selected sampling its actions (eval_mode sample); it is "
            "validated greedily (P(submit) > 0.5) as asked; --stochastic --seed S validates it "
            "the way it was selected"
        )
    return {
        "kind": kind,
        "config": cfg,
        "window": w,
        "step_s": s,
        "leakage": leakage,
        "warnings": warnings,
        "uses_waitpred": wp,
        "trained_span_s": trained_span_s(data.get("sample_params")),
        "trained_offsets_s": trained_offsets_s(data.get("sample_params")),
    }


def sampling_warnings(
    model_cfg: dict[str, Any], sim_config: dict[str, Any], warmup_days: float, workload_days: float
) -> list[str]:
    """Where this validation replays the trace differently from the model's training samples."""
    out = []
    sp = model_cfg["data"].get("sample_params") or {}
    if sp.get("config") and sp["config"] != sim_config:
        diff = sorted(k for k in set(sp["config"]) | set(sim_config) if sp["config"].get(k) != sim_config.get(k))
        out.append(f"cluster configuration differs from the model's training data in {diff}")
    for key, val in (("warmup_days", warmup_days), ("workload_days", workload_days)):
        if key in sp and float(sp[key]) != float(val):
            out.append(f"{key} {val} differs from the model's training data ({sp[key]})")
    return out
