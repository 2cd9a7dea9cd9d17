"""Before the day's first experiment group: can the target run any of them at all?

On the local target every group needs the built functions of its system (``make functions``)
and redis-server. Without them every group's deploy fails the same way, one after another,
each group's tasks burning their own minutes. This step says it once, naming what is missing
and the command that fixes it (exit 2), and the DAG runs no group after it. Its failure report
(``_ops/preflight-*.json``, ``"failed": true`` with the selected groups) makes the day's summary
count every selected group as failed. The knative target deploys images: nothing to check here.
"""

from __future__ import annotations

from stepkit import StepError

from ..catalogue import load_catalogue
from ..common import add_common, run_date
from ..results import write_failure_report, write_op_report


def _names(text: str) -> list[str]:
    return [n for n in (t.strip() for t in text.split(",")) if n]


def add_arguments(p):
    add_common(p)
    p.add_argument("--experiments", required=True, help="comma-separated experiments the day runs")
    p.add_argument("--systems", required=True, help="comma-separated systems the day runs (wasm, native)")


def run(args) -> int:
    date = run_date(args)
    experiments, systems = _names(args.experiments), _names(args.systems)
    groups: list[list[str]] = []
    try:
        cat = load_catalogue(args.catalogue_dir)
        unknown = [e for e in experiments if e not in cat]
        if unknown or not experiments:
            raise StepError(
                f"--experiments {args.experiments!r}: unknown {unknown or 'none given'}; "
                f"the catalogue has {', '.join(sorted(cat))}"
            )
        bad = [s for s in systems if s not in ("wasm", "native")]
        if bad or not systems:
            raise StepError(f"--systems {args.systems!r}: choose from wasm, native")
        groups = [[e, s] for e in experiments for s in systems if s in cat[e]["systems"]]
        problems: list[str] = []
        if args.target == "local":
            from .. import runtimes
            from ..targets.local import redis_binary

            for system in sorted({s for _, s in groups}):
                missing = runtimes.build_problems(system)
                if missing:
                    problems.append(f"the {system} functions are not built ({'; '.join(missing[:4])})")
            try:
                redis_binary()
            except StepError as exc:
                problems.append(str(exc))
        if problems:
            fix = " run `make functions` first" if any("functions" in p for p in problems) else ""
            raise StepError(
                f"the {args.target} target cannot run any of the {len(groups)} selected experiment "
                f"group(s): {'; '.join(problems)}.{fix}"
            )
    except BaseException as exc:
        write_failure_report(
            args.results, date, args.run_id, "preflight", exc, {"target": args.target, "groups": groups}
        )
        raise
    write_op_report(args.results, date, args.run_id, "preflight", {"target": args.target, "groups": groups})
    print(f"preflight: the {args.target} target can run the {len(groups)} selected group(s)", flush=True)
    return 0
