"""The A/A control's false-difference rate: over many days of A/A measurements in which
nothing differs, how often the day's A/A verdict (:func:`faasm_tasks.stats.aa_verdict`) says
"fail". It should be at most 1 - level (5 % at 95 %).

* synthetic days (the default): each day ``--figures`` figures, each measured ``--repeats``
  times per arm in the run step's randomized order (:func:`faasm_tasks.order.trials`), with
  log-normal noise (``--noise``) and an optional drift over the step (``--drift``: the last
  trial that much slower than the first). ``--sequential`` measures arm A's repeats, then
  A''s, as the run step did before its order was randomized: with drift, that order
  manufactures a difference and the rate shows it;
* stored days (``--results ROOT --date END --days N``): every run in the window that measured
  A/A arms, its verdict as the check step computes it (:func:`faasm_tasks.trends.aa_control`).

Prints one line per stored run (or a summary of the synthetic days) and the rate with its
Clopper-Pearson interval against the target, at most ``1 - level``
(:func:`faasm_tasks.stats.false_difference_rate`; the trend page shows the same over its
window); writes JSON with ``--json PATH``.
"""

from __future__ import annotations

import numpy as np

from stepkit import StepError, storage

from .. import order, stats


def add_arguments(p):
    p.add_argument("--days", type=int, default=100, help="days to simulate, or of stored results (default 100)")
    p.add_argument("--figures", type=int, default=6, help="synthetic: A/A figures per day (default 6)")
    p.add_argument("--repeats", type=int, default=6, help="synthetic: repeats per arm (default 6)")
    p.add_argument("--noise", type=float, default=0.05, help="synthetic: log-normal sigma of a value (default 0.05)")
    p.add_argument(
        "--drift", type=float, default=0.0, help="synthetic: relative slow-down over the step (0.2: +20 %% at the end)"
    )
    p.add_argument("--sequential", action="store_true", help="synthetic: arm A's repeats first, then A''s")
    p.add_argument("--level", type=float, default=stats.LEVEL, help="the day's A/A level (default 0.95)")
    p.add_argument("--seed", type=int, default=0, help="synthetic: seed of the noise and of the orders")
    p.add_argument("--results", help="stored results root: the rate over its runs with A/A arms instead")
    p.add_argument("--date", help="with --results: the window's last date (YYYY-MM-DD)")
    p.add_argument("--json", help="also write the result here")


def synthetic(
    days: int,
    figures: int = 6,
    repeats: int = 6,
    noise: float = 0.05,
    drift: float = 0.0,
    sequential: bool = False,
    level: float = stats.LEVEL,
    seed: int = 0,
) -> dict:
    """The false-difference rate over ``days`` simulated A/A days (see the module)."""
    rng = np.random.default_rng(seed)
    fails = 0
    for d in range(days):
        comparisons = []
        for f in range(figures):
            if sequential:
                trials = [order.Trial(0, arm, r) for arm in order.AA_ARMS for r in range(repeats)]
            else:
                trials = order.trials(1, repeats, seed=seed * 1_000_003 + d * 1009 + f, arms=order.AA_ARMS)
            values: dict[str, list[float]] = {arm: [] for arm in order.AA_ARMS}
            for i, t in enumerate(trials):
                slow = 1 + drift * i / max(1, len(trials) - 1)
                values[t.arm].append(100.0 * slow * float(np.exp(noise * rng.standard_normal())))
            comparisons.append((f"figure {f}", *values.values()))
        verdict = stats.aa_verdict(comparisons, level)
        fails += verdict["verdict"] == "fail"
    return {
        "source": "synthetic",
        "days": days,
        "figures": figures,
        "repeats": repeats,
        "noise": noise,
        "drift": drift,
        "order": "sequential" if sequential else "randomized",
        **stats.false_difference_rate(fails, days, level),
    }


def stored(root: str, end: str, days: int, level: float = stats.LEVEL) -> dict:
    """The rate over the stored runs with A/A arms in the ``days`` days up to ``end``: the trend
    page's computation (:func:`faasm_tasks.trends.aa_history`) over that window."""
    from .. import trends  # pandas only here

    return {"source": root, "days": days, "end": end, **trends.aa_history(trends.load_window(root, end, days), level)}


def run(args) -> int:
    if args.days < 1 or args.figures < 1 or args.repeats < 1:
        raise StepError("--days, --figures and --repeats must be at least 1")
    if not 0 < args.level < 1:
        raise StepError(f"--level must be between 0 and 1, got {args.level}")
    if args.results:
        if not args.date:
            raise StepError("--results needs --date (the window's last day)")
        res = stored(args.results, args.date, args.days, args.level)
        for r in res["runs"]:
            print(f"aa-rate: {r['date']} {r['run_id']}: {r['text']}", flush=True)
        uncounted = len(res["runs"]) - res["verdicts"]
        what = f"{res['verdicts']} stored run(s) with A/A arms in {args.days} days to {args.date}" + (
            f" ({uncounted} more without an interval, not counted)" if uncounted else ""
        )
    else:
        res = synthetic(
            args.days, args.figures, args.repeats, args.noise, args.drift, args.sequential, args.level, args.seed
        )
        what = (
            f"{args.days} synthetic days of {args.figures} A/A figure(s), {args.repeats} repeats per arm, "
            f"noise {args.noise:g}, drift {args.drift:g}, {res['order']} order"
        )
    print(f"aa-rate: {what}: {stats.rate_text(res)}", flush=True)
    if args.json:
        storage.write_json(args.json, res)
    return 0
