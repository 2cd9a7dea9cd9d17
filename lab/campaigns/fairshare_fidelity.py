"""Does Slurm's fair share in the simulator replace the trace's recorded priorities? Replay fidelity and the plan at submission on ls6.

Run: ``nice -n 10 .venv/bin/python -m lab.campaigns.fairshare_fidelity [--smoke] [--json OUT] [--write-doc PAGE]``.

The ls6 log (ingested with America/Chicago local times) replayed by the ``fidelity`` step in
Mirage's warm-started 5-day episodes over the shipped preset's calibration period, jobs submitted
2022-12-01 to 2023-04-01 (``--smoke``: December only), under configurations that differ only in
the queue order (every other setting is the ``ls6`` preset's: 78 nodes, conservative backfill
every 60 s, 8 running jobs per user, age weight 3000):

* ``recorded``: the ``ls6`` preset itself, the trace's recorded priority plus age (the value
  Slurm computed for the job; the export holds one value per job, written after submission);
* ``age_size``: age only (what a simulator without fair share has);
* ``fairshare-W`` / ``fairshare-W-1d``: Slurm's multifactor priority with the classic fair share
  (``mirage_tasks/sim/fairshare.py``) of weight W, usage half-life 7 days (1 day), read only from
  the trace's users and the runs before each instant: no recorded priority at all.

Every replay uses every job's real run time (replay fidelity, not prediction at submission). For
each configuration: the per-job MAE of the start wait and the share within 1 h; for the pairs a
user would compare, the difference with a 95 % interval from a paired bootstrap over the 5-day
episodes (2000 resamples, seed 0: jobs of one episode share a replay, so episodes are resampled
whole). Prints a table and a JSON summary; ``--write-doc`` writes the results page.

At submission (no run time, no later arrival: :func:`mirage_tasks.calibration.atsubmit.sweep`, what
the ``waitpred`` step's ``plan`` and ``plan_request`` candidates are): the same jobs' waits as the
scheduler's plan from the queue at each job's submission, with the ``ls6`` preset's weights (age
only: its recorded priorities contain the outcome, so the plan never reads them) and with fair share
(from the runs started before that instant), against predicting zero wait; intervals from a paired
bootstrap over days (jobs of one day share the queue states).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository (lab/campaigns/ is two below)
LS6 = ROOT.parent / "shared" / "traces" / "ls6-a100.log.gz"
FROM, TO, SMOKE_TO = "2022-12-01T00:00:00+00:00", "2023-04-01T00:00:00+00:00", "2023-01-01T00:00:00+00:00"
EPISODE_DAYS = 5
CONFIGS = {  # name -> changes to the ls6 preset
    "recorded": {},
    "age_size": {"priority": "age_size"},
    "fairshare-3000": {"priority": "multifactor", "weight_fairshare": 3000.0},
    "fairshare-10000": {"priority": "multifactor", "weight_fairshare": 10000.0},
    "fairshare-30000": {"priority": "multifactor", "weight_fairshare": 30000.0},
    "fairshare-10000-1d": {"priority": "multifactor", "weight_fairshare": 10000.0, "fs_halflife_s": 86400},
}
SMOKE_CONFIGS = ("recorded", "age_size", "fairshare-3000")
PAIRS = [
    ("fairshare-3000", "age_size"),
    ("fairshare-3000", "recorded"),
    ("fairshare-10000", "recorded"),
    ("fairshare-30000", "recorded"),
    ("fairshare-10000-1d", "recorded"),
]


def _step(args: list[str], env: dict) -> None:
    p = subprocess.run([sys.executable, "-m", "mirage_tasks", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(args[:1])} failed (rc {p.returncode}):\n{p.stderr[-3000:]}")


def measure(log: str, root: pathlib.Path, smoke: bool, resamples: int) -> dict:
    import numpy as np
    import pandas as pd

    from mirage_tasks.sim.config import PRESETS

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    trace = root / "ls6"
    _step(
        ["ingest", "--trace", log, "--timezone", "America/Chicago", "--out", str(trace), "--log-level", "WARNING"], env
    )
    to = SMOKE_TO if smoke else TO
    names = SMOKE_CONFIGS if smoke else tuple(CONFIGS)
    waits, walls = {}, {}
    for name in names:
        cfg_path = root / f"{name}.json"
        cfg_path.write_text(json.dumps(PRESETS["ls6"].replace(**CONFIGS[name]).to_dict()))
        out = root / f"fid-{name}"
        t = time.perf_counter()
        _step(
            [
                "fidelity",
                "--trace",
                str(trace),
                "--from",
                FROM,
                "--to",
                to,
                "--episode-days",
                str(EPISODE_DAYS),
                "--cluster-config",
                str(cfg_path),
                "--compare",
                "--out",
                str(out),
                "--log-level",
                "WARNING",
            ],
            env,
        )
        walls[name] = round(time.perf_counter() - t, 1)
        w = pd.read_parquet(out / "waits.parquet").sort_values(["job_id", "submit"]).reset_index(drop=True)
        waits[name] = w
    first = waits[names[0]]
    for name in names:  # the same jobs in the same order, or the pairing is meaningless
        if not (waits[name].job_id.to_numpy() == first.job_id.to_numpy()).all():
            sys.exit(f"bench: {name} scored other jobs than {names[0]}")
    t = (first.submit - pd.Timestamp(FROM)).dt.total_seconds().to_numpy()
    episode = (t // (EPISODE_DAYS * 86400)).astype(int)
    err = {n: np.abs(w.sim_wait_s - w.real_wait_s).to_numpy() / 3600.0 for n, w in waits.items()}
    within = {n: (e <= 1.0).astype(float) for n, e in err.items()}
    rng = np.random.default_rng(0)
    eps = np.unique(episode)
    members = [np.flatnonzero(episode == e) for e in eps]
    picks = [np.concatenate([members[k] for k in rng.integers(0, len(eps), len(eps))]) for _ in range(resamples)]

    def interval(a: str, b: str, x: dict) -> list[float]:
        d = [x[a][ii].mean() - x[b][ii].mean() for ii in picks]
        return [float(v) for v in np.percentile(d, [2.5, 97.5])]

    zero = float((first.real_wait_s.to_numpy() / 3600.0).mean())
    at_submit = _at_submission(trace, to, smoke, resamples)
    out = {
        "window": [FROM, to],
        "episode_days": EPISODE_DAYS,
        "jobs": int(len(first)),
        "episodes": int(len(eps)),
        "resamples": resamples,
        "zero_wait_mae_h": round(zero, 3),
        "configs": {},
        "pairs": [],
        "at_submission": at_submit,
    }
    for n in names:
        out["configs"][n] = {
            "changes": CONFIGS[n],
            "mae_h": round(float(err[n].mean()), 3),
            "within_1h": round(float(within[n].mean()), 4),
            "replay_wall_s": walls[n],
        }
    for a, b in PAIRS:
        if a in err and b in err:
            out["pairs"].append(
                {
                    "a": a,
                    "b": b,
                    "mae_h_diff": round(float(err[a].mean() - err[b].mean()), 3),
                    "mae_h_diff_ci": [round(v, 3) for v in interval(a, b, err)],
                    "within_1h_diff": round(float(within[a].mean() - within[b].mean()), 4),
                    "within_1h_diff_ci": [round(v, 4) for v in interval(a, b, within)],
                }
            )
    return out


def _reading(s: dict) -> str:
    """What the intervals say about fair share against the recorded priorities (from the figures)."""
    vs = [p for p in s["pairs"] if p["b"] == "recorded"]
    tie = [p["a"] for p in vs if p["mae_h_diff_ci"][0] <= 0 <= p["mae_h_diff_ci"][1]]
    worse = [p["a"] for p in vs if p["mae_h_diff_ci"][0] > 0]
    better = [p["a"] for p in vs if p["mae_h_diff_ci"][1] < 0]
    parts = []
    if tie:
        parts.append(
            f"{', '.join(tie)} cannot be told apart from the recorded priorities in MAE (the interval "
            "holds 0) without reading any"
        )
    if better:
        parts.append(f"{', '.join(better)} fit better than the recorded priorities")
    if worse:
        parts.append(f"{', '.join(worse)} fit worse than them")
    return ("; ".join(parts) + ".") if parts else "no pair against the recorded priorities was measured."


def _at_submission(trace: pathlib.Path, to: str, smoke: bool, resamples: int) -> dict:
    """The scheduler's plan at each job's submission with and without fair share (see the docstring)."""
    import numpy as np
    import pandas as pd

    from mirage_tasks.calibration import atsubmit
    from mirage_tasks.data.schema import read_trace
    from mirage_tasks.sim import PRESETS, Workload

    df, _ = read_trace(str(trace / "trace.parquet"))
    wl = Workload.from_frame(df)
    a, b = int(pd.Timestamp(FROM).timestamp()), int(pd.Timestamp(to).timestamp())
    names = ("age_size", "fairshare-3000") if smoke else ("age_size", "fairshare-3000", "fairshare-10000")
    cfgs = {"age_size": PRESETS["ls6"], **{n: PRESETS["ls6"].replace(**CONFIGS[n]) for n in names[1:]}}
    sw = {n: atsubmit.sweep(wl, cfgs[n], a, b) for n in names}
    real = sw[names[0]].real_wait_s.to_numpy() / 3600.0
    day = ((sw[names[0]].submit.to_numpy() - a) // 86400).astype(int)
    rng = np.random.default_rng(0)
    days = np.unique(day)
    members = [np.flatnonzero(day == d) for d in days]
    picks = [np.concatenate([members[k] for k in rng.integers(0, len(days), len(days))]) for _ in range(resamples)]
    out: dict = {
        "jobs": int(len(real)),
        "days": int(len(days)),
        "zero_mae_h": round(float(real.mean()), 3),
        "zero_within_1h": round(float((real <= 1.0).mean()), 4),
        "plans": {},
        "pairs": [],
    }
    err = {"zero": real}
    for n in names:
        for col in ("plan_s", "plan_request_s"):
            e = np.abs(sw[n][col].to_numpy() / 3600.0 - real)
            err[f"{n}:{col}"] = e
            out["plans"][f"{n}:{col}"] = {
                "mae_h": round(float(e.mean()), 3),
                "within_1h": round(float((e <= 1.0).mean()), 4),
            }

    def diff(x: str, y: str) -> dict:
        d = [err[x][ii].mean() - err[y][ii].mean() for ii in picks]
        w = [(err[x][ii] <= 1.0).mean() - (err[y][ii] <= 1.0).mean() for ii in picks]
        return {
            "a": x,
            "b": y,
            "mae_h_diff": round(float(err[x].mean() - err[y].mean()), 3),
            "mae_h_diff_ci": [round(float(v), 3) for v in np.percentile(d, [2.5, 97.5])],
            "within_1h_diff": round(float((err[x] <= 1.0).mean() - (err[y] <= 1.0).mean()), 4),
            "within_1h_diff_ci": [round(float(v), 4) for v in np.percentile(w, [2.5, 97.5])],
        }

    for col in ("plan_s", "plan_request_s"):
        for n in names:
            out["pairs"].append(diff(f"{n}:{col}", "zero"))
        for n in names[1:]:
            out["pairs"].append(diff(f"{n}:{col}", f"age_size:{col}"))
    return out


def _diff(p: dict, key: str, fmt: str) -> str:
    """A pair's difference with its interval, as the differences tables state it."""
    lo, hi = p[f"{key}_diff_ci"]
    return f"{p[f'{key}_diff']:{fmt}} [{lo:{fmt}}, {hi:{fmt}}]"


def answer(s: dict) -> list[str]:
    """The page's leading answer, from its tables: the replay's MAE per queue order and how the fair
    share configurations compare with the recorded priorities (:func:`_reading`'s split by interval),
    and the plan at submission lowest in MAE against zero wait."""
    c = s["configs"]
    vs_rec = [p for p in s["pairs"] if p["b"] == "recorded"]
    first = vs_rec[0] if vs_rec else None
    vs_age = next((p for p in s["pairs"] if p["b"] == "age_size"), None)
    tie = [p["a"] for p in vs_rec if p["mae_h_diff_ci"][0] <= 0 <= p["mae_h_diff_ci"][1]]
    worse = [p["a"] for p in vs_rec if p["mae_h_diff_ci"][0] > 0]
    better = [p["a"] for p in vs_rec if p["mae_h_diff_ci"][1] < 0]
    text = (
        "**Answer.** Replayed with every job's real run time, per-job wait MAE is "
        + ", ".join(f"{n} {c[n]['mae_h']:.2f} h" for n in ("recorded", "age_size") if n in c)
        + f" (zero wait {s['zero_wait_mae_h']:.2f} h). Fair share computed from the trace alone, against the "
        "recorded priorities in MAE [95 % CI]: "
        + "; ".join(
            part
            for part in (
                f"not told apart for {', '.join(tie)}" if tie else "",
                f"better for {', '.join(better)}" if better else "",
                f"worse for {', '.join(worse)}" if worse else "",
            )
            if part
        )
        + (f" ({first['a']} {_diff(first, 'mae_h', '+.3f')} h)" if first else "")
        + (f"; {vs_age['a']} against age only {_diff(vs_age, 'mae_h', '+.3f')} h" if vs_age else "")
        + "."
    )
    z = s.get("at_submission") or {}
    vs0 = [p for p in z.get("pairs", []) if p["b"] == "zero"]
    if vs0:
        b = min(vs0, key=lambda p: p["mae_h_diff"])
        text += (
            f" At submission, the plan lowest in MAE, {b['a']} ({z['plans'][b['a']]['mae_h']:.2f} h), against zero "
            f"wait ({z['zero_mae_h']:.2f} h): {_diff(b, 'mae_h', '+.3f')} h, within 1 h "
            f"{_diff(b, 'within_1h', '+.2%')}."
        )
    return [text, ""]


def page(s: dict) -> str:
    lines = [
        "# Fair share in the simulator against the recorded priorities (ls6 replay fidelity)",
        "",
        *answer(s),
        "Written by `python -m lab.campaigns.fairshare_fidelity --write-doc docs/results/fairshare-fidelity.md` (see its",
        "docstring for the protocol). The ls6 log's jobs submitted "
        f"{s['window'][0][:10]} to {s['window'][1][:10]} ({s['jobs']} jobs), replayed in {s['episodes']} "
        f"warm-started {s['episode_days']}-day episodes with every job's real run time (replay fidelity: "
        "the figures say how well the simulator reproduces the log, not how well it predicts a wait at "
        "submission). Every setting but the queue order is the `ls6` preset's. Predicting zero wait for "
        f"every job scores MAE {s['zero_wait_mae_h']:.2f} h.",
        "",
        "| queue order | MAE (h) | within 1 h | replay (s) |",
        "|---|---|---|---|",
    ]
    for n, c in s["configs"].items():
        lines.append(f"| {n} | {c['mae_h']:.2f} | {c['within_1h']:.1%} | {c['replay_wall_s']:.0f} |")
    lines += [
        "",
        f"Differences (first minus second; 95 % interval from a paired bootstrap over the episodes, "
        f"{s['resamples']} resamples):",
        "",
        "| pair | MAE (h) | within 1 h |",
        "|---|---|---|",
    ]
    for p in s["pairs"]:
        lo, hi = p["mae_h_diff_ci"]
        l2, h2 = p["within_1h_diff_ci"]
        lines.append(
            f"| {p['a']} - {p['b']} | {p['mae_h_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
            f"{p['within_1h_diff']:+.2%} [{l2:+.2%}, {h2:+.2%}] |"
        )
    lines += [
        "",
        "What each configuration may know: `recorded` reads each job's priority as the export holds it "
        "(one value, written by Slurm after the job's submission, including the fair share of that moment); "
        "the `fairshare-*` rows read only the trace's users and the runs before each instant (usage decayed "
        "with the half-life), as Slurm's own scheduler does. `age_size` knows neither.",
        "",
        f"Reading: {_reading(s)} The weights were not fitted: these configurations were looked at on "
        "this one window, so a small edge among them is a selection; `calibrate --search-fairshare` fits "
        "weight and half-life on one period and scores another.",
        "",
    ]
    z = s["at_submission"]
    lines += [
        "## At submission",
        "",
        f"The same {z['jobs']} jobs, each predicted at its submission by the scheduler's plan from the queue "
        "then (`plan`: per-user run-time estimates; `plan_request`: requested times, Slurm's "
        "`squeue --start`), without fair share (the preset's age weight) and with it (usage from the runs "
        "started before that instant). Nothing after the submission is read; later arrivals of higher "
        f"priority are not modelled. Zero wait scores MAE {z['zero_mae_h']:.2f} h, within 1 h "
        f"{z['zero_within_1h']:.1%}.",
        "",
        "| plan | MAE (h) | within 1 h |",
        "|---|---|---|",
    ]
    for n, v in z["plans"].items():
        lines.append(f"| {n} | {v['mae_h']:.2f} | {v['within_1h']:.1%} |")
    lines += [
        "",
        f"Differences (95 % interval from a paired bootstrap over the {z['days']} days):",
        "",
        "| pair | MAE (h) | within 1 h |",
        "|---|---|---|",
    ]
    for p in z["pairs"]:
        lo, hi = p["mae_h_diff_ci"]
        l2, h2 = p["within_1h_diff_ci"]
        lines.append(
            f"| {p['a']} - {p['b']} | {p['mae_h_diff']:+.3f} [{lo:+.3f}, {hi:+.3f}] | "
            f"{p['within_1h_diff']:+.2%} [{l2:+.2%}, {h2:+.2%}] |"
        )
    vs0 = [p for p in z["pairs"] if p["b"] == "zero"]
    beat = [p["a"] for p in vs0 if p["mae_h_diff_ci"][1] < 0]
    lost = [p["a"] for p in vs0 if p["mae_h_diff_ci"][0] > 0]
    lines += [
        "",
        "Reading: in MAE, "
        + (f"{', '.join(beat)} beat predicting zero wait" if beat else "no plan beats predicting zero wait")
        + (f"; {', '.join(lost)} lose to it" if lost else "")
        + ". The within-1-h share of every plan "
        "stays below zero wait's where the interval says so: most jobs start at once, and a plan that "
        "puts any of them in a queue misses them. The weights are the ones looked at above (a selection "
        "on this window).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log", default=str(LS6), help=f"the ls6 log ({LS6})")
    ap.add_argument("--smoke", action="store_true", help="December 2022 and three configurations (seconds)")
    ap.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (2000)")
    ap.add_argument("--json", default=None, help="also write the summary here")
    ap.add_argument("--write-doc", default=None, help="write the results page here")
    args = ap.parse_args(argv)
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(ap, args, {"resamples": (100, 100_000)}, files=("json", "write_doc"))
    if not os.path.exists(args.log):
        sys.exit(f"bench: {args.log} not found (../shared/traces beside the repository); pass --log")
    with tempfile.TemporaryDirectory(prefix="bench-fairshare-") as tmp:
        s = measure(args.log, pathlib.Path(tmp), args.smoke, args.resamples)
    print(f"{s['jobs']} jobs in {s['episodes']} episodes; zero-wait MAE {s['zero_wait_mae_h']:.2f} h")
    for n, c in s["configs"].items():
        print(f"{n:>20}: MAE {c['mae_h']:.2f} h, within 1 h {c['within_1h']:.1%} ({c['replay_wall_s']:.0f} s)")
    for p in s["pairs"]:
        (lo, hi), (l2, h2) = p["mae_h_diff_ci"], p["within_1h_diff_ci"]
        print(
            f"{p['a']} - {p['b']}: MAE {p['mae_h_diff']:+.3f} h [{lo:+.3f}, {hi:+.3f}], within 1 h "
            f"{p['within_1h_diff']:+.2%} [{l2:+.2%}, {h2:+.2%}]"
        )
    z = s["at_submission"]
    print(f"at submission: zero wait MAE {z['zero_mae_h']:.2f} h")
    for p in z["pairs"]:
        (lo, hi), (l2, h2) = p["mae_h_diff_ci"], p["within_1h_diff_ci"]
        print(
            f"  {p['a']} - {p['b']}: MAE {p['mae_h_diff']:+.3f} h [{lo:+.3f}, {hi:+.3f}], within 1 h "
            f"{p['within_1h_diff']:+.2%} [{l2:+.2%}, {h2:+.2%}]"
        )
    print(json.dumps(s))
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(s, indent=1) + "\n")
    if args.write_doc:
        pathlib.Path(args.write_doc).write_text(page(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
