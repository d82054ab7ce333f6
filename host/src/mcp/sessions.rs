//! The Streamable HTTP transport's sessions (the 2025 era's `Mcp-Session-Id`),
//! capped. Each costs the server a worker task, channels and buffers — tens
//! of KiB — and lives until closed or idle for five minutes, so a client
//! looping on `initialize` could otherwise hold gigabytes within that time.
//! A new session past `[mcp] max_sessions` closes the oldest one instead of
//! being refused: a client whose session is gone gets 404 and starts a new
//! one, as the protocol says it must, and nothing of the guard depends on
//! transport sessions (calls are keyed by tool-call id and conversation).
//! Stateless requests of the 2026 era open none.
//!
//! With bearer tokens, each principal also holds at most `[mcp]
//! max_sessions_per_principal`: its new session past that closes its own
//! oldest, so one token holder's loop closes none of another's. (rmcp asks
//! for a session without saying for whom: the bearer middleware names the
//! principal in [`PRINCIPAL`] while it serves the request.)

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId, SessionManager};
use std::collections::VecDeque;

tokio::task_local! {
    /// The authenticated principal of the HTTP request being served, if any.
    pub static PRINCIPAL: Option<String>;
}

/// rmcp's in-memory sessions, at most `max` open at once and at most
/// `per_principal` of one authenticated principal.
pub struct CappedSessions {
    inner: LocalSessionManager,
    max: usize,
    per_principal: usize,
    /// The sessions this manager made and whose they are, oldest first
    /// (some since closed or expired). Locked from the count to the insert,
    /// so concurrent `initialize`s cannot overshoot.
    made: tokio::sync::Mutex<VecDeque<(SessionId, Option<String>)>>,
}

impl CappedSessions {
    /// In-memory sessions with rmcp's defaults, at most `max` at once and
    /// `per_principal` of one principal (each at least 1: the new one).
    pub fn new(max: usize, per_principal: usize) -> Self {
        let (max, per_principal) = (max.max(1), per_principal.max(1));
        Self { inner: LocalSessionManager::default(), max, per_principal, made: tokio::sync::Mutex::default() }
    }

    /// Makes room for one more of the open sessions in `made` whose owner
    /// `counts`: closes the oldest of them until fewer than `cap` are left
    /// (`why` names the setting), and forgets them.
    async fn make_room(&self, made: &mut VecDeque<(SessionId, Option<String>)>, cap: usize, counts: impl Fn(&Option<String>) -> bool, why: &'static str) {
        let open = self.inner.sessions.read().await;
        let counted = || made.iter().filter(|(id, whose)| counts(whose) && open.contains_key(id)).map(|(id, _)| id);
        let over = (counted().count() + 1).saturating_sub(cap);
        let excess: Vec<SessionId> = counted().take(over).cloned().collect();
        drop(open);
        for id in &excess {
            // Closed now, or expired meanwhile (it leaves the map first, whatever its worker says).
            let _ = self.inner.close_session(id).await;
            tracing::debug!(session = %id, cap, why, "closed an MCP session to open a new one");
        }
        made.retain(|(id, _)| !excess.contains(id));
    }
}

impl SessionManager for CappedSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let owner = PRINCIPAL.try_with(Clone::clone).ok().flatten();
        let mut made = self.made.lock().await;
        if owner.is_some() {
            self.make_room(&mut made, self.per_principal, |whose| *whose == owner, "[mcp] max_sessions_per_principal").await;
        }
        self.make_room(&mut made, self.max, |_| true, "[mcp] max_sessions").await;
        if made.len() >= 2 * self.max {
            let open = self.inner.sessions.read().await;
            made.retain(|(id, _)| open.contains_key(id));
        }
        let (id, transport) = self.inner.create_session().await?;
        made.push_back((id.clone(), owner));
        Ok((id, transport))
    }

    async fn initialize_session(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }
}
