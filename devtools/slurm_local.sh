#!/usr/bin/env bash
# A real local Slurm (make slurm / make slurm-stop / make slurm-status), as root: munge with its own
# key and socket, one slurmctld and N `slurmd -N nX` on free 127.0.0.1 ports, everything under
# var/slurm. Size and scheduler settings come from the simulator's cluster config
# (mirage_tasks/sim/config.py; mirage_tasks/slurm/conf.py says what maps and what does not):
#
#   SLURM_CLUSTER=ls6 SLURM_FACTOR=60 devtools/slurm_local.sh start   (defaults: 4 nodes, factor 1)
#   SLURM_ACCOUNTING=1 SLURM_USERS=40 ...  also slurmdbd on a local MariaDB, accounts u0..u39 + service
#   devtools/slurm_local.sh stop      cancels every job, stops each daemon by the pid it recorded and the
#                                     job steps found in its spool folder; nothing else
#   devtools/slurm_local.sh status    each daemon; exit 1 naming the dead ones, 3 when none runs
#
# Every daemon listens on 127.0.0.1 only. Bounds (exit 2 naming the variable): SLURM_NODES 1..256,
# SLURM_USERS at most 10000, SLURM_FACTOR in (0, 1e6]. SIGTERM or Ctrl-C while it starts stops what
# it started. SLURM_ROOT (default var/slurm) and VENV (default .venv) name another state folder and
# interpreter.
#
# Clients: source var/slurm/env.sh (sets SLURM_CONF).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
DIR="${SLURM_ROOT:-$ROOT/var/slurm}"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
case "${1:-}" in
  start)
    args=(--root "$DIR" --factor "${SLURM_FACTOR:-1}")
    if [ -n "${SLURM_CLUSTER:-}" ]; then args+=(--cluster-config "$SLURM_CLUSTER"); fi
    if [ -n "${SLURM_NODES:-}" ]; then args+=(--nodes "$SLURM_NODES"); fi
    if [ -n "${SLURM_ACCOUNTING:-}" ] && [ "${SLURM_ACCOUNTING}" != 0 ]; then args+=(--accounting); fi
    if [ -n "${SLURM_USERS:-}" ]; then args+=(--users "$SLURM_USERS"); fi
    exec "$VENV/bin/python" -m lab.slurm.cluster start "${args[@]}" ;;
  stop) exec "$VENV/bin/python" -m lab.slurm.cluster stop --root "$DIR" ;;
  status) exec "$VENV/bin/python" -m lab.slurm.cluster status --root "$DIR" ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
