//! A task's id: the ledger's key of its call, (session, tool-call id), with
//! the session written *without* the principal's namespace. Whoever asks
//! about a task id is resolved inside their own namespace, so a principal
//! can name only its own tasks: another principal's id, however obtained,
//! names a call that does not exist for the asker. Nothing is kept in
//! memory to make an id work: any host of a fleet, and a host restarted
//! after a kill -9, reads the same call.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What every task id starts with (and the version of its layout).
const PREFIX: &str = "tg1.";

/// The task id of the call (`session`, `call_id`) made by `principal`
/// (whose namespace prefixes `session`, as `principal/…`).
pub fn encode(session: &str, call_id: &str, principal: Option<&str>) -> String {
    let local = principal.and_then(|p| session.strip_prefix(p)).and_then(|s| s.strip_prefix('/')).unwrap_or(session);
    format!("{PREFIX}{}.{}", URL_SAFE_NO_PAD.encode(local), URL_SAFE_NO_PAD.encode(call_id))
}

/// The call (session, tool-call id) that `task_id` names for `principal`:
/// the session inside `principal`'s namespace. `None` for anything that is
/// not a task id of this layout.
pub fn decode(task_id: &str, principal: Option<&str>) -> Option<(String, String)> {
    let (local, call_id) = task_id.strip_prefix(PREFIX)?.split_once('.')?;
    let text = |part: &str| URL_SAFE_NO_PAD.decode(part).ok().and_then(|b| String::from_utf8(b).ok()).filter(|s| !s.is_empty());
    let (local, call_id) = (text(local)?, text(call_id)?);
    let session = match principal {
        Some(p) => format!("{p}/{local}"),
        None => local,
    };
    Some((session, call_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_call_in_the_askers_namespace() {
        let id = encode("ops/conversation-1", "toolu_01", Some("ops"));
        assert_eq!(decode(&id, Some("ops")), Some(("ops/conversation-1".into(), "toolu_01".into())));
        // Another principal asking with the same id lands in its own namespace.
        assert_eq!(decode(&id, Some("support")), Some(("support/conversation-1".into(), "toolu_01".into())));
        // Without authentication there is no namespace.
        let open = encode("conversation-1", "c.1", None);
        assert_eq!(decode(&open, None), Some(("conversation-1".into(), "c.1".into())));
    }

    #[test]
    fn anything_else_is_no_task() {
        for bad in ["", "tg1.", "tg1.a", "tg1..", "tg2.YQ.Yg", "tg1.!!.Yg", "tg1.YQ.", "gate-test"] {
            assert_eq!(decode(bad, None), None, "{bad}");
        }
    }
}
