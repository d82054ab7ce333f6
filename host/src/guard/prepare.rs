//! A plugin's request on its way to the wire: refusals of what a plugin may
//! not set, then the key attached the way the downstream expects.

use crate::ledger::records::{StoredBody, StoredRequest};
use crate::policy::{Downstream, KeyTransport};

/// Headers a plugin may never set: credentials are the host's to inject,
/// keys are the host's to mint, and framing is the HTTP client's.
const FORBIDDEN_HEADERS: &[&str] = &["authorization", "proxy-authorization", "idempotency-key", "host", "content-length", "transfer-encoding", "connection"];

/// A request ready to send: the plugin's, with the key (and any credential)
/// attached. Deliberately not `Debug`: it may carry a secret.
#[derive(Clone)]
pub struct Prepared {
    /// The HTTP method.
    pub method: String,
    /// The absolute URL, already checked against the grants.
    pub url: url::Url,
    /// Headers, the key and credentials included.
    pub headers: Vec<(String, String)>,
    /// The body, with the key if it travels there.
    pub body: Vec<u8>,
}

use crate::net::http::{MAX_HEADER_BYTES, MAX_HEADER_NAME_BYTES, MAX_HEADER_VALUE_BYTES, MAX_HEADERS};

/// Refuses a request whose headers the HTTP stack could not carry (too
/// many, too large, or not valid names and values — a CR, LF or NUL in a
/// value), or that sets a header only the host may set: credentials, keys
/// (the usual one and every one `d` takes), framing. Nothing is recorded or
/// sent for it.
///
/// # Errors
/// What the plugin did wrong and what to do instead.
pub fn check_headers(request: &StoredRequest, d: &Downstream) -> Result<(), String> {
    if request.headers.len() > MAX_HEADERS {
        return Err(format!("the request has {} headers; at most {MAX_HEADERS} are sent", request.headers.len()));
    }
    let total: usize = request.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    if total > MAX_HEADER_BYTES {
        return Err(format!("the request's headers take {total} bytes; at most {MAX_HEADER_BYTES} are sent"));
    }
    let key_headers: Vec<String> = d.host_headers().collect();
    for (name, value) in &request.headers {
        if name.len() > MAX_HEADER_NAME_BYTES || value.len() > MAX_HEADER_VALUE_BYTES {
            return Err(format!(
                "header `{}` is too large (names up to {MAX_HEADER_NAME_BYTES} bytes, values up to {MAX_HEADER_VALUE_BYTES})",
                name.chars().take(64).collect::<String>()
            ));
        }
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(format!("`{}` is not a valid HTTP header name", name.escape_debug()));
        }
        if http::HeaderValue::from_str(value).is_err() {
            return Err(format!("the value of header `{name}` has a character HTTP does not allow (CR, LF, NUL or another control)"));
        }
        let lower = name.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&lower.as_str()) || key_headers.contains(&lower) {
            return Err(format!("the request sets `{name}`, which only the host may set (it mints idempotency keys and injects credentials); remove it"));
        }
    }
    Ok(())
}

/// [`check_headers`], then refuses a body that already carries a key field
/// `d` takes (or that cannot carry one).
///
/// # Errors
/// What the plugin did wrong and what to do instead.
pub fn check(request: &StoredRequest, d: &Downstream) -> Result<(), String> {
    check_headers(request, d)?;
    check_method(&request.method)?;
    for transport in &d.keys {
        match transport {
            KeyTransport::FormField { name } => {
                let body = request.body.to_bytes();
                if form_urlencoded::parse(&body).any(|(k, _)| k == name.as_str()) {
                    return Err(format!("the form body sets `{name}`, which carries the host's idempotency key; remove it"));
                }
            }
            KeyTransport::JsonField { name } => {
                let mut body: serde_json::Value = serde_json::from_slice(&request.body.to_bytes())
                    .map_err(|e| format!("downstream `{}` takes its key in a JSON body, but the body is not JSON: {e}", d.name))?;
                if !body.is_object() {
                    return Err(format!("downstream `{}` takes its key in a JSON object body; the body is not an object", d.name));
                }
                if field(&body, name).is_some() {
                    return Err(format!("the JSON body sets `{name}`, which carries the host's idempotency key; remove it"));
                }
                set_field(&mut body, name, "").map_err(|e| format!("downstream `{}` takes its key at `{name}` of the JSON body, but {e}", d.name))?;
            }
            KeyTransport::Query { name } => {
                let url = url::Url::parse(&request.url).map_err(|e| format!("`{}` is not a URL: {e}", request.url))?;
                if url.query_pairs().any(|(k, _)| k == name.as_str()) {
                    return Err(format!("the URL sets query parameter `{name}`, which carries the host's idempotency key; remove it"));
                }
            }
            KeyTransport::Header { .. } | KeyTransport::SfString { .. } => {}
        }
    }
    Ok(())
}

/// Refuses a method that is not a valid HTTP token (grants list only real
/// methods, so anything else is denied anyway; this keeps it out of the ledger).
///
/// # Errors
/// Why the method cannot be sent.
pub fn check_method(method: &str) -> Result<(), String> {
    match http::Method::from_bytes(method.as_bytes()) {
        Ok(_) if method.len() <= 16 => Ok(()),
        _ => Err(format!("`{}` is not an HTTP method", method.chars().take(32).collect::<String>().escape_debug())),
    }
}

/// The wire form of a checked request, with `key` attached by every
/// transport the downstream configures (`None`: an unkeyed fetch) and the
/// downstream's credential, if it has one.
pub fn build(request: &StoredRequest, mut url: url::Url, downstream: &Downstream, key: Option<&str>) -> Prepared {
    let mut headers = request.headers.clone();
    if let (Some(spec), Some(secret)) = (&downstream.credential, &downstream.secret) {
        headers.push((spec.header.clone(), secret.expose().to_string()));
    }
    let mut body = request.body.to_bytes();
    if let Some(key) = key {
        for transport in &downstream.keys {
            match transport {
                KeyTransport::Header { name } => headers.push((name.clone(), key.to_string())),
                KeyTransport::SfString { name } => headers.push((name.clone(), format!("\"{key}\""))),
                KeyTransport::FormField { name } => {
                    let pair = form_urlencoded::Serializer::new(String::new()).append_pair(name, key).finish();
                    if !body.is_empty() {
                        body.push(b'&');
                    }
                    body.extend_from_slice(pair.as_bytes());
                }
                KeyTransport::JsonField { name } => {
                    if let Ok(mut object @ serde_json::Value::Object(_)) = serde_json::from_slice(&body)
                        && set_field(&mut object, name, key).is_ok()
                    {
                        body = serde_json::to_vec(&object).unwrap_or(body);
                    }
                }
                KeyTransport::Query { name } => {
                    url.query_pairs_mut().append_pair(name, key);
                }
            }
        }
    }
    Prepared { method: request.method.to_ascii_uppercase(), url, headers, body }
}

/// The value at `name` of a JSON body: a top-level field, or with a leading
/// `/` a JSON Pointer (RFC 6901) to a nested one.
fn field<'a>(body: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    if name.starts_with('/') { body.pointer(name) } else { body.get(name) }
}

/// Sets `name` (see [`field`]) of an object body to `key`, making the
/// objects a pointer passes through where they are missing.
///
/// # Errors
/// The pointer passes through something that is not an object.
fn set_field(body: &mut serde_json::Value, name: &str, key: &str) -> Result<(), String> {
    let path: Vec<String> = match name.strip_prefix('/') {
        Some(pointer) => pointer.split('/').map(|t| t.replace("~1", "/").replace("~0", "~")).collect(),
        None => vec![name.to_string()],
    };
    let (last, parents) = path.split_last().expect("split yields at least one token");
    let mut at = body;
    for token in parents {
        let object = at.as_object_mut().ok_or_else(|| format!("what holds `{token}` is not an object"))?;
        at = object.entry(token.clone()).or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    }
    let object = at.as_object_mut().ok_or_else(|| format!("what holds `{last}` is not an object"))?;
    object.insert(last.clone(), key.into());
    Ok(())
}

/// The plugin's request in the ledger's form.
pub fn stored(method: &str, url: &str, headers: Vec<(String, String)>, body: &[u8]) -> StoredRequest {
    StoredRequest { method: method.to_ascii_uppercase(), url: url.into(), headers, body: StoredBody::from_bytes(body) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::RawDownstream;

    fn downstream(keys: Vec<KeyTransport>) -> Downstream {
        let raw = RawDownstream { url: "http://127.0.0.1:1".into(), key: Some(keys), ..RawDownstream::default() };
        Downstream::from_raw("d", raw, std::path::Path::new(".")).unwrap()
    }

    fn request(headers: &[(&str, &str)], body: &str) -> StoredRequest {
        stored("post", "http://127.0.0.1:1/x", headers.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect(), body.as_bytes())
    }

    #[test]
    fn refuses_keys_credentials_and_framing_set_by_the_plugin() {
        let d = downstream(vec![KeyTransport::Header { name: "X-Key".into() }]);
        for header in ["Authorization", "idempotency-key", "x-key", "Host", "Content-Length"] {
            assert!(check(&request(&[(header, "v")], ""), &d).is_err(), "{header}");
        }
        assert!(check(&request(&[("Accept", "json")], ""), &d).is_ok());
        // What the HTTP stack cannot carry is refused here, before anything is recorded.
        for (name, value) in [("X-Evil", "a\r\nInjected: 1"), ("X-Nul", "a\0b"), ("Bad Name", "v"), ("", "v")] {
            assert!(check(&request(&[(name, value)], ""), &d).is_err(), "{name:?}: {value:?}");
        }
        let many: Vec<(String, String)> = (0..=MAX_HEADERS).map(|i| (format!("x-h{i}"), "v".into())).collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert!(check(&request(&many, ""), &d).unwrap_err().contains("at most 64"));
        assert!(check(&request(&many[..MAX_HEADERS], ""), &d).is_ok());
        let huge = "v".repeat(MAX_HEADER_VALUE_BYTES + 1);
        assert!(check(&request(&[("x-big", &huge)], ""), &d).is_err());
        assert!(check(&stored("GE T", "http://127.0.0.1:1/x", vec![], b""), &d).is_err());
        let form = downstream(vec![KeyTransport::FormField { name: "metadata[k]".into() }]);
        assert!(check(&request(&[], "a=1&metadata%5Bk%5D=mine"), &form).is_err());
        let json = downstream(vec![KeyTransport::JsonField { name: "idempotency_key".into() }]);
        assert!(check(&request(&[], r#"{"idempotency_key":"x"}"#), &json).is_err());
        assert!(check(&request(&[], "[1]"), &json).is_err());
        let nested = downstream(vec![KeyTransport::JsonField { name: "/options/idempotency_key".into() }]);
        assert!(check(&request(&[], r#"{"options":{"idempotency_key":"mine"}}"#), &nested).is_err(), "set by the plugin");
        assert!(check(&request(&[], r#"{"options":"flat"}"#), &nested).unwrap_err().contains("not an object"));
        assert!(check(&request(&[], r#"{"options":{"a":1}}"#), &nested).is_ok());
        assert!(check(&request(&[], r#"{"amount":1}"#), &nested).is_ok(), "missing objects are made");
        let query = downstream(vec![KeyTransport::Query { name: "idempotency_key".into() }]);
        let mine = stored("post", "http://127.0.0.1:1/x?a=1&idempotency_key=mine", vec![], b"");
        assert!(check(&mine, &query).unwrap_err().contains("query parameter `idempotency_key`"));
        assert!(check(&stored("post", "http://127.0.0.1:1/x?a=1", vec![], b""), &query).is_ok());
    }

    #[test]
    fn attaches_the_same_key_by_every_configured_transport() {
        let d = downstream(vec![
            KeyTransport::Header { name: "Idempotency-Key".into() },
            KeyTransport::SfString { name: "Idem".into() },
            KeyTransport::FormField { name: "metadata[toolguard_key]".into() },
        ]);
        let req = request(&[], "amount=5");
        let url = url::Url::parse(&req.url).unwrap();
        let wire = build(&req, url, &d, Some("tg1_abc"));
        assert!(wire.headers.contains(&("Idempotency-Key".into(), "tg1_abc".into())));
        assert!(wire.headers.contains(&("Idem".into(), "\"tg1_abc\"".into())));
        assert_eq!(String::from_utf8(wire.body).unwrap(), "amount=5&metadata%5Btoolguard_key%5D=tg1_abc");
        let json = downstream(vec![KeyTransport::JsonField { name: "idempotency_key".into() }]);
        let req = request(&[], r#"{"amount":5}"#);
        let wire = build(&req, url::Url::parse(&req.url).unwrap(), &json, Some("k"));
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&wire.body).unwrap(), serde_json::json!({"amount":5,"idempotency_key":"k"}));
        let nested = downstream(vec![KeyTransport::JsonField { name: "/options/idem~1key".into() }]);
        let req = request(&[], r#"{"amount":5,"options":{"a":1}}"#);
        let wire = build(&req, url::Url::parse(&req.url).unwrap(), &nested, Some("k"));
        let sent: serde_json::Value = serde_json::from_slice(&wire.body).unwrap();
        assert_eq!(sent, serde_json::json!({"amount":5,"options":{"a":1,"idem/key":"k"}}));
        let req = request(&[], r#"{"amount":5}"#);
        let wire = build(&req, url::Url::parse(&req.url).unwrap(), &nested, Some("k"));
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&wire.body).unwrap(), serde_json::json!({"amount":5,"options":{"idem/key":"k"}}));
        let query = downstream(vec![KeyTransport::Query { name: "idempotency_key".into() }]);
        let req = stored("post", "http://127.0.0.1:1/x?a=1", vec![], b"amount=5");
        let wire = build(&req, url::Url::parse(&req.url).unwrap(), &query, Some("tg1 abc"));
        assert_eq!(wire.url.as_str(), "http://127.0.0.1:1/x?a=1&idempotency_key=tg1+abc");
        assert_eq!(wire.body, b"amount=5", "the body is the plugin's");
        assert_eq!(req.url, "http://127.0.0.1:1/x?a=1", "the ledger keeps the plugin's URL, without the key");
    }
}
