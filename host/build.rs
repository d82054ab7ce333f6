//! Builds the example and fixture plugins in `plugins/` for `wasm32-wasip2`
//! whenever the host builds, in the manner of wasmtime's test-programs
//! artifacts, and tells the host where the components are
//! (`TOOLGUARD_WASM_DIR`). The plugins use their own target directory so this
//! nested cargo never waits on the outer build's directory lock.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The plugin packages the host embeds as `builtin:` components (src/builtin.rs).
const EMBEDDED: [&str; 3] = ["text-stats", "template", "payments"];

fn main() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let root = manifest_dir.parent().expect("host/ lives in the workspace root");
    let plugins = root.join("plugins");
    // Relative to the package root, so a target dir shared by several
    // checkouts (a CI cache) never checks another checkout's files.
    println!("cargo:rerun-if-changed=../plugins");
    println!("cargo:rerun-if-changed=../wit");

    let target_dir = outer_target_dir(Path::new(&env("OUT_DIR"))).join("wasm-plugins");
    let mut cargo = Command::new(env("CARGO"));
    cargo.args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"]).arg(plugins.join("Cargo.toml")).arg("--target-dir").arg(&target_dir);
    // A default build (the shipped binary, the demo) needs only the plugins
    // it embeds (src/builtin.rs); the tests' build (`test-hooks`) also
    // loads every fixture.
    if std::env::var_os("CARGO_FEATURE_TEST_HOOKS").is_none() {
        for package in EMBEDDED {
            cargo.args(["-p", package]);
        }
    }
    // The outer build's flags and target settings are for the host, not for wasm.
    for var in ["RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET", "CARGO_PROFILE_RELEASE_DEBUG"] {
        cargo.env_remove(var);
    }
    let status = cargo.status().expect("could not run cargo to build the plugins");
    assert!(status.success(), "building the plugins failed; is the target installed? run `rustup target add wasm32-wasip2`");

    let wasm_dir = target_dir.join("wasm32-wasip2").join("release");
    println!("cargo:rustc-env=TOOLGUARD_WASM_DIR={}", wasm_dir.display());
}

/// The target directory of the outer build, found from `OUT_DIR`
/// (`<target>/[<triple>/]<profile>/build/<pkg>-<hash>/out`).
fn outer_target_dir(out_dir: &Path) -> PathBuf {
    let build = out_dir.ancestors().find(|p| p.file_name().is_some_and(|n| n == "build")).expect("OUT_DIR lies under <target>/<profile>/build");
    let profile_dir = build.parent().expect("build/ has a parent");
    let mut target = profile_dir.parent().expect("the profile dir has a parent");
    if target.parent().is_some_and(|p| p.join("CACHEDIR.TAG").exists()) && !target.join("CACHEDIR.TAG").exists() {
        // `--target <triple>` adds one level: <target>/<triple>/<profile>.
        target = target.parent().expect("checked above");
    }
    target.to_path_buf()
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("cargo sets {name} for build scripts"))
}
