//! Ledger retention through the real binary: what pruning removes, that a
//! pruned call is refused as `expired` (never run again), and that pruning
//! never takes away the hold rule's protection. Refunds are counted at the
//! sandbox.

use crate::common::stdout_json;
use crate::payments::Downstream;
use crate::world::{World, ledger_dir};
use serde_json::Value;
use std::time::Duration;
use toolguard::ledger::{Ledger, records::now_ms};
use toolguard_sandbox::Fault;

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

/// A world whose downstream keeps keys for 1 hour, with `[retention]` at
/// the shortest that allows (2 hours).
fn world() -> World {
    let w = World::with(Downstream { timeout_ms: 500, reconcile_ms: 200, retention_hours: 1, ..Downstream::default() });
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    text.push_str("\n[retention]\nhours = 2\n");
    std::fs::write(&w.config, text).unwrap();
    w
}

#[test]
fn a_pruned_call_is_refused_as_expired_and_an_open_episode_is_never_pruned() {
    let w = world();
    // c1: a refund whose caller heard the result (its episode closes).
    let (ok, first) = w.refund("c1", 100);
    assert!(ok, "{first}");
    // u1: a refund the provider commits but answers too late: the caller hears
    // `outcome-unknown` (its episode stays open, its attempt unknown).
    w.sandbox.set_list_lag(Duration::from_secs(600));
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let (ok, unknown) = w.refund("u1", 200);
    assert!(!ok && kind(&unknown) == "outcome-unknown", "{unknown}");
    assert_eq!((w.refunds_of(100), w.refunds_of(200)), (1, 1));

    // Nothing is two hours old yet: `ledger prune` removes nothing.
    let out = w.toolguard(&["ledger", "prune"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(stdout_json(&out)["pruned"]["calls"], 0, "{}", String::from_utf8_lossy(&out.stdout));

    // Two hours later (a pass with the cut-off moved past now).
    {
        let ledger = Ledger::open(&ledger_dir(w.dir.path())).unwrap();
        let now = now_ms();
        let report = ledger.prune(now + 1, now).unwrap();
        assert_eq!((report.calls, report.episodes), (1, 1), "only c1 and its closed episode: {report:?}");
    }
    let stats = stdout_json(&w.toolguard(&["ledger", "stats", "--json"]));
    assert_eq!((stats["tombstones"].as_u64(), stats["episodes_open"].as_u64()), (Some(1), Some(1)), "{stats}");

    // The model retries c1 (a resumed agent): refused, nothing sent.
    let (ok, retry) = w.refund("c1", 100);
    assert!(!ok, "{retry}");
    assert_eq!(kind(&retry), "expired", "{retry}");
    assert!(retry["message"].as_str().unwrap().contains("not run again"), "{retry}");
    assert_eq!(w.refunds_of(100), 1, "a pruned call never runs again");
    // A blind repeat of the unknown refund under a new id: still held.
    let (ok, repeat) = w.refund("u1-retry", 200);
    assert!(!ok && kind(&repeat) == "held", "pruning kept the open episode: {repeat}");
    assert_eq!(w.refunds_of(200), 1);
    // A new id for c1's refund after its definitive answer is a new refund, as before pruning.
    let (ok, again) = w.refund("c2", 100);
    assert!(ok, "{again}");
    assert_eq!(w.refunds_of(100), 2);
    // The action's episodes start again after pruning, and the hold rule
    // still finds the latest: a third refund whose answer is lost holds its
    // blind repeat.
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let (ok, lost) = w.refund("c3", 100);
    assert!(!ok && kind(&lost) == "outcome-unknown", "{lost}");
    let (ok, repeat) = w.refund("c3-retry", 100);
    assert!(!ok && kind(&repeat) == "held", "{repeat}");
    assert_eq!(w.refunds_of(100), 3, "c1, c2 and c3: the repeat sent nothing");
}

#[test]
fn retention_shorter_than_a_downstream_keeps_its_keys_is_refused_at_load() {
    let w = World::with(Downstream { retention_hours: 24, ..Downstream::default() });
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    text.push_str("\n[retention]\nhours = 24\n");
    std::fs::write(&w.config, text).unwrap();
    let out = w.toolguard(&["ledger", "prune"]);
    assert!(!out.status.success());
    let message = stdout_json(&out)["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("retention.hours") && message.contains("= 25"), "{message}");
    assert_eq!(w.refunds_of(100), 0);
}
