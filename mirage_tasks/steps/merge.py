"""``python -m mirage_tasks merge``: sample shards -> one chronological dataset.

``--in`` takes committed ``sample`` outputs (any order); they must share every parameter
but the shard (same trace, node size, baseline, window, configuration, ...). Rows are
sorted by sample index, then probe time; a sample present twice is an error.

Outputs under ``--out``: ``dataset.npz`` (``X`` float32 [n, window, F], ``y`` float32 [n]
hours, ``sample``, ``sample_start``, ``probe_time``, ``node`` int64 [n]), ``probes.parquet``
(per-probe metadata, same row order) and ``manifest.json``::

    feature_names, window, step_s, n_examples, n_samples, node, baseline, shapes,
    sample_start_min, sample_start_max (epoch s), sample_start_min_iso/max_iso,
    data_end (ISO: max sample_start + workload_days, the latest trace time any example
    depends on), trace_fingerprint, params (shared sample parameters), shards (fingerprints)

With ``--start``/``--count``/``--interval-hours`` the inputs are day partitions
(``sample --day``) and the dataset keeps the samples of that window only, numbered
``0 .. count-1`` from ``--start``; a window sample missing from the partitions is an error.
With ``--trace`` each day partition is checked against that trace (it must have been sampled
from the same jobs before its horizon: days from an earlier, shorter export of a growing trace
qualify) and the manifest records that trace's fingerprint.

With ``--waitpred-features`` (shards sampled with ``--waitpred``) every history gains four
channels, the wait predictor's answer at its decision time (``calibration.atprobe.FEATURES``:
its wait, its bound, and the wait minus the time left as a gap part and an overlap part), the same
at every step of the window; a
model trained on it is protocol v2's ``xgboost-wp`` and is scored by ``probe-replay``, which
builds the same channels from the scored samples.
"""

from __future__ import annotations

import argparse

from stepkit import Step, require_committed

from .. import __version__
from ..data.artifacts import DATASET_FILE, MANIFEST_FILE, PROBES_FILE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--in", dest="inputs", nargs="+", required=True, help="sample output prefixes (shards)")
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument("--no-compress", action="store_true", help="write dataset.npz uncompressed")
    p.add_argument("--start", default=None, help="window: first sample start (ISO), with --count")
    p.add_argument("--count", type=int, default=None, help="window: number of samples")
    p.add_argument("--interval-hours", type=float, default=None, help="window: hours between sample starts")
    p.add_argument(
        "--trace",
        default=None,
        help="window: the trace the day partitions are for; each must have been sampled from the jobs "
        "this trace holds before its horizon (a grown trace keeps earlier days valid)",
    )
    p.add_argument(
        "--waitpred-features",
        action="store_true",
        help="append the wait predictor's answer at each probe (its wait, its bound, and the wait minus the "
        "time left as a gap and an overlap part, hours) to every history as four channels; the "
        "shards must be sampled with --waitpred",
    )


def run(args: argparse.Namespace) -> int:
    from stepkit import StepError

    from ..data.artifacts import npz_bytes, parquet_bytes
    from ..data.schema import parse_time
    from ..sampling.sample import merge_shards, shared_params

    window = None
    given = [x is not None for x in (args.start, args.count, args.interval_hours)]
    if any(given):
        if not all(given):
            raise StepError("--start, --count and --interval-hours go together (a window of day partitions)")
        if args.count < 1 or args.interval_hours <= 0:
            raise StepError("--count must be >= 1 and --interval-hours > 0")
        window = (int(parse_time(args.start, "--start").timestamp()), args.count, args.interval_hours)
    markers = [require_committed(u, "sample shard") for u in args.inputs]
    shared = shared_params(list(args.inputs), markers)
    params = {"compress": not args.no_compress}
    if window:
        params["window"] = list(window)
    if args.waitpred_features:  # a new parameter only when set: datasets without it keep their keys
        params["waitpred_features"] = True
    if args.trace and not window:
        raise StepError("--trace goes with a window (--start/--count/--interval-hours) of day partitions")
    step = Step("merge", args.out, __version__, params, inputs=[*args.inputs, *([args.trace] if args.trace else [])])
    if step.skip():
        return 0
    fingerprint = None
    if args.trace:
        from ..data.artifacts import require_input
        from ..data.prefixes import load_prefixes
        from ..data.schema import read_trace
        from ..sampling.sample import check_prefixes
        from ..sim.config import SimConfig
        from ..sim.workload import Workload

        require_input(args.trace, "--trace")
        df, _meta = read_trace(args.trace)
        check_prefixes(list(args.inputs), markers, load_prefixes(args.trace, df), float(shared["workload_days"]))
        cfg = SimConfig.from_dict(shared["config"])
        fingerprint = Workload.from_frame(df, cfg.procs_per_node or None).fingerprint  # as sample builds it
    cat, probes, manifest = merge_shards(list(args.inputs), shared, window, fingerprint)
    manifest["shards"] = [m["fingerprint"] for m in markers]
    if args.waitpred_features:
        from ..calibration import atprobe

        cat["X"] = atprobe.with_features(cat["X"], probes, f"merge --in {' '.join(args.inputs)}")
        manifest["feature_names"] = [*manifest["feature_names"], *atprobe.FEATURES]
        manifest["shapes"]["X"] = list(cat["X"].shape)
    step.write_bytes(DATASET_FILE, npz_bytes(cat, compress=not args.no_compress))
    step.write_bytes(PROBES_FILE, parquet_bytes(probes))
    step.write_json(MANIFEST_FILE, manifest)
    step.commit(summary={k: manifest[k] for k in ("n_examples", "n_samples", "node", "data_end", "y_mean_h")})
    print(
        f"merge: {manifest['n_samples']} samples, {manifest['n_examples']} examples, X {manifest['shapes']['X']}, "
        f"samples {manifest['sample_start_min_iso']} .. {manifest['sample_start_max_iso']}, "
        f"data_end {manifest['data_end']}",
        flush=True,
    )
    return 0
