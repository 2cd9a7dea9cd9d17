"""What the QBETS reference bound costs on a whole log, and how the cost grows with the log.

    .venv/bin/python bench/qbets.py TRACE [--procs-per-node N] [--repeat 3]

``TRACE`` is an ingested trace (``python -m mirage_tasks ingest`` output). The bound is computed
online over every job of the log (:func:`mirage_tasks.calibration.qbets.bounds`, as the
``waitpred`` step runs it up to its last scored month) on the first quarter, half and all of the
jobs; printed per size: jobs, CPU seconds (best of ``--repeat``), microseconds per job, and the
change points. Microseconds per job that stay flat as the log doubles say the cost is
O(n log n)-ish, not quadratic.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", help="an ingested trace (folder or trace.parquet)")
    p.add_argument("--procs-per-node", type=int, default=None, help="for traces with processors but no nodes")
    p.add_argument("--repeat", type=int, default=3, help="runs per size; the best is printed (3)")
    args = p.parse_args()

    from mirage_tasks.calibration import qbets
    from mirage_tasks.calibration.fidelity import node_class
    from mirage_tasks.data.schema import read_trace
    from mirage_tasks.sim.workload import Workload

    df, _ = read_trace(args.trace)
    wl = Workload.from_frame(df, args.procs_per_node)
    n = len(wl)
    for m in (n // 4, n // 2, n):
        best = float("inf")
        for _ in range(max(1, args.repeat)):
            t0 = time.process_time()
            groups = node_class(wl.nodes[:m])
            _, info = qbets.bounds(wl.submit[:m], wl.real_start[:m], groups)
            best = min(best, time.process_time() - t0)
        print(
            f"qbets {args.trace}: {m} jobs, {best:.2f} CPU s, {1e6 * best / max(m, 1):.1f} us/job, "
            f"{sum(info['resets'].values())} change points in {len(info['resets'])} classes",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
