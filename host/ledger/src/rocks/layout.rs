//! The RocksDB ledger's key layout: its column families and how each key is
//! built. Every variable-length field is length-prefixed, so no field can
//! run into the next and a prefix scan selects exactly one session, call or
//! action (the family table is in the module docs of [`super`]).

use crate::CallRecord;
use crate::retention::RetireEntry;

pub(super) const CF_META: &str = "meta";
pub(super) const CF_CALLS: &str = "calls";
pub(super) const CF_ATTEMPTS: &str = "attempts";
pub(super) const CF_BY_STATE: &str = "attempts_by_state";
pub(super) const CF_CALL_ATTEMPTS: &str = "call_attempts";
pub(super) const CF_GRANT_HISTORY: &str = "grant_history";
pub(super) const CF_UNSETTLED: &str = "unsettled";
pub(super) const CF_EPISODES: &str = "episodes";
pub(super) const CF_BUDGET: &str = "budget";
pub(super) const CF_EPISODE_CALLS: &str = "episode_calls";
pub(super) const CF_RETIRE: &str = "retire";
pub(super) const CF_EXPIRED: &str = "expired";
pub(super) const CF_LATEST: &str = "latest_episode";
pub(super) const CF_SPEND: &str = "spend";
pub(super) const CF_SPEND_TOTAL: &str = "spend_total";
pub(super) const ALL_CFS: [&str; 15] = [
    CF_META,
    CF_CALLS,
    CF_ATTEMPTS,
    CF_BY_STATE,
    CF_CALL_ATTEMPTS,
    CF_GRANT_HISTORY,
    CF_UNSETTLED,
    CF_EPISODES,
    CF_BUDGET,
    CF_EPISODE_CALLS,
    CF_RETIRE,
    CF_EXPIRED,
    CF_LATEST,
    CF_SPEND,
    CF_SPEND_TOTAL,
];

pub(super) fn session_prefix(session: &str) -> Vec<u8> {
    length_prefixed(session)
}

/// `field` after its length: no field can run into the next.
pub(super) fn length_prefixed(field: &str) -> Vec<u8> {
    let mut k = (field.len() as u32).to_be_bytes().to_vec();
    k.extend_from_slice(field.as_bytes());
    k
}

pub(super) fn call_key(session: &str, call_id: &str) -> Vec<u8> {
    let mut k = session_prefix(session);
    k.extend_from_slice(&(call_id.len() as u32).to_be_bytes());
    k.extend_from_slice(call_id.as_bytes());
    k
}

/// The key of a limit's running total in `spend_total`: its scope (length-
/// prefixed, as its uses' keys begin) and the end of the window it sums.
pub(super) fn spend_total_key(scope_prefix: &[u8], until_ms: u64) -> Vec<u8> {
    [scope_prefix, &until_ms.to_be_bytes()].concat()
}

/// A limit's use as stored in `spend`: its amount and its window's end.
pub(super) fn use_value(amount: u64, until_ms: u64) -> Vec<u8> {
    [amount.to_be_bytes(), until_ms.to_be_bytes()].concat()
}

/// [`use_value`] read back: `(amount, window end)`, or `None` if damaged.
pub(super) fn use_of(value: &[u8]) -> Option<(u64, u64)> {
    let amount = u64::from_be_bytes(value.get(..8)?.try_into().ok()?);
    Some((amount, u64::from_be_bytes(value.get(8..16)?.try_into().ok()?)))
}

/// A running total as stored: an `i64`, big-endian (a release's operand is negative).
pub(super) fn total_of(bytes: &[u8]) -> i64 {
    bytes.try_into().map(i64::from_be_bytes).unwrap_or(0)
}

/// The smallest key greater than every key starting with `prefix`, if any.
pub(super) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut upper = prefix.to_vec();
    while let Some(last) = upper.pop() {
        if last < u8::MAX {
            upper.push(last + 1);
            return Some(upper);
        }
    }
    None
}

/// Length-prefixed (session, tool, args digest): one action, whatever its call id.
pub(super) fn action_prefix(session: &str, tool: &str, args_digest: &str) -> Vec<u8> {
    let mut k = Vec::new();
    for field in [session, tool, args_digest] {
        k.extend_from_slice(&(field.len() as u32).to_be_bytes());
        k.extend_from_slice(field.as_bytes());
    }
    k
}

/// An action's prefix, then the episode number: episodes sort by number.
pub(super) fn episode_key(session: &str, tool: &str, args_digest: &str, episode: u64) -> Vec<u8> {
    let mut k = action_prefix(session, tool, args_digest);
    k.extend_from_slice(&episode.to_be_bytes());
    k
}

/// The retire index's key of `entry`: time, then the unit.
pub(super) fn retire_key(entry: &RetireEntry) -> Vec<u8> {
    [entry.at_ms.to_be_bytes().as_slice(), entry.unit.as_bytes()].concat()
}

/// The episode-calls index's key of a call in episode `n` of its action.
pub(super) fn episode_call_key(call: &CallRecord, n: u64) -> Vec<u8> {
    let mut k = episode_key(&call.session, &call.tool, &call.args_digest, n);
    k.extend_from_slice(call.call_id.as_bytes());
    k
}

/// Where, in `meta`, each host's [`crate::ServingRecord`] lives.
pub(super) const SERVING_PREFIX: &[u8] = b"serving/";

/// The `meta` key of `host`'s serving record.
pub(super) fn serving_key(host: &str) -> Vec<u8> {
    [SERVING_PREFIX, host.as_bytes()].concat()
}
