#!/usr/bin/env bash
# The main job on embedded defaults, end to end and visible: `serve` (SQLite registry under the
# demo dir, local-directory buckets, a free localhost port, no admin token on loopback), three
# registered stores with demo nodes streaming their positions, health, a pause that uploads
# nothing and survives a restart of the service, resume and catch-up, a restore drill, the
# restore points, and a restore compared by digest with the original. Everything lands under
# ./demo (removed first); the service's log is demo/service.log. Exits non-zero on any failure;
# the service and the nodes are stopped on any exit.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mushroom-backup/target}"
# Embedded defaults only: no setting from the caller's environment reaches the service.
for v in $(compgen -v | grep -E '^(MUSHROOMDB_BACKUP_|OTEL_)' || true); do unset "$v"; done

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\ndemo: %s\n' "$*" >&2; exit 1; }

step "build"
# cargo's own progress, not a silent wait: a first build compiles ~500 crates (see docs/setup.md
# for how long it takes and the disk it needs).
cargo build
mb="$CARGO_TARGET_DIR/debug/mushroom-backup"
demo="$PWD/demo"
rm -rf "$demo"
mkdir -p "$demo/logs" "$demo/buckets"
data="$demo/service"            # the service's data dir: registry.db, scratch, stores/
root="$data/stores"             # the default allowed store root
names=(orders users events)
paused=users                    # the store the demo pauses, drills and restores

serve_pid=""
node_pids=()
cleanup() {
    local rc=$?
    # The nodes first: on a signal each sends its last position to the service before it exits.
    for pid in "${node_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${node_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
    [ "$rc" = 0 ] || printf 'demo: failed (exit %s); logs under %s\n' "$rc" "$demo" >&2
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts `serve` on a free localhost port and sets $server once it prints its listening line.
start_service() {
    local out="$demo/logs/serve-$1.out"
    "$mb" serve --listen 127.0.0.1:0 --data-dir "$data" --instance-id demo \
        --wal-interval-ms 250 --restore-point-interval-ms 3000 \
        >"$out" 2>>"$demo/service.log" &
    serve_pid=$!
    local addr=""
    for _ in $(seq 300); do
        addr=$(sed -n 's/.*"listening":"\([^"]*\)".*/\1/p' "$out")
        [ -n "$addr" ] && break
        kill -0 "$serve_pid" 2>/dev/null || fail "serve exited; see $demo/service.log"
        sleep 0.1
    done
    [ -n "$addr" ] || fail "serve printed no listening line in 30 s; see $demo/service.log"
    server="http://$addr"
}
ctl() { "$mb" ctl --server "$server" "$@"; }
# `ctl [--json] health [ID]`, which exits 3 while a store shown is unhealthy (catching up,
# starting): shown, not fatal.
ctl_health() {
    local json=()
    if [ "${1:-}" = --json ]; then json=(--json); shift; fi
    ctl "${json[@]}" health "$@" || [ "$?" = 3 ]
}

# One line: each store's durable/shipped commit (and PAUSED); with a target per store, exits 0
# when every store has shipped its target, 3 while one has not.
status() {
    ctl_health --json | python3 -c '
import json, sys
names = dict(a.split("=", 1) for a in sys.argv[1].split())
want = dict(a.split("=", 1) for a in sys.argv[2].split()) if len(sys.argv) > 2 else {}
parts, done = [], True
for s in sorted(json.load(sys.stdin)["stores"], key=lambda s: names.get(s["store_id"], "")):
    name = names.get(s["store_id"], s["store_id"])
    d, sh = s["durable_commit_seq"], s["shipped_commit_seq"]
    parts.append(f"{name} durable {d:>5} shipped {sh:>5}" + (" PAUSED" if s["paused"] else ""))
    done = done and name in want and sh >= int(want[name])
print("  " + " | ".join(parts))
sys.exit(0 if want and done else 3)
' "$ids" "$@"
}
# Prints the status in place (a new line now and then when stdout is not a terminal); returns
# status's 0 or 3, and ends the demo on any other failure (the service gone, no python3, ...).
show() {
    local line rc=0
    line=$(status "$@") || rc=$?
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || fail "ctl health failed (exit $rc); see $demo/service.log"
    if [ -t 1 ]; then printf '\r\033[K%s' "$line"; else
        tick=$((${tick:-0} + 1)); [ $((tick % 4)) = 1 ] && echo "$line"; fi
    return "$rc"
}
# The data objects of a bucket (segments, archives, snapshots, manifests), not its lease.
objects() { (cd "$demo/buckets/$1" && find gen manifests -type f 2>/dev/null | sort); }

step "start the service on its embedded defaults"
start_service 1
echo "listening on $server; SQLite registry $data/registry.db; stores under $root"

step "three existing databases: 500 commits each, written by the reference engine"
for i in "${!names[@]}"; do
    "$mb" store write "$root/${names[$i]}" --commits 500 --snapshot-every 1000 \
        --rotate-bytes 65536 --seed "$i" 2>>"$demo/logs/store-write.log"
done
ls "$root"

step "register them, each backing up to its own local-directory bucket"
declare -A id token
ids=""
for n in "${names[@]}"; do
    reg=$(ctl --json register --dir "$root/$n" --destination "file://$demo/buckets/$n" --label "app=$n")
    id[$n]=$(echo "$reg" | sed -n 's/.*"store_id":"\([^"]*\)".*/\1/p')
    token[$n]=$(echo "$reg" | sed -n 's/.*"node_token":"\([^"]*\)".*/\1/p')
    [ -n "${id[$n]}" ] && [ -n "${token[$n]}" ] || fail "register $n answered: $reg"
    ids+="${id[$n]}=$n "
    echo "$n -> store ${id[$n]} (bucket file://$demo/buckets/$n)"
done

step "start a demo node per store: 2,500 more commits each at 400/s, streaming positions"
for i in "${!names[@]}"; do
    n=${names[$i]}
    MUSHROOMDB_BACKUP_NODE_TOKEN=${token[$n]} "$mb" node --store "$root/$n" --server "$server" \
        --store-id "${id[$n]}" --commits 2500 --rate 400 --snapshot-every 1000 \
        --rotate-bytes 65536 --seed "$i" --flush-timeout-ms 5000 \
        >"$demo/logs/node-$n.json" 2>"$demo/logs/node-$n.log" &
    node_pids+=($!)
done
for _ in $(seq 4); do show || true; sleep 0.25; done; echo

step "ctl health while the nodes write"
ctl_health

step "pause $paused while its node keeps writing"
ctl pause "${id[$paused]}" --reason "demo: storage maintenance" --for 10m
before=$(objects "$paused")

step "live status until the nodes finish (the paused store's shipped position stands still)"
while :; do
    running=0
    for pid in "${node_pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    [ "$running" = 0 ] && break
    show || true
    sleep 0.25
done
show || true; echo
for i in "${!names[@]}"; do
    wait "${node_pids[$i]}" || fail "the node of ${names[$i]} failed; see $demo/logs/node-${names[$i]}.log"
done
node_pids=()
declare -A final
want=""
for n in "${names[@]}"; do
    final[$n]=$(sed -n 's/.*"commit_seq":\([0-9]*\).*/\1/p' "$demo/logs/node-$n.json")
    [ -n "${final[$n]}" ] || fail "the node of $n printed no final position"
    want+="$n=${final[$n]} "
done
echo "the nodes are done: ${want% }"
[ "$(objects "$paused")" = "$before" ] || fail "$paused uploaded objects while paused"
echo "$paused's bucket: $(echo "$before" | grep -c .) data objects at the pause, the same now"

step "restart the service: the pause is in the registry and survives it"
kill "$serve_pid"
wait "$serve_pid" || true
start_service 2
# The worker starts again (and takes its lease back) before it shows more than "starting".
for _ in $(seq 40); do
    ctl_health --json "${id[$paused]}" | grep -q '"reason":"starting' || break
    sleep 0.25
done
ctl_health "${id[$paused]}"
python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["stores"][0]["paused"] else 1)' \
    <<<"$(ctl_health --json "${id[$paused]}")" || fail "$paused is not paused after the restart"
[ "$(objects "$paused")" = "$before" ] || fail "$paused uploaded objects while paused"

step "resume $paused; wait until every store has shipped every commit its node made"
ctl resume "${id[$paused]}"
caught=0
for _ in $(seq 240); do
    if show "${want% }"; then caught=1; break; fi
    sleep 0.25
done
echo
[ "$caught" = 1 ] || fail "the stores did not catch up within 60 s"

step "ctl health"
ctl_health

step "a restore drill on $paused: the newest restore point, restored into scratch and checked"
ctl drill "${id[$paused]}"

step "the restore points of $paused"
ctl list-restore-points "${id[$paused]}"

step "restore $paused from its bucket and compare digests with the original"
"$mb" restore --from "file://$demo/buckets/$paused" --to "$demo/restored-$paused" 2>>"$demo/logs/restore.log"
orig=$("$mb" store digest "$root/$paused")
back=$("$mb" store digest "$demo/restored-$paused")
echo "original: $orig"
echo "restored: $back"
[ "$orig" = "$back" ] || fail "the restored store differs from the original"

printf '\nThe restored store is identical. Everything is under %s.\n' "$demo"
