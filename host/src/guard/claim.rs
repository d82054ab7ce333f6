//! What every step that acts on a tool call holds first: the call's lock in
//! this process, and on a shared ledger the call's claim, so that no two
//! runs — here or on another host — act on one call at once. Admission takes
//! them before a plugin runs; recovery before it re-sends or reconciles.

use super::Guard;
use super::landing::Landing;
use crate::ledger::records::{CallRecord, now_ms};
use crate::ledger::{Claim, LedgerError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The lock a run of one tool call (session, call id) holds, with the
/// completion its last run queued and nobody has waited for yet.
pub(super) type CallLock = Arc<tokio::sync::Mutex<Option<Landing>>>;

/// A held call lock.
pub(super) type Held = tokio::sync::OwnedMutexGuard<Option<Landing>>;

/// The lock under which the guard decides about one action (session, tool, digest).
pub(super) type ActionLock = Arc<tokio::sync::Mutex<()>>;

/// How often a host waits for another host's run of the same tool call.
pub(super) const CLAIM_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// What a lock keeps for its next holder; while it is busy, the lock stays
/// in its map even when nobody holds or waits for it.
pub(super) trait Slot: Default {
    /// Whether the slot still holds something the next holder must wait for.
    fn busy(&mut self) -> bool;
}

impl Slot for () {
    fn busy(&mut self) -> bool {
        false
    }
}

impl Slot for Option<Landing> {
    fn busy(&mut self) -> bool {
        self.as_mut().is_some_and(|landing| !landing.landed())
    }
}

/// Locks by name, each dropped from the map once nobody holds or waits for
/// it and its slot is not busy.
pub(super) struct Locks<K, V = ()> {
    map: Mutex<HashMap<K, Arc<tokio::sync::Mutex<V>>>>,
    /// How many locks the map kept when it was last swept.
    kept: std::sync::atomic::AtomicUsize,
}

impl<K, V> Default for Locks<K, V> {
    fn default() -> Self {
        Self { map: Mutex::new(HashMap::new()), kept: std::sync::atomic::AtomicUsize::new(0) }
    }
}

impl<K: std::hash::Hash + Eq, V: Slot> Locks<K, V> {
    /// The lock of `key`. Locks nobody uses are swept out once the map has
    /// doubled since its last sweep: a sweep per call would cost as many
    /// steps as there are calls in flight.
    pub fn get(&self, key: K) -> Arc<tokio::sync::Mutex<V>> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if map.len() >= 2 * self.kept.load(Relaxed) + 64 {
            map.retain(|_, l| Arc::strong_count(l) > 1 || l.try_lock().map_or(true, |mut slot| slot.busy()));
            self.kept.store(map.len(), Relaxed);
        }
        map.entry(key).or_default().clone()
    }

    /// Whether the lock of `key` is held right now, or its slot is busy.
    pub fn held(&self, key: &K) -> bool {
        let map = self.map.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(key).is_some_and(|l| l.try_lock().map_or(true, |mut slot| slot.busy()))
    }
}

/// Runs a ledger operation `f` on the blocking pool, so it never blocks an
/// async worker. The hot path uses `Ledger::read` and `Ledger::commit_async`
/// instead; this serves claims and recovery.
pub(super) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a ledger task panicked")
}

impl Guard {
    /// The lock of tool call (session, call id).
    pub(super) fn call_lock(&self, session: &str, call_id: &str) -> CallLock {
        self.in_flight.get((session.to_string(), call_id.to_string()))
    }

    /// Takes the lock of tool call (session, call id), waiting for a run of
    /// it in progress, and then for the completion its last run queued: what
    /// is read under the lock is what the ledger holds. Cancel-safe.
    pub(super) async fn lock_call(&self, session: &str, call_id: &str) -> Held {
        let mut held = self.call_lock(session, call_id).lock_owned().await;
        // Left in the lock while it is waited for: cancelled, the next holder waits.
        if let Some(landing) = held.as_mut() {
            let _ = landing.wait().await;
        }
        *held = None;
        held
    }

    /// The lock under which the guard decides about an action (session, tool, args digest).
    pub(super) fn action_lock(&self, session: &str, tool: &str, args_digest: &str) -> ActionLock {
        self.actions.get((session.to_string(), tool.to_string(), args_digest.to_string()))
    }

    /// Whether a run of tool call (session, call id) holds its lock right now.
    pub(super) fn in_progress(&self, session: &str, call_id: &str) -> bool {
        self.in_flight.held(&(session.to_string(), call_id.to_string()))
    }

    /// Claims `record` (`persisted`: it is in the ledger already) for this
    /// host for `lease_ms`, its lock held by the caller. On a shared ledger
    /// this is one conditional write (see `Ledger::claim_call`); on a host's
    /// own ledger the lock is the claim, nothing is written and the call is
    /// ours to run.
    ///
    /// # Errors
    /// The ledger cannot be read or written.
    pub(super) async fn claim(&self, record: CallRecord, persisted: bool, lease_ms: u64) -> Result<Claim, LedgerError> {
        if !self.ledger.shared() {
            return Ok(Claim::Run { record, persisted });
        }
        let claim = CallRecord { owner: Some(self.host.clone()), lease_until_ms: Some(now_ms() + lease_ms), ..record };
        let ledger = self.ledger.clone();
        // A claim is ours again if it landed before the connection was lost:
        // made once more, it finds its own owner and holds.
        blocking(move || match ledger.claim_call(&claim, now_ms()) {
            Err(e) if e.is_lost() => ledger.claim_call(&claim, now_ms()),
            claimed => claimed,
        })
        .await
    }

    /// Ends this host's claim on a call that did not complete, so another host
    /// may retry it at once (a no-op on a host's own ledger).
    pub(crate) async fn release(&self, record: &CallRecord) {
        if !self.ledger.shared() {
            return;
        }
        let (ledger, session, call_id, host) = (self.ledger.clone(), record.session.clone(), record.call_id.clone(), self.host.clone());
        if let Err(e) = blocking(move || ledger.release_call(&session, &call_id, &host)).await {
            tracing::warn!(error = %e, call_id = %record.call_id, "could not release a tool call's claim; it lapses with its lease");
        }
    }
}

/// `hostname-pid-random`: names this process in claims, unique even when a
/// host restarts with the same pid.
pub(super) fn host_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "host".into(), |s| s.trim().to_string());
    let mut nonce = [0u8; 4];
    let _ = getrandom::fill(&mut nonce);
    format!("{name}-{}-{}", std::process::id(), hex::encode(nonce))
}
