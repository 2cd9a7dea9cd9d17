"""The service keeper on a real (local) Slurm over several busy windows.

    python -m lab.campaigns.keeper_campaign windows --trace var/keepcamp/ls6/trace.parquet --out var/keepcamp
    python -m lab.campaigns.keeper_campaign run --root var/keepcamp --model M --avg-cal-samples S [--policies ...]
    python -m lab.campaigns.keeper_campaign page --root var/keepcamp --write-doc docs/results/keeper-campaign.md

``windows`` chooses the windows before any keeper run, from the real log alone: the hourly
number of jobs waiting in the log (submitted, not started), its median over the training period
(``--train-from``/``--train-to``, the months the model's samples come from) as the line for
"busy", and the test period's non-overlapping windows of ``--span-hours`` whose mean queue is
above that median, the busiest first (``--count`` of them), listed by date (``windows.json``).

``run`` starts one ``keep-service`` per window (its measurement mode, ``python -m lab
keeper-slurm``), all at once, each on a local Slurm of its own (``--slurm-root``): every policy's ``--chains`` chains, chain ``c`` starting ``--offset-hours + c x
--stagger-hours`` after the window's start, so that one chain of a policy ends before its next
starts (at most one service job per policy at a time, plus a successor's overlap); and, for the
first window (``--baseline-windows``: the windows listed), a ``replay-slurm`` of the same
background without any chain, so the page can say how much the chains moved the background they
are judged in. ``--extra-nodes K`` adds K nodes to the log's
cluster: the chains bring their own capacity (one node per service job at a time), so the
background keeps, on average, the capacity it had in the log, while the chains still queue with it
for the same nodes (on 78 nodes without it, 3 or 4 chains at a time lengthened the background's
mean wait by 1.2 to 1.7 h, Slurm's own spread being 0.07 h). With ``--offset-hours``, the extra
nodes served the background alone until the chains started (set ``keepc2``: its background's mean
wait 0.41 h shorter than without chains); ``--late-extra-nodes`` keeps them drained until then. The runs are niced to ``--nice`` (negative:
ahead of other work on the machine, which would otherwise stretch Slurm's dispatch, one real
second being ``--factor`` trace seconds). Each run's wall time and CPU are printed.

``page`` pools the runs (:mod:`mirage_tasks.slurm.keeper_stats`: a bootstrap over chains, the
policies paired on the same window, chain and link) and writes the results page with the
commands, the windows and their queues, per-window rows, the simulator's prediction for the same
chains, and the background with and without the chains.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from mirage_tasks.sim import decision_rules as dr

ROOT = Path(__file__).resolve().parents[2]  # the repository (lab/campaigns/ is two below)
PY = sys.executable
DEFAULTS = {
    "train_from": "2022-10-12",
    "train_to": "2023-01-28",
    "test_from": "2023-01-28",
    "test_to": "2023-03-31",
    "span_hours": 204.0,
    "count": 5,
}


def queue_series(trace: str, t_from: pd.Timestamp, t_to: pd.Timestamp) -> pd.Series:
    """Jobs waiting in the real log (submitted, not yet started) at every hour of [t_from, t_to)."""
    from mirage_tasks.data.schema import read_trace

    df, _ = read_trace(trace)
    epoch = pd.Timestamp(0, tz="UTC")
    sub = (df["submit"] - epoch).dt.total_seconds().to_numpy()
    st = (df["start"] - epoch).dt.total_seconds().to_numpy()
    hours = pd.date_range(t_from, t_to, freq="1h", inclusive="left")
    t = (hours - epoch).total_seconds().to_numpy()
    n = np.searchsorted(np.sort(sub), t, side="right") - np.searchsorted(np.sort(st), t, side="right")
    return pd.Series(n, index=hours)


def choose_windows(
    trace: str, train_from: str, train_to: str, test_from: str, test_to: str, span_h: float, count: int
) -> dict:
    ts = lambda s: pd.Timestamp(s, tz="UTC")  # noqa: E731
    train = queue_series(trace, ts(train_from), ts(train_to))
    median = float(train.median())
    test = queue_series(trace, ts(test_from), ts(test_to))
    span = pd.Timedelta(hours=span_h)
    cands = []
    for start in pd.date_range(ts(test_from), ts(test_to) - span, freq="1D"):
        q = test[(test.index >= start) & (test.index < start + span)]
        cands.append((float(q.mean()), start))
    busy = sorted([c for c in cands if c[0] > median], key=lambda c: -c[0])
    chosen: list[tuple[float, pd.Timestamp]] = []
    for m, s in busy:
        if all(abs((s - o).total_seconds()) >= span.total_seconds() for _, o in chosen):
            chosen.append((m, s))
        if len(chosen) == count:
            break
    chosen.sort(key=lambda c: c[1])
    return {
        "median_queue_train": median,
        "train": [train_from, train_to],
        "test": [test_from, test_to],
        "span_hours": span_h,
        "candidates": len(cands),
        "busy_candidates": len(busy),
        "windows": [
            {"name": f"w{i + 1}", "from": s.strftime("%Y-%m-%dT%H:%M"), "mean_queue": m}
            for i, (m, s) in enumerate(chosen)
        ],
    }


def keep_argv(a: argparse.Namespace, w: dict) -> list[str]:
    start = pd.Timestamp(w["from"], tz="UTC")
    to = start + pd.Timedelta(hours=a.span_hours + 48)  # held beyond the chains: the session ends with them
    from mirage_tasks.slurm.livewait import WAIT_RULES

    pol = a.policies.split(",")
    inputs = (
        (["--model", a.model] if dr.MODEL in pol else [])
        + (["--avg-cal-samples", a.avg_cal_samples] if dr.AVG_CAL in pol else [])
        + (["--waitpred", a.waitpred] if set(WAIT_RULES) & set(pol) else [])
        + (["--guarantee-samples", a.guarantee_samples] if dr.GUARANTEE_CAL in pol else [])
    )
    from mirage_tasks.sim.config import PRESETS

    nodes = ["--nodes", str(PRESETS["ls6"].nodes + a.extra_nodes)] if a.extra_nodes else []
    if getattr(a, "late_extra_nodes", False):
        nodes += ["--late-nodes", str(a.extra_nodes)]
    return [
        PY,
        "-m",
        "lab",
        "keeper-slurm",
        "--policy",
        a.policies,
        *inputs,
        "--node",
        "1",
        "--service-hours",
        "48",
        "--factor",
        f"{a.factor:g}",
        "--slurm-root",
        f"{a.root}/slurm-{a.name}-{w['name']}",
        "--cluster-config",
        "ls6",
        *nodes,
        "--trace",
        a.trace,
        "--background-from",
        w["from"],
        "--background-to",
        to.strftime("%Y-%m-%dT%H:%M"),
        "--chains",
        str(a.chains),
        "--stagger-hours",
        f"{a.stagger_hours:g}",
        *(["--offset-hours", f"{a.offset_hours:g}"] if a.offset_hours else []),
        "--deadline-s",
        f"{a.deadline_s:g}",
        "--stop-chain",
        "--out",
        f"{a.root}/{a.name}-{w['name']}",
    ]


def replay_argv(a: argparse.Namespace, w: dict) -> list[str]:
    start = pd.Timestamp(w["from"], tz="UTC")
    to = start + pd.Timedelta(hours=a.span_hours)
    return [
        PY,
        "-m",
        "lab",
        "replay-slurm",
        "--trace",
        a.trace,
        "--from",
        w["from"],
        "--to",
        to.strftime("%Y-%m-%dT%H:%M"),
        "--factor",
        f"{a.factor:g}",
        "--cluster-config",
        "ls6",
        "--slurm-root",
        f"{a.root}/slurm-{w['name']}-nochains",
        "--drain",
        "60",
        "--out",
        f"{a.root}/replay-{w['name']}-nochains",
    ]


def run(a: argparse.Namespace) -> int:
    wins = json.load(open(f"{a.root}/windows.json"))["windows"]
    jobs = [(f"{a.name}-{w['name']}", keep_argv(a, w)) for w in wins]
    names = [w["name"] for w in wins]
    base = [] if a.no_baseline else names[:1] if a.baseline_windows is None else a.baseline_windows.split(",")
    unknown = sorted(set(base) - set(names))
    if unknown:
        raise SystemExit(
            f"--baseline-windows {a.baseline_windows}: {', '.join(unknown)} not in "
            f"{a.root}/windows.json ({', '.join(names)})"
        )
    jobs += [(f"replay-{w['name']}-nochains", replay_argv(a, w)) for w in wins if w["name"] in base]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = {}
    for name, argv in jobs:
        log = open(f"{a.root}/{name}.log", "w")
        print(f"{name}: nice -n {a.nice} {shlex.join(argv)}", flush=True)
        procs[name] = (
            subprocess.Popen(
                ["nice", "-n", str(a.nice), *argv], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env
            ),
            time.monotonic(),
            log,
        )
    rc = 0
    for name, (p, t0, log) in procs.items():
        code = p.wait()
        log.close()
        print(f"{name}: rc {code}, wall {time.monotonic() - t0:.0f} s", flush=True)
        rc = rc or code
    return rc


def repredict_run(run: Path, slurm_root: Path) -> pd.DataFrame:
    """A stored keep-service run's links with the simulator's prediction computed again by this
    checkout's :meth:`~lab.slurm.keeper_session.MeasuredSession.links`, from what the run stored: its
    parameters (``keeper.json``), its links, the background as Slurm ran it
    (``background.parquet``) and its cluster's slurmctld log and state (submission instants to
    the ms, the phase of the fair-share re-reads). For runs from before ``late_nodes_joined_epoch``
    was recorded, the late nodes joined right after chain 0's predecessors were queued, so that
    instant is slurmctld's own record of their resume. The policies that do not use a model or a
    predictor must come out as stored (a check of the rebuild; runs whose join instant was not
    recorded come out near it, not equal: the prediction of the later chains is sensitive to it)."""
    from lab.__main__ import step_parser as lab_step_parser
    from lab.slurm.compare import last_recalc_epoch
    from lab.slurm.keeper_session import MeasuredSession
    from mirage_tasks.data.schema import parse_time, read_trace
    from mirage_tasks.data.times import hours_to_s
    from mirage_tasks.sim.config import config_from_args
    from mirage_tasks.slurm import keeper as kp
    from mirage_tasks.slurm.conf import sim_config
    from mirage_tasks.slurm.queue import read_resume_log, read_submit_log

    k = json.loads((run / "keeper.json").read_text())
    facts = k["facts"]
    params = {x: v for x, v in k.items() if x not in ("links", "summary", "facts")}
    ns = lab_step_parser("keeper-slurm").parse_args(["--out", str(run)])
    vars(ns).update(params)
    _, meta = read_trace(ns.trace)
    cfg = config_from_args(ns, meta.machine_nodes)
    policies = ns.policy.split(",")
    keeper = {"avg_offset_h": (facts.get("avg_cal") or {}).get("threshold")}
    decide = None
    if dr.MODEL in policies:
        decide, info = kp.model_decider(ns.model)
        keeper["decide_within_s"] = info["trained_span_s"] if ns.decide_within == "trained" else None
        keeper["decide_at_s"] = info["trained_offsets_s"] if params.get("decide_at") == "probes" else None
    gcal = facts.get("guarantee_cal")
    if gcal:
        keeper["guarantee_margin_h"], keeper["guarantee_at_s"] = gcal["threshold"], tuple(gcal["at_s"])
    from mirage_tasks.slurm import livewait

    if set(livewait.WAIT_RULES) & set(policies):
        keeper["waitpred"] = livewait.load(ns.waitpred, meta.timezone)
        keeper["wait_cfg"] = sim_config(cfg, ns.factor, bool(params.get("accounting")))
    stored = pd.read_parquet(run / "links.parquet")
    base = stored[[c for c in stored.columns if not c.startswith("sim_")]]
    rows = json.loads(base.to_json(orient="records"))
    results: dict[str, list] = {}
    for r in rows:
        results.setdefault(r["policy"], []).append(r)
    epochs = read_submit_log(str(slurm_root / "log" / "slurmctld.log"))
    late = int(params.get("late_nodes") or 0)
    late_nodes = [f"n{i}" for i in range(cfg.nodes - late + 1, cfg.nodes + 1)] if late else []
    join = facts.get("late_nodes_joined_epoch")
    if late and join is None:
        join = read_resume_log(str(slurm_root / "log" / "slurmctld.log"), late_nodes)
    s = MeasuredSession(
        env={},
        jobcomp=None,
        policies=policies,
        keeper=keeper,
        decide=decide,
        chains=int(ns.chains),
        t0=int(parse_time(ns.background_from, "--background-from").timestamp()),
        accounting=bool(params.get("accounting")),
        late_nodes=late_nodes,
        join_epoch=join,
    )
    s.results = results
    s.bg_out, s.bg_facts = pd.read_parquet(run / "background.parquet"), facts["background"]
    s.recalc_epoch, s.submit_epochs = last_recalc_epoch(str(slurm_root / "state")), epochs
    return s.links(cfg, ns.factor, hours_to_s(ns.service_hours), ns.node, int(facts["nice"]), int(ns.step_s))


def repredict(a: argparse.Namespace) -> int:
    """``repredict``: every window's run of set ``--name``, predicted again; writes
    ``<run>/repredicted.parquet`` (the page reads the simulator's columns from it where present)
    and prints, per policy, how many links' predicted decisions and interruptions moved."""
    wins = [w["name"] for w in json.load(open(f"{a.root}/windows.json"))["windows"]]
    rc = 0
    for w in wins:
        run, sl = Path(a.root, f"{a.name}-{w}"), Path(a.root, f"slurm-{a.name}-{w}")
        if not (run / "_SUCCESS.json").exists():
            print(f"{a.name}-{w}: no committed run (skipped)", flush=True)
            continue
        t0 = time.monotonic()
        new = repredict_run(run, sl)
        for p, (moved, total) in _page_module().moved_predictions(pd.read_parquet(run / "links.parquet"), new).items():
            print(f"{a.name}-{w} {p}: {moved} of {total} predicted interruptions moved", flush=True)
            if p in (dr.REACTIVE, dr.AVG, dr.AVG_CAL) and moved:
                print(f"{a.name}-{w} {p}: the rebuild does not reproduce the stored prediction", flush=True)
                rc = 1
        new.to_parquet(run / "repredicted.parquet", index=False)
        print(f"{a.name}-{w}: {time.monotonic() - t0:.0f} s", flush=True)
    return rc


def _page_module():
    """lab/pages/keeper_campaign_page.py (the page writer, beside the other pages)."""
    from lab.pages import keeper_campaign_page

    return keeper_campaign_page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("windows", help="choose the busy windows from the real log (before any run)")
    w.add_argument("--trace", required=True)
    w.add_argument("--out", required=True, help="folder for windows.json")
    for k, v in DEFAULTS.items():
        w.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    r = sub.add_parser("run", help="one keep-service per window, at once, plus one replay without chains")
    r.add_argument("--root", required=True)
    r.add_argument("--trace", required=True)
    r.add_argument("--name", default="keep", help="the runs' outputs: <root>/<name>-<window> (keep)")
    r.add_argument("--model", default=None, help="train output (policy model)")
    r.add_argument("--avg-cal-samples", default=None, help="sample output (policy avg-cal)")
    r.add_argument("--waitpred", default=None, help="waitpred output (policies wait-pred and guarantee)")
    r.add_argument(
        "--guarantee-samples",
        default=None,
        help="sample output drawn with --waitpred (policy guarantee-cal's calibration)",
    )
    r.add_argument("--policies", default="model,avg-cal,avg,reactive")
    r.add_argument("--chains", type=int, default=4)
    r.add_argument("--stagger-hours", type=float, default=50.0)
    r.add_argument("--span-hours", type=float, default=DEFAULTS["span_hours"])
    r.add_argument("--factor", type=float, default=180.0)
    r.add_argument("--deadline-s", type=float, default=3600.0)
    r.add_argument("--nice", type=int, default=-5)
    r.add_argument("--no-baseline", action="store_true", help="no replay without chains")
    r.add_argument(
        "--baseline-windows",
        default=None,
        help="comma list of the windows replayed without chains (default: the first)",
    )
    r.add_argument(
        "--offset-hours",
        type=float,
        default=0.0,
        help="trace hours from a window's start to its first chain (0); a second set with another "
        "offset keeps other links in the same windows",
    )
    r.add_argument(
        "--extra-nodes",
        type=int,
        default=0,
        help="nodes added to the log's cluster for the chains (0): with one per service job at a time "
        "(the policies of a set run side by side) the background keeps the capacity it had in the "
        "log on average, and the chains compete with it for the same nodes",
    )
    r.add_argument(
        "--late-extra-nodes",
        action="store_true",
        help="the extra nodes stay drained until the first chain starts (keeper-slurm --late-nodes; "
        "needs --offset-hours): before the chains exist the background has the log's capacity, "
        "as in the replays without chains",
    )
    q = sub.add_parser("repredict", help="the simulator's prediction for a set's stored runs, computed again")
    q.add_argument("--root", required=True)
    q.add_argument("--name", required=True, help="the set (its runs <root>/<name>-<window>)")
    g = sub.add_parser("page", help="write the results page from the runs' outputs")
    g.add_argument("--root", required=True)
    g.add_argument("--write-doc", default=None)
    a = ap.parse_args(argv)
    if a.cmd == "windows":
        doc = choose_windows(a.trace, a.train_from, a.train_to, a.test_from, a.test_to, a.span_hours, a.count)
        os.makedirs(a.out, exist_ok=True)
        Path(a.out, "windows.json").write_text(json.dumps(doc, indent=1))
        print(json.dumps(doc, indent=1))
        return 0
    if a.cmd == "repredict":
        return repredict(a)
    if a.cmd == "run":
        if a.late_extra_nodes and not (a.extra_nodes and a.offset_hours > 0):
            ap.error("--late-extra-nodes needs --extra-nodes K and --offset-hours > 0 (when they join)")
        return run(a)
    text = _page_module().page(a.root)
    if a.write_doc:
        Path(a.write_doc).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
