"""Policies before/after the training fix, on the same ls6 data (docs/results/ls6-months.md).

    nice -n 5 .venv/bin/python -m lab.campaigns.ls6_policy_fix [--month 2023-01] [--node 8]

Needs the outputs of ``lab/campaigns/ls6_months.py`` (the month's transformer and trace). Runs the
step CLIs: ``train --model transformer_policy`` on that frozen transformer twice, with the
seed's method (one REINFORCE step per batch, constant entropy bonus: ``ppo_epochs=1
entropy_final=0.1``) and with the fix (the preset: 8 clipped PPO steps per batch, entropy
decaying to 0), both with the same seed, episodes and budget; then ``validate`` each
greedily (argmax of the policy: does it ever submit?) and with its calibrated P(submit)
threshold, on the month's samples; then ``metrics`` with the month's baselines.
Outputs under ``<root>/policy/<month>/node<N>/``; prints the CPU time of the steps.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

from lab.campaigns.ls6_months import ROOT, month_start, run

VARIANTS = {"reinforce": ["--param", "ppo_epochs=1", "--param", "entropy_final=0.1"], "ppo": []}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="var/ls6-months")
    p.add_argument("--month", default="2023-01")
    p.add_argument("--node", type=int, default=8)
    p.add_argument("--val-count", type=int, default=156)
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="train --param for both variants (e.g. a smaller budget for a smoke run)",
    )
    args = p.parse_args()
    from stepkit.cli import check_command_args  # the step contract's checks: exit 2 naming the flag

    check_command_args(p, args, {"node": (1, 10_000), "val_count": (1, 100_000)}, folders=("root",), files=())
    t0 = time.monotonic()
    root = (ROOT / args.root).resolve()
    logs = root / "logs"
    base = root / "models" / args.month / f"node{args.node}" / "transformer"
    if not (base / "_SUCCESS.json").exists():
        raise SystemExit(f"{base}: not trained yet (run python -m lab.campaigns.ls6_months first)")
    out = root / "policy" / args.month / f"node{args.node}"
    start = month_start(args.month)
    val = [
        "validate",
        "--trace",
        str(root / "trace"),
        "--cluster-config",
        "ls6",
        "--start",
        start.isoformat(),
        "--count",
        str(args.val_count),
        "--interval-hours",
        "4",
        "--node",
        str(args.node),
        "--workers",
        "1",
    ]
    runs = [str(root / "validate" / args.month / f"node{args.node}" / b) for b in ("reactive", "avg")]
    for name, extra in VARIANTS.items():
        m = out / f"transformer_policy-{name}"
        run(
            [
                "train",
                "--model",
                "transformer_policy",
                "--base",
                str(base),
                "--trace",
                str(root / "trace"),
                "--out",
                str(m),
                "--threads",
                "1",
                *[a for kv in args.param for a in ("--param", kv)],
                *extra,
            ],
            logs / f"policy-{args.month}-{args.node}-{name}.log",
        )
        for rule, flag in (("argmax", ["--argmax"]), ("calibrated", [])):
            v = out / f"v-{name}-{rule}"
            run(
                [*val, "--model", str(m), "--name", f"policy_{name}_{rule}", "--out", str(v), *flag],
                logs / f"policy-{args.month}-{args.node}-{name}-{rule}.log",
            )
            runs.append(str(v))
    run(
        ["metrics", "--in", *runs, "--out", str(out / "metrics")], logs / f"policy-{args.month}-{args.node}-metrics.log"
    )
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"ls6_policy_fix: CPU {ru.ru_utime + ru.ru_stime:.0f} s, wall {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
