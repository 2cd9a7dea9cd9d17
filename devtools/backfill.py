"""``airflow backfill create`` that never leaves runs queued forever behind a paused DAG.

Airflow 3 creates a paused DAG's backfill runs and then never starts them, with no message
(apache/airflow issue 60768); every DAG of this package is paused at creation. This wrapper
checks first:

    python devtools/backfill.py --dag-id mirage_samples --from-date 2023-01-01 --to-date 2023-01-31 \\
        --max-active-runs 2 --dag-run-conf '{"trace": "/data/ls6-a100.log.gz"}'

* the DAG paused: exit 2 with a message that says how to unpause, and nothing created;
* ``--unpause``: unpause it (``airflow dags unpause``), then create the backfill;
* the DAG unknown to this Airflow's database: exit 2 (a typo, or the dag-processor has not
  parsed it yet).

Every other argument goes to ``airflow backfill create`` unchanged. Run it with the Airflow
settings of the instance you mean (``source var/airflow-live/env.sh`` for ``make airflow``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--dag-id", required=True)
    parser.add_argument("--unpause", action="store_true", help="unpause a paused DAG first (else exit 2)")
    args, rest = parser.parse_known_args(argv)
    airflow = [sys.executable, "-m", "airflow"]

    from airflow.models.dag import DagModel  # after the caller's AIRFLOW_HOME is in force

    dag = DagModel.get_dagmodel(args.dag_id)
    if dag is None:
        print(
            f"backfill: no DAG {args.dag_id!r} in this Airflow's database (AIRFLOW_HOME={os.environ.get('AIRFLOW_HOME')}): "
            "check the name, or wait until the dag-processor has parsed it",
            file=sys.stderr,
        )
        return 2
    if dag.is_paused:
        if not args.unpause:
            print(
                f"backfill: DAG {args.dag_id} is paused, and Airflow 3 leaves a paused DAG's backfill runs queued "
                f"forever. Unpause it first:\n    airflow dags unpause {args.dag_id}\nor pass --unpause to this "
                "command. Nothing was created.",
                file=sys.stderr,
            )
            return 2
        subprocess.run([*airflow, "dags", "unpause", args.dag_id], check=True, stdout=subprocess.DEVNULL)
        print(f"backfill: unpaused {args.dag_id}", file=sys.stderr)
    return subprocess.run([*airflow, "backfill", "create", "--dag-id", args.dag_id, *rest]).returncode


if __name__ == "__main__":
    sys.exit(main())
