//! Looking an attempt whose outcome is unknown up at the provider.

use serde::Serialize;

use crate::wit::{Attempt, Header, Reconciliation, Response};

/// A plugin that can tell, by looking at the provider, whether an attempt took
/// effect. The host calls it when a send's outcome is unknown and at recovery;
/// only `fetch` is allowed here (`send` is denied).
pub trait Reconcile {
    /// Looks `attempt`, made by tool `tool` with `args_json`, up at the provider.
    /// Answer [`found`] with what the request would have returned,
    /// `Reconciliation::NotFound` when the provider has no trace of it, or
    /// `Reconciliation::StillUnknown(why)` when the look-up could not tell.
    fn reconcile(tool: &str, args_json: &str, attempt: &Attempt) -> Reconciliation;
}

/// The provider has the attempt: `body` as the JSON 200 response the request would have had.
pub fn found<T: Serialize>(body: &T) -> Reconciliation {
    match serde_json::to_vec(body) {
        Ok(body) => {
            Reconciliation::Found(Response { status: 200, headers: vec![Header { name: "content-type".into(), value: "application/json".into() }], body })
        }
        Err(e) => Reconciliation::StillUnknown(format!("the provider's object could not be written as JSON: {e}")),
    }
}
