#!/usr/bin/env bash
# The SeaweedFS of the benchmarks at database size (benches/s5cmd.rs's docs): `weed mini` from
# scripts/seaweedfs.sh with 1 GiB volumes on fixed loopback ports, so that a benchmark can
# restart it empty between repetitions and keep its endpoint:
#   scripts/seaweedfs-bench.sh start     # no bucket (the bench makes `bench`); prints the
#                                        # endpoint (credentials test/test)
#   MUSHROOM_BENCH_ENDPOINT=http://127.0.0.1:19000 \
#   MUSHROOM_BENCH_BETWEEN="scripts/seaweedfs-bench.sh restart" cargo bench --bench s5cmd
#   scripts/seaweedfs-bench.sh stop
# Restarting, not vacuuming, frees what a repetition stored (an 8 GiB store's two prefixes are
# 16 GiB there): weed died in the one run that vacuumed that much instead (cause not found).
# SW_PORT_BASE (default 19000) picks the ports; its state (pid, data directory) is kept in
# ${TMPDIR:-/tmp}/mushroom-seaweedfs-bench-PORT, which `stop` trusts only when it is our own
# directory naming a `weed` process and a data directory sw_start made (/tmp is shared: a
# planted state must not make `stop` kill another process or remove another directory).
set -euo pipefail
cd "$(dirname "$0")/.."
export SW_PORT_BASE=${SW_PORT_BASE:-19000}
export SW_VOLUME_MB=${SW_VOLUME_MB:-1024}
state=${TMPDIR:-/tmp}/mushroom-seaweedfs-bench-$SW_PORT_BASE
# shellcheck source=scripts/seaweedfs.sh
source scripts/seaweedfs.sh

start() {
    if [ -e "$state" ] || [ -L "$state" ]; then
        echo "$state exists: a server on ports from $SW_PORT_BASE is running (stop it first)" >&2
        return 1
    fi
    sw_start
    mkdir -m 700 "$state"
    echo "$SW_PID" >"$state/pid"
    echo "$SW_DIR" >"$state/dir"
    echo "$MUSHROOM_TEST_SEAWEEDFS_ENDPOINT"
}

# Empty again, with the bucket `bench` the running benchmark made at its start.
restart() {
    stop
    start >/dev/null
    local s5cmd
    s5cmd=$(ls .venv/lib/python3*/site-packages/s5cmd/bin/s5cmd)
    AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1 \
        "$s5cmd" --endpoint-url "$MUSHROOM_TEST_SEAWEEDFS_ENDPOINT" mb s3://bench >/dev/null
}

stop() {
    [ -e "$state" ] || [ -L "$state" ] || return 0
    if [ -L "$state" ] || [ ! -d "$state" ] || [ ! -O "$state" ]; then
        echo "$state is not a directory of ours: not trusted, left alone" >&2
        return 1
    fi
    SW_PID=$(cat "$state/pid")
    SW_DIR=$(cat "$state/dir")
    if ! [[ "$SW_PID" =~ ^[0-9]+$ ]] || [ "$(cat "/proc/$SW_PID/comm" 2>/dev/null)" != weed ]; then
        SW_PID= # gone already (or not ours to kill)
    fi
    # sw_start's mktemp: directly in the temp directory, named mushroom-seaweedfs.*, ours.
    local tmp=${TMPDIR:-/tmp}
    case "$SW_DIR" in
    *..*) SW_DIR= ;;
    "${tmp%/}"/mushroom-seaweedfs.*) [ "${SW_DIR%/*}" = "${tmp%/}" ] && [ -O "$SW_DIR" ] || SW_DIR= ;;
    *) SW_DIR= ;;
    esac
    mapfile -t SW_PORTS < <(seq "$SW_PORT_BASE" $((SW_PORT_BASE + 9)))
    sw_stop
    rm -rf "$state"
}

case "${1:-}" in
start) start ;;
restart) restart ;;
stop) stop ;;
*)
    echo "usage: $0 start|restart|stop" >&2
    exit 2
    ;;
esac
