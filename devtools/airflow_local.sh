#!/usr/bin/env bash
# A real local Airflow on PostgreSQL, bound to 127.0.0.1 on free ports (make airflow / make airflow-stop).
#
#   devtools/airflow_local.sh start   PostgreSQL (var/pg, as the postgres user), airflow db migrate, then
#                                     scheduler, dag-processor, triggerer and api-server; prints the UI's
#                                     address and login and writes var/airflow-live/env.sh
#   devtools/airflow_local.sh stop    stops exactly what start started (pid files), PostgreSQL last
#   devtools/airflow_local.sh status
#
# `source var/airflow-live/env.sh` gives a shell the same settings, for the airflow CLI
# (airflow backfill create ..., airflow dags trigger ...).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
LIVE="$ROOT/var/airflow-live"
PIDS="$LIVE/pids"
PGDATA="$ROOT/var/pg"
PGRUN="$ROOT/var/pg-run"
ENVFILE="$LIVE/env.sh"
DB="${AIRFLOW_LOCAL_DB:-airflow}"  # the metadata database's name (bench/backfill.py uses its own, FRESH=1)
PGBIN="${PGBIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
SERVICES=(api-server scheduler dag-processor triggerer)

free_port() {
  "$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

as_postgres() {  # PostgreSQL refuses to run as root: its commands run as the postgres user
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  if [ -z "$PGBIN" ] || [ ! -x "$PGBIN/pg_ctl" ]; then
    echo "PostgreSQL not found (make system-deps installs Debian's postgresql)" >&2; exit 1
  fi
  for s in "${SERVICES[@]}"; do
    if alive "$PIDS/$s.pid"; then echo "already running ($s, pid $(cat "$PIDS/$s.pid")): make airflow-stop first" >&2; exit 1; fi
  done
  mkdir -p "$LIVE/logs" "$PIDS" "$PGRUN"
  local pg_port api_port log_port trig_port
  pg_port=$(free_port); api_port=$(free_port); log_port=$(free_port); trig_port=$(free_port)

  # --- PostgreSQL in var/pg, on 127.0.0.1 only, trust auth (loopback, this machine's users)
  if [ ! -f "$PGDATA/PG_VERSION" ]; then
    mkdir -p "$PGDATA"
    [ "$(id -u)" = 0 ] && chown postgres: "$PGDATA" "$PGRUN"
    as_postgres "$PGBIN/initdb" -D "$PGDATA" -U postgres --auth=trust -E UTF8 >"$LIVE/logs/initdb.log" 2>&1 \
      || { cat "$LIVE/logs/initdb.log"; exit 1; }
  fi
  [ "$(id -u)" = 0 ] && chown postgres: "$PGRUN"
  as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" -l "$PGRUN/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $PGRUN" start >/dev/null
  echo "$pg_port" > "$LIVE/pg.port"
  if [ "${FRESH:-0}" = 1 ]; then
    as_postgres "$PGBIN/dropdb" -h 127.0.0.1 -p "$pg_port" -U postgres --if-exists "$DB"
  fi
  as_postgres "$PGBIN/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1 \
    || as_postgres "$PGBIN/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres "$DB"

  cat > "$ENVFILE" <<EOF
# written by devtools/airflow_local.sh start: the live local Airflow's settings
export AIRFLOW_HOME="$LIVE"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$ROOT/plugins"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__PARALLELISM=4
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql+psycopg2://postgres@127.0.0.1:$pg_port/$DB"
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$api_port
export AIRFLOW__API__BASE_URL="http://127.0.0.1:$api_port"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$api_port/execution/"
export AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=$log_port
export AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=$trig_port
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin"
export AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL=15
export AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL=15
export HOUSE_RUNNER="\${HOUSE_RUNNER:-local}"
export HOUSE_STORAGE_ROOT="\${HOUSE_STORAGE_ROOT:-$ROOT/var/storage}"
EOF
  # shellcheck disable=SC1090
  source "$ENVFILE"
  trap 'echo "start failed: stopping what was started" >&2; stop' ERR
  "$VENV/bin/airflow" db migrate >"$LIVE/logs/db-migrate.log" 2>&1 || { tail -n 40 "$LIVE/logs/db-migrate.log"; exit 1; }

  cd "$ROOT"
  local s
  for s in "${SERVICES[@]}"; do
    local args=("$s")
    case "$s" in
      api-server) args+=(-H 127.0.0.1 -p "$api_port") ;;
      scheduler|triggerer) args+=(--skip-serve-logs) ;;
    esac
    # its own session: the pid is the process group, so stop reaches every child it forks
    setsid "$VENV/bin/airflow" "${args[@]}" >"$LIVE/logs/$s.log" 2>&1 < /dev/null &
    echo $! > "$PIDS/$s.pid"
  done

  local url="http://127.0.0.1:$api_port"
  for _ in $(seq 1 120); do
    if "$VENV/bin/python" -c "import urllib.request,sys; urllib.request.urlopen('$url/api/v2/monitor/health', timeout=2)" 2>/dev/null; then
      local pw
      pw=$("$VENV/bin/python" -c "import json; print(json.load(open('$LIVE/simple_auth_manager_passwords.json.generated'))['admin'])" 2>/dev/null || echo "see $LIVE/simple_auth_manager_passwords.json.generated")
      echo "Airflow UI: $url  (login: admin / $pw)"
      echo "PostgreSQL: 127.0.0.1:$pg_port (data in var/pg); logs in var/airflow-live/logs"
      echo "CLI settings: source var/airflow-live/env.sh; stop everything: make airflow-stop"
      trap - ERR
      return 0
    fi
    for s in "${SERVICES[@]}"; do
      alive "$PIDS/$s.pid" || { echo "$s exited; its log:" >&2; tail -n 30 "$LIVE/logs/$s.log" >&2; stop; exit 1; }
    done
    sleep 1
  done
  echo "api-server did not answer at $url within 120 s" >&2; stop; exit 1
}

stop() {
  local s pid
  for s in "${SERVICES[@]}"; do
    [ -f "$PIDS/$s.pid" ] || continue
    pid=$(cat "$PIDS/$s.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      kill -KILL -- "-$pid" 2>/dev/null || true
      echo "stopped $s (process group $pid)"
    fi
    rm -f "$PIDS/$s.pid"
  done
  if [ -n "$PGBIN" ] && [ -f "$PGDATA/postmaster.pid" ]; then
    as_postgres "$PGBIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null && echo "stopped PostgreSQL (var/pg)"
  fi
}

status() {
  local s
  for s in "${SERVICES[@]}"; do
    if alive "$PIDS/$s.pid"; then echo "$s: running (pid $(cat "$PIDS/$s.pid"))"; else echo "$s: stopped"; fi
  done
  if [ -f "$PGDATA/postmaster.pid" ]; then echo "postgres: running (port $(cat "$LIVE/pg.port" 2>/dev/null))"; else echo "postgres: stopped"; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
