#!/usr/bin/env bash
# Builds the Python, JavaScript and TypeScript plugins (examples and fixtures)
# with their languages' own standard toolchains, with no flags beyond the WIT
# world:
#   componentize-py componentize   (pip: componentize-py), with python/sdk on the path
#   componentize-js                (npm: @bytecodealliance/componentize-js)
#   TypeScript: jco's guest types from wit/, tsc (type check), rolldown
#   (bundle into one module), then componentize-js
# into $1 (one .wasm per plugin). A plugin is rebuilt only when its source,
# its SDK, the WIT or the toolchain version changed (a stamp beside each output).
# Needs COMPONENTIZE_PY and JS_MODULES (the node_modules holding
# componentize-js, jco, typescript and rolldown); dev.sh installs and sets them.
set -euo pipefail
cd "$(dirname "$0")"
out="$1"
mkdir -p "$out"
wit_sum="$(cat ../wit/*.wit | sha256sum | cut -c1-16)"

stamp() { # name, source dir, toolchain version (the SDKs count as source)
    echo "$wit_sum $(cat "$2"/*.* python/sdk/toolguard_sdk/*.py js/sdk/*.* 2>/dev/null | sha256sum | cut -c1-16) $3"
}

build_py() { # name, dir, world
    local name="$1" dir="$2" world="$3" version s
    version="$("$COMPONENTIZE_PY" --version)"
    s="$(stamp "$name" "$dir" "$version")"
    [ -f "$out/$name.wasm" ] && [ "$(cat "$out/$name.stamp" 2>/dev/null)" = "$s" ] && return
    "$COMPONENTIZE_PY" -d ../wit -w "$world" componentize app -p "$dir" -p python/sdk -o "$out/$name.wasm" >/dev/null
    echo "$s" > "$out/$name.stamp"
}

COMPONENTIZE_JS="$JS_MODULES/.bin/componentize-js"

build_js() { # name, dir, world
    local name="$1" dir="$2" world="$3" version s tmp
    version="$("$COMPONENTIZE_JS" --version)"
    s="$(stamp "$name" "$dir" "$version")"
    [ -f "$out/$name.wasm" ] && [ "$(cat "$out/$name.stamp" 2>/dev/null)" = "$s" ] && return
    # componentize-js reads the WIT through a sandboxed filesystem rooted at
    # the working directory: build from a copy holding both.
    tmp="$(mktemp -d)"
    cp -r ../wit "$tmp/wit"
    if [ -f "$dir/app.ts" ]; then
        "$JS_MODULES/.bin/rolldown" "$dir/app.ts" -f esm -o "$tmp/app.js" -e 'toolguard:plugin/outbound@0.1.0' >/dev/null
    else
        cp "$dir/app.js" "$tmp/app.js"
    fi
    (cd "$tmp" && "$COMPONENTIZE_JS" app.js -w wit -n "$world" -o "$name.wasm" >/dev/null)
    mv "$tmp/$name.wasm" "$out/$name.wasm"
    rm -rf "$tmp"
    echo "$s" > "$out/$name.stamp"
}

# A QuickJS build (componentize-qjs, shipped with jco; synchronous: toolguard
# does not enable the component model's async ABI): several linear memories.
build_qjs() { # name, dir, world, [--sync]
    local name="$1" dir="$2" world="$3" s
    s="$(stamp "$name" "$dir" "componentize-qjs $(cd "$JS_MODULES/componentize-qjs" && node -p 'require("./package.json").version') $*")"
    [ -f "$out/$name.wasm" ] && [ "$(cat "$out/$name.stamp" 2>/dev/null)" = "$s" ] && return
    "$JS_MODULES/.bin/componentize-qjs" -w ../wit -j "$dir/app.js" -n "$world" ${4:-} -o "$out/$name.wasm" >/dev/null
    echo "$s" > "$out/$name.stamp"
}

# The TypeScript plugins: the contract's types generated from wit/ (always
# fresh), then a strict type check of the SDK and every app.ts.
node js/sdk/gen-types.mjs "$JS_MODULES" ../wit reconciling-plugin js/types
"$JS_MODULES/.bin/tsc" -p js/tsconfig.json

build_py py_payments python/payments reconciling-plugin &
build_py py_text python/text plugin &
build_py py_socket fixtures/python-socket plugin &
wait
build_js js_text js/text plugin
build_qjs qjs_text js/text plugin --sync
build_qjs qjs_async js/text plugin     # its default, the async ABI: refused with what to do
build_js js_fetch fixtures/js-fetch plugin
build_js js_tickets js/tickets reconciling-plugin
