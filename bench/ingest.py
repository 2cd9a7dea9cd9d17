"""Ingest throughput: rows/s parsing the ls6 sacct log and the CEA-Curie SWF log (312k jobs).

Run: ``make bench`` or ``.venv/bin/python bench/ingest.py [--repeat 3] [--smoke]``. Prints, per trace,
the best-of-N wall time of parsing alone and of the whole step (parse, Parquet write,
report, marker), and rows per second for each. Traces are read from ../shared/traces.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

from mirage_tasks.data.ingest import parse  # noqa: E402
from stepkit.cli import main  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
CASES = [("ls6-a100.log.gz", "America/Chicago"), ("CEA-Curie-2011-2.1-cln.swf.gz", None)]


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main_bench() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--traces", default=str(TRACES), help=f"folder of the traces ({TRACES})")
    ap.add_argument("--smoke", action="store_true", help="the ls6 log only, once (what the test suite runs)")
    args = ap.parse_args()
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(ap, args, {"repeat": (1, 100)}, folders=(), files=())
    if args.smoke:
        args.repeat = 1
    cases = CASES[:1] if args.smoke else CASES
    traces = pathlib.Path(args.traces)
    print(f"{'trace':<32} {'rows':>8} {'parse s':>8} {'parse rows/s':>13} {'step s':>8} {'step rows/s':>12}")
    for name, tz in cases:
        path = traces / name
        if not path.exists():
            print(f"{name:<32} skipped: {path} not found")
            continue
        rows = parse(str(path), "auto", tz).rows_read
        t_parse = best(lambda p=path, z=tz: parse(str(p), "auto", z), args.repeat)

        def step(p=path, z=tz):
            with tempfile.TemporaryDirectory() as d:
                argv = ["ingest", "--trace", str(p), "--out", d] + (["--timezone", z] if z else [])
                assert main("mirage_tasks", {"ingest": ("mirage_tasks.steps.ingest", "")}, argv) == 0

        t_step = best(step, args.repeat)
        print(
            f"{name:<32} {rows:>8} {t_parse:>8.3f} {rows / t_parse:>13,.0f} {t_step:>8.3f} {rows / t_step:>12,.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
