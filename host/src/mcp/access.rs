//! Who may come in over HTTP: the static bearer tokens (each its
//! principal), or the OAuth gate with the scopes each tool needs. Read at
//! start and again on every reload, checked before the reload is swapped
//! in: a token or principal removed from the configuration is refused from
//! its next request on, and a new tool's scopes apply to its first call.

use super::oauth::gate::Gate;
use super::principals::Principal;
use crate::config::McpConfig;
use crate::reload::{Commit, Follower, Next};
use crate::runtime::Runtime;
use std::net::SocketAddr;
use std::sync::{Arc, PoisonError, RwLock};

/// The credentials accepted now.
pub(crate) struct Access {
    /// Static bearer tokens and their principals (none: no token needed, on loopback).
    pub tokens: Vec<(Principal, String)>,
    /// The OAuth 2.1 resource server, under `[mcp.oauth]` (then `tokens` is empty).
    pub oauth: Option<Arc<Gate>>,
}

impl Access {
    /// What `config` accepts for `runtime`'s tools on a server bound to
    /// `addr`; an OAuth authenticator whose settings did not change is
    /// kept from `previous` (with its cached keys).
    ///
    /// # Errors
    /// A token variable unset or too short, or nothing to authenticate
    /// with beyond loopback.
    pub(crate) fn of(config: &McpConfig, runtime: &Runtime, previous: Option<&Access>, addr: SocketAddr) -> Result<Self, String> {
        let mut tokens = Vec::new();
        for (principal, var) in config.all_tokens() {
            let token = std::env::var(&var).map_err(|_| format!("the token of principal `{principal}` is in `{var}`, which is not set"))?;
            if token.len() < 16 {
                return Err(format!("the token in `{var}` is shorter than 16 characters; use a long random one"));
            }
            tokens.push((Principal(principal), token));
        }
        let oauth = match &config.oauth {
            Some(o) => {
                let kept = previous.and_then(|p| p.oauth.as_ref()).filter(|g| format!("{:?}", g.auth.config) == format!("{o:?}"));
                let auth = match kept {
                    Some(gate) => gate.auth.clone(),
                    None => Arc::new(super::oauth::Authenticator::new(o)?),
                };
                let tools = runtime.tools().map(|t| (t.name.as_str(), t.plugin.as_str(), t.effect.as_str()));
                Some(Arc::new(Gate { scopes: super::oauth::scopes::ScopeMap::new(&o.scopes, tools), auth }))
            }
            None => None,
        };
        if !addr.ip().is_loopback() && tokens.is_empty() && oauth.is_none() {
            return Err(format!(
                "binding {addr} beyond loopback needs client authentication: set [mcp.oauth] (or, for development, [mcp] token_env or tokens)"
            ));
        }
        Ok(Self { tokens, oauth })
    }
}

/// The credentials accepted now, swapped whole by a reload.
pub(crate) struct Doors {
    current: RwLock<Arc<Access>>,
    addr: SocketAddr,
}

impl Doors {
    /// Accepting `access` on a server bound to `addr`.
    pub(crate) fn new(access: Access, addr: SocketAddr) -> Arc<Self> {
        Arc::new(Self { current: RwLock::new(Arc::new(access)), addr })
    }

    /// The credentials accepted now.
    pub(crate) fn current(&self) -> Arc<Access> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The OAuth gate now, under `[mcp.oauth]`.
    pub(crate) fn gate(&self) -> Option<Arc<Gate>> {
        self.current().oauth.clone()
    }
}

/// Follows a reload: the new configuration's credentials, swapped in after it.
pub(crate) struct Following(pub Arc<Doors>);

impl Follower for Following {
    fn prepare(&self, next: &Next<'_>) -> Result<Commit, String> {
        let access = Access::of(&next.config.mcp, next.runtime, Some(&self.0.current()), self.0.addr)?;
        let doors = self.0.clone();
        Ok(Box::new(move || *doors.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(access)))
    }
}
