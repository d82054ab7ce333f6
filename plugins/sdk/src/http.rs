//! Requests through the guard: `send` for side effects, `fetch` for reads.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::wit::{self, Header, OutboundError, ToolError};

/// An HTTP request a plugin builds and hands to the host.
///
/// It never carries an idempotency key or credentials: the host adds those
/// (and refuses a request that tries to).
#[derive(Debug, Clone)]
pub struct Request {
    inner: wit::Request,
    /// Why the request cannot be sent (a body that failed to serialise), if so.
    broken: Option<String>,
}

impl Request {
    /// A request with `method` (`GET`, `HEAD`, `POST`, `PUT`, `PATCH`, `DELETE`) to absolute `url`.
    pub fn new(method: &str, url: impl Into<String>) -> Request {
        Request { inner: wit::Request { method: method.into(), url: url.into(), headers: Vec::new(), body: Vec::new() }, broken: None }
    }

    /// A `GET` of `url`.
    pub fn get(url: impl Into<String>) -> Request {
        Request::new("GET", url)
    }

    /// A `POST` to `url`.
    pub fn post(url: impl Into<String>) -> Request {
        Request::new("POST", url)
    }

    /// Appends `pairs` to the URL's query, form-encoded.
    pub fn query(mut self, pairs: &[(&str, &str)]) -> Request {
        let query = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
        if !query.is_empty() {
            self.inner.url.push(if self.inner.url.contains('?') { '&' } else { '?' });
            self.inner.url.push_str(&query);
        }
        self
    }

    /// Adds a header (not the key header, not `Authorization`: the host owns those).
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.inner.headers.push(Header { name: name.into(), value: value.into() });
        self
    }

    /// Sets a JSON body and its `Content-Type`. If `body` cannot be written
    /// as JSON, `send`/`fetch` answer `invalid` and nothing is sent.
    pub fn json<T: Serialize>(mut self, body: &T) -> Request {
        match serde_json::to_vec(body) {
            Ok(body) => self.body("application/json", body),
            Err(e) => {
                self.broken = Some(format!("the JSON body could not be written: {e}; nothing was sent"));
                self
            }
        }
    }

    /// Sets a form-encoded body (`application/x-www-form-urlencoded`), as Stripe-like APIs take.
    pub fn form(self, pairs: &[(&str, &str)]) -> Request {
        let body = form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish();
        self.body("application/x-www-form-urlencoded", body.into_bytes())
    }

    /// Sets a raw body with its `Content-Type`.
    pub fn body(mut self, content_type: &str, body: Vec<u8>) -> Request {
        self.inner.headers.retain(|h| !h.name.eq_ignore_ascii_case("content-type"));
        self.inner.headers.push(Header { name: "Content-Type".into(), value: content_type.into() });
        self.inner.body = body;
        self
    }

    /// Sends it under the guard: checked against the grants, keyed and recorded
    /// by the host before it leaves; a repeat returns the recorded response.
    pub fn send(&self) -> Result<Response, OutboundError> {
        self.check()?;
        wit::outbound::send(&self.inner).map(Response)
    }

    /// Fetches it (`GET`/`HEAD` only): inside the grants, not keyed, not recorded.
    pub fn fetch(&self) -> Result<Response, OutboundError> {
        self.check()?;
        wit::outbound::fetch(&self.inner).map(Response)
    }

    fn check(&self) -> Result<(), OutboundError> {
        self.broken.clone().map_or(Ok(()), |why| Err(OutboundError::Invalid(why)))
    }
}

/// The downstream's answer, as the host received (or recorded) it.
#[derive(Debug, Clone)]
pub struct Response(pub wit::Response);

impl Response {
    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        self.0.status
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.0.status)
    }

    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.0.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| h.value.as_str())
    }

    /// The raw body.
    pub fn body(&self) -> &[u8] {
        &self.0.body
    }

    /// The body parsed as JSON into `T`; a body that is not is a tool failure that says so.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, ToolError> {
        serde_json::from_slice(&self.0.body)
            .map_err(|e| ToolError::Failed(format!("the provider answered HTTP {} with a body that is not the expected JSON: {e}", self.0.status)))
    }
}
