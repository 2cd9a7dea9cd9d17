"""Print the tables of docs/results/slurm-replay.md and service-keeper.md from step outputs.

    python -m lab.pages.slurm_results replay var/slurmwork/quiet-x60 var/slurmwork/quiet-x120 ...
    python -m lab.pages.slurm_results keeper var/slurmwork/keep-quiet var/slurmwork/keep-busy
    python -m lab.pages.slurm_results spread var/slurmwork/busy-r1 var/slurmwork/busy-r2 var/slurmwork/busy-r3

``spread``: repeats of one replay (same window, settings and factor) set Slurm against itself,
job by job (the same trace job's start in two runs of Slurm), beside each run's simulator
against that run's Slurm: the agreement a simulator can be asked for is what Slurm keeps with
itself.
"""

from __future__ import annotations

import json
import sys

import pandas as pd


def _f(v, fmt):
    return "-" if v is None or v != v else fmt.format(v)


def replay(prefixes):
    print(
        "| replay | factor | scored / compared | not started (both) | start error mean / median / p90 / max (h) "
        "| within 1 h | Spearman | mean wait Slurm / sim (h) | backfill starts Slurm / sim | rules (> 1 h) "
        "| trace vs Slurm MAE, within 1 h | trace vs sim MAE, within 1 h | wall (s) | load start -> end |"
    )
    print("|" + "---|" * 14)
    for p in prefixes:
        name = "replay.json" if not p.split("/")[-1].startswith("rescore") else "fidelity_slurm.json"
        d = json.load(open(f"{p}/{name}"))
        c = d["comparison"]
        m, e, sl, sm = c["sim_vs_slurm"], c["start_error_h"], c["slurm_vs_trace"], c["sim_vs_trace"]
        r = d["run"]
        print(
            f"| {p.split('/')[-1]} | {d['factor']:g} | {c['scored']} / {c['compared']} | {c.get('not_started_both', '-')} | "
            f"{_f(e['mean'], '{:.2f}')} / {_f(e['median'], '{:.2f}')} / {_f(e['p90'], '{:.2f}')} / {_f(e['max'], '{:.2f}')} | "
            f"{_f(m.get('within_1h'), '{:.1%}')} | {_f(m.get('spearman'), '{:.2f}')} | "
            f"{_f(m.get('real_mean_h'), '{:.2f}')} / {_f(m.get('sim_mean_h'), '{:.2f}')} | "
            f"{c['backfilled']['slurm']} / {c['backfilled']['sim']} | {c['why'] or 'none'} | "
            f"{_f(sl.get('mae_h'), '{:.2f}')}, {_f(sl.get('within_1h'), '{:.0%}')} | "
            f"{_f(sm.get('mae_h'), '{:.2f}')}, {_f(sm.get('within_1h'), '{:.0%}')} | {r.get('wall_s')} | "
            f"{' '.join(r.get('loadavg_start') or [])} -> {' '.join(r.get('loadavg_end') or [])} |"
        )


def keeper(prefixes):
    """Every link of every run, then the summary over all of them (a chain of one run is one
    bootstrap unit; the policies are paired on the same run, chain and link)."""
    from mirage_tasks.slurm.keeper_stats import markdown, summary

    print(
        "| run | policy | chain | pred wait (h) | decision lead (h) | signed interruption (h) | wasted node-h | forced "
        "| sim: lead (h) | sim: signed (h) | sim: wasted node-h | model output at submit (h) |"
    )
    print("|" + "---|" * 12)
    frames, factors, nodes = [], set(), set()
    for p in prefixes:
        f = pd.read_parquet(f"{p}/links.parquet")
        k = json.load(open(f"{p}/keeper.json"))
        fac = k["factor"]
        factors.add(fac)
        nodes.add(k["node"])
        frames.append(f.assign(run=p.split("/")[-1]))
        for r in f.to_dict("records"):
            pw = (r["pred_start"] - r["pred_submit"]) * fac / 3600
            print(
                f"| {p.split('/')[-1]} | {r['policy']} | {r.get('chain', 0)} | {pw:.2f} | {r['decision_lead_trace_h']:.2f} | "
                f"{r['signed_interruption_h']:+.2f} | {r['wasted_node_h']:.2f} | {r['forced']} | "
                f"{r.get('sim_decision_lead_h', float('nan')):.2f} | {r.get('sim_signed_interruption_h', float('nan')):+.2f} | "
                f"{r.get('sim_wasted_node_h', float('nan')):.2f} | {_f(r.get('model_output'), '{:+.2f}')} |"
            )
        print(
            f"<!-- {p}: load {k['facts']['loadavg_start']} -> {k['facts']['loadavg_end']}, cpu {k['facts']['cpu_s']} s, "
            f"errors {k['facts']['errors']} -->"
        )
    if len(factors) != 1 or len(nodes) != 1:
        print(f"<!-- no summary: the runs differ in factor {sorted(factors)} or node {sorted(nodes)} -->")
        return
    print()
    print("\n".join(markdown(summary(pd.concat(frames, ignore_index=True), factors.pop(), nodes.pop()))))


def _starts(p):
    """Scored jobs' trace-time submit and start in one replay (or rescoring), by trace job id."""
    j = pd.read_parquet(f"{p}/jobs.parquet")
    j = j[j["kind"] == "window"].set_index("trace_job_id")
    return j


def _agree(a_sub, a_st, b_st):
    both = a_st.notna() & b_st.notna()
    err = (a_st[both] - b_st[both]).abs() / 3600
    rho = pd.Series((a_st - a_sub)[both]).rank().corr(pd.Series((b_st - a_sub)[both]).rank())
    return (
        int(both.sum()),
        float((err <= 1).mean()) if len(err) else float("nan"),
        float(err.mean()) if len(err) else float("nan"),
        rho,
    )


def spread(prefixes):
    import itertools

    runs = {p.split("/")[-1]: _starts(p) for p in prefixes}
    print("| pair | compared | within 1 h | mean abs start difference (h) | Spearman (waits) |")
    print("|---|---|---|---|---|")
    rows = []
    for (na, a), (nb, b) in itertools.combinations(runs.items(), 2):
        ids = a.index.intersection(b.index)
        n, w, m, r = _agree(a.loc[ids, "submit_t"], a.loc[ids, "start_t"], b.loc[ids, "start_t"])
        rows.append(("Slurm vs Slurm", w, m, r))
        print(f"| Slurm {na} vs Slurm {nb} | {n} | {_f(w, '{:.1%}')} | {_f(m, '{:.2f}')} | {_f(r, '{:.2f}')} |")
    for na, a in runs.items():
        if "sim_start_t" not in a:
            continue
        n, w, m, r = _agree(a["submit_t"], a["start_t"], a["sim_start_t"])
        rows.append(("simulator vs Slurm", w, m, r))
        print(f"| simulator vs Slurm, {na} | {n} | {_f(w, '{:.1%}')} | {_f(m, '{:.2f}')} | {_f(r, '{:.2f}')} |")
    for kind in ("Slurm vs Slurm", "simulator vs Slurm"):
        ws = [w for k, w, _, _ in rows if k == kind and w == w]
        if ws:
            print(f"<!-- {kind}: within 1 h {min(ws):.1%} .. {max(ws):.1%} over {len(ws)} -->")


if __name__ == "__main__":
    commands = {"replay": replay, "keeper": keeper, "spread": spread}
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(commands)}}} OUTPUT_PREFIX ... (--help: what each prints)")
    commands[sys.argv[1]](sys.argv[2:])
