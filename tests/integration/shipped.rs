//! The shipped binary has no test hooks. The failpoints
//! (`TOOLGUARD_FAILPOINT`) and the skewed clock (`TOOLGUARD_CLOCK_SKEW_MS`)
//! exist only in the build the tests make (the `test-hooks` feature); a
//! default build, the one shipped, must not read either: whoever can set a
//! service's environment could otherwise make it abort between its durable
//! write and its send, or move its leases and retention.
//!
//! `./dev.sh test` builds the default binary first and names a copy of it in
//! `TOOLGUARD_SHIPPED_BINARY`.

use crate::common::{BIN, stdout_json};
use crate::world::{PI, SESSION, World, ledger_dir};
use std::process::{Command, Output};
use toolguard::ledger::Ledger;

/// 400 days back: a clock no host could be mistaken for having.
const SKEW_MS: i64 = -400 * 86_400_000;

fn shipped() -> String {
    std::env::var("TOOLGUARD_SHIPPED_BINARY")
        .unwrap_or_else(|_| panic!("TOOLGUARD_SHIPPED_BINARY is not set: run the tests with ./dev.sh test, which builds the default binary and names it there"))
}

/// A refund of `amount` by `binary` with both hooks' variables set.
fn refund_with_hooks_set(binary: &str, w: &World, call_id: &str, amount: u64) -> Output {
    Command::new(binary)
        .args(["call", "--config", w.config.to_str().unwrap(), "--session", SESSION, "--call-id", call_id, "refund"])
        .arg(format!(r#"{{"payment_intent":"{PI}","amount_cents":{amount},"reason":"duplicate"}}"#))
        .env("TOOLGUARD_LOG", "warn")
        .env("TOOLGUARD_FAILPOINT", "after-attempt-write")
        .env("TOOLGUARD_CLOCK_SKEW_MS", SKEW_MS.to_string())
        .output()
        .unwrap()
}

/// How far the recorded call's creation time is from now, in ms (negative: in the past).
fn recorded_offset_ms(w: &World, call_id: &str) -> i64 {
    let ledger = Ledger::open_read_only(&ledger_dir(w.dir.path())).unwrap();
    let call = ledger.call(SESSION, call_id).unwrap().expect("the call was recorded");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    call.created_ms as i64 - now
}

#[test]
fn the_shipped_binary_reads_no_test_hook() {
    // The tests' build obeys both: it aborts after the attempt is written,
    // before anything is sent, on a clock 400 days back.
    let hooked = World::new();
    let out = refund_with_hooks_set(BIN, &hooked, "h1", 501);
    assert!(!out.status.success(), "the tests' build aborts at the failpoint");
    assert!(String::from_utf8_lossy(&out.stderr).contains("failpoint `after-attempt-write` reached"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(hooked.posts_of(501).is_empty(), "it aborted before the send");
    let offset = recorded_offset_ms(&hooked, "h1");
    assert!((offset - SKEW_MS).abs() < 3_600_000, "the tests' build recorded the call on the skewed clock: {offset} ms from now");

    // The shipped binary ignores both: the refund is made, once, and recorded on the real clock.
    let w = World::new();
    let out = refund_with_hooks_set(&shipped(), &w, "s1", 502);
    assert!(out.status.success(), "the shipped binary did not abort: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout_json(&out)["status"], "succeeded");
    assert_eq!(w.refunds_of(502), 1);
    let offset = recorded_offset_ms(&w, "s1");
    assert!(offset.abs() < 3_600_000, "the shipped binary recorded the call on the host's own clock: {offset} ms from now");
}

/// The crates the shipped build compiles when the README's cold-build
/// figure was measured (`./dev.sh demo` on a fresh clone, empty cargo home
/// and target, 2026-12-07: 16 min 45 s wall, 1,810 CPU-s, README "Quick start"; docs/development.md "The cold build").
/// A test cannot time a cold build (tests never assert wall-clock times),
/// but it can see the build grow: adding a crate to the shipped build fails
/// this until someone measures the cold demo again and updates the README's
/// figure and this number together.
const SHIPPED_CRATES_MEASURED: usize = 379;

#[test]
fn the_shipped_build_compiles_no_crate_beyond_those_its_cold_build_was_measured_with() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(cargo)
        .args(["tree", "--manifest-path", manifest, "-p", "toolguard", "--edges", "normal,build", "--prefix", "none", "--locked", "--offline", "-f", "{p}"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut crates: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim_end_matches(" (*)").trim_end_matches(" (proc-macro)").split(" (").next().unwrap_or_default().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    crates.sort();
    crates.dedup();
    assert!(
        crates.len() <= SHIPPED_CRATES_MEASURED,
        "the shipped build now compiles {} crates, {} more than when its cold build was measured: time `./dev.sh demo` on a fresh clone \
         with an empty target directory, then update the README's quick-start figure, docs/development.md and SHIPPED_CRATES_MEASURED together",
        crates.len(),
        crates.len() - SHIPPED_CRATES_MEASURED
    );
}

/// No path around the guard ships: the bench's unguarded baseline — its
/// runtime flag, its mode and its send — is compiled only with the `bench`
/// feature, so the shipped binary has no symbol of it. (Before it was gated,
/// it had `guard::direct::send_unguarded`. The tests' build is no witness:
/// `cargo test --workspace` builds the bench crate too, whose dependency
/// turns the feature on for the host it builds.)
#[test]
fn the_shipped_binary_has_no_unguarded_send() {
    let bytes = std::fs::read(shipped()).unwrap();
    for name in ["send_unguarded", "unguarded_for_bench"] {
        let found = bytes.windows(name.len()).any(|w| w == name.as_bytes());
        assert!(!found, "the shipped binary has `{name}`: a way around the guard compiled in");
    }
}
