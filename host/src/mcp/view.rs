//! What MCP clients see of the generation serving now: its runtime and its
//! tool list. A reload swaps it whole ([`crate::reload::Follower`]); when
//! the tools changed — names, descriptions, schemas, annotations — every
//! session that initialized (2025-11-25), and every `subscriptions/listen`
//! stream that asked for tool changes (2026-07-28), is sent
//! `notifications/tools/list_changed`.

use crate::policy::Effect;
use crate::reload::{Commit, Follower, Next};
use crate::runtime::Runtime;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use rmcp::service::SubscriptionSink;
use rmcp::{Peer, RoleServer};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

/// One generation as MCP serves it.
pub(crate) struct View {
    /// The runtime a call made now runs in (and keeps until it ends).
    pub runtime: Arc<Runtime>,
    /// Tools in name order, each with its enforced class.
    pub tools: BTreeMap<String, (Tool, Effect)>,
}

impl View {
    /// The MCP view of `runtime`'s tools.
    pub(crate) fn of(runtime: Arc<Runtime>) -> Self {
        let tools = runtime
            .tools()
            .map(|t| {
                let input: JsonObject = t.input_schema.json().as_object().cloned().unwrap_or_default();
                let mut tool = Tool::new(t.name.clone(), t.description.clone(), Arc::new(input));
                if let Some(output) = t.output_schema.as_ref().and_then(|s| s.json().as_object().cloned()) {
                    tool = tool.with_raw_output_schema(Arc::new(output));
                }
                let read_only = t.effect == Effect::ReadOnly;
                let annotations = ToolAnnotations::new()
                    .read_only(read_only)
                    .destructive(t.effect == Effect::Irreversible)
                    // Repeating an idempotent (or read-only) call changes nothing more,
                    // and the guard deduplicates by tool-call id; an irreversible one is a new effect.
                    .idempotent(t.effect != Effect::Irreversible)
                    .open_world(runtime.has_grants(&t.plugin));
                (t.name.clone(), (tool.with_annotations(annotations), t.effect))
            })
            .collect();
        Self { runtime, tools }
    }

    /// The tool list as clients receive it, for comparing two generations.
    fn listed(&self) -> serde_json::Value {
        serde_json::to_value(self.tools.values().map(|(t, _)| t).collect::<Vec<_>>()).unwrap_or_default()
    }
}

/// The view serving now, and the sessions to tell when its tools change.
pub(crate) struct Views {
    current: RwLock<Arc<View>>,
    peers: Mutex<Vec<Peer<RoleServer>>>,
    /// Open `subscriptions/listen` streams, by a number of their own.
    streams: Mutex<Vec<(u64, SubscriptionSink)>>,
    next_stream: std::sync::atomic::AtomicU64,
}

impl Views {
    /// Serving `runtime`.
    pub(crate) fn new(runtime: Arc<Runtime>) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::new(View::of(runtime))),
            peers: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            next_stream: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The view serving now.
    pub(crate) fn current(&self) -> Arc<View> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Remembers a session that initialized, to tell it of tool changes
    /// (closed ones are forgotten when telling fails).
    pub(crate) fn joined(&self, peer: Peer<RoleServer>) {
        let mut peers = self.peers.lock().unwrap_or_else(PoisonError::into_inner);
        peers.retain(|p| !p.is_transport_closed());
        peers.push(peer);
    }

    /// Tells `sink`'s stream of tool changes until [`Views::closed`] with the answered number.
    pub(crate) fn listening(&self, sink: SubscriptionSink) -> u64 {
        let id = self.next_stream.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).push((id, sink));
        id
    }

    /// Forgets the stream numbered `id` (it ended).
    pub(crate) fn closed(&self, id: u64) {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).retain(|(n, _)| *n != id);
    }

    /// Tells every session and every listening stream the tool list changed.
    fn tell(self: &Arc<Self>) {
        let peers: Vec<Peer<RoleServer>> = self.peers.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let streams: Vec<SubscriptionSink> = self.streams.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(_, s)| s.clone()).collect();
        tokio::spawn(async move {
            for peer in peers {
                if let Err(e) = peer.notify_tool_list_changed().await {
                    tracing::debug!(error = %e, "a session was not told the tool list changed (it has closed)");
                }
            }
            for stream in streams {
                if let Err(e) = stream.notify_tool_list_changed().await {
                    tracing::debug!(error = %e, "a listening stream was not told the tool list changed (it has closed)");
                }
            }
        });
    }
}

/// Follows a reload: the new generation's view, swapped in after it.
pub(crate) struct Following(pub Arc<Views>);

impl Follower for Following {
    fn prepare(&self, next: &Next<'_>) -> Result<Commit, String> {
        let view = Arc::new(View::of(next.runtime.clone()));
        let changed = view.listed() != self.0.current().listed();
        let views = self.0.clone();
        Ok(Box::new(move || {
            *views.current.write().unwrap_or_else(PoisonError::into_inner) = view;
            if changed {
                views.tell();
            }
        }))
    }
}
