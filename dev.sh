#!/usr/bin/env bash
# toolguard's one entry point on a fresh machine. It installs what the build
# needs (the wasm32-wasip2 target; libclang for RocksDB's bindings) and then
#   ./dev.sh demo [ARGS…]   runs `toolguard demo` (the main job, embedded defaults)
#   ./dev.sh test [ARGS…]   runs the whole test suite: `cargo test --workspace --locked`, with
#                           the crash torture harness last and its tally shown (ARGS, if
#                           given, go to a single `cargo test` instead)
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
    export TOOLGUARD_NODE="$npm16/node_modules/.bin/node"
    export TOOLGUARD_CONFORMANCE="$npm16/node_modules/.bin/conformance"
    export TOOLGUARD_CONFORMANCE_2026="$npm26/node_modules/.bin/conformance"
    export TOOLGUARD_PYTHON="$venv/bin/python"
}

case "${1:-}" in
    demo) shift; prerequisites; exec cargo run --quiet --locked -p toolguard -- demo "$@" ;;
    test)
        shift
        prerequisites
        mcp_clients
        if [ $# -gt 0 ]; then exec cargo test --workspace --locked "$@"; fi
        cargo test --workspace --locked -- --skip torture
        exec cargo test --locked -p toolguard --test integration torture -- --nocapture ;;
    *) echo "usage: ./dev.sh demo | ./dev.sh test" >&2; exit 2 ;;
esac
