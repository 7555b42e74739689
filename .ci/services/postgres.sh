#!/usr/bin/env bash
# A throwaway PostgreSQL server for the history tests: Debian's postgresql, a fresh cluster on loopback.
#
#   .ci/services/postgres.sh start   # prints `export DISTPERF_TEST_POSTGRES_URL=...` (stdout only); the rest to stderr
#   .ci/services/postgres.sh stop    # stops the server it started and removes the cluster
#
# The cluster (data, socket, log, password) lives under $DISTPERF_POSTGRES_STATE, owned by the `postgres` user
# when run as root (the server refuses to run as root), by the caller otherwise. It listens on 127.0.0.1 only,
# on a free port, with password (SCRAM) authentication; nothing in /etc or /var/lib/postgresql is touched.
# Idempotent: start on a running cluster only prints the export; stop on none does nothing.
set -euo pipefail

STATE="${DISTPERF_POSTGRES_STATE:-${TMPDIR:-/tmp}/distperf-postgres-$(id -u)}"
DATA="$STATE/data"
DB=distperf_test
DB_USER=distperf

log() { echo "postgres.sh: $*" >&2; }

bindir() {
  # Debian keeps the server binaries per major version, off PATH; take the newest.
  local dir
  dir="$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$dir" ] && [ -x "$dir/initdb" ] && echo "$dir"
}

as_owner() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

install_packages() {
  if bindir >/dev/null; then
    return
  fi
  [ "$(id -u)" = 0 ] || { log "not root: cannot install postgresql (apt-get install postgresql)"; exit 1; }
  log "installing postgresql (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
  # The package may create and start its default cluster; this script uses its own, so stop that one.
  if command -v pg_lsclusters >/dev/null; then
    pg_lsclusters -h 2>/dev/null | awk '$4 == "online" {print $1, $2}' | while read -r version name; do
      log "stopping the package's default cluster $version/$name"
      pg_ctlcluster "$version" "$name" stop >&2 || true
    done
  fi
}

url() {
  echo "postgresql://$DB_USER:$(cat "$STATE/password")@127.0.0.1:$(cat "$STATE/port")/$DB"
}

running() {
  local bin
  bin="$(bindir)" || return 1
  [ -f "$DATA/PG_VERSION" ] && [ -f "$STATE/port" ] && as_owner "$bin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start() {
  if running; then
    log "already running on port $(cat "$STATE/port")"
    echo "export DISTPERF_TEST_POSTGRES_URL=$(url)"
    return
  fi
  install_packages
  local bin
  bin="$(bindir)"
  stop_quietly
  mkdir -p "$STATE/socket"
  python3 -c 'import secrets; print(secrets.token_hex(16))' > "$STATE/password"
  chmod 700 "$STATE"
  chmod 600 "$STATE/password"
  [ "$(id -u)" = 0 ] && chown -R postgres: "$STATE"
  log "initdb in $DATA"
  as_owner "$bin/initdb" -D "$DATA" -U "$DB_USER" --pwfile="$STATE/password" --auth-host=scram-sha-256 \
    --auth-local=scram-sha-256 -E UTF8 --no-locale >"$STATE/initdb.log" 2>&1 \
    || { cat "$STATE/initdb.log" >&2; exit 1; }
  # A port taken between choosing it and the server binding it makes pg_ctl fail: choose again.
  local attempt
  for attempt in 1 2 3; do
    free_port > "$STATE/port"
    if as_owner "$bin/pg_ctl" -D "$DATA" -l "$STATE/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -c port=$(cat "$STATE/port") -c unix_socket_directories=$STATE/socket" \
        start >&2; then
      break
    fi
    [ "$attempt" = 3 ] && { tail -n 20 "$STATE/server.log" >&2; exit 1; }
  done
  PGPASSWORD="$(cat "$STATE/password")" "$bin/createdb" -h 127.0.0.1 -p "$(cat "$STATE/port")" -U "$DB_USER" "$DB"
  log "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$(cat "$STATE/port"), database $DB"
  echo "export DISTPERF_TEST_POSTGRES_URL=$(url)"
}

stop_quietly() {
  local bin
  if bin="$(bindir)" && [ -f "$DATA/PG_VERSION" ]; then
    as_owner "$bin/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >&2 2>/dev/null || true
  fi
  rm -rf "$STATE"
}

stop() {
  if [ ! -d "$STATE" ]; then
    return
  fi
  stop_quietly
  log "stopped; removed $STATE"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
