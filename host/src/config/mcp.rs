//! `[mcp]`: how `toolguard serve` speaks MCP (`docs/mcp.md`).

use serde::Deserialize;

/// What to do with a side-effecting MCP `tools/call` that carries no tool-call id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum MissingCallId {
    /// Refuse it with an `isError` result saying what to send (the default).
    #[default]
    Refuse,
    /// Weaker, opt-in: use a digest of the tool and arguments as the call id,
    /// so identical calls in a session are one call — a blind retry is
    /// deduplicated, but so is a genuine repeat.
    DeriveFromArguments,
}

/// `[mcp]`: how `toolguard serve` speaks MCP (see `docs/mcp.md`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpConfig {
    /// The session of calls whose client names none.
    pub default_session: String,
    /// See [`MissingCallId`].
    pub missing_call_id: MissingCallId,
    /// An environment variable holding the bearer token HTTP clients must
    /// send; required when `--http` binds beyond loopback. Shorthand for one
    /// entry of `tokens`, whose principal is `token_principal`.
    pub token_env: Option<String>,
    /// The principal of clients that present `token_env`'s token.
    pub token_principal: String,
    /// Bearer tokens, each its own principal: the sessions a token's
    /// holders name live in that principal's namespace, and budgets per
    /// principal count them together.
    pub tokens: Vec<McpToken>,
    /// Host names (or `host:port`) accepted besides loopback, for DNS-rebinding protection.
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`scheme://host[:port]`, `:*` for any port, or
    /// `null`) whose requests are served besides the server's own; a
    /// request carrying any other `Origin` is refused 403. Empty (the
    /// default): only the server's own origin — MCP clients that are not
    /// browsers send none.
    pub allowed_origins: Vec<String>,
    /// Largest HTTP request body accepted.
    pub max_request_bytes: usize,
    /// Most Streamable HTTP sessions (`Mcp-Session-Id`) open at once; a
    /// new one past it closes the oldest ([`crate::mcp::sessions`]).
    pub max_sessions: usize,
    /// Most of those one authenticated principal holds: a new one past it
    /// closes that principal's own oldest, so a token holder looping on
    /// `initialize` cannot close other principals' sessions.
    pub max_sessions_per_principal: usize,
    /// Most tool calls one authenticated principal has running (or waiting
    /// for an instance) at once; one more is answered `busy` and not run
    /// ([`crate::mcp::principals`]).
    pub max_calls_per_principal: usize,
    /// Most HTTP requests one authenticated principal has open at once —
    /// bodies being read, responses being streamed, GET streams — past which
    /// its next request is answered 429 ([`crate::mcp::principals`]).
    pub max_requests_per_principal: usize,
    /// Most MCP tasks one authenticated principal has unsettled on a host
    /// at once; a call past it is answered `busy`, nothing run.
    pub max_tasks_per_principal: usize,
    /// Most approval requests one authenticated principal's calls may open
    /// per hour, over the fleet (counted in the ledger, in the same write
    /// as the request); a call past it is answered `busy`, nobody asked.
    pub max_approval_requests_per_principal_hour: u32,
    /// Most HTTP connections open at once ([`crate::mcp::listen`]).
    pub max_connections: usize,
    /// An environment variable holding the operator's bearer token: with
    /// it, `serve --http` also serves `/approvals` (list and decide
    /// approvals, `docs/tasks.md`); never a client's token.
    pub operator_token_env: Option<String>,
    /// For a client that opted into MCP Tasks: how long a side-effecting
    /// call may run before it is answered with a task instead of waiting
    /// (`docs/tasks.md`).
    pub task_after_ms: u64,
    /// Tools served only as MCP tasks: a client that did not opt into the
    /// tasks extension gets `-32021`, and a 2026-07-28 client is asked the
    /// tool's first questions on the `tools/call` itself, its task begun
    /// once they are answered (`docs/questions.md`).
    pub tasks_required: Vec<String>,
    /// How often a task's client is asked to poll (`pollIntervalMs`), and
    /// the first pause before the host tries again to settle a call whose
    /// outcome is not yet known (doubling up to a minute).
    pub task_poll_ms: u64,
    /// How long a task is kept for `tasks/get` after it was created
    /// (`ttlMs`); its call stays in the ledger for its retention either way.
    pub task_ttl_ms: u64,
    /// `serve --http` as an OAuth 2.1 resource server: principals and
    /// scopes from the platform's identity provider (`docs/mcp.md`).
    pub oauth: Option<super::OAuthConfig>,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            default_session: "default".into(),
            missing_call_id: MissingCallId::Refuse,
            token_env: None,
            token_principal: "token-holder".into(),
            tokens: Vec::new(),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_request_bytes: 1 << 20,
            max_sessions: 1_000,
            max_sessions_per_principal: 100,
            max_calls_per_principal: 64,
            max_requests_per_principal: 256,
            max_tasks_per_principal: 256,
            max_approval_requests_per_principal_hour: 100,
            max_connections: 4_096,
            operator_token_env: None,
            task_after_ms: 2_000,
            tasks_required: Vec::new(),
            task_poll_ms: 1_000,
            task_ttl_ms: 3_600_000,
            oauth: None,
        }
    }
}

/// One bearer token of `[mcp] tokens` and whom it stands for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToken {
    /// The principal: 1–64 of `A-Z a-z 0-9 . _ -`.
    pub principal: String,
    /// The environment variable holding the token (read at start; never logged).
    pub token_env: String,
}

impl McpConfig {
    /// Every token, `token_env` included, as (principal, variable).
    pub fn all_tokens(&self) -> Vec<(String, String)> {
        let legacy = self.token_env.iter().map(|v| (self.token_principal.clone(), v.clone()));
        legacy.chain(self.tokens.iter().map(|t| (t.principal.clone(), t.token_env.clone()))).collect()
    }
}

/// Whether `name` may be a principal: it prefixes session ids, so it must
/// be short and unable to contain the separator.
pub fn valid_principal(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Whether `origin` is a well-formed `[mcp] allowed_origins` entry: `null`,
/// or an origin [`split_origin`] reads.
pub fn valid_origin(origin: &str) -> bool {
    origin == "null" || split_origin(origin).is_some()
}

/// An origin `http[s]://host[:port]` as (scheme, host, port) — the port the
/// one written (digits, or `*` for any), else the scheme's default (RFC
/// 6454); `None` for anything else (another scheme, a path, userinfo, a
/// query). The one reading of an origin, for the config's check and the
/// server's (`mcp/origin.rs`); case is the caller's to fold.
pub fn split_origin(origin: &str) -> Option<(&str, &str, &str)> {
    let (scheme, authority) = origin.split_once("://")?;
    let default = match scheme {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    let (host, port) = match authority.rsplit_once(':') {
        // `[::1]:8080`, `host:8080`, `host:*`; a bare IPv6 literal has its colons inside brackets.
        Some((host, port)) if !port.contains(']') => (host, port),
        _ => (authority, default),
    };
    let host_ok = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '[' | ']' | ':'));
    let port_ok = port == "*" || (!port.is_empty() && port.len() <= 5 && port.chars().all(|c| c.is_ascii_digit()));
    (host_ok && port_ok).then_some((scheme, host, port))
}

/// How MCP listens only a restart changes; who may come in (the tokens, and
/// `[mcp.oauth]`'s issuers, claims and scopes) a reload applies. Whether
/// OAuth is on at all, and its resource (the metadata's paths), need a restart.
impl super::RestartOnly for McpConfig {
    fn restart_only_changes(&self, new: &Self) -> Vec<String> {
        use super::restart::differs;
        // Every field, named: a reload applies those bound to `_`.
        let McpConfig {
            default_session,
            missing_call_id,
            token_env: _,
            token_principal: _,
            tokens: _,
            allowed_hosts,
            allowed_origins,
            max_request_bytes,
            max_sessions,
            max_sessions_per_principal,
            max_calls_per_principal,
            max_requests_per_principal,
            max_tasks_per_principal,
            max_approval_requests_per_principal_hour,
            max_connections,
            operator_token_env,
            task_after_ms,
            tasks_required,
            task_poll_ms,
            task_ttl_ms,
            oauth,
        } = self;
        let resource = |o: &Option<super::OAuthConfig>| o.as_ref().map(|o| o.resource.clone());
        [
            differs("`[mcp] default_session`", default_session, &new.default_session),
            differs("`[mcp] missing_call_id`", missing_call_id, &new.missing_call_id),
            differs("`[mcp] allowed_hosts`", allowed_hosts, &new.allowed_hosts),
            differs("`[mcp] allowed_origins`", allowed_origins, &new.allowed_origins),
            differs("`[mcp] max_request_bytes`", max_request_bytes, &new.max_request_bytes),
            differs("`[mcp] max_sessions`", max_sessions, &new.max_sessions),
            differs("`[mcp] max_sessions_per_principal`", max_sessions_per_principal, &new.max_sessions_per_principal),
            differs("`[mcp] max_calls_per_principal`", max_calls_per_principal, &new.max_calls_per_principal),
            differs("`[mcp] max_requests_per_principal`", max_requests_per_principal, &new.max_requests_per_principal),
            differs("`[mcp] max_tasks_per_principal`", max_tasks_per_principal, &new.max_tasks_per_principal),
            differs(
                "`[mcp] max_approval_requests_per_principal_hour`",
                max_approval_requests_per_principal_hour,
                &new.max_approval_requests_per_principal_hour,
            ),
            differs("`[mcp] max_connections`", max_connections, &new.max_connections),
            differs("`[mcp] operator_token_env`", operator_token_env, &new.operator_token_env),
            differs("`[mcp] task_after_ms`", task_after_ms, &new.task_after_ms),
            differs("`[mcp] tasks_required`", tasks_required, &new.tasks_required),
            differs("`[mcp] task_poll_ms`", task_poll_ms, &new.task_poll_ms),
            differs("`[mcp] task_ttl_ms`", task_ttl_ms, &new.task_ttl_ms),
            differs("`[mcp.oauth]` (on or off, or its `resource`)", &resource(oauth), &resource(&new.oauth)),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}
