#!/usr/bin/env bash
# A throwaway PostgreSQL server for the registry tests.
#
# Source it and call the functions (what scripts/test.sh does):
#   source scripts/postgres.sh
#   pg_start            # installs Debian's postgresql if missing, starts a server on a free
#                       # loopback port, sets and exports PG_URL (postgres://postgres@127.0.0.1:PORT/postgres)
#   pg_stop             # stops it and removes its data directory
# Or run it: `bash scripts/postgres.sh start` prints the URL and the data directory;
# `bash scripts/postgres.sh stop DIR` stops that server.
#
# The server is initdb'd into a fresh temp directory, owned by the `postgres` user when run as
# root (the server refuses to run as root), with trust authentication on loopback only and
# fsync off: it holds test data for one run and nothing else.

pg_bin_dir() {
    local dir
    dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    [ -n "$dir" ] && [ -x "$dir/initdb" ] && echo "$dir"
}

# Installs Debian's `postgresql` package unless a server is already installed.
pg_ensure_installed() {
    if pg_bin_dir >/dev/null; then
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        echo "postgres.sh: PostgreSQL is not installed and this is not root; install the postgresql package" >&2
        return 1
    fi
    echo "postgres.sh: installing postgresql (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    pg_bin_dir >/dev/null || {
        echo "postgres.sh: postgresql installed, but no /usr/lib/postgresql/*/bin/initdb" >&2
        return 1
    }
}

# Runs a server binary as `postgres` when we are root, else as ourselves.
_pg_as_owner() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

_pg_free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts the server; sets PG_DIR, PG_PORT and exports PG_URL.
pg_start() {
    pg_ensure_installed || return 1
    local bin
    bin=$(pg_bin_dir)
    PG_DIR=$(mktemp -d -t mushroom-pg.XXXXXX)
    if [ "$(id -u)" = 0 ]; then
        chown postgres:postgres "$PG_DIR"
    fi
    if ! _pg_as_owner "$bin/initdb" -D "$PG_DIR/data" -U postgres -A trust -E UTF8 \
        --locale=C --no-sync >"$PG_DIR/initdb.log" 2>&1; then
        echo "postgres.sh: initdb failed; its log:" >&2
        cat "$PG_DIR/initdb.log" >&2
        return 1
    fi
    # A free port can be taken between choosing and binding it: try a few.
    local attempt
    for attempt in 1 2 3 4 5; do
        PG_PORT=$(_pg_free_port)
        if _pg_as_owner "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
            start >/dev/null; then
            export PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
            return 0
        fi
    done
    echo "postgres.sh: the server did not start; its log:" >&2
    cat "$PG_DIR/server.log" >&2
    return 1
}

# Stops the server started by pg_start (or the one in directory $1) and removes its files.
pg_stop() {
    local dir=${1:-${PG_DIR:-}}
    [ -n "$dir" ] && [ -d "$dir" ] || return 0
    local bin
    bin=$(pg_bin_dir) || return 0
    _pg_as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    [ "$dir" = "${PG_DIR:-}" ] && unset PG_DIR PG_PORT PG_URL
    return 0
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in
        start)
            pg_start
            echo "export MUSHROOM_TEST_POSTGRES_URL=$PG_URL"
            echo "# stop it with: bash $0 stop $PG_DIR"
            ;;
        stop)
            pg_stop "${2:?usage: $0 stop DIR}"
            ;;
        *)
            echo "usage: $0 start | stop DIR" >&2
            exit 2
            ;;
    esac
fi
