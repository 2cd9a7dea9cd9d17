"""Print the tables of docs/results/slurm-replay.md and service-keeper.md from step outputs.

    python devtools/slurm_results.py replay var/slurmwork/quiet-x60 var/slurmwork/quiet-x120 ...
    python devtools/slurm_results.py keeper var/slurmwork/keep-quiet var/slurmwork/keep-busy
"""

from __future__ import annotations

import json
import sys

import pandas as pd


def _f(v, fmt):
    return "-" if v is None or v != v else fmt.format(v)


def replay(prefixes):
    print("| replay | factor | scored / compared | not started (both) | start error mean / median / p90 / max (h) "
          "| within 1 h | Spearman | mean wait Slurm / sim (h) | backfill starts Slurm / sim | rules (> 1 h) "
          "| trace vs Slurm MAE, within 1 h | trace vs sim MAE, within 1 h | wall (s) | load start -> end |")
    print("|" + "---|" * 14)
    for p in prefixes:
        name = "replay.json" if not p.split("/")[-1].startswith("rescore") else "fidelity_slurm.json"
        d = json.load(open(f"{p}/{name}"))
        c = d["comparison"]
        m, e, sl, sm = c["sim_vs_slurm"], c["start_error_h"], c["slurm_vs_trace"], c["sim_vs_trace"]
        r = d["run"]
        print(f"| {p.split('/')[-1]} | {d['factor']:g} | {c['scored']} / {c['compared']} | {c.get('not_started_both', '-')} | "
              f"{_f(e['mean'], '{:.2f}')} / {_f(e['median'], '{:.2f}')} / {_f(e['p90'], '{:.2f}')} / {_f(e['max'], '{:.2f}')} | "
              f"{_f(m.get('within_1h'), '{:.1%}')} | {_f(m.get('spearman'), '{:.2f}')} | "
              f"{_f(m.get('real_mean_h'), '{:.2f}')} / {_f(m.get('sim_mean_h'), '{:.2f}')} | "
              f"{c['backfilled']['slurm']} / {c['backfilled']['sim']} | {c['why'] or 'none'} | "
              f"{_f(sl.get('mae_h'), '{:.2f}')}, {_f(sl.get('within_1h'), '{:.0%}')} | "
              f"{_f(sm.get('mae_h'), '{:.2f}')}, {_f(sm.get('within_1h'), '{:.0%}')} | {r.get('wall_s')} | "
              f"{' '.join(r.get('loadavg_start') or [])} -> {' '.join(r.get('loadavg_end') or [])} |")


def keeper(prefixes):
    print("| run | policy | pred wait (h) | decision lead (h) | signed interruption (h) | wasted node-h | forced "
          "| sim: lead (h) | sim: signed (h) | sim: wasted node-h | model output at submit (h) |")
    print("|" + "---|" * 11)
    for p in prefixes:
        f = pd.read_parquet(f"{p}/links.parquet")
        k = json.load(open(f"{p}/keeper.json"))
        fac = k["factor"]
        for r in f.to_dict("records"):
            pw = (r["pred_start"] - r["pred_submit"]) * fac / 3600
            print(f"| {p.split('/')[-1]} | {r['policy']} | {pw:.2f} | {r['decision_lead_trace_h']:.2f} | "
                  f"{r['signed_interruption_h']:+.2f} | {r['wasted_node_h']:.2f} | {r['forced']} | "
                  f"{r.get('sim_decision_lead_h', float('nan')):.2f} | {r.get('sim_signed_interruption_h', float('nan')):+.2f} | "
                  f"{r.get('sim_wasted_node_h', float('nan')):.2f} | {_f(r.get('model_output'), '{:+.2f}')} |")
        print(f"<!-- {p}: load {k['facts']['loadavg_start']} -> {k['facts']['loadavg_end']}, cpu {k['facts']['cpu_s']} s, "
              f"errors {k['facts']['errors']} -->")


if __name__ == "__main__":
    {"replay": replay, "keeper": keeper}[sys.argv[1]](sys.argv[2:])
