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

case "${1:-}" in
    demo) shift; prerequisites; exec cargo run --quiet --locked -p toolguard -- demo "$@" ;;
    test)
        shift
        prerequisites
        if [ $# -gt 0 ]; then exec cargo test --workspace --locked "$@"; fi
        cargo test --workspace --locked -- --skip torture
        exec cargo test --locked -p toolguard --test integration torture -- --nocapture ;;
    *) echo "usage: ./dev.sh demo | ./dev.sh test" >&2; exit 2 ;;
esac
