"""A lazy sub-command dispatcher shared by ``python -m mirage_tasks`` and ``python -m faasm_tasks``.

Each step lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int | None``. Only the module of the chosen step is imported, so
``ingest`` never pays for importing torch.

Exit codes: 0 success (or skipped), 2 bad input or parameters (:class:`StepError`,
argparse errors), 1 anything else (with a traceback; a dead pool worker,
:class:`stepkit.pool.WorkerDied`, with its one-line reason), 143 SIGTERM while the
step ran (what it started stopped first: :mod:`stepkit.procs`, :mod:`stepkit.pool`), 75 another run is writing the
very same output right now (:data:`stepkit.lease.EXIT_BUSY`: retryable, the retry skips; a
writer of a *different* output to the same prefix is exit 2).

Called without ``argv`` (``python -m <package>`` and the ``mirage-tasks`` /
``faasm-tasks`` console scripts), :func:`main` is the process entry: it flushes stdout
and stderr and leaves with ``os._exit(rc)``. Interpreter shutdown is skipped on
purpose: pyarrow's thread pools can abort it (``terminate called without an active
exception``, exit 134) after a step failed, which would turn a deterministic exit 2
into a random 134 that Airflow retries. Everything a step writes is committed (files
closed, renamed) before ``run`` returns, so nothing is lost by skipping the shutdown.
Called with ``argv`` (tests), it returns the exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import lease, procs, reach, s3check
from .errors import StepError
from .pool import Terminated, WorkerDied


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def main(prog: str, steps: Mapping[str, tuple[str, str]], argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` to ``steps[name] = (module, one-line help)``.

    With ``argv=None`` the command line of this process is used and the process exits
    (see the module docstring); otherwise the exit code is returned.
    """
    if argv is None:
        exit_now(dispatch(prog, steps, sys.argv[1:]))
    return dispatch(prog, steps, argv)


def exit_now(rc: int) -> None:
    """Flush stdio and end the process with ``rc``, skipping interpreter shutdown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe must not change the exit code
            pass
    logging.shutdown()
    os._exit(rc)


#: The largest seed every step accepts (numpy's ``SeedSequence`` and Optuna take 0 .. 2**32 - 1).
SEED_MAX = 2**32 - 1


def check_flag_values(args: argparse.Namespace, bounds: Mapping[str, tuple[Any, Any]] | None = None) -> None:
    """Values argparse accepts but no step can use, refused for every step in one place,
    before the step reads or starts anything: a float flag of ``nan`` or ``inf``
    (``type=float`` parses both), an ``s3://`` URI without a bucket, a seed (``--seed``,
    ``--*-seed``) outside 0 .. :data:`SEED_MAX`, and a value outside its step's ``BOUNDS``
    (``{dest: (lowest, highest)}``, inclusive, None for no bound; each element of a list
    flag). Raises :class:`StepError` naming the flag."""
    bounds = dict(bounds or {})
    for dest, value in vars(args).items():
        flag = "--" + dest.replace("_", "-")
        if dest == "seed" or dest.endswith("_seed"):
            bounds.setdefault(dest, (0, SEED_MAX))
        lo, hi = bounds.get(dest, (None, None))
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise StepError(f"{flag} {v}: not a finite number")
            if isinstance(v, str) and v.lower().startswith("s3://") and not v[5:].split("/", 1)[0]:
                raise StepError(f"{flag} {v}: an s3:// URI needs a bucket (s3://BUCKET/key)")
            if (
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and ((lo is not None and v < lo) or (hi is not None and v > hi))
            ):
                rng = (
                    f"between {lo:g} and {hi:g}"
                    if lo is not None and hi is not None
                    else f"at least {lo:g}"
                    if lo is not None
                    else f"at most {hi:g}"
                )
                raise StepError(f"{flag} {v}: must be {rng}")


def add_contract_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every step takes from the step contract (not from its module): ``--log-level``
    and ``--on-change`` (:mod:`stepkit.step`: what a run of other inputs does to a committed
    ``--out``)."""
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument(
        "--on-change",
        choices=("refuse", "replace"),
        default=None,
        help="a committed --out of other inputs or parameters: refuse (exit 2, nothing touched; "
        "for outputs under a name a user gave) or replace it (recompute); default: what its "
        "marker recorded, else replace",
    )


def dispatch(prog: str, steps: Mapping[str, tuple[str, str]], argv: Sequence[str]) -> int:
    """Run one step and return its exit code (0, 2 or 1; 130 when interrupted)."""
    argv = list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"usage: python -m {prog} <step> [flags]   (python -m {prog} <step> --help)", "", "steps:"]
        lines += [f"  {name:<14} {helptext}" for name, (_, helptext) in steps.items()]
        print("\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in steps:
        print(f"{prog}: unknown step {name!r}; choose from {', '.join(steps)}", file=sys.stderr)
        return 2
    reach.allow_package(prog)  # its own shipped files (catalogue, profiles) stay readable in a DAG step
    module = importlib.import_module(steps[name][0])
    parser = argparse.ArgumentParser(prog=f"python -m {prog} {name}", description=steps[name][1])
    add_contract_arguments(parser)
    module.add_arguments(parser)
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:  # argparse: --help (0) or a bad flag (2, message printed)
        return exc.code if isinstance(exc.code, int) else 2
    setup_logging(args.log_level)
    from .step import Step  # fsspec: only once a step runs

    Step.default_on_change = args.on_change  # what a rerun of other inputs does to a committed --out
    # recorded in the marker, so the output can be rerun (devtools/rerun_at_version.py)
    Step.command = {"package": prog, "argv": argv, "cwd": os.getcwd()}
    restore = procs.trap_sigterm()  # SIGTERM: the step's finally blocks stop what it started, exit 143
    try:
        # NaN, infinities, s3:// without a bucket, seeds and the step's BOUNDS: exit 2 naming the flag
        check_flag_values(args, getattr(module, "BOUNDS", None))
        reach.check_argv(rest)  # a DAG step: every URI under the allowed roots, before any is touched
        s3check.preflight(rest)  # a misconfigured store: exit 2 naming the setting, in seconds
        rc = module.run(args)
    except lease.LeaseHeld as exc:
        print(f"{prog} {name}: error: {exc}", file=sys.stderr)
        return lease.EXIT_BUSY if exc.same_output else 2  # the same work elsewhere: a retry skips
    except reach.Refused as exc:  # an input outside the allowed roots: name the flag that carried it
        flags = [] if str(exc).startswith("--") else reach.flags_naming(exc.uri, rest)
        print(f"{prog} {name}: error: {'/'.join(flags) + ': ' if flags else ''}{exc}", file=sys.stderr)
        return 2
    except StepError as exc:
        print(f"{prog} {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog} {name}: interrupted", file=sys.stderr)
        return 130
    except Terminated as exc:
        # a step that knows what it stopped (or failed to) says so in ``exc.cleanup``
        cleanup = getattr(exc, "cleanup", None) or "the processes it started were stopped"
        print(f"{prog} {name}: {exc}; {cleanup}", file=sys.stderr)
        return 143
    except WorkerDied as exc:
        print(f"{prog} {name}: error: {exc}", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - report and fail with the traceback
        traceback.print_exc()
        return 1
    finally:
        try:
            lease.release_all()  # what a failed (or returning) step still holds: the next writer need not wait
        finally:
            Step.default_on_change = None
            Step.command = None
            restore()
    return int(rc or 0)


def console() -> None:
    """Console-script entry (``mirage-tasks``, ``faasm-tasks``): the package is the script's name.

    ``mirage-tasks ingest ...`` is ``python -m mirage_tasks ingest ...``; the step
    registry is the package's ``__main__.STEPS``.
    """
    package = Path(sys.argv[0]).name.removesuffix(".exe").replace("-", "_")
    try:
        registry = importlib.import_module(f"{package}.__main__")
        steps = registry.STEPS
    except (ImportError, AttributeError):
        print(f"{sys.argv[0]}: no task package {package!r} with a STEPS registry in __main__", file=sys.stderr)
        exit_now(2)
    main(package, steps)


def check_command_args(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    bounds: Mapping[str, tuple[Any, Any]] | None = None,
    *,
    folders: Sequence[str] = (),
    files: Sequence[str] = (),
) -> None:
    """The step contract's flag checks for a command that is not a step (``bench/*.py``), before
    it starts anything: :func:`check_flag_values` with ``bounds``, each dest in ``folders`` a
    folder or creatable as one (not an existing file), each dest in ``files`` a path whose folder
    exists and is writable (an ``--out`` report) and not a folder itself. A failure is
    ``parser.error`` (exit 2 with the usage line and a message naming the flag)."""
    try:
        check_flag_values(args, bounds)
        for dest in folders:
            v = getattr(args, dest, None)
            if v:
                _check_folder(str(v), "--" + dest.replace("_", "-"))
        for dest in files:
            v = getattr(args, dest, None)
            if v:
                flag = "--" + dest.replace("_", "-")
                p = Path(str(v))
                if p.is_dir():
                    raise StepError(f"{flag} {v}: is a folder, not a file")
                up = p.absolute().parent
                if not up.is_dir() or not os.access(up, os.W_OK | os.X_OK):
                    raise StepError(f"{flag} {v}: its folder {up} does not exist or is not writable")
    except StepError as exc:
        parser.error(str(exc))


def _check_folder(v: str, flag: str) -> None:
    p = Path(v)
    if p.exists() and not p.is_dir():
        raise StepError(f"{flag} {v}: exists and is not a folder")
    up = p if p.exists() else next((q for q in p.absolute().parents if q.exists()), None)
    if up is None or not up.is_dir() or not os.access(up, os.W_OK | os.X_OK):
        raise StepError(f"{flag} {v}: cannot create or write a folder there")
