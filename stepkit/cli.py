"""A lazy sub-command dispatcher shared by ``python -m mirage_tasks`` and ``python -m faasm_tasks``.

Each step lives in its own module exposing ``add_arguments(parser)`` and
``run(args) -> int | None``. Only the module of the chosen step is imported, so
``ingest`` never pays for importing torch.

Exit codes: 0 success (or skipped), 2 bad input or parameters (:class:`StepError`,
``ValueError`` from argument checks), 1 anything else (with a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback
from collections.abc import Mapping, Sequence

from .step import StepError


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def main(prog: str, steps: Mapping[str, tuple[str, str]], argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` to ``steps[name] = (module, one-line help)``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        lines = [f"usage: python -m {prog} <step> [flags]   (python -m {prog} <step> --help)", "", "steps:"]
        lines += [f"  {name:<14} {helptext}" for name, (_, helptext) in steps.items()]
        print("\n".join(lines))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in steps:
        print(f"{prog}: unknown step {name!r}; choose from {', '.join(steps)}", file=sys.stderr)
        return 2
    module = importlib.import_module(steps[name][0])
    parser = argparse.ArgumentParser(prog=f"python -m {prog} {name}", description=steps[name][1])
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    setup_logging(args.log_level)
    try:
        rc = module.run(args)
    except StepError as exc:
        print(f"{prog} {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog} {name}: interrupted", file=sys.stderr)
        return 130
    except Exception:  # noqa: BLE001 - report and fail with the traceback
        traceback.print_exc()
        return 1
    return int(rc or 0)
