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
//!
//! **A session is its principal's** (`docs/threat-model.md`). A session id
//! is not a credential: every request naming one — a POST of a request, a
//! notification or the answer to a server-to-client request, the GET
//! stream, its resumption, the DELETE — reaches the session only when it
//! comes from the principal that opened it. Anyone else is served exactly
//! as if the session did not exist (rmcp's 404 `Session not found`; a
//! DELETE answered 202 and nothing closed), so holding another principal's
//! session id gives no oracle, no stream, no way to answer its questions
//! and no way to end it.

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{LocalSessionManager, LocalSessionManagerError};
use rmcp::transport::streamable_http_server::session::{RestoreOutcome, ServerSseMessage, SessionId, SessionManager};
use std::collections::{HashMap, VecDeque};
use std::sync::{PoisonError, RwLock};

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
    /// The sessions this manager made, oldest first (some since closed or
    /// expired). Locked from the count to the insert, so concurrent
    /// `initialize`s cannot overshoot.
    made: tokio::sync::Mutex<VecDeque<SessionId>>,
    /// Whose each session in `made` is (`None`: opened without a principal).
    owners: RwLock<HashMap<SessionId, Option<String>>>,
}

/// The principal of the HTTP request being served (`None` without one).
fn caller() -> Option<String> {
    PRINCIPAL.try_with(Clone::clone).ok().flatten()
}

impl CappedSessions {
    /// In-memory sessions with rmcp's defaults, at most `max` at once and
    /// `per_principal` of one principal (each at least 1: the new one).
    pub fn new(max: usize, per_principal: usize) -> Self {
        let (max, per_principal) = (max.max(1), per_principal.max(1));
        Self { inner: LocalSessionManager::default(), max, per_principal, made: tokio::sync::Mutex::default(), owners: RwLock::default() }
    }

    /// Whether session `id` was opened by the principal of the request
    /// being served (an unknown id is nobody's).
    fn callers(&self, id: &SessionId) -> bool {
        let owners = self.owners.read().unwrap_or_else(PoisonError::into_inner);
        owners.get(id).is_some_and(|owner| *owner == caller())
    }

    /// The error rmcp's own manager gives for a session it does not have.
    fn not_found(id: &SessionId) -> LocalSessionManagerError {
        LocalSessionManagerError::SessionNotFound(id.clone())
    }

    /// Forgets the sessions of `made` no longer open, and their owners.
    async fn forget_closed(&self, made: &mut VecDeque<SessionId>) {
        let open = self.inner.sessions.read().await;
        made.retain(|id| open.contains_key(id));
        self.owners.write().unwrap_or_else(PoisonError::into_inner).retain(|id, _| open.contains_key(id));
    }

    /// Makes room for one more of the open sessions in `made` whose owner
    /// `counts`: closes the oldest of them until fewer than `cap` are left
    /// (`why` names the setting), and forgets them.
    async fn make_room(&self, made: &mut VecDeque<SessionId>, cap: usize, counts: impl Fn(&Option<String>) -> bool, why: &'static str) {
        let open = self.inner.sessions.read().await;
        let excess: Vec<SessionId> = {
            let owners = self.owners.read().unwrap_or_else(PoisonError::into_inner);
            let counted = || made.iter().filter(|id| owners.get(*id).is_some_and(&counts) && open.contains_key(*id));
            let over = (counted().count() + 1).saturating_sub(cap);
            counted().take(over).cloned().collect()
        };
        drop(open);
        for id in &excess {
            // Closed now, or expired meanwhile (it leaves the map first, whatever its worker says).
            let _ = self.inner.close_session(id).await;
            tracing::debug!(session = %id, cap, why, "closed an MCP session to open a new one");
        }
        made.retain(|id| !excess.contains(id));
        let mut owners = self.owners.write().unwrap_or_else(PoisonError::into_inner);
        for id in &excess {
            owners.remove(id);
        }
    }
}

impl SessionManager for CappedSessions {
    type Error = LocalSessionManagerError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let owner = caller();
        let mut made = self.made.lock().await;
        if owner.is_some() {
            self.make_room(&mut made, self.per_principal, |whose| *whose == owner, "[mcp] max_sessions_per_principal").await;
        }
        self.make_room(&mut made, self.max, |_| true, "[mcp] max_sessions").await;
        if made.len() >= 2 * self.max {
            self.forget_closed(&mut made).await;
        }
        let (id, transport) = self.inner.create_session().await?;
        self.owners.write().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), owner);
        made.push_back(id.clone());
        Ok((id, transport))
    }

    async fn initialize_session(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        // Another principal's session is one that does not exist.
        Ok(self.callers(id) && self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        // A DELETE comes in a request's scope: rmcp answers one for an unknown
        // session 202 and closes nothing, so for another principal's. rmcp also
        // closes a session whose worker ended (idle, or the server stopping),
        // from a task of its own, outside any request: that always closes.
        let from_a_request = PRINCIPAL.try_with(|_| ()).is_ok();
        if from_a_request && !self.callers(id) {
            return Ok(());
        }
        self.owners.write().unwrap_or_else(PoisonError::into_inner).remove(id);
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if !self.callers(id) {
            return Err(Self::not_found(id));
        }
        self.inner.create_stream(id, message).await
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        // The answer to a server-to-client request is taken only from the principal it was put to.
        if !self.callers(id) {
            return Err(Self::not_found(id));
        }
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if !self.callers(id) {
            return Err(Self::not_found(id));
        }
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if !self.callers(id) {
            return Err(Self::not_found(id));
        }
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(&self, id: SessionId) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session made by `principal`: its id.
    async fn made_by(sessions: &CappedSessions, principal: &str) -> SessionId {
        PRINCIPAL.scope(Some(principal.into()), sessions.create_session()).await.unwrap().0
    }

    async fn seen_by(sessions: &CappedSessions, principal: &str, id: &SessionId) -> bool {
        PRINCIPAL.scope(Some(principal.into()), sessions.has_session(id)).await.unwrap()
    }

    #[tokio::test]
    async fn a_session_is_its_principals_and_ended_only_by_it_or_by_rmcp() {
        let sessions = CappedSessions::new(10, 10);
        let id = made_by(&sessions, "a").await;
        assert!(seen_by(&sessions, "a", &id).await);
        assert!(!seen_by(&sessions, "b", &id).await, "another principal's session does not exist for it");
        // b's DELETE closes nothing.
        PRINCIPAL.scope(Some("b".into()), sessions.close_session(&id)).await.unwrap();
        assert!(seen_by(&sessions, "a", &id).await);
        // rmcp closing it after its worker ended (outside any request) removes it: no session left behind.
        sessions.close_session(&id).await.unwrap();
        assert!(!seen_by(&sessions, "a", &id).await);
        assert!(sessions.owners.read().unwrap().is_empty(), "its owner forgotten too");
        // The owner's own DELETE closes its session.
        let other = made_by(&sessions, "a").await;
        PRINCIPAL.scope(Some("a".into()), sessions.close_session(&other)).await.unwrap();
        assert!(!seen_by(&sessions, "a", &other).await);
    }
}
