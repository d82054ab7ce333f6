//! One authorization server's signing keys: discovered from its metadata
//! (RFC 8414, or OpenID Connect discovery) or named, fetched over the
//! reviewer's TLS, cached. Keys rotate without an outage and never fail
//! open: an unknown `kid` prompts one fetch (at most one per
//! `refetch_min_seconds`, so a flood of forged `kid`s cannot hammer the
//! server); keys older than `keys_max_age_seconds` are used only while a
//! fresh fetch succeeds — past that, every token is refused.

use crate::config::{IssuerConfig, OAuthConfig};
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use url::Url;

/// The largest metadata or JWKS document read.
const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// What a key lookup found.
pub enum Lookup {
    /// The key to check the token with.
    Found(DecodingKey),
    /// No key of that id, even after a fetch (or a fetch was not allowed yet).
    UnknownKey,
    /// No usable keys: never fetched, or expired and the server cannot be reached.
    Unavailable(String),
}

/// One key of a set.
struct Key {
    kid: Option<String>,
    algorithm: Option<Algorithm>,
    key: DecodingKey,
}

#[derive(Default)]
struct State {
    keys: Vec<Key>,
    fetched: Option<Instant>,
    attempted: Option<Instant>,
    failure: Option<String>,
}

/// One issuer's keys.
pub struct IssuerKeys {
    /// The issuer identifier.
    pub issuer: String,
    /// Prepended to its principals.
    pub principal_prefix: Option<String>,
    config: IssuerConfig,
    http: reqwest::Client,
    max_age: Duration,
    refetch: Duration,
    state: Mutex<State>,
}

impl IssuerKeys {
    /// The keys of `issuer` under `oauth`'s cache rules (nothing fetched yet).
    ///
    /// # Errors
    /// Its TLS settings cannot be used.
    pub fn new(issuer: &IssuerConfig, oauth: &OAuthConfig) -> Result<Self, String> {
        let label = format!("authorization server `{}`", issuer.issuer);
        let tls = crate::net::tls::rustls_config(&issuer.tls.clone().unwrap_or_default(), &label)?;
        let http = crate::net::client(crate::net::Peer::direct(&label, Some(tls), crate::net::deadlines::AUTHORIZATION_SERVER))?;
        Ok(Self {
            issuer: issuer.issuer.clone(),
            principal_prefix: issuer.principal_prefix.clone(),
            config: issuer.clone(),
            http,
            max_age: Duration::from_secs(oauth.keys_max_age_seconds),
            refetch: Duration::from_secs(oauth.refetch_min_seconds),
            state: Mutex::new(State::default()),
        })
    }

    /// The key for a token signed with `algorithm` under `kid`.
    pub async fn lookup(&self, kid: Option<&str>, algorithm: Algorithm) -> Lookup {
        let mut state = self.state.lock().await;
        let may_fetch = |s: &State| s.attempted.is_none_or(|t| t.elapsed() >= self.refetch);
        let fresh = |s: &State| s.fetched.is_some_and(|t| t.elapsed() < self.max_age);
        if !fresh(&state) && may_fetch(&state) {
            self.fetch_into(&mut state).await;
        }
        if !fresh(&state) {
            let why = state.failure.clone().unwrap_or_else(|| "its keys have not been fetched yet".into());
            return Lookup::Unavailable(format!("the keys of `{}` are not available: {why}", self.issuer));
        }
        if let Some(key) = find(&state.keys, kid, algorithm) {
            return Lookup::Found(key);
        }
        // Perhaps the server rotated its keys: look once more, if allowed yet.
        if may_fetch(&state) {
            self.fetch_into(&mut state).await;
            if let Some(key) = find(&state.keys, kid, algorithm) {
                return Lookup::Found(key);
            }
        }
        Lookup::UnknownKey
    }

    async fn fetch_into(&self, state: &mut State) {
        state.attempted = Some(Instant::now());
        match self.fetch().await {
            Ok(keys) => {
                tracing::debug!(issuer = %self.issuer, keys = keys.len(), "fetched the authorization server's keys");
                *state = State { keys, fetched: Some(Instant::now()), attempted: state.attempted, failure: None };
            }
            Err(e) => {
                tracing::warn!(issuer = %self.issuer, "cannot fetch the authorization server's keys: {e}");
                state.failure = Some(e);
            }
        }
    }

    async fn fetch(&self) -> Result<Vec<Key>, String> {
        let document = match (&self.config.jwks_file, &self.config.jwks_uri) {
            (Some(path), _) => std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            (None, Some(uri)) => self.get(&checked_url(uri)?).await?,
            (None, None) => {
                let uri = self.discover().await?;
                self.get(&uri).await?
            }
        };
        let set: serde_json::Value = serde_json::from_slice(&document).map_err(|e| format!("its JWKS is not JSON: {e}"))?;
        let keys: Vec<Key> = set["keys"].as_array().map(|keys| keys.iter().filter_map(usable).collect()).unwrap_or_default();
        if keys.is_empty() {
            return Err("its JWKS holds no usable signing key".into());
        }
        Ok(keys)
    }

    /// The JWKS URL from the server's metadata: RFC 8414's well-known URL
    /// first, then OpenID Connect's; the metadata must name this issuer.
    async fn discover(&self) -> Result<Url, String> {
        let issuer = Url::parse(&self.issuer).map_err(|e| e.to_string())?;
        let path = issuer.path().trim_end_matches('/');
        let origin = issuer.origin().ascii_serialization();
        let candidates = [
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/')),
        ];
        let mut failures = Vec::new();
        for candidate in candidates {
            let url = Url::parse(&candidate).map_err(|e| e.to_string())?;
            match self.get(&url).await.and_then(|body| serde_json::from_slice::<serde_json::Value>(&body).map_err(|e| e.to_string())) {
                Ok(metadata) => {
                    if metadata["issuer"].as_str() != Some(self.issuer.as_str()) {
                        return Err(format!("its metadata at {url} names issuer {} (expected `{}`)", metadata["issuer"], self.issuer));
                    }
                    let uri = metadata["jwks_uri"].as_str().ok_or_else(|| format!("its metadata at {url} names no jwks_uri"))?;
                    return checked_url(uri);
                }
                Err(e) => failures.push(format!("{url}: {e}")),
            }
        }
        Err(format!("no metadata found: {}", failures.join("; ")))
    }

    async fn get(&self, url: &Url) -> Result<Vec<u8>, String> {
        let response = self.http.get(url.clone()).header("accept", "application/json").send().await.map_err(|e| format!("{url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        crate::net::body::collect_within(response, MAX_DOCUMENT_BYTES as u64).await.map_err(|e| match e {
            crate::net::body::BodyError::TooLarge => format!("{url}: larger than {MAX_DOCUMENT_BYTES} bytes"),
            crate::net::body::BodyError::Transport(e) => format!("{url}: {e}"),
            crate::net::body::BodyError::Sink(e) => format!("{url}: {e}"),
        })
    }
}

/// A URL keys may be fetched from: https, or http on loopback.
fn checked_url(text: &str) -> Result<Url, String> {
    let url = Url::parse(text).map_err(|e| format!("`{text}`: {e}"))?;
    if url.scheme() == "https" || (url.scheme() == "http" && crate::policy::is_loopback(&url)) {
        Ok(url)
    } else {
        Err(format!("`{text}` is not https: keys are fetched only over TLS (or on loopback)"))
    }
}

/// A signing key of a JWKS, if it is one this server can use: never a
/// symmetric (`oct`) key, never one marked for encryption.
fn usable(value: &serde_json::Value) -> Option<Key> {
    if value["kty"] == "oct" || value.get("use").is_some_and(|u| u != "sig") {
        return None;
    }
    let jwk: Jwk = serde_json::from_value(value.clone()).ok()?;
    let key = DecodingKey::from_jwk(&jwk).ok()?;
    let algorithm = jwk.common.key_algorithm.and_then(|a| a.to_string().parse::<Algorithm>().ok());
    Some(Key { kid: jwk.common.key_id.clone(), algorithm, key })
}

/// The key with id `kid` (or, without one, the only key) fit for `algorithm`.
fn find(keys: &[Key], kid: Option<&str>, algorithm: Algorithm) -> Option<DecodingKey> {
    let fits = |k: &&Key| k.key.family() == algorithm.family() && k.algorithm.is_none_or(|a| a == algorithm);
    match kid {
        Some(kid) => keys.iter().filter(fits).find(|k| k.kid.as_deref() == Some(kid)).map(|k| k.key.clone()),
        None => {
            let mut candidates = keys.iter().filter(fits);
            match (candidates.next(), candidates.next()) {
                (Some(only), None) => Some(only.key.clone()),
                _ => None,
            }
        }
    }
}
