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
