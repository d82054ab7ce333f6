//! Schema migrations, run when a writable handle opens an older ledger.
//! Each step only adds: every record an older version wrote is kept as it
//! was and read with the defaults of the fields it lacks.

use super::retention::RetireEntry;
use super::{CallState, Durability, EpisodeOp, EpisodeRecord, Ledger, LedgerError, LedgerWrite};
use std::collections::BTreeMap;

/// 1 → 2: episodes. Schema 1 had no episodes; its hold rule held a new
/// identical call while an earlier one had an attempt pending or unknown.
/// Every call that never completed but made an attempt may still be that
/// earlier call, so each opens an episode of its action with itself as the
/// executor (several of one action: episodes 1, 2, … in admission order),
/// and a new identical call follows it. Calls that completed were answered
/// by schema-1 code before it printed them: their episodes would be closed,
/// so none is written. The write is deterministic (times from the calls),
/// so hosts of a fleet migrating at once write the same rows.
pub(super) fn to_2(ledger: &Ledger) -> Result<(), LedgerError> {
    let mut actions: BTreeMap<(String, String, String), Vec<(u64, String)>> = BTreeMap::new();
    for call in ledger.calls(None)? {
        if call.state == CallState::Completed || ledger.attempts_of_call(&call.session, &call.call_id)?.is_empty() {
            continue;
        }
        actions.entry((call.session, call.tool, call.args_digest)).or_default().push((call.created_ms, call.call_id));
    }
    let mut write = LedgerWrite::new();
    let mut opened = 0;
    for ((session, tool, args_digest), mut calls) in actions {
        calls.sort();
        for (n, (created_ms, executor)) in calls.into_iter().enumerate() {
            let episode = n as u64 + 1;
            if ledger.episode(&session, &tool, &args_digest, Some(episode))?.is_some() {
                continue; // another host of the fleet migrated first
            }
            let record = EpisodeRecord {
                session: session.clone(),
                tool: tool.clone(),
                args_digest: args_digest.clone(),
                episode,
                executor,
                closed: false,
                opened_ms: created_ms,
                closed_ms: None,
            };
            write = write.episode(EpisodeOp::Open(record));
            opened += 1;
        }
    }
    match ledger.commit(write, Durability::Synced) {
        Err(e) if !e.is_conflict() => return Err(e),
        _ => {}
    }
    ledger.backend.set_schema("2").map_err(|e| ledger.backend_err(e))?;
    tracing::info!(ledger = %ledger.location(), episodes = opened, "ledger migrated from schema 1 to 2");
    Ok(())
}

/// 2 → 3: retention. Indexes the calls of each episode, and enters every
/// unit that is final already in the retire index: completed calls outside
/// episodes at their completion, closed episodes at their closing. Only
/// index entries are added, never a record rewritten, so a fleet's hosts
/// may migrate at once while others serve; an entry read from a record
/// that changed since is harmless (pruning re-checks each unit).
pub(super) fn to_3(ledger: &Ledger) -> Result<(), LedgerError> {
    ledger.backend.backfill_episode_index().map_err(|e| ledger.backend_err(e))?;
    let calls = ledger.calls(None)?.into_iter().filter_map(|c| RetireEntry::of_call(&c));
    let episodes = ledger.backend.episodes().map_err(|e| ledger.backend_err(e))?;
    let closed = episodes.iter().filter(|e| e.closed).map(|e| RetireEntry::of_close(&e.id(), e.closed_ms.unwrap_or(e.opened_ms)));
    let entries: Vec<RetireEntry> = calls.chain(closed).collect();
    for chunk in entries.chunks(1_000) {
        let write = chunk.iter().cloned().fold(LedgerWrite::new(), LedgerWrite::retiring);
        ledger.commit(write, Durability::Synced)?;
    }
    ledger.backend.set_schema("3").map_err(|e| ledger.backend_err(e))?;
    tracing::info!(ledger = %ledger.location(), retiring = entries.len(), "ledger migrated from schema 2 to 3");
    Ok(())
}

/// 3 → 4: spending limits. The table or family of limits' uses is created
/// empty where the ledger opens (nothing to fill: no use was ever spent
/// before), so this only records the version.
pub(super) fn to_4(ledger: &Ledger) -> Result<(), LedgerError> {
    ledger.backend.set_schema("4").map_err(|e| ledger.backend_err(e))?;
    tracing::info!(ledger = %ledger.location(), "ledger migrated from schema 3 to 4");
    Ok(())
}
