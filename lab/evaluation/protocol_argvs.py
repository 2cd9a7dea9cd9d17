"""The evaluation protocols' command lines beyond the wait predictor's: the probe-replay decisions
(protocol v1 and v2's samples, models and replays) and the online decider's runs, per log
description (:class:`mirage_tasks.run.evalplan.LogSpec`) and budget
(:class:`~mirage_tasks.run.evalplan.Budget`). ``python -m lab.campaigns.mirage_eval`` runs them
after the product's :func:`~mirage_tasks.run.evalplan.waitpred_argvs` (what the
``mirage_evaluation`` DAG runs). Each argv is ``[step, flags...]`` for ``python -m mirage_tasks``
or a lab module named by :data:`mirage_tasks.run.evalplan.MODULES`. Stdlib only at import."""

from __future__ import annotations

from datetime import datetime, timedelta

from mirage_tasks.run.evalplan import WORKLOAD_DAYS, Budget, LogSpec, SpecError, month_end, utc_day
from mirage_tasks.sim import decision_rules as dr


def sample_counts(spec: LogSpec, budget: Budget) -> tuple[int, str, str, int]:
    """(training count, first training start, first scored start, scored count) on the protocol's
    grid: training samples from ``train_start`` until ``WORKLOAD_DAYS`` before the first scored
    month, scored samples over the scored months (UTC days)."""
    first = utc_day(f"{spec.months[0]}-01")
    end = utc_day(month_end(spec.months[-1]))
    step = timedelta(hours=budget.interval_h)
    t0 = utc_day(spec.train_start or spec.calibrate[0])
    n_train = int((first - timedelta(days=WORKLOAD_DAYS) - t0) / step) + 1
    n_score = int((end - first) / step)
    if budget.max_train or budget.max_score:  # a smoke size: the last training samples before the first scored month
        n_train, n_score = min(n_train, budget.max_train or n_train), min(n_score, budget.max_score or n_score)
        t0 = first - timedelta(days=WORKLOAD_DAYS) - step * (n_train - 1)
    if n_train < 2:
        raise SpecError(
            f"{spec.source or spec.name}: the training window before {spec.months[0]} holds "
            f"{n_train} sample(s) {budget.interval_h:g} h apart: start it earlier (train_start)"
        )
    return n_train, t0.isoformat(), first.isoformat(), n_score


def decision_argvs(
    spec: LogSpec,
    root: str,
    budget: Budget = Budget(),
    nodes: tuple[int, ...] | None = None,
    *,
    waitpred: bool = False,
    fresh: tuple[str, ...] = (),
    online_rules: bool = True,
    grid_rule_nodes: tuple[int, ...] | None = None,
) -> list[tuple[str, list[str]]]:
    """(name, argv) of the decision evaluation per node size: sample (training and scored months),
    merge, train each model, then the probe replay (docs/results/protocol.md).

    ``waitpred``: protocol v2 (docs/results/protocol-v2.md): the samples carry the wait predictor's
    answer at each probe (``sample --waitpred``, the log's ``waitpred`` output), under ``v2-*``
    folders, and ``fresh`` months are sampled and scored beside the spec's (the training window
    stays the spec's: before its first month); the online decider runs on them, with the v2 rules
    (:func:`online_rule_argvs`, minutes per rule: the predictor asked every 10 minutes) only when
    ``online_rules``; given ``grid_rule_nodes``, the :data:`PREDICTOR_GRID_RULES` run on those node
    sizes alone (the others on every size)."""
    d = f"{root.rstrip('/')}/{spec.name}"
    n_train, train_start, score_start, n_score = sample_counts(spec, budget)
    out: list[tuple[str, list[str]]] = []
    sizes = [n for n in spec.nodes if not nodes or n in nodes]
    v = "v2-" if waitpred else ""
    for n in sizes:
        common = [
            *_validate_common(d, budget, n),
            "--probe-spacing",
            "end",
            *(["--waitpred", f"{d}/waitpred"] if waitpred else []),
        ]
        out.append(
            (
                f"sample-train-node{n}",
                [
                    "sample",
                    *common,
                    "--start",
                    train_start,
                    "--count",
                    str(n_train),
                    "--out",
                    f"{d}/{v}samples-train/node{n}",
                ],
            )
        )
        out.append(
            (
                f"merge-node{n}",
                [
                    "merge",
                    "--in",
                    f"{d}/{v}samples-train/node{n}",
                    "--out",
                    f"{d}/{v}datasets/node{n}",
                    "--no-compress",
                ],
            )
        )
        out.append(
            (
                f"sample-score-node{n}",
                [
                    "sample",
                    *common,
                    "--start",
                    score_start,
                    "--count",
                    str(n_score),
                    "--out",
                    f"{d}/{v}samples-score/node{n}",
                ],
            )
        )
        if fresh:
            f_start, f_count = _fresh_window(budget, fresh)
            out.append(
                (
                    f"sample-fresh-node{n}",
                    [
                        "sample",
                        *common,
                        "--start",
                        f_start.isoformat(),
                        "--count",
                        str(f_count),
                        "--out",
                        f"{d}/{v}samples-fresh/node{n}",
                    ],
                )
            )
        for model in budget.models:
            out.append(
                (
                    f"train-node{n}-{model}",
                    [
                        "train",
                        "--model",
                        model,
                        "--dataset",
                        f"{d}/{v}datasets/node{n}",
                        "--out",
                        f"{d}/{v}models/node{n}/{model}",
                        "--preset",
                        "quick",
                        "--seed",
                        "0",
                        "--threads",
                        "1",
                    ],
                )
            )
        if waitpred and WP_MODEL in budget.models:  # protocol v2's xgboost-wp: the same fit, the answer as channels
            out.append(
                (
                    f"merge-wp-node{n}",
                    [
                        "merge",
                        "--in",
                        f"{d}/{v}samples-train/node{n}",
                        "--out",
                        f"{d}/{v}datasets-wp/node{n}",
                        "--no-compress",
                        "--waitpred-features",
                    ],
                )
            )
            out.append(
                (
                    f"train-node{n}-{WP_MODEL}-wp",
                    [
                        "train",
                        "--model",
                        WP_MODEL,
                        "--dataset",
                        f"{d}/{v}datasets-wp/node{n}",
                        "--out",
                        f"{d}/{v}models/node{n}/{WP_MODEL}-wp",
                        "--preset",
                        "quick",
                        "--seed",
                        "0",
                        "--threads",
                        "1",
                    ],
                )
            )
    if waitpred and fresh:
        out += online_argvs(spec, root, budget, sizes, fresh)
    for n in sizes:
        for kind, months in (("score", spec.months), *((("fresh", fresh),) if fresh else ())):
            out.append(
                (
                    f"eval-node{n}" + ("-fresh" if kind == "fresh" else ""),
                    [
                        "probe-replay",
                        "--train-samples",
                        f"{d}/{v}samples-train/node{n}",
                        "--dataset",
                        f"{d}/{v}datasets/node{n}",
                        "--score-samples",
                        f"{d}/{v}samples-{kind}/node{n}",
                        "--months",
                        *months,
                        "--models",
                        *(f"{d}/{v}models/node{n}/{m}" for m in _replayed(budget, waitpred)),
                        "--out",
                        f"{d}/{v}eval{'-fresh' if kind == 'fresh' else ''}/node{n}",
                        "--bootstrap",
                        str(budget.bootstrap),
                    ],
                )
            )
    if waitpred and fresh and online_rules:  # after the replay: the calibrated rules take its thresholds
        out += online_rule_argvs(spec, root, budget, sizes, fresh, grid_rule_nodes)
    return out


#: the model protocol v2 also trains with the wait predictor's answer as features (``xgboost-wp``)
WP_MODEL = "xgboost"


def _replayed(budget: Budget, waitpred: bool) -> list[str]:
    """The model folders the probe replay scores: the budget's, and under v2 ``xgboost-wp``."""
    return [*budget.models, *([f"{WP_MODEL}-wp"] if waitpred and WP_MODEL in budget.models else [])]


def _fresh_window(budget: Budget, fresh: tuple[str, ...]) -> tuple[datetime, int]:
    """(first start, sample count) of the fresh months' samples, capped by ``budget.max_score``."""
    f_start = utc_day(f"{fresh[0]}-01")
    f_count = int((utc_day(month_end(fresh[-1])) - f_start) / timedelta(hours=budget.interval_h))
    return f_start, min(f_count, budget.max_score) if budget.max_score else f_count


#: protocol v2's online decider (``validate``, a decision every 10 minutes): the rules it runs.
#: A model without a suffix is asked every 10 minutes within its training probes' span (the last
#: 24 h for the end spacing; ``validate --decide-at grid``, the default before ``auto``); a ``-all``
#: rule is the same model asked at every decision of the grid (``--decide-within all``), a
#: ``-probes`` rule only at its training probes' times (``--decide-at probes``: the times its
#: threshold was calibrated at, as the probe replay asks it, and what ``--decide-at auto``, the
#: default, does for an end-spaced model)
ONLINE_RULES = ("reactive", "xgboost", "xgboost-all", "xgboost-probes", "xgboost-uniform")


ASK_ALL = "-all"


ASK_SUFFIXES = {ASK_ALL: ["--decide-within", "all", "--decide-at", "grid"], "-probes": ["--decide-at", "probes"]}


#: the end-spaced models, whose unsuffixed rules ask on the 10-minute grid (named: ``auto`` would ask
#: them at their probes' times; a uniform model is on the grid either way)
GRID_MODELS = ("xgboost", "xgboost-wp")


def base_rule(rule: str) -> str:
    """The model or rule an online rule name runs (its name without an :data:`ASK_SUFFIXES` suffix)."""
    return _asked(rule)[0]


def _validate_common(d: str, budget: Budget, n: int) -> list[str]:
    """The flags every ``sample`` and online ``validate`` of a log's node size shares: its trace, its
    calibrated configuration, the sampling interval, the node size and one worker."""
    return [
        "--trace",
        f"{d}/trace",
        "--cluster-config",
        f"{d}/cal/config.json",
        "--interval-hours",
        f"{budget.interval_h:g}",
        "--node",
        str(n),
        "--workers",
        "1",
    ]


def online_argvs(
    spec: LogSpec, root: str, budget: Budget, sizes: list[int], fresh: tuple[str, ...]
) -> list[tuple[str, list[str]]]:
    """Protocol v2's online decider on the fresh months' samples (same starts as the probe replay's):
    reactive, the xgboost model of the replay, and an xgboost trained on the reference's uniform probe
    spacing (7 decisions 8 h apart, as the service keeper's model was), which shows what a model
    that never saw a decision in the predecessor's last 8 hours answers there."""
    d = f"{root.rstrip('/')}/{spec.name}"
    n_train, train_start, _, _ = sample_counts(spec, budget)
    f_start, f_count = _fresh_window(budget, fresh)
    out: list[tuple[str, list[str]]] = []
    for n in sizes:
        common = _validate_common(d, budget, n)
        out.append(
            (
                f"sample-uniform-node{n}",
                [
                    "sample",
                    *common,
                    "--start",
                    train_start,
                    "--count",
                    str(n_train),
                    "--out",
                    f"{d}/uniform-samples-train/node{n}",
                ],
            )
        )
        out.append(
            (
                f"merge-uniform-node{n}",
                [
                    "merge",
                    "--in",
                    f"{d}/uniform-samples-train/node{n}",
                    "--out",
                    f"{d}/uniform-datasets/node{n}",
                    "--no-compress",
                ],
            )
        )
        out.append(
            (
                f"train-uniform-node{n}",
                [
                    "train",
                    "--model",
                    "xgboost",
                    "--dataset",
                    f"{d}/uniform-datasets/node{n}",
                    "--out",
                    f"{d}/uniform-models/node{n}/xgboost",
                    "--preset",
                    "quick",
                    "--seed",
                    "0",
                    "--threads",
                    "1",
                ],
            )
        )
        models = {
            "reactive": "reactive",
            "xgboost": f"{d}/v2-models/node{n}/xgboost",
            "xgboost-uniform": f"{d}/uniform-models/node{n}/xgboost",
        }
        for rule in ONLINE_RULES:
            model, ask = _asked(rule)
            out.append(
                (
                    f"online-node{n}-{rule}",
                    [
                        "validate",
                        *common,
                        "--start",
                        f_start.isoformat(),
                        "--count",
                        str(f_count),
                        "--model",
                        models[model],
                        "--name",
                        rule,
                        *ask,
                        "--threads",
                        "1",
                        "--out",
                        f"{d}/v2-online-fresh/node{n}/{rule}",
                    ],
                )
            )
    return out


#: protocol v2's rules the online decider also runs, each as the probe replay scores it (the calibrated
#: ones with the replay's thresholds, the predictor's with the samples' waitpred output)
ONLINE_V2_RULES = (
    "avg-cal",
    "wait-pred",
    "wait-pred-cal",
    "guarantee-10",
    "guarantee-cal",
    "xgboost-wp",
    "xgboost-wp-all",
    "xgboost-wp-probes",
)


#: of :data:`ONLINE_V2_RULES`, those that ask the wait predictor every 10 minutes until they submit
#: (hundreds of its answers per sample: the costly ones; avg-cal, guarantee-cal and the ``-probes``
#: rule are asked at a few fixed times)
PREDICTOR_GRID_RULES = ("wait-pred", "wait-pred-cal", "guarantee-10", "xgboost-wp", "xgboost-wp-all")


def _asked(rule: str) -> tuple[str, list[str]]:
    """(the model or rule an online rule name runs, the ``validate`` flags of how it is asked)."""
    for suffix, flags in ASK_SUFFIXES.items():
        if rule.endswith(suffix):
            return rule[: -len(suffix)], list(flags)
    return rule, (["--decide-at", "grid"] if rule in GRID_MODELS else [])


def online_rule_argvs(
    spec: LogSpec,
    root: str,
    budget: Budget,
    sizes: list[int],
    fresh: tuple[str, ...],
    grid_rule_nodes: tuple[int, ...] | None = None,
) -> list[tuple[str, list[str]]]:
    """:data:`ONLINE_V2_RULES` on the online decider's samples (:func:`online_argvs`), after the probe
    replay of the fresh months (whose calibration gives avg-cal's offset and wait-pred-cal's margin);
    the :data:`PREDICTOR_GRID_RULES` only on the node sizes of ``grid_rule_nodes`` when given."""
    d = f"{root.rstrip('/')}/{spec.name}"
    f_start, f_count = _fresh_window(budget, fresh)
    out: list[tuple[str, list[str]]] = []
    for n in sizes:
        common = [
            *_validate_common(d, budget, n),
            "--start",
            f_start.isoformat(),
            "--count",
            str(f_count),
            "--threads",
            "1",
        ]
        for rule in ONLINE_V2_RULES:
            base, ask = _asked(rule)
            if base == f"{WP_MODEL}-wp" and WP_MODEL not in budget.models:
                continue
            if grid_rule_nodes is not None and rule in PREDICTOR_GRID_RULES and n not in grid_rule_nodes:
                continue
            extra = (
                ["--calibration", f"{d}/v2-eval-fresh/node{n}"]
                if rule in (dr.AVG_CAL, dr.WAIT_PRED_CAL, dr.GUARANTEE_CAL)
                else []
            )
            if rule != dr.AVG_CAL:
                extra += ["--waitpred", f"{d}/waitpred"]
            extra += ask
            model = f"{d}/v2-models/node{n}/{base}" if base.endswith("-wp") else base
            out.append(
                (
                    f"online-node{n}-{rule}",
                    [
                        "validate",
                        *common,
                        "--model",
                        model,
                        "--name",
                        rule,
                        *extra,
                        "--out",
                        f"{d}/v2-online-fresh/node{n}/{rule}",
                    ],
                )
            )
    return out
