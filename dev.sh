#!/usr/bin/env bash
# toolguard's one entry point on a fresh machine. It installs what the build
# needs (the wasm32-wasip2 target; libclang for RocksDB's bindings) and then
#   ./dev.sh demo [ARGS…]   runs `toolguard demo` (the main job, embedded defaults)
#   ./dev.sh bench [ARGS…]  builds the host and `toolguard-bench` optimised and runs the
#                           benchmarks (docs/benchmarks.md)
#   ./dev.sh test [ARGS…]   runs the whole test suite: `cargo test --workspace --locked` of the
#                           build with test hooks (`--features toolguard/test-hooks`), with
#                           the crash torture harness last and its tally shown (ARGS, if
#                           given, go to a single `cargo test` instead), against a throwaway
#                           PostgreSQL it starts for the shared ledger's tests and real OCI
#                           registries (Debian's docker-registry) for the registry tests
set -euo pipefail
cd "$(dirname "$0")"

need_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

prerequisites() {
    # The plugins build for wasm32-wasip2 with the toolchain rust-toolchain.toml pins.
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        rustup target add wasm32-wasip2
    fi
    # librocksdb-sys generates its bindings with bindgen: libclang and clang's headers.
    if command -v dpkg >/dev/null; then
        if ! dpkg -s libclang-dev >/dev/null 2>&1; then
            need_root apt-get update -qq
            need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev >/dev/null
        fi
    elif ! ldconfig -p 2>/dev/null | grep -q 'libclang'; then
        echo "dev.sh: install libclang (and clang's headers) and retry" >&2
        exit 1
    fi
}

# The MCP clients the tests drive: Node 22 with the official conformance
# suites (npm: node@22 brings its own binary, leaving the system Node alone)
# and the official Python SDK, installed once into a cache.
TOOLS="${TOOLGUARD_TOOLS:-$HOME/.cache/toolguard/tools}"
mcp_clients() {
    local npm16="$TOOLS/conformance-0.1.16" npm26="$TOOLS/conformance-0.2.0-alpha.12" venv="$TOOLS/python"
    if [ ! -x "$npm16/node_modules/.bin/node" ] || [ ! -e "$npm16/node_modules/.bin/conformance" ]; then
        mkdir -p "$npm16"
        (cd "$npm16" && npm install --silent --no-audit --no-fund node@22 @modelcontextprotocol/conformance@0.1.16)
    fi
    if [ ! -e "$npm26/node_modules/.bin/conformance" ]; then
        mkdir -p "$npm26"
        (cd "$npm26" && npm install --silent --no-audit --no-fund @modelcontextprotocol/conformance@0.2.0-alpha.12)
    fi
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import mcp' 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet "mcp==2.3.0"
    fi
    # An independent OCI client (oras) that reads what `toolguard push`
    # wrote and pushes artifacts toolguard pulls; bcrypt for the test
    # registry's htpasswd file; authlib (on Flask) for a real OAuth 2.1
    # authorization server (tests/oauth/authorization_server.py); jsonschema
    # to validate the review's SARIF against the SARIF 2.1.0 schema.
    if ! "$venv/bin/python" -c 'import oras, bcrypt, authlib, flask, jsonschema' 2>/dev/null; then
        "$venv/bin/pip" install --quiet "oras==0.2.43" "bcrypt==5.0.0" "authlib==1.9.6" "flask==3.1.3" "jsonschema==4.26.0"
    fi
    export TOOLGUARD_NODE="$npm16/node_modules/.bin/node"
    export TOOLGUARD_CONFORMANCE="$npm16/node_modules/.bin/conformance"
    export TOOLGUARD_CONFORMANCE_2026="$npm26/node_modules/.bin/conformance"
    export TOOLGUARD_PYTHON="$venv/bin/python"
}

# The Python and JavaScript plugins' toolchains, from the package registries
# (pinned), installed once into the tools cache; then the plugins themselves
# (plugins/build-foreign.sh: rebuilt only when their sources change). First
# build about a minute; see docs/plugins.md.
foreign_plugins() {
    local py="$TOOLS/componentize-py-0.25.1" js="$TOOLS/componentize-js-0.23.0"
    if [ ! -x "$py/bin/componentize-py" ]; then
        python3 -m venv "$py"
        "$py/bin/pip" install --quiet "componentize-py==0.25.1"
    fi
    if [ ! -e "$js/node_modules/.bin/componentize-js" ] || [ ! -e "$js/node_modules/.bin/tsc" ] || [ ! -e "$js/node_modules/.bin/rolldown" ]; then
        mkdir -p "$js"
        (cd "$js" && npm install --silent --no-audit --no-fund @bytecodealliance/componentize-js@0.23.0 \
            @bytecodealliance/jco@1.35.0 typescript@7.0.2 rolldown@1.3.3)
    fi
    export TOOLGUARD_FOREIGN_PLUGINS="${CARGO_TARGET_DIR:-$PWD/target}/foreign-plugins"
    COMPONENTIZE_PY="$py/bin/componentize-py" JS_MODULES="$js/node_modules" \
        plugins/build-foreign.sh "$TOOLGUARD_FOREIGN_PLUGINS"
}

# A throwaway PostgreSQL for the shared ledger's tests: its own cluster in a
# temporary directory on a free loopback port, removed when the tests end.
# initdb refuses to run as root, so as root it runs as the `postgres` user
# (the Debian package creates it).
PG_AS=()
postgres_server() {
    PG_BIN="$(dirname "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb 2>/dev/null | tail -1 || true)")"
    if [ ! -x "$PG_BIN/initdb" ]; then
        need_root apt-get update -qq
        need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        PG_BIN="$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | tail -1)")"
    fi
    if ! command -v openssl >/dev/null; then
        need_root apt-get update -qq
        need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
    fi
    PG_DIR="$(mktemp -d)"
    # TLS for the fleet tests that run over `sslmode=verify-full`: a throwaway
    # CA and a certificate for 127.0.0.1, made with the OpenSSL command line
    # (the host itself uses rustls).
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=toolguard test PostgreSQL CA" \
        -keyout "$PG_DIR/ca.key" -out "$PG_DIR/ca.pem" 2>/dev/null
    openssl req "${ec[@]}" -subj "/CN=127.0.0.1" -keyout "$PG_DIR/server.key" -out "$PG_DIR/server.csr" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$PG_DIR/san.ext"
    openssl x509 -req -in "$PG_DIR/server.csr" -CA "$PG_DIR/ca.pem" -CAkey "$PG_DIR/ca.key" -CAcreateserial \
        -days 2 -extfile "$PG_DIR/san.ext" -out "$PG_DIR/server.pem" 2>/dev/null
    chmod 600 "$PG_DIR/server.key"
    if [ "$(id -u)" -eq 0 ]; then chown -R postgres "$PG_DIR"; PG_AS=(runuser -u postgres --); fi
    local port
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    "${PG_AS[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U toolguard -A trust -E UTF8 --no-sync >/dev/null
    trap postgres_stop EXIT
    "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_DIR -c max_connections=200 -c ssl=on -c ssl_cert_file=$PG_DIR/server.pem -c ssl_key_file=$PG_DIR/server.key" start >/dev/null
    export TOOLGUARD_TEST_POSTGRES="postgres://toolguard@127.0.0.1:$port/postgres"
    export TOOLGUARD_TEST_POSTGRES_CA="$PG_DIR/ca.pem"
}
postgres_stop() {
    "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$PG_DIR" "${SHIPPED_DIR:-}"
}

# A real OCI registry for the registry tests: Debian's `docker-registry`
# (CNCF Distribution). Each test starts its own on loopback with throwaway
# storage (tests/integration/registry.rs), so one can be stopped mid-test.
registry_server() {
    if ! command -v docker-registry >/dev/null; then
        need_root apt-get update -qq
        need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null
    fi
    export TOOLGUARD_REGISTRY_BIN="$(command -v docker-registry)"
}

# The tests' build: the host with its test hooks (failpoints, a skewed
# clock) compiled in. The shipped binary never has them (docs/development.md).
HOOKS=(--features toolguard/test-hooks)

# The binary a default build makes — the shipped one, without test hooks —
# copied aside before the tests' build replaces target/debug/toolguard; a
# test checks that it ignores the hooks' variables. (`./dev.sh demo` runs
# this same build.)
shipped_binary() {
    local exe
    exe="$(cargo build --locked --quiet -p toolguard --bin toolguard --message-format=json-render-diagnostics \
        | python3 -c 'import json, sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')"
    SHIPPED_DIR="$(mktemp -d)"
    cp "$exe" "$SHIPPED_DIR/toolguard"
    export TOOLGUARD_SHIPPED_BINARY="$SHIPPED_DIR/toolguard"
}

case "${1:-}" in
    demo) shift; prerequisites; exec cargo run --quiet --locked -p toolguard -- demo "$@" ;;
    bench)
        shift
        prerequisites
        # Optimised (docs/benchmarks.md): the host as shipped, then the
        # benchmarks beside it, which serve from that binary for (h) and (k).
        cargo build --quiet --profile bench --locked -p toolguard
        exec cargo run --quiet --profile bench --locked -p toolguard-bench -- "$@" ;;
    test)
        shift
        prerequisites
        mcp_clients
        foreign_plugins
        postgres_server
        registry_server
        shipped_binary
        if [ $# -gt 0 ]; then cargo test --workspace --locked "${HOOKS[@]}" "$@"; exit; fi
        # Kill-timing tests run alone, after the rest: the tortures, and the
        # kill landing right after an answer, whose window (the told record's
        # write → the process's exit) is microseconds only on an idle machine;
        # under the whole suite's load the scheduler can stretch it.
        cargo test --workspace --locked "${HOOKS[@]}" -- --skip torture --skip crash::a_kill_right_after_the_answer
        cargo test --locked "${HOOKS[@]}" -p toolguard --test integration crash::a_kill_right_after_the_answer
        # The guard's edge cases, recovery and the hold rule again, on a PostgreSQL ledger.
        TOOLGUARD_TEST_LEDGER=postgres cargo test --locked "${HOOKS[@]}" -p toolguard --test integration -- guard_ recovery_edges hold::
        # The fleet tests again, over TLS to PostgreSQL (sslmode=verify-full).
        TOOLGUARD_TEST_POSTGRES_TLS=1 cargo test --locked "${HOOKS[@]}" -p toolguard --test integration -- fleet:: hold_cli::on_a_fleet
        cargo test --locked "${HOOKS[@]}" -p toolguard --test integration torture -- --nocapture
        # Restarts of the ledger's server under two hosts, alone: it restarts the server every test shares.
        TOOLGUARD_TEST_POSTGRES_RESTART="${PG_AS[*]} $PG_BIN/pg_ctl -D $PG_DIR/data -l $PG_DIR/log -w -t 300 -m fast restart >/dev/null" \
            cargo test --locked "${HOOKS[@]}" -p toolguard --test integration restarts_of_the_ledger_server -- --ignored --nocapture ;;
    *) echo "usage: ./dev.sh demo | ./dev.sh test | ./dev.sh bench" >&2; exit 2 ;;
esac
