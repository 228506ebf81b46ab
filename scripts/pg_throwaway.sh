#!/usr/bin/env bash
# Throwaway PostgreSQL 15 cluster for tests (no system service, no persistent state).
#
#   eval "$(scripts/pg_throwaway.sh start DIR PORT)"   # exports FEDPLAT_TEST_PG_URL
#   python -m pytest tests/test_store.py
#   scripts/pg_throwaway.sh stop DIR                   # stops it and deletes its files
#
# Only the export line goes to stdout (so `eval` is safe); progress goes to stderr.
# The server listens on 127.0.0.1 only and keeps its socket in DIR. DIR's parents
# must be traversable by user "postgres" when run as root (mktemp -d under /tmp is).
# initdb and postgres refuse to run as root, so as root every server command runs
# as the "postgres" system user via su; as another user they run directly.
set -euo pipefail

PGBIN="${PGBIN:-/usr/lib/postgresql/15/bin}"
DB_USER="fl"
DB_NAME="fedplat_test"

usage() {
    echo "usage: $0 start DIR PORT | stop DIR" >&2
    exit 2
}

log() { echo "pg_throwaway: $*" >&2; }

# Run a command as the cluster owner; arguments are quoted for su's shell.
as_owner() {
    if [[ "$(id -u)" == 0 ]]; then
        su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
    else
        "$@"
    fi
}

start() {
    local dir="$1" port="$2"
    [[ "$port" =~ ^[0-9]+$ ]] || { log "PORT must be a number"; exit 2; }
    [[ -x "$PGBIN/initdb" ]] || { log "no initdb in $PGBIN (apt-get install postgresql)"; exit 1; }
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd -P)"
    if [[ -e "$dir/data" ]]; then
        log "$dir/data exists; stop the old cluster first ($0 stop $dir)"
        exit 1
    fi
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres "$dir"
    fi
    chmod 700 "$dir"

    # A fresh random password per cluster: nothing to leak, nothing to rotate.
    local password
    password="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    ( umask 077; printf '%s\n' "$password" >"$dir/pwfile" )
    if [[ "$(id -u)" == 0 ]]; then
        chown postgres "$dir/pwfile"
    fi

    log "initdb in $dir/data"
    as_owner "$PGBIN/initdb" -D "$dir/data" -A scram-sha-256 --pwfile="$dir/pwfile" \
        -U "$DB_USER" -E UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    rm -f "$dir/pwfile"

    log "starting on 127.0.0.1:$port"
    # fsync=off: a test cluster is discarded after use, durability buys nothing.
    if ! as_owner "$PGBIN/pg_ctl" -w -t 60 -D "$dir/data" -l "$dir/server.log" \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >&2; then
        cat "$dir/server.log" >&2 || true
        exit 1
    fi

    if ! PGPASSWORD="$password" "$PGBIN/createdb" -h 127.0.0.1 -p "$port" \
        -U "$DB_USER" "$DB_NAME" >&2; then
        log "createdb failed; stopping the cluster"
        as_owner "$PGBIN/pg_ctl" -m fast -D "$dir/data" stop >&2 || true
        exit 1
    fi
    log "ready: database $DB_NAME, user $DB_USER"
    echo "export FEDPLAT_TEST_PG_URL=postgresql+psycopg://$DB_USER:$password@127.0.0.1:$port/$DB_NAME"
}

stop() {
    local dir="$1"
    [[ -d "$dir" ]] || { log "no such directory: $dir"; exit 1; }
    dir="$(cd "$dir" && pwd -P)"
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        log "stopping cluster in $dir/data"
        as_owner "$PGBIN/pg_ctl" -m fast -w -D "$dir/data" stop >&2 || true
    fi
    # Remove only what start created, never DIR's other contents.
    rm -rf "$dir/data" "$dir/server.log" "$dir/initdb.log" "$dir/pwfile"
    rmdir "$dir" 2>/dev/null || true
}

[[ $# -ge 1 ]] || usage
case "$1" in
    start) [[ $# -eq 3 ]] || usage; start "$2" "$3" ;;
    stop) [[ $# -eq 2 ]] || usage; stop "$2" ;;
    *) usage ;;
esac
