//! A task's id: the ledger's key of its call, (session, tool-call id), with
//! the session written *without* the principal's namespace, and a tag
//! sealing both to the principal that made the call: HMAC-SHA256, under a
//! key derived from the ledger's secret (`mcp/handles.rs`), of the
//! principal, the session and the call id, 128 bits kept.
//!
//! So an id cannot be guessed or enumerated — the Tasks extension requires
//! it — even by someone who knows the session and call ids: without the
//! ledger's secret there is no tag. Whoever presents an id is resolved
//! inside their own namespace and the tag checked for *them*, so another
//! principal's id, however obtained, names no task (the same `-32602` as an
//! id that never existed). Nothing is kept in memory to make an id work:
//! any host of a fleet (one ledger, one secret), and a host restarted after
//! a kill -9, opens the same id.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac as _};

/// What every task id starts with (and the version of its layout).
const PREFIX: &str = "tg2.";

/// How many bytes of the HMAC a task id keeps (128 bits).
const TAG_BYTES: usize = 16;

/// Seals and opens task ids under one key.
pub struct TaskIds<'a> {
    key: &'a [u8],
}

impl<'a> TaskIds<'a> {
    /// Task ids sealed under `key` (derived for task ids alone).
    pub fn new(key: &'a [u8]) -> Self {
        Self { key }
    }

    /// The HMAC over what the id binds: principal, session (in its
    /// namespace), call id; each length-prefixed so no two splits collide.
    fn mac(&self, principal: Option<&str>, local: &str, call_id: &str) -> Hmac<sha2::Sha256> {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(self.key).expect("HMAC takes any key length");
        mac.update(b"toolguard task id v2");
        for part in [principal.unwrap_or(""), local, call_id] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(&[u8::from(principal.is_some())]);
        mac
    }

    /// The task id of the call (`session`, `call_id`) made by `principal`
    /// (whose namespace prefixes `session`, as `principal/…`).
    pub fn encode(&self, session: &str, call_id: &str, principal: Option<&str>) -> String {
        let local = principal.and_then(|p| session.strip_prefix(p)).and_then(|s| s.strip_prefix('/')).unwrap_or(session);
        let tag = self.mac(principal, local, call_id).finalize().into_bytes();
        format!("{PREFIX}{}.{}.{}", URL_SAFE_NO_PAD.encode(local), URL_SAFE_NO_PAD.encode(call_id), URL_SAFE_NO_PAD.encode(&tag[..TAG_BYTES]))
    }

    /// The call (session, tool-call id) that `task_id` names for
    /// `principal`: the session inside `principal`'s namespace. `None` for
    /// anything that is not a task id sealed for `principal` (the tag is
    /// compared in constant time).
    pub fn decode(&self, task_id: &str, principal: Option<&str>) -> Option<(String, String)> {
        let mut parts = task_id.strip_prefix(PREFIX)?.split('.');
        let (local, call_id, tag) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let text = |part: &str| URL_SAFE_NO_PAD.decode(part).ok().and_then(|b| String::from_utf8(b).ok()).filter(|s| !s.is_empty());
        let (local, call_id) = (text(local)?, text(call_id)?);
        let tag = URL_SAFE_NO_PAD.decode(tag).ok().filter(|t| t.len() == TAG_BYTES)?;
        self.mac(principal, &local, &call_id).verify_truncated_left(&tag).ok()?;
        let session = match principal {
            Some(p) => format!("{p}/{local}"),
            None => local,
        };
        Some((session, call_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> TaskIds<'static> {
        TaskIds::new(b"a key of the tests' own")
    }

    #[test]
    fn an_id_names_its_call_only_for_its_principal() {
        let id = ids().encode("ops/conversation-1", "toolu_01", Some("ops"));
        assert_eq!(ids().decode(&id, Some("ops")), Some(("ops/conversation-1".into(), "toolu_01".into())));
        // Another principal presenting the same id gets nothing, not its own namespace's call.
        assert_eq!(ids().decode(&id, Some("support")), None);
        assert_eq!(ids().decode(&id, None), None, "nor does an unauthenticated caller");
        // Without authentication there is no namespace, and the tag still binds.
        let open = ids().encode("conversation-1", "c.1", None);
        assert_eq!(ids().decode(&open, None), Some(("conversation-1".into(), "c.1".into())));
        assert_eq!(ids().decode(&open, Some("conversation-1")), None);
    }

    #[test]
    fn an_id_cannot_be_made_without_the_key() {
        let id = ids().encode("ops/s", "c", Some("ops"));
        assert_eq!(TaskIds::new(b"another key").decode(&id, Some("ops")), None, "another ledger's secret");
        // The call and session are readable in the id; naming another call keeps the tag, which then fails.
        let (head, tag) = id.rsplit_once('.').unwrap();
        let (_, call) = head.rsplit_once('.').unwrap();
        let forged = id.replace(call, &URL_SAFE_NO_PAD.encode("c2"));
        assert_eq!(ids().decode(&forged, Some("ops")), None);
        let mut flipped = tag.to_string().into_bytes();
        flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
        assert_eq!(ids().decode(&format!("{head}.{}", String::from_utf8(flipped).unwrap()), Some("ops")), None);
        // The unsealed layout of before is no task id now.
        let old = format!("tg1.{}.{}", URL_SAFE_NO_PAD.encode("s"), URL_SAFE_NO_PAD.encode("c"));
        assert_eq!(ids().decode(&old, Some("ops")), None);
    }

    #[test]
    fn anything_else_is_no_task() {
        for bad in ["", "tg2.", "tg2.a", "tg2..", "tg2.YQ.Yg", "tg2.YQ.Yg.", "tg2.!!.Yg.AAAA", "tg2.YQ.Yg.AAAA.x", "gate-test"] {
            assert_eq!(ids().decode(bad, None), None, "{bad}");
        }
    }
}
