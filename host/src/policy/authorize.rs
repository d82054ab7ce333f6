//! The one place a plugin's request is checked against its grants, after
//! every decoding a server or proxy could apply. Deny by default.

use super::{Downstream, Downstreams, Grant};
use std::sync::Arc;
use url::Url;

/// Why a request may not go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No grant covers it.
    Denied(String),
    /// It is malformed.
    Invalid(String),
}

/// Finds the downstream a grant opens for `method url`, returning it with
/// the parsed (normalised) URL to send to.
///
/// The URL is parsed as a browser would (WHATWG): `\` becomes `/`, and dot
/// segments — literal or percent-encoded — are resolved. The path is then
/// compared with the grant's prefix *decoded*, segment by segment. What
/// could still make a downstream or a proxy route the request elsewhere than
/// the path that was checked — an encoded `/` or `\`, an encoded `%` (a
/// second decoding), a `;` path parameter, an encoded control character —
/// is refused unless the grant opts in (`allow_encoded_path`).
///
/// # Errors
/// [`Refusal::Invalid`] for a URL that does not parse or carries
/// credentials; [`Refusal::Denied`] when no grant covers the request.
pub fn authorize(grants: &[Grant], downstreams: &Downstreams, method: &str, url: &str) -> Result<(Arc<Downstream>, Url), Refusal> {
    let parsed = Url::parse(url).map_err(|e| Refusal::Invalid(format!("`{url}` is not an absolute URL: {e}")))?;
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(Refusal::Invalid("URLs may not carry credentials".into()));
    }
    let method = method.to_ascii_uppercase();
    let ambiguous = ambiguous_path(parsed.path());
    let Some(path) = decoded_path(parsed.path()) else {
        return Err(Refusal::Invalid(format!("the path of `{parsed}` does not decode to UTF-8")));
    };
    // Dot segments were resolved by the parser; one that appears only once
    // decoded (from `%2F..`) could climb out of any prefix.
    if path.split('/').any(|segment| segment == "." || segment == "..") {
        return Err(Refusal::Denied(format!("{method} {parsed}: its decoded path has a `.` or `..` segment; nothing was sent")));
    }
    for grant in grants {
        let Some(d) = downstreams.get(&grant.downstream) else { continue };
        let same_origin = parsed.scheme() == d.origin.scheme()
            && parsed.host_str() == d.origin.host_str()
            && parsed.port_or_known_default() == d.origin.port_or_known_default();
        let prefix = decoded_path(&join_paths(d.origin.path(), &grant.path_prefix)).unwrap_or_default();
        if same_origin && path_within(&path, &prefix) && grant.methods.iter().any(|m| m.eq_ignore_ascii_case(&method)) {
            if let Some(what) = ambiguous.filter(|_| !grant.allow_encoded_path) {
                return Err(Refusal::Denied(format!(
                    "{method} {parsed}: the path contains {what}, which a downstream or proxy may read as another path than \
                     the one the grant was checked against; nothing was sent (a reviewer may allow it with \
                     `allow_encoded_path = true` on the grant)"
                )));
            }
            return Ok((d.clone(), parsed));
        }
    }
    Err(Refusal::Denied(format!("{method} {parsed}: no outbound grant of this plugin covers it; nothing was sent")))
}

/// What in a (parsed, still encoded) path could be read as another path.
fn ambiguous_path(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2f") {
        Some("an encoded `/` (%2F)")
    } else if lower.contains("%5c") {
        Some("an encoded `\\` (%5C)")
    } else if lower.contains("%25") {
        Some("an encoded `%` (%25), which a second decoding turns into something else")
    } else if path.contains(';') {
        Some("a `;` path parameter, which some servers and proxies strip")
    } else if (0..0x20u8).chain([0x7f]).any(|c| lower.contains(&format!("%{c:02x}"))) {
        Some("an encoded control character")
    } else {
        None
    }
}

/// `path` percent-decoded, if that is UTF-8.
fn decoded_path(path: &str) -> Option<String> {
    percent_encoding::percent_decode_str(path).decode_utf8().ok().map(|p| p.into_owned())
}

/// `base` and `prefix` joined with exactly one slash between them.
fn join_paths(base: &str, prefix: &str) -> String {
    format!("{}/{}", base.trim_end_matches('/'), prefix.trim_start_matches('/'))
}

/// Whether `path` is `prefix` or lies below it (segment-wise).
fn path_within(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty() || path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}
