"""A log to evaluate, described once, and every command line of its evaluation (no I/O but reading
the description).

A **log description** (:class:`LogSpec`) is a small JSON or YAML file, or the same fields as flags
(``bench/mirage_eval.py --trace ...``) or as the ``mirage_evaluation`` DAG's form::

    {"name": "mysite", "trace": "/data/sacct-2024.log", "timezone": "Europe/Berlin",
     "calibrate": ["2024-01-01", "2024-03-01"], "months": ["2024-03", "2024-04", "2024-05"],
     "nodes": [1, 8], "procs_per_node": null, "machine_nodes": 240}

``trace`` is a raw log (a Slurm ``sacct`` export or an SWF file, local path or URI); a relative
path is read from the folder of the description file (or ``traces`` when given). ``calibrate`` is
the calibration period ``[from, to)`` (dates in the log's time zone), ``months`` the scored
months after it, ``nodes`` the service's node sizes (the probe-replay evaluation), and
``procs_per_node`` converts processor counts where the log records no node counts (SWF).
``machine_nodes`` is the machine's size where the log does not state it (an SWF header's
``MaxNodes`` does): the calibrated simulator is never larger. ``train_start`` (default: the
calibration start) is the first training sample's day, ``start_config`` a simulator preset tried
first by the calibration.

The functions below give each step's argv (``[step, flags...]`` for ``python -m mirage_tasks``,
or for a module named by :data:`MODULES`); ``bench/mirage_eval.py`` runs them one after the
other and the ``mirage_evaluation`` DAG maps them onto tasks. Stdlib only at import.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

#: the modules that are not ``python -m mirage_tasks <step>`` steps
MODULES = {"probe-replay": "lab.evaluation.probe_replay"}
#: the protocol's budgets (docs/results/protocol.md)
CAL_TRIALS = 40
CAL_TIMEOUT_S = 300.0
INTERVAL_H = 6.0
BOOTSTRAP = 2000
WORKLOAD_DAYS = 5.0
MODELS = ("xgboost", "linear_quantile")
MAX_MONTHS = 24
MAX_NODE_SIZES = 8

_MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class SpecError(ValueError):
    """A log description that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class LogSpec:
    name: str
    trace: str
    calibrate: tuple[str, str]
    months: tuple[str, ...]
    nodes: tuple[int, ...] = (1, 8)
    timezone: str | None = None
    procs_per_node: int | None = None
    machine_nodes: int | None = None
    train_start: str | None = None
    start_config: str | None = None
    source: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        d["calibrate"], d["months"], d["nodes"] = list(self.calibrate), list(self.months), list(self.nodes)
        return d

    @classmethod
    def from_dict(cls, doc: Any, source: str = "the log description", traces: str | None = None) -> LogSpec:
        """Checked: every problem is a :class:`SpecError` naming ``source`` and the field."""
        if not isinstance(doc, dict):
            raise SpecError(f"{source}: a log description is a mapping of fields, got {type(doc).__name__}")
        known = {f.name for f in fields(cls)} - {"source"}
        unknown = sorted(set(doc) - known)
        if unknown:
            raise SpecError(f"{source}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        for req in ("name", "trace", "calibrate", "months"):
            if doc.get(req) in (None, "", []):
                raise SpecError(f"{source}: field {req!r} is required")

        def err(fld: str, msg: str) -> SpecError:
            return SpecError(f"{source}: field {fld!r}: {msg}")

        name = doc["name"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise err("name", f"{name!r} is not a short name (letters, digits, '.', '_', '-'; it names a folder)")
        trace = doc["trace"]
        if not isinstance(trace, str):
            raise err("trace", "a path or URI of the raw log")
        if "://" not in trace and not Path(trace).is_absolute():
            base = Path(traces) if traces else (Path(source).parent if source.endswith((".json", ".yaml", ".yml"))
                                                  else Path.cwd())
            trace = str((base / trace).resolve())
        cal = doc["calibrate"]
        if isinstance(cal, (list, tuple)):  # YAML reads an unquoted 2024-01-01 as a date
            cal = [x.isoformat() if isinstance(x, date) else x for x in cal]
        if isinstance(doc.get("train_start"), date):
            doc = {**doc, "train_start": doc["train_start"].isoformat()}
        if not isinstance(cal, (list, tuple)) or len(cal) != 2 or not all(isinstance(x, str) for x in cal):
            raise err("calibrate", "two dates [from, to), e.g. [\"2024-01-01\", \"2024-03-01\"]")
        c0, c1 = (_day(x, "calibrate", source) for x in cal)
        if c1 <= c0:
            raise err("calibrate", f"the end {cal[1]} is not after the start {cal[0]}")
        months = doc["months"]
        if isinstance(months, str):
            months = [months]
        if not isinstance(months, (list, tuple)) or not months:
            raise err("months", "a list of scored months YYYY-MM")
        bad = [m for m in months if not (isinstance(m, str) and _MONTH.fullmatch(m))]
        if bad:
            raise err("months", f"{', '.join(map(repr, bad))} not of the form YYYY-MM")
        months = tuple(sorted(set(months)))
        if len(months) > MAX_MONTHS:
            raise err("months", f"{len(months)} months; at most {MAX_MONTHS}")
        if date(int(months[0][:4]), int(months[0][5:]), 1) < c1:
            raise err("months", f"the first scored month {months[0]} begins before the calibration period ends "
                                f"({cal[1]}): score months after it")
        nodes = doc.get("nodes", [1, 8])
        if isinstance(nodes, int) and not isinstance(nodes, bool):
            nodes = [nodes]
        if (not isinstance(nodes, (list, tuple)) or not nodes
                or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 100_000 for n in nodes)):
            raise err("nodes", f"a list of node sizes, each a whole number 1 .. 100000, got {nodes!r}")
        if len(set(nodes)) > MAX_NODE_SIZES:
            raise err("nodes", f"at most {MAX_NODE_SIZES} node sizes")

        def opt_int(fld: str, lo: int, hi: int) -> int | None:
            v = doc.get(fld)
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise err(fld, f"a whole number {lo} .. {hi}, got {v!r}")
            return v

        tz = doc.get("timezone")
        if tz is not None:
            if not isinstance(tz, str) or not tz:
                raise err("timezone", "an IANA time zone name, e.g. America/Chicago")
            try:
                from zoneinfo import ZoneInfo

                ZoneInfo(tz)
            except Exception as exc:  # noqa: BLE001 - any failure to resolve it is the user's to fix
                raise err("timezone", f"{tz!r} is not a known time zone") from exc
        ts = doc.get("train_start")
        if ts is not None:
            _day(ts, "train_start", source)
        sc = doc.get("start_config")
        if sc is not None and not isinstance(sc, str):
            raise err("start_config", "a simulator preset name or a configuration file")
        return cls(name=name, trace=trace, calibrate=(str(cal[0]), str(cal[1])), months=months,
                   nodes=tuple(sorted(set(nodes))), timezone=tz, procs_per_node=opt_int("procs_per_node", 1, 4096),
                   machine_nodes=opt_int("machine_nodes", 1, 10_000_000), train_start=ts, start_config=sc,
                   source=source)


def _day(v: Any, fld: str, source: str) -> date:
    try:
        return date.fromisoformat(str(v)[:10])
    except ValueError as exc:
        raise SpecError(f"{source}: field {fld!r}: {v!r} is not a date YYYY-MM-DD") from exc


def load(path: str, traces: str | None = None) -> LogSpec:
    """A log description from a JSON or YAML file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError(f"{path}: cannot read the log description ({exc.strerror or exc})") from exc
    if p.suffix in (".yaml", ".yml"):
        import yaml  # noqa: PLC0415 - only for YAML descriptions

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: not valid YAML: {exc}") from exc
    else:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}: not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    return LogSpec.from_dict(doc, source=str(path), traces=traces)


def month_end(m: str) -> str:
    """The day after month ``m`` (YYYY-MM-DD)."""
    y, mo = int(m[:4]), int(m[5:])
    return f"{y + (mo == 12):04d}-{mo % 12 + 1:02d}-01"


def _utc(day: str) -> datetime:
    return datetime.fromisoformat(day[:10]).replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Budget:
    """The evaluation's sizes (the protocol's by default; smaller for a smoke run)."""

    trials: int = CAL_TRIALS
    timeout_s: float = CAL_TIMEOUT_S
    interval_h: float = INTERVAL_H
    bootstrap: int = BOOTSTRAP
    models: tuple[str, ...] = MODELS
    max_train: int = 0
    max_score: int = 0


def waitpred_argvs(spec: LogSpec, root: str, budget: Budget = Budget()) -> list[tuple[str, list[str]]]:
    """(name, argv) of the wait-predictor evaluation: ingest, calibrate, waitpred."""
    d = f"{root.rstrip('/')}/{spec.name}"
    ing = ["ingest", "--trace", spec.trace, "--out", f"{d}/trace"]
    if spec.timezone:
        ing += ["--timezone", spec.timezone]
    m0, m1 = spec.months[0], spec.months[-1]
    cal = ["calibrate", "--trace", f"{d}/trace", "--calibrate-from", spec.calibrate[0],
           "--calibrate-to", spec.calibrate[1], "--score-from", f"{m0}-01", "--score-to", month_end(m1),
           "--trials", str(budget.trials), "--timeout-s", f"{budget.timeout_s:g}", "--seed", "0", "--out", f"{d}/cal"]
    if spec.procs_per_node:
        cal += ["--procs-per-node", str(spec.procs_per_node)]
    if spec.start_config:
        cal += ["--start-config", spec.start_config]
    if spec.machine_nodes:
        cal += ["--machine-nodes", str(spec.machine_nodes)]
    wp = ["waitpred", "--trace", f"{d}/trace", "--cluster-config", f"{d}/cal/config.json",
          "--calibrate-from", spec.calibrate[0], "--calibrate-to", spec.calibrate[1], "--months", *spec.months,
          "--out", f"{d}/waitpred"]
    if spec.procs_per_node:
        wp += ["--procs-per-node", str(spec.procs_per_node)]
    return [("ingest", ing), ("calibrate", cal), ("waitpred", wp)]


def calibration_cut(cal_uri: str) -> str | None:
    """Why the ``calibrate`` output at ``cal_uri`` is not the protocol's, or None: its search
    stopped at its time limit before running its trials. Which trials then ran depends on the
    machine's speed (CEA-Curie's 300 s ran 17 of 40 trials once and 40 of 40 on a quieter
    machine, and chose other priority weights), so every result downstream would too."""
    from stepkit import storage

    doc = storage.read_json(storage.join(cal_uri, "calibration.json"))
    se = doc.get("search") or {}
    if se.get("stopped_by") != "timeout":
        return None
    return (f"{cal_uri}: the calibration stopped at its {se.get('timeout_s'):g} s limit after "
            f"{se.get('trials_run')} of {se.get('trials')} trials; its configuration would depend on this "
            "machine's speed. Rerun with a larger --cal-timeout-s (0: no limit) or fewer --cal-trials")


def sample_counts(spec: LogSpec, budget: Budget) -> tuple[int, str, str, int]:
    """(training count, first training start, first scored start, scored count) on the protocol's
    grid: training samples from ``train_start`` until ``WORKLOAD_DAYS`` before the first scored
    month, scored samples over the scored months (UTC days)."""
    first = _utc(f"{spec.months[0]}-01")
    end = _utc(month_end(spec.months[-1]))
    step = timedelta(hours=budget.interval_h)
    t0 = _utc(spec.train_start or spec.calibrate[0])
    n_train = int((first - timedelta(days=WORKLOAD_DAYS) - t0) / step) + 1
    n_score = int((end - first) / step)
    if budget.max_train or budget.max_score:  # a smoke size: the last training samples before the first scored month
        n_train, n_score = min(n_train, budget.max_train or n_train), min(n_score, budget.max_score or n_score)
        t0 = first - timedelta(days=WORKLOAD_DAYS) - step * (n_train - 1)
    if n_train < 2:
        raise SpecError(f"{spec.source or spec.name}: the training window before {spec.months[0]} holds "
                        f"{n_train} sample(s) {budget.interval_h:g} h apart: start it earlier (train_start)")
    return n_train, t0.isoformat(), first.isoformat(), n_score


def decision_argvs(spec: LogSpec, root: str, budget: Budget = Budget(),
                   nodes: tuple[int, ...] | None = None, *, waitpred: bool = False,
                   fresh: tuple[str, ...] = (), online_rules: bool = True) -> list[tuple[str, list[str]]]:
    """(name, argv) of the decision evaluation per node size: sample (training and scored months),
    merge, train each model, then the probe replay (docs/results/protocol.md).

    ``waitpred``: protocol v2 (docs/results/protocol-v2.md): the samples carry the wait predictor's
    answer at each probe (``sample --waitpred``, the log's ``waitpred`` output), under ``v2-*``
    folders, and ``fresh`` months are sampled and scored beside the spec's (the training window
    stays the spec's: before its first month); the online decider runs on them, with the v2 rules
    (:func:`online_rule_argvs`, minutes per rule: the predictor asked every 10 minutes) only when
    ``online_rules``."""
    d = f"{root.rstrip('/')}/{spec.name}"
    n_train, train_start, score_start, n_score = sample_counts(spec, budget)
    out: list[tuple[str, list[str]]] = []
    sizes = [n for n in spec.nodes if not nodes or n in nodes]
    v = "v2-" if waitpred else ""
    for n in sizes:
        common = ["--trace", f"{d}/trace", "--cluster-config", f"{d}/cal/config.json",
                  "--interval-hours", f"{budget.interval_h:g}", "--probe-spacing", "end", "--node", str(n),
                  "--workers", "1", *(["--waitpred", f"{d}/waitpred"] if waitpred else [])]
        out.append((f"sample-train-node{n}", ["sample", *common, "--start", train_start, "--count", str(n_train),
                                              "--out", f"{d}/{v}samples-train/node{n}"]))
        out.append((f"merge-node{n}", ["merge", "--in", f"{d}/{v}samples-train/node{n}", "--out",
                                       f"{d}/{v}datasets/node{n}", "--no-compress"]))
        out.append((f"sample-score-node{n}", ["sample", *common, "--start", score_start, "--count", str(n_score),
                                              "--out", f"{d}/{v}samples-score/node{n}"]))
        if fresh:
            f_start, f_count = _fresh_window(budget, fresh)
            out.append((f"sample-fresh-node{n}", ["sample", *common, "--start", f_start.isoformat(), "--count",
                                                  str(f_count), "--out", f"{d}/{v}samples-fresh/node{n}"]))
        for model in budget.models:
            out.append((f"train-node{n}-{model}", ["train", "--model", model, "--dataset", f"{d}/{v}datasets/node{n}",
                                                   "--out", f"{d}/{v}models/node{n}/{model}", "--preset", "quick",
                                                   "--seed", "0", "--threads", "1"]))
        if waitpred and WP_MODEL in budget.models:  # protocol v2's xgboost-wp: the same fit, the answer as channels
            out.append((f"merge-wp-node{n}", ["merge", "--in", f"{d}/{v}samples-train/node{n}", "--out",
                                              f"{d}/{v}datasets-wp/node{n}", "--no-compress", "--waitpred-features"]))
            out.append((f"train-node{n}-{WP_MODEL}-wp", ["train", "--model", WP_MODEL, "--dataset",
                                                         f"{d}/{v}datasets-wp/node{n}", "--out",
                                                         f"{d}/{v}models/node{n}/{WP_MODEL}-wp", "--preset", "quick",
                                                         "--seed", "0", "--threads", "1"]))
    if waitpred and fresh:
        out += online_argvs(spec, root, budget, sizes, fresh)
    for n in sizes:
        for kind, months in (("score", spec.months), *((("fresh", fresh),) if fresh else ())):
            out.append((f"eval-node{n}" + ("-fresh" if kind == "fresh" else ""),
                        ["probe-replay", "--train-samples", f"{d}/{v}samples-train/node{n}",
                         "--dataset", f"{d}/{v}datasets/node{n}",
                         "--score-samples", f"{d}/{v}samples-{kind}/node{n}", "--months", *months,
                         "--models", *(f"{d}/{v}models/node{n}/{m}" for m in _replayed(budget, waitpred)),
                         "--out", f"{d}/{v}eval{'-fresh' if kind == 'fresh' else ''}/node{n}",
                         "--bootstrap", str(budget.bootstrap)]))
    if waitpred and fresh and online_rules:  # after the replay: the calibrated rules take its thresholds
        out += online_rule_argvs(spec, root, budget, sizes, fresh)
    return out


#: the model protocol v2 also trains with the wait predictor's answer as features (``xgboost-wp``)
WP_MODEL = "xgboost"


def _replayed(budget: Budget, waitpred: bool) -> list[str]:
    """The model folders the probe replay scores: the budget's, and under v2 ``xgboost-wp``."""
    return [*budget.models, *([f"{WP_MODEL}-wp"] if waitpred and WP_MODEL in budget.models else [])]


def _fresh_window(budget: Budget, fresh: tuple[str, ...]) -> tuple[datetime, int]:
    """(first start, sample count) of the fresh months' samples, capped by ``budget.max_score``."""
    f_start = _utc(f"{fresh[0]}-01")
    f_count = int((_utc(month_end(fresh[-1])) - f_start) / timedelta(hours=budget.interval_h))
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


def online_argvs(spec: LogSpec, root: str, budget: Budget, sizes: list[int],
                 fresh: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """Protocol v2's online decider on the fresh months' samples (same starts as the probe replay's):
    reactive, the xgboost model of the replay, and an xgboost trained on the reference's uniform probe
    spacing (7 decisions 8 h apart, as the service keeper's model was), which shows what a model
    that never saw a decision in the predecessor's last 8 hours answers there."""
    d = f"{root.rstrip('/')}/{spec.name}"
    n_train, train_start, _, _ = sample_counts(spec, budget)
    f_start, f_count = _fresh_window(budget, fresh)
    out: list[tuple[str, list[str]]] = []
    for n in sizes:
        common = ["--trace", f"{d}/trace", "--cluster-config", f"{d}/cal/config.json",
                  "--interval-hours", f"{budget.interval_h:g}", "--node", str(n), "--workers", "1"]
        out.append((f"sample-uniform-node{n}", ["sample", *common, "--start", train_start, "--count", str(n_train),
                                                "--out", f"{d}/uniform-samples-train/node{n}"]))
        out.append((f"merge-uniform-node{n}", ["merge", "--in", f"{d}/uniform-samples-train/node{n}", "--out",
                                               f"{d}/uniform-datasets/node{n}", "--no-compress"]))
        out.append((f"train-uniform-node{n}", ["train", "--model", "xgboost", "--dataset", f"{d}/uniform-datasets/node{n}",
                                               "--out", f"{d}/uniform-models/node{n}/xgboost", "--preset", "quick",
                                               "--seed", "0", "--threads", "1"]))
        models = {"reactive": "reactive", "xgboost": f"{d}/v2-models/node{n}/xgboost",
                  "xgboost-uniform": f"{d}/uniform-models/node{n}/xgboost"}
        for rule in ONLINE_RULES:
            model, ask = _asked(rule)
            out.append((f"online-node{n}-{rule}", ["validate", *common, "--start", f_start.isoformat(), "--count",
                                                   str(f_count), "--model", models[model], "--name", rule, *ask,
                                                   "--threads", "1", "--out", f"{d}/v2-online-fresh/node{n}/{rule}"]))
    return out


#: protocol v2's rules the online decider also runs, each as the probe replay scores it (the calibrated
#: ones with the replay's thresholds, the predictor's with the samples' waitpred output)
ONLINE_V2_RULES = ("avg-cal", "wait-pred", "wait-pred-cal", "guarantee-10", "guarantee-cal", "xgboost-wp",
                   "xgboost-wp-all", "xgboost-wp-probes")


def _asked(rule: str) -> tuple[str, list[str]]:
    """(the model or rule an online rule name runs, the ``validate`` flags of how it is asked)."""
    for suffix, flags in ASK_SUFFIXES.items():
        if rule.endswith(suffix):
            return rule[:-len(suffix)], list(flags)
    return rule, (["--decide-at", "grid"] if rule in GRID_MODELS else [])


def online_rule_argvs(spec: LogSpec, root: str, budget: Budget, sizes: list[int],
                      fresh: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """:data:`ONLINE_V2_RULES` on the online decider's samples (:func:`online_argvs`), after the probe
    replay of the fresh months (whose calibration gives avg-cal's offset and wait-pred-cal's margin)."""
    d = f"{root.rstrip('/')}/{spec.name}"
    f_start, f_count = _fresh_window(budget, fresh)
    out: list[tuple[str, list[str]]] = []
    for n in sizes:
        common = ["--trace", f"{d}/trace", "--cluster-config", f"{d}/cal/config.json",
                  "--interval-hours", f"{budget.interval_h:g}", "--node", str(n), "--workers", "1",
                  "--start", f_start.isoformat(), "--count", str(f_count), "--threads", "1"]
        for rule in ONLINE_V2_RULES:
            base, ask = _asked(rule)
            if base == f"{WP_MODEL}-wp" and WP_MODEL not in budget.models:
                continue
            extra = (["--calibration", f"{d}/v2-eval-fresh/node{n}"]
                     if rule in ("avg-cal", "wait-pred-cal", "guarantee-cal") else [])
            if rule != "avg-cal":
                extra += ["--waitpred", f"{d}/waitpred"]
            extra += ask
            model = f"{d}/v2-models/node{n}/{base}" if base.endswith("-wp") else base
            out.append((f"online-node{n}-{rule}", ["validate", *common, "--model", model, "--name", rule, *extra,
                                                   "--out", f"{d}/v2-online-fresh/node{n}/{rule}"]))
    return out


def command(argv: list[str]) -> list[str]:
    """``python -m`` arguments of an argv from the functions above."""
    mod = MODULES.get(argv[0])
    return ["-m", mod, *argv[1:]] if mod else ["-m", "mirage_tasks", *argv]

