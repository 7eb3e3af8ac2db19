#!/usr/bin/env bash
# PgBouncer in transaction-pooling mode in front of the test PostgreSQL, for the
# pooler pass of the suite (docs/testing.md):
#
#   .ci/pgbouncer.sh start          # listens on 127.0.0.1:6433 (PGBOUNCER_PORT)
#   .ci/pgbouncer.sh stop           # by its pidfile
#   .ci/pgbouncer.sh run CMD ARG... # start, run CMD with PGBOUNCER_PORT set, stop
#
# `make test-pgbouncer` runs the pooler pass of the suite with `run`: the test
# databases are created directly on DATABASE_URL's server, the tests' connections go
# through the pooler (tests/support/pgbouncer.py).
#
# Variables: PGBOUNCER_PORT (6433: a system PgBouncer may hold 6432), PGBOUNCER_DIR (its
# config, pidfile and log; default /tmp/django-idempotency-pgbouncer-$PGBOUNCER_PORT),
# PGHOST / PGPORT of the server behind it (127.0.0.1 / 5432). Installs PgBouncer with
# apt-get if it is missing. PgBouncer refuses to run as root: as root it runs as the
# postgres user.
set -euo pipefail

PORT="${PGBOUNCER_PORT:-6433}"
DIR="${PGBOUNCER_DIR:-/tmp/django-idempotency-pgbouncer-$PORT}"
SERVER_HOST="${PGHOST:-127.0.0.1}"
SERVER_PORT="${PGPORT:-5432}"
PIDFILE="$DIR/pgbouncer.pid"

find_pgbouncer() {
  command -v pgbouncer || { [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer; }
}

install() {
  if [ -z "$(find_pgbouncer)" ]; then
    apt-get install -y pgbouncer || { apt-get update && apt-get install -y pgbouncer; }
  fi
}

start() {
  install
  mkdir -p "$DIR"
  cat >"$DIR/pgbouncer.ini" <<INI
[databases]
* = host=$SERVER_HOST port=$SERVER_PORT

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
max_db_connections = 40
ignore_startup_parameters = extra_float_digits
server_reset_query =
admin_users = postgres
pidfile = $PIDFILE
logfile = $DIR/pgbouncer.log
INI
  printf '"postgres" ""\n' >"$DIR/userlist.txt"
  local runner=()
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$DIR"
    runner=(-u postgres)
  fi
  stop quiet
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "127.0.0.1:$PORT is already in use: choose another PGBOUNCER_PORT" >&2
    return 1
  fi
  "$(find_pgbouncer)" -d "${runner[@]}" "$DIR/pgbouncer.ini"
  for _ in $(seq 1 50); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      echo "pgbouncer (transaction pooling) on 127.0.0.1:$PORT -> $SERVER_HOST:$SERVER_PORT"
      return 0
    fi
    sleep 0.1
  done
  echo "pgbouncer did not start; see $DIR/pgbouncer.log" >&2
  cat "$DIR/pgbouncer.log" >&2 || true
  return 1
}

stop() {
  if [ -f "$PIDFILE" ]; then
    local pid
    pid="$(cat "$PIDFILE")"
    if kill "$pid" 2>/dev/null; then
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      [ "${1:-}" = quiet ] || echo "pgbouncer stopped (pid $pid)"
    fi
    rm -f "$PIDFILE"
  fi
}

run() {
  start
  trap stop EXIT
  PGBOUNCER_PORT="$PORT" "$@"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 start | stop | run CMD [ARG...]" >&2; exit 2 ;;
esac
