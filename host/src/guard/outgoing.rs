//! Definitive answers on their way to their caller: produced by the guard,
//! not yet recorded as told. A call identical to one of them that arrives
//! meanwhile waits (briefly) to learn when that answer left the host: if it
//! left before the new call arrived, the caller knew the outcome and the new
//! call is a new action; if not, the two overlapped and the new one is held.
//! Only this host's answers are known here; on a fleet, a repeat reaching
//! another host in the milliseconds between an answer and its record is
//! held once more (the safe side).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an answer counts as on its way: past it, it is taken as never
/// delivered (the caller went away, or the embedder never reports).
pub(super) const DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// An action: (session, tool, args digest).
type Action = (String, String, String);

/// The answers on their way, by action and call id, since when.
#[derive(Default)]
pub(super) struct Outgoing {
    answers: Mutex<HashMap<Action, HashMap<String, Instant>>>,
    left: tokio::sync::Notify,
}

impl Outgoing {
    /// A definitive answer to `call_id` of `action` is about to be handed to its caller.
    pub fn leaving(&self, action: Action, call_id: &str) {
        let mut map = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.entry(action).or_default().insert(call_id.to_string(), Instant::now());
    }

    /// What the caller of `call_id` was told is recorded (or it never got it).
    pub fn recorded(&self, action: &Action, call_id: &str) {
        let mut map = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(calls) = map.get_mut(action) {
            calls.remove(call_id);
            if calls.is_empty() {
                map.remove(action);
            }
        }
        drop(map);
        self.left.notify_waiters();
    }

    /// Whether an answer of `action` is on its way now.
    pub fn any(&self, action: &Action) -> bool {
        let mut map = self.answers.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(calls) = map.get_mut(action) else { return false };
        calls.retain(|_, since| since.elapsed() < DELIVERY_WAIT);
        let any = !calls.is_empty();
        if !any {
            map.remove(action);
        }
        any
    }

    /// Waits until some answer is recorded, or `until`.
    pub async fn wait(&self, until: Instant) {
        let left = self.left.notified();
        let _ = tokio::time::timeout(until.saturating_duration_since(Instant::now()), left).await;
    }
}
