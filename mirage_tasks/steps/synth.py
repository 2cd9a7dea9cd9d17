"""``python -m mirage_tasks synth``: fit a workload profile to a trace, or generate a synthetic trace.

The profile and the generator are :mod:`mirage_tasks.data.synth`. ``--fit TRACE`` writes
``profile.json`` and a real-vs-generated comparison (``fit_report.json``/``.md``);
``--profile NAME|URI --from --to`` writes ``trace.parquet`` (the ``ingest`` layout) and
``synth_report.json``.
"""

from __future__ import annotations

import argparse

from stepkit import Step, StepError, storage

from .. import __version__
from ..data.profiles import PACKAGED

#: The largest arrival-rate multiple: beyond it the Poisson draws overflow (and no cluster is that busy).
MAX_LOAD_SCALE = 1000.0
#: The longest generated span, and the most jobs a generated trace may be expected to hold:
#: a 100-year window ran for minutes; ten years of the ls6 profile are about 600,000 jobs, and
#: 900,000 jobs took 51 s CPU (2 min wall on the loaded 2-core machine).
MAX_SPAN_DAYS = 3660
MAX_EXPECTED_JOBS = 1_000_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--fit", metavar="TRACE", help="fit a profile to this trace (normalised Parquet/ingest output, or a raw log)"
    )
    mode.add_argument(
        "--profile", help=f"generate from this profile: a JSON URI or a packaged name ({', '.join(PACKAGED)})"
    )
    p.add_argument("--out", required=True, help="output prefix URI")
    p.add_argument("--timezone", default=None, help="with --fit on a raw sacct log: its IANA time zone")
    p.add_argument(
        "--batch-gap-s", type=float, default=60.0, help="with --fit: submits of one user closer than this form a batch"
    )
    p.add_argument(
        "--compare-month",
        default=None,
        help="with --fit: month (YYYY-MM) to compare real vs generated (default: busiest)",
    )
    p.add_argument("--from", dest="t_from", help="with --profile: first submit time (ISO, UTC if no offset)")
    p.add_argument("--to", dest="t_to", help="with --profile: end of the generated span (exclusive)")
    p.add_argument("--seed", type=int, default=0, help="with --profile: random seed (same seed, same trace)")
    p.add_argument(
        "--load-scale", type=float, default=1.0, help="with --profile: multiply the arrival rate (default 1.0)"
    )


def run(args: argparse.Namespace) -> int:
    if args.fit:
        return _run_fit(args)
    return _run_generate(args)


def _read_any(uri: str, timezone: str | None) -> tuple:
    from ..data.ingest import parse
    from ..data.schema import TRACE_FILE, read_trace

    if uri.endswith(".parquet") or storage.exists(storage.join(uri, TRACE_FILE)):
        return read_trace(uri)
    res = parse(uri, "auto", timezone)
    return res.frame, res.meta


def _run_fit(args: argparse.Namespace) -> int:
    import pandas as pd

    from ..data.synth import compare, fit_markdown, fit_profile, generate

    if args.batch_gap_s < 0:
        raise StepError(f"--batch-gap-s {args.batch_gap_s:g}: must be >= 0 seconds")
    params = {
        "mode": "fit",
        "batch_gap_s": args.batch_gap_s,
        "compare_month": args.compare_month,
        "timezone": args.timezone,
    }
    step = Step("synth-fit", args.out, __version__, params, inputs=[args.fit])
    if step.skip():
        return 0
    df, meta = _read_any(args.fit, args.timezone)
    profile = fit_profile(df, meta, args.batch_gap_s)
    months = df["submit"].dt.strftime("%Y-%m")
    month = args.compare_month or months.value_counts().idxmax()
    real = df[months == month]
    if real.empty:
        raise StepError(f"--compare-month {month}: the trace has no jobs submitted then")
    m0 = pd.Timestamp(month + "-01", tz="UTC")
    m1 = m0 + pd.offsets.MonthBegin(1)
    gen = generate(profile, m0, m1, seed=0)
    rows = compare(real, gen)
    step.write_json("profile.json", profile)
    step.write_json("fit_report.json", {"month": month, "rows": rows})
    step.write_bytes("fit_report.md", fit_markdown(rows, month).encode())
    step.commit(summary={"jobs": profile["fitted_on"]["jobs"], "compare_month": month})
    print(fit_markdown(rows, month))
    return 0


def _run_generate(args: argparse.Namespace) -> int:
    from ..data.prefixes import PREFIXES_FILE
    from ..data.schema import TRACE_FILE, TraceMeta, describe, parse_time, submit_prefixes, write_trace
    from ..data.synth import generate, load_profile

    if not args.t_from or not args.t_to:
        raise StepError("--profile needs --from and --to")
    t_from, t_to = parse_time(args.t_from, "--from"), parse_time(args.t_to, "--to")
    if t_to <= t_from:
        raise StepError(f"--to {args.t_to} must be later than --from {args.t_from}")
    if not 0 < args.load_scale <= MAX_LOAD_SCALE:
        raise StepError(
            f"--load-scale {args.load_scale:g}: must be > 0 and at most {MAX_LOAD_SCALE:g} "
            "(a multiple of the profile's arrival rate)"
        )
    span_days = (t_to - t_from).total_seconds() / 86400
    if span_days > MAX_SPAN_DAYS:
        raise StepError(
            f"--from {args.t_from} --to {args.t_to}: {span_days:.0f} days; at most {MAX_SPAN_DAYS} days "
            "(ten years) are generated in one run"
        )
    profile = load_profile(args.profile)
    from ..data.synth import expected_jobs

    want = expected_jobs(profile, span_days, args.load_scale)
    if want > MAX_EXPECTED_JOBS:
        raise StepError(
            f"--from/--to/--load-scale: the profile would generate about {want:,.0f} jobs in "
            f"{span_days:.0f} days at x{args.load_scale:g}; at most {MAX_EXPECTED_JOBS:,} in one run"
        )
    params = {
        "mode": "generate",
        "profile": profile,
        "from": t_from.isoformat(),
        "to": t_to.isoformat(),
        "seed": args.seed,
        "load_scale": args.load_scale,
    }
    step = Step("synth", args.out, __version__, params)
    if step.skip():
        return 0
    df = generate(profile, t_from, t_to, args.seed, args.load_scale)
    if df.empty:
        raise StepError(f"the profile generated no jobs in [{args.t_from}, {args.t_to})")
    meta = TraceMeta(
        source=f"synth:{args.profile}:seed={args.seed}",
        format="synthetic",
        timezone="UTC",
        machine_nodes=profile.get("machine_nodes"),
    )
    write_trace(step.record(TRACE_FILE), df, meta)
    step.write_json(PREFIXES_FILE, submit_prefixes(df))
    stats = describe(df)
    step.write_json("synth_report.json", {"profile": args.profile, "seed": args.seed, "stats": stats})
    step.commit(summary=stats)
    print(
        f"synth: {stats['jobs']} jobs from {stats['first_submit']} to {stats['last_submit']} -> {step.path(TRACE_FILE)}"
    )
    return 0
