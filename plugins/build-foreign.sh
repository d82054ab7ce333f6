#!/usr/bin/env bash
# Builds the Python and JavaScript plugins (examples and fixtures) with their
# languages' own standard toolchains, with no flags beyond the WIT world:
#   componentize-py componentize   (pip: componentize-py)
#   componentize-js                (npm: @bytecodealliance/componentize-js)
# into $1 (one .wasm per plugin). A plugin is rebuilt only when its source,
# the WIT or the toolchain version changed (a stamp beside each output).
# Needs COMPONENTIZE_PY and COMPONENTIZE_JS (dev.sh installs and sets them).
set -euo pipefail
cd "$(dirname "$0")"
out="$1"
mkdir -p "$out"
wit_sum="$(cat ../wit/*.wit | sha256sum | cut -c1-16)"

stamp() { # name, source dir, toolchain version
    echo "$wit_sum $(cat "$2"/*.* | sha256sum | cut -c1-16) $3"
}

build_py() { # name, dir, world
    local name="$1" dir="$2" world="$3" version s
    version="$("$COMPONENTIZE_PY" --version)"
    s="$(stamp "$name" "$dir" "$version")"
    [ -f "$out/$name.wasm" ] && [ "$(cat "$out/$name.stamp" 2>/dev/null)" = "$s" ] && return
    "$COMPONENTIZE_PY" -d ../wit -w "$world" componentize app -p "$dir" -o "$out/$name.wasm" >/dev/null
    echo "$s" > "$out/$name.stamp"
}

build_js() { # name, dir, world
    local name="$1" dir="$2" world="$3" version s tmp
    version="$("$COMPONENTIZE_JS" --version)"
    s="$(stamp "$name" "$dir" "$version")"
    [ -f "$out/$name.wasm" ] && [ "$(cat "$out/$name.stamp" 2>/dev/null)" = "$s" ] && return
    # componentize-js reads the WIT through a sandboxed filesystem rooted at
    # the working directory: build from a copy holding both.
    tmp="$(mktemp -d)"
    cp -r ../wit "$tmp/wit" && cp "$dir/app.js" "$tmp/app.js"
    (cd "$tmp" && "$COMPONENTIZE_JS" app.js -w wit -n "$world" -o "$name.wasm" >/dev/null)
    mv "$tmp/$name.wasm" "$out/$name.wasm"
    rm -rf "$tmp"
    echo "$s" > "$out/$name.stamp"
}

build_py py_payments python/payments reconciling-plugin &
build_py py_socket fixtures/python-socket plugin &
wait
build_js js_text js/text plugin
build_js js_fetch fixtures/js-fetch plugin
build_js js_tickets js/tickets reconciling-plugin
