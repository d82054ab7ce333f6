//! Requests that are not side effects: `outbound.fetch` (GET and HEAD inside
//! the plugin's grants, sent once, keyless and unrecorded), and — only in a
//! build with the `bench` feature — the bench's unguarded baseline, which
//! sends the same way.

use super::transport::Outcome;
use super::{Request, Response, SendError, Wires, prepare};
use crate::policy::{self, Grant};

/// A read-only request inside `grants`.
///
/// # Errors
/// Not a GET or HEAD, a body, no grant covers it, or nothing came back.
pub async fn fetch(wires: &Wires, grants: &[Grant], req: Request) -> Result<Response, SendError> {
    if !req.method.eq_ignore_ascii_case("GET") && !req.method.eq_ignore_ascii_case("HEAD") {
        let method = req.method.chars().take(32).collect::<String>();
        return Err(SendError::Invalid(format!("fetch is for GET and HEAD, not {method}; side effects go through send")));
    }
    if !req.body.is_empty() {
        return Err(SendError::Invalid("fetch sends no body (GET and HEAD carry none); nothing was sent".into()));
    }
    direct(wires, grants, req).await
}

/// `toolguard bench`'s unguarded baseline: the request authorised and sent
/// as a guarded send would be — no admission, no ledger write, no key.
/// Compiled only with the `bench` feature.
#[cfg(feature = "bench")]
pub(crate) async fn send_unguarded(wires: &Wires, grants: &[Grant], req: Request) -> Result<Response, SendError> {
    direct(wires, grants, req).await
}

/// Authorises `req` under `grants` and sends it once, keyless and unrecorded.
async fn direct(wires: &Wires, grants: &[Grant], req: Request) -> Result<Response, SendError> {
    let (downstream, url) = policy::authorize(grants, wires.downstreams(), &req.method, &req.url).map_err(SendError::from)?;
    let request = prepare::stored(&req.method, url.as_str(), req.headers, &req.body);
    prepare::check_headers(&request, &downstream).map_err(SendError::Invalid)?;
    let prepared = prepare::build(&request, url, &downstream, None);
    let mut tries = 0;
    let _http = crate::phases::time(crate::phases::Phase::Http);
    match super::transport::perform(wires.client(&downstream), &downstream, &prepared, &mut tries).await {
        Outcome::Answered { response, .. } | Outcome::Unsettled { response: Some(response), .. } => Ok(response.into()),
        Outcome::Unsettled { reason, .. } | Outcome::NotSent { reason } => Err(SendError::Transport(reason)),
    }
}
