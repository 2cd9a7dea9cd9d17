"""A log to evaluate, described once, and every command line of its evaluation (no I/O but reading
the description).

A **log description** (:class:`LogSpec`) is a small JSON or YAML file, or the same fields as flags
(``python -m lab.campaigns.mirage_eval --trace ...``) or as the ``mirage_evaluation`` DAG's form::

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
first by the calibration (a preset, or a file read like ``trace``). ``partition_max_limit`` (a
mapping partition -> seconds, ``*`` for all) and ``default_limit_s`` declare the limits a job that
requests none gets (its partition's maximum, else its user's history, else this default:
:mod:`mirage_tasks.data.limits`, ``ingest --partition-max-limit/--default-limit-s``).

A description is checked as a whole against what its steps accept (:meth:`LogSpec.from_dict`,
stdlib only; :func:`check_against_steps` with the steps' own parsers and ``BOUNDS``), so a value
is refused here naming the file and the field, never later by a step naming a flag the user
never wrote; every count has an upper bound named in its error (``MAX_*`` below), and a file is
read with the bounded loader (:mod:`stepkit.safeload`).

The functions below give each step's argv (``[step, flags...]`` for ``python -m mirage_tasks``,
or for a module named by :data:`MODULES`); ``python -m lab.campaigns.mirage_eval`` runs them one after the
other and the ``mirage_evaluation`` DAG maps them onto tasks. Stdlib only at import.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

#: the modules that are not ``python -m mirage_tasks <step>`` steps
MODULES = {"probe-replay": "lab.evaluation.probe_replay"}
#: the protocol's budgets (docs/results/protocol.md)
CAL_TRIALS = 40
#: the calibration's budget is its trials; a wall limit (seconds, 0: none) is an opt-in that fails
#: the calibration when reached (``calibrate --timeout-s``)
CAL_TIMEOUT_S = 0.0
INTERVAL_H = 6.0
BOOTSTRAP = 2000
WORKLOAD_DAYS = 5.0
MODELS = ("xgboost", "linear_quantile")
#: Upper bounds of every count in a log description, each named in its error: scored months
#: (and the span from the first to the last), node sizes, the calibration period and the
#: training window (days), a node size, the file itself (bytes) and its strings (characters).
MAX_MONTHS = 24
MAX_NODE_SIZES = 8
MAX_NODE_SIZE = 100_000
MAX_CALIBRATION_DAYS = 731
MAX_TRAINING_DAYS = 1096
MAX_DESCRIPTION_BYTES = 64 * 1024
MAX_TEXT = 4096
#: the years a date may name: every step reads dates with pandas (whose nanosecond timestamps end
#: in April 2262) and the wait predictor's windows are epoch seconds
YEAR_MIN, YEAR_MAX = 1970, 2261

_MONTH = re.compile(r"\d{4}-(0[1-9]|1[0-2])")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
#: a day, or a day and a time of day, in the log's time zone (no offset): what every step reads alike
_WHEN = re.compile(r"\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2})?)?")


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
    partition_max_limit: tuple[tuple[str, int], ...] = ()
    default_limit_s: int | None = None
    source: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("source")
        d["partition_max_limit"] = dict(self.partition_max_limit)
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
        base = (
            Path(traces)
            if traces
            else (Path(source).parent if source.endswith((".json", ".yaml", ".yml")) else Path.cwd())
        )
        trace = doc["trace"]
        if not isinstance(trace, str) or len(trace) > MAX_TEXT:
            raise err("trace", f"a path or URI of the raw log (at most {MAX_TEXT} characters)")
        if trace.lower().startswith("s3://") and not trace[5:].split("/", 1)[0]:
            # every step refuses it (stepkit.cli.check_flag_values) naming its --trace flag
            raise err("trace", f"{trace!r}: an s3:// URI needs a bucket (s3://BUCKET/key)")
        if "://" not in trace and not Path(trace).is_absolute():
            trace = str((base / trace).resolve())
        cal = doc["calibrate"]
        if not isinstance(cal, (list, tuple)) or len(cal) != 2:
            raise err("calibrate", 'two dates [from, to), e.g. ["2024-01-01", "2024-03-01"]')
        cal = [_text_when(x) for x in cal]  # YAML reads an unquoted 2024-01-01 as a date
        c0, c1 = (_when(x, "calibrate", source) for x in cal)
        if c1 <= c0:
            raise err("calibrate", f"the end {cal[1]} is not after the start {cal[0]}")
        if (c1 - c0).days > MAX_CALIBRATION_DAYS:
            raise err("calibrate", f"{cal[0]} .. {cal[1]} is {(c1 - c0).days} days; at most {MAX_CALIBRATION_DAYS}")
        months = doc["months"]
        if isinstance(months, str):
            months = [months]
        if not isinstance(months, (list, tuple)) or not months:
            raise err("months", "a list of scored months YYYY-MM")
        if len(months) > MAX_MONTHS:
            raise err("months", f"{len(months)} months; at most {MAX_MONTHS}")
        bad = [m for m in months if not (isinstance(m, str) and _MONTH.fullmatch(m))]
        if bad:
            raise err("months", f"{', '.join(map(repr, bad))} not of the form YYYY-MM")
        months = tuple(sorted(set(months)))
        for m in (months[0], months[-1]):
            _when(f"{m}-01", "months", source)  # the years every step reads
        span = (int(months[-1][:4]) - int(months[0][:4])) * 12 + int(months[-1][5:]) - int(months[0][5:]) + 1
        if span > MAX_MONTHS:  # the scored window runs from the first month to the end of the last
            raise err("months", f"{months[0]} .. {months[-1]} spans {span} months; at most {MAX_MONTHS}")
        if datetime(int(months[0][:4]), int(months[0][5:]), 1) < c1:
            # the steps score from the first month's midnight: a calibration period ending later that
            # day (a time of day) overlaps it, and calibrate would refuse its --score-from
            raise err(
                "months",
                f"the first scored month {months[0]} begins before the calibration period ends "
                f"({cal[1]}): score months after it",
            )
        nodes = doc.get("nodes", [1, 8])
        if isinstance(nodes, int) and not isinstance(nodes, bool):
            nodes = [nodes]
        if isinstance(nodes, (list, tuple)) and len(nodes) > MAX_NODE_SIZES:
            raise err("nodes", f"{len(nodes)} node sizes; at most {MAX_NODE_SIZES}")
        if (
            not isinstance(nodes, (list, tuple))
            or not nodes
            or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_NODE_SIZE for n in nodes)
        ):
            raise err("nodes", f"a list of node sizes, each a whole number 1 .. {MAX_NODE_SIZE}, got {nodes!r}")

        def opt_int(fld: str, lo: int, hi: int) -> int | None:
            v = doc.get(fld)
            if v is None:
                return None
            if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
                raise err(fld, f"a whole number {lo} .. {hi}, got {v!r}")
            return v

        tz = doc.get("timezone")
        if tz is not None:
            if not isinstance(tz, str) or not tz or len(tz) > 64:
                raise err("timezone", "an IANA time zone name (at most 64 characters), e.g. America/Chicago")
            try:
                from zoneinfo import ZoneInfo

                ZoneInfo(tz)
            except Exception as exc:  # any failure to resolve it is the user's to fix
                raise err("timezone", f"{tz!r} is not a known time zone") from exc
        ts = doc.get("train_start")
        if ts is not None:
            ts = _text_when(ts)
            t0 = _when(ts, "train_start", source)
            first = datetime(int(months[0][:4]), int(months[0][5:]), 1)
            if t0 >= first:
                raise err("train_start", f"{ts} is not before the first scored month {months[0]}")
            if (first - t0).days > MAX_TRAINING_DAYS:
                raise err(
                    "train_start",
                    f"the training window {ts} .. {months[0]} is {(first - t0).days} days; at most {MAX_TRAINING_DAYS}",
                )
        sc = _start_config(doc.get("start_config"), base, err)
        pml = doc.get("partition_max_limit") or {}
        if not isinstance(pml, dict) or not all(
            isinstance(k, str) and k and "=" not in k and isinstance(v, int) and not isinstance(v, bool) and 1 <= v
            for k, v in pml.items()
        ):
            raise err("partition_max_limit", f"a mapping of partition names to seconds (>= 1), got {pml!r}")
        return cls(
            name=name,
            trace=trace,
            calibrate=(str(cal[0]), str(cal[1])),
            months=months,
            nodes=tuple(sorted(set(nodes))),
            timezone=tz,
            procs_per_node=opt_int("procs_per_node", 1, 4096),
            machine_nodes=opt_int("machine_nodes", 1, 10_000_000),
            train_start=ts,
            start_config=sc,
            partition_max_limit=tuple(sorted(pml.items())),
            default_limit_s=opt_int("default_limit_s", 1, 100 * 366 * 86400),
            source=source,
        )


def _text_when(v: Any) -> Any:
    """A YAML date or datetime as the text a step reads (``2024-01-01``, ``2024-01-01T12:00:00``)."""
    return v.isoformat() if isinstance(v, date) else v


def _when(v: Any, fld: str, source: str) -> datetime:
    """A day or a day and time of day as every step reads it (pandas, in the log's time zone):
    ``YYYY-MM-DD[THH:MM[:SS]]`` without an offset, in years :data:`YEAR_MIN` .. :data:`YEAR_MAX`.
    Anything else passed here once and was refused by ``calibrate`` naming its own flags."""
    if not isinstance(v, str) or not _WHEN.fullmatch(v):
        raise SpecError(
            f"{source}: field {fld!r}: {v!r} is not a date YYYY-MM-DD (or YYYY-MM-DDTHH:MM, in the "
            "log's time zone, without an offset)"
        )
    try:
        t = datetime.fromisoformat(v)
    except ValueError as exc:
        raise SpecError(f"{source}: field {fld!r}: {v!r} is not a date ({exc})") from None
    if not YEAR_MIN <= t.year <= YEAR_MAX:
        raise SpecError(f"{source}: field {fld!r}: {v!r}: the year must lie in {YEAR_MIN} .. {YEAR_MAX}")
    return t


def _start_config(sc: Any, base: Path, err) -> str | None:
    """``start_config`` as ``calibrate --start-config`` will read it: a preset, a URI, or a file
    (a relative path from the description's folder, as ``trace``). A name that is neither was
    refused by ``calibrate`` with a message about ``--cluster-config``, a flag the user never wrote."""
    if sc is None:
        return None
    from ..sim.config import PRESETS

    if not isinstance(sc, str) or not sc or len(sc) > MAX_TEXT:
        raise err("start_config", f"a simulator preset ({', '.join(PRESETS)}) or a configuration file")
    if sc in PRESETS or "://" in sc:
        return sc
    path = Path(sc) if Path(sc).is_absolute() else (base / sc).resolve()
    if not path.is_file():
        raise err("start_config", f"{sc!r} is neither a preset ({', '.join(PRESETS)}) nor a file ({path})")
    return str(path)


def load(path: str, traces: str | None = None) -> LogSpec:
    """A log description from a JSON or YAML file (``.yaml``/``.yml``: YAML), read with the bounded
    loader (:mod:`stepkit.safeload`: at most :data:`MAX_DESCRIPTION_BYTES`, nesting and YAML aliases
    bounded, so an alias bomb is refused while it is read)."""
    from stepkit.errors import StepError
    from stepkit.safeload import parse_document, read_bounded

    kind = "yaml" if Path(path).suffix in (".yaml", ".yml") else "json"
    try:
        data = read_bounded(path, MAX_DESCRIPTION_BYTES)
    except StepError as exc:
        raise SpecError(f"{path}: cannot read the log description ({str(exc).removeprefix(f'{path}: ')})") from None
    try:
        doc = parse_document(data, path, kind, MAX_DESCRIPTION_BYTES)
    except StepError as exc:
        raise SpecError(str(exc)) from None
    return LogSpec.from_dict(doc, source=str(path), traces=traces)


#: the log description's field behind each flag its steps get (the rest come from the budget)
FLAG_FIELDS = {
    "--trace": "trace",
    "--timezone": "timezone",
    "--calibrate-from": "calibrate",
    "--calibrate-to": "calibrate",
    "--score-from": "months",
    "--score-to": "months",
    "--months": "months",
    "--procs-per-node": "procs_per_node",
    "--machine-nodes": "machine_nodes",
    "--start-config": "start_config",
}


def check_against_steps(spec: LogSpec, root: str, budget: Budget | None = None) -> None:
    """The description as a whole against what its steps accept: each of :func:`waitpred_argvs`
    parsed by its step's own parser and checked as the step CLI checks flags before it starts
    (:func:`stepkit.cli.check_flag_values` with the step's ``BOUNDS``), and ``start_config`` read
    as ``calibrate`` reads it. A refusal is a :class:`SpecError` naming the description and its
    field, not a step's flag the user never wrote. Imports the steps (pandas): for the driver
    and the tests; :meth:`LogSpec.from_dict` holds the same limits without them."""
    import contextlib
    import importlib
    import io

    from stepkit.cli import check_flag_values
    from stepkit.errors import StepError

    from ..__main__ import STEPS
    from .plan import step_parser

    where = spec.source or "the log description"
    for name, argv in waitpred_argvs(spec, root, budget or Budget()):
        parser, err = step_parser(name), io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = parser.parse_args(argv[1:])
            check_flag_values(args, getattr(importlib.import_module(STEPS[name][0]), "BOUNDS", None))
        except (SystemExit, StepError) as exc:
            msg = str(exc) if isinstance(exc, StepError) else err.getvalue().strip().splitlines()[-1]
            flag = next((f for f in FLAG_FIELDS if f in msg), None)
            what = f"field {FLAG_FIELDS[flag]!r}" if flag else "the evaluation's budget"
            raise SpecError(f"{where}: {what}: the {name} step would refuse it: {msg}") from None
    if spec.start_config:
        from ..sim.config import SimConfig, load_config

        try:
            SimConfig.from_dict(load_config(spec.start_config))
        except (StepError, ValueError, TypeError) as exc:
            raise SpecError(
                f"{where}: field 'start_config': {spec.start_config}: {str(exc).removeprefix('--cluster-config ')}"
            ) from None


def unique_names(specs: list[LogSpec]) -> None:
    """A :class:`SpecError` naming both descriptions when two logs share a name: a log's outputs
    live under ``<root>/<name>/``, so the second would be refused there (or, run at once, race
    the first for the same folders) and one log's result would stand for two."""
    seen: dict[str, LogSpec] = {}
    for s in specs:
        if s.name in seen:
            first = seen[s.name]
            raise SpecError(
                f"two log descriptions name the log {s.name!r}: {first.source or 'the first'} and "
                f"{s.source or 'the second'} (a log's outputs live under its name: rename one)"
            )
        seen[s.name] = s


def month_end(m: str) -> str:
    """The day after month ``m`` (YYYY-MM-DD)."""
    y, mo = int(m[:4]), int(m[5:])
    return f"{y + (mo == 12):04d}-{mo % 12 + 1:02d}-01"


def utc_day(day: str) -> datetime:
    return datetime.fromisoformat(day[:10]).replace(tzinfo=UTC)


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
    for part, seconds in spec.partition_max_limit:
        ing += ["--partition-max-limit", f"{part}={seconds}"]
    if spec.default_limit_s:
        ing += ["--default-limit-s", str(spec.default_limit_s)]
    m0, m1 = spec.months[0], spec.months[-1]
    cal = [
        "calibrate",
        "--trace",
        f"{d}/trace",
        "--calibrate-from",
        spec.calibrate[0],
        "--calibrate-to",
        spec.calibrate[1],
        "--score-from",
        f"{m0}-01",
        "--score-to",
        month_end(m1),
        "--trials",
        str(budget.trials),
        "--seed",
        "0",
        "--out",
        f"{d}/cal",
    ]
    if budget.timeout_s:  # opt-in: reaching it fails the calibration
        cal += ["--timeout-s", f"{budget.timeout_s:g}"]
    if spec.procs_per_node:
        cal += ["--procs-per-node", str(spec.procs_per_node)]
    if spec.start_config:
        cal += ["--start-config", spec.start_config]
    if spec.machine_nodes:
        cal += ["--machine-nodes", str(spec.machine_nodes)]
    wp = [
        "waitpred",
        "--trace",
        f"{d}/trace",
        "--cluster-config",
        f"{d}/cal/config.json",
        "--calibrate-from",
        spec.calibrate[0],
        "--calibrate-to",
        spec.calibrate[1],
        "--months",
        *spec.months,
        "--out",
        f"{d}/waitpred",
    ]
    if spec.procs_per_node:
        wp += ["--procs-per-node", str(spec.procs_per_node)]
    # keyed by the log's name, not by what they depend on: a rerun of other inputs under an existing
    # name is refused naming both (stepkit.step), so a log's trace, its calibration and its wait
    # predictor always belong together
    return [(n, [*a, "--on-change", "refuse"]) for n, a in (("ingest", ing), ("calibrate", cal), ("waitpred", wp))]


def command(argv: list[str]) -> list[str]:
    """``python -m`` arguments of an argv from the functions above."""
    mod = MODULES.get(argv[0])
    return ["-m", mod, *argv[1:]] if mod else ["-m", "mirage_tasks", *argv]
