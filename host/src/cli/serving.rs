//! `toolguard ledger stats`'s view of a fleet: what each host serves, as it
//! last noted in the shared ledger, and every plugin that live hosts serve
//! under different policies (`docs/operations.md`).

use crate::ledger::ServingRecord;
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A host that noted what it serves within this long is live (hosts note it
/// at start, on each reload and every [`crate::serve`] refresh).
pub(super) const LIVE_MS: u64 = 30 * 60_000;

/// Per plugin served by more than one policy among live hosts: each policy
/// digest and the hosts serving it.
fn differing(records: &[ServingRecord], now_ms: u64) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut by_plugin: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    for record in records.iter().filter(|r| now_ms.saturating_sub(r.seen_ms) <= LIVE_MS) {
        for (plugin, served) in &record.plugins {
            by_plugin.entry(plugin.clone()).or_default().entry(served.policy_digest.clone()).or_default().push(record.host.clone());
        }
    }
    by_plugin.retain(|_, policies| policies.len() > 1);
    by_plugin
}

/// The hosts and the plugins whose policies differ among the live ones, as JSON.
pub(super) fn json(records: &[ServingRecord], now_ms: u64) -> Value {
    let hosts: Vec<Value> = records.iter().map(|r| json!({ "record": r, "live": now_ms.saturating_sub(r.seen_ms) <= LIVE_MS })).collect();
    json!({ "hosts": hosts, "policies_differ": differing(records, now_ms) })
}

/// The same, for a person.
pub(super) fn print(records: &[ServingRecord], now_ms: u64) {
    for r in records {
        let age_s = now_ms.saturating_sub(r.seen_ms) / 1000;
        let state = if now_ms.saturating_sub(r.seen_ms) <= LIVE_MS { "live" } else { "not seen lately" };
        outln!("serving     {} (generation {}, noted {age_s} s ago, {state})", super::terminal_safe(&r.host), r.generation);
        for (plugin, served) in &r.plugins {
            outln!("              {:<16} policy {} component {}", super::terminal_safe(plugin), short(&served.policy_digest), short(&served.sha256));
        }
    }
    for (plugin, policies) in differing(records, now_ms) {
        let each: Vec<String> = policies.iter().map(|(digest, hosts)| format!("{} on {}", short(digest), hosts.join(", "))).collect();
        outln!("DIFFERS     `{}` is served under {} policies: {}", super::terminal_safe(&plugin), policies.len(), super::terminal_safe(&each.join("; ")));
    }
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}
