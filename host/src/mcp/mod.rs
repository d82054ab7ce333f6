//! `toolguard serve`: the loaded tools as an MCP server, over stdio or
//! Streamable HTTP, with the official Rust SDK (rmcp). Both protocol eras
//! are answered (2025-11-25 with its `initialize` handshake, and the
//! stateless 2026-07-28). The tool-call and session ids that scope the
//! guard's keys come from `_meta` (see [`ids`] and `docs/mcp.md`).
//! [`client`] is the minimal Streamable HTTP client the benchmarks and the
//! integration tests drive it with.

mod access;
mod approval;
pub mod client;
mod delivery;
mod handles;
pub mod http;
pub mod ids;
pub mod listen;
pub mod oauth;
mod operator;
mod origin;
pub mod principals;
mod questions;
mod request_ids;
pub mod results;
pub mod sessions;
mod task_calls;
pub mod tasks;
mod view;

use crate::config::McpConfig;
use crate::error::ErrorKind;
use crate::policy::Effect;
use crate::runtime::{CallRequest, Runtime};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock, GetTaskParams, GetTaskResult, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::{NotificationContext, RequestContext, SubscriptionContext};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt as _};
use std::sync::Arc;

/// The MCP face of the generation serving now. Cheap to clone: the HTTP
/// transport makes one per request.
#[derive(Clone)]
pub struct McpHost {
    /// What serves now, and how to reload it.
    pub(crate) live: Arc<crate::reload::Live>,
    /// The runtime and tool list MCP serves now ([`view`]).
    views: Arc<view::Views>,
    config: Arc<McpConfig>,
    /// Each principal's tool calls in flight (`[mcp] max_calls_per_principal`).
    in_flight: Arc<principals::CallsInFlight>,
    /// Over stdio: answers waiting for their response to be written.
    pending: Option<Arc<delivery::Pending>>,
    /// The MCP tasks this host drives ([`tasks`]).
    tasks: Arc<tasks::Tasks>,
    /// Seals the handles clients hand back: `requestState` ([`questions`]) and task ids ([`tasks::id`]).
    handles: Arc<handles::Handles>,
}

impl McpHost {
    /// The MCP view of what `live` serves, following its reloads.
    pub fn new(live: Arc<crate::reload::Live>, config: McpConfig) -> Self {
        let views = view::Views::new(live.runtime());
        live.follow(Arc::new(view::Following(views.clone())));
        let in_flight = principals::CallsInFlight::new(config.max_calls_per_principal);
        let tasks = Arc::new(tasks::Tasks::new(views.clone(), &config));
        if let Some(guard) = live.runtime().guard() {
            guard.limit_approval_requests(config.max_approval_requests_per_principal_hour);
        }
        Self { live, views, config: Arc::new(config), in_flight, pending: None, tasks, handles: Arc::default() }
    }

    /// The runtime a call made now runs in.
    pub(crate) fn runtime(&self) -> Arc<Runtime> {
        self.views.current().runtime.clone()
    }

    /// Serves MCP over stdin/stdout until the client goes away.
    ///
    /// # Errors
    /// The transport failed.
    pub async fn serve_stdio(mut self) -> anyhow::Result<()> {
        let pending = Arc::new(delivery::Pending::default());
        self.pending = Some(pending.clone());
        // Both ends are pipes when a client launched us (the usual case): then
        // they are driven by the IO reactor, not one blocking-pool hand-off per
        // message; anything else falls back to tokio's blocking stdio.
        let (stdin, stdout) = rmcp::transport::stdio_pipes();
        let inner = rmcp::transport::async_rw::AsyncRwTransport::new_server(stdin, stdout);
        let transport = delivery::Delivering { inner, pending };
        let running = self.serve(transport).await?;
        running.waiting().await?;
        Ok(())
    }

    /// Records what the caller of an irreversible tool was told once the
    /// response carrying it has been written ([`delivery`]).
    fn deliver(&self, cx: &RequestContext<RoleServer>, ran: (CallRequest, Arc<Runtime>), answer: Result<crate::CallOutput, crate::CallError>) {
        let (request, runtime) = ran;
        let answer = delivery::Answer { request, answer, runtime };
        let slot = cx.extensions.get::<axum::http::request::Parts>().and_then(|p| p.extensions.get::<delivery::Slot>());
        match (slot, &self.pending) {
            (Some(slot), _) => slot.push(cx.id.clone(), answer),
            (None, Some(pending)) => pending.insert(cx.id.clone(), answer),
            // Another transport: the answer is as good as sent.
            (None, None) => {
                tokio::spawn(async move { answer.delivered(crate::ledger::records::now_ms()).await });
            }
        }
    }

    /// The authenticated principal of an HTTP request (the bearer middleware
    /// checked its token and named it), if there is one.
    fn principal(&self, cx: &RequestContext<RoleServer>) -> Option<String> {
        let parts = cx.extensions.get::<axum::http::request::Parts>()?;
        parts.extensions.get::<http::Principal>().map(|p| p.0.clone())
    }

    /// The tenant of the request's token, if `[mcp.oauth]` names one.
    fn tenant(&self, cx: &RequestContext<RoleServer>) -> Option<String> {
        let parts = cx.extensions.get::<axum::http::request::Parts>()?;
        parts.extensions.get::<oauth::Authenticated>().and_then(|a| a.tenant.clone())
    }
}

impl ServerHandler for McpHost {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().enable_tasks().build())
            .with_server_info(Implementation::new("toolguard", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Tools run under toolguard: side effects are idempotent per tool call. Send the model's tool-call id \
                 as _meta[\"toolguard/toolCallId\"] and the conversation as _meta[\"toolguard/sessionId\"]. On \
                 outcome-unknown or held, check status before repeating under a new id. Clients that opt into MCP \
                 Tasks get a task instead of an unsettled answer, and its result once the call is settled.",
            )
    }

    async fn on_initialized(&self, cx: NotificationContext<RoleServer>) {
        // Told when a reload changes the tools (view.rs).
        self.views.joined(cx.peer);
    }

    fn accepted_subscription_filter(&self, _requested: &rmcp::model::SubscriptionFilter) -> Option<rmcp::model::SubscriptionFilter> {
        // Only the tool list changes here (on a reload); the SDK keeps what was requested of it.
        Some(rmcp::model::SubscriptionFilter::builder().tools_list_changed().build())
    }

    async fn listen(&self, cx: SubscriptionContext) -> Result<(), ErrorData> {
        let stream = self.views.listening(cx.sink().clone());
        cx.cancelled().await;
        self.views.closed(stream);
        Ok(())
    }

    async fn list_tools(&self, _request: Option<PaginatedRequestParams>, _cx: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.views.current().tools.values().map(|(t, _)| t.clone()).collect()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.views.current().tools.get(name).map(|(t, _)| t.clone())
    }

    async fn call_tool(&self, mut request: CallToolRequestParams, cx: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        // One generation for the whole call: the one serving as it arrives.
        let view = self.views.current();
        let Some((_, effect)) = view.tools.get(request.name.as_ref()) else {
            return Err(ErrorData::invalid_params(format!("Unknown tool: {}", request.name), None));
        };
        let args_json = serde_json::to_string(&request.arguments.take().unwrap_or_default()).unwrap_or_else(|_| "{}".into());
        let meta = &cx.meta.0.0;
        let side_effects = *effect != Effect::ReadOnly;
        let call_id = ids::call_id(meta).or_else(|| ids::fallback_call_id(side_effects, &request.name, &args_json, &self.config));
        let Some(call_id) = call_id else {
            let text = format!(
                "invalid-args: `{}` has side effects, so toolguard needs the model's tool-call id to make retries safe. \
                 Send it as _meta[\"{}\"] (and the conversation as _meta[\"{}\"]) on tools/call.",
                request.name,
                ids::CALL_ID_KEY,
                ids::SESSION_KEY
            );
            let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
            r.structured_content = Some(serde_json::json!({ "kind": ErrorKind::InvalidArgs, "missing": ids::CALL_ID_KEY }));
            return Ok(r.into());
        };
        let principal = self.principal(&cx);
        let session = match ids::session(meta, principal.as_deref(), &self.config) {
            Ok(session) => session,
            Err(why) => {
                let mut r = CallToolResult::error(vec![ContentBlock::text(format!("invalid-args: {why}"))]);
                r.structured_content = Some(serde_json::json!({ "kind": ErrorKind::InvalidArgs, "message": why }));
                return Ok(r.into());
            }
        };
        // Held until the call is answered (or its request dropped).
        let _counted = match principal.as_deref().map(|p| self.in_flight.enter(p)) {
            Some(Err(cap)) => return Ok(busy(&request.name, &call_id, cap).into()),
            counted => counted,
        };
        let call = CallRequest { session, call_id, tool: request.name.to_string(), args_json, principal, tenant: self.tenant(&cx) };
        let opted_in = cx.client_capabilities().is_some_and(|c| c.supports_tasks());
        if !opted_in && self.config.tasks_required.contains(&call.tool) {
            return Err(tasks_required());
        }
        let runtime = view.runtime.clone();
        let (inputs, approval_asked) = self.inputs(&cx, &call, (request.request_state.as_ref(), request.input_responses.as_ref()))?;
        if let Some(responses) = &request.input_responses {
            self.record_responses(&call, responses, approval_asked.as_deref()).await?;
        }
        if opted_in && side_effects && runtime.guard().is_some() {
            return self.call_as_task(call, *effect, &cx, inputs).await;
        }
        let inputs = Arc::new(inputs);
        let answer = runtime.call_answering(&call, inputs.clone()).await;
        if let Some(asked) = self.input_required(&cx, (&call, &inputs), &answer) {
            return Ok(asked.into());
        }
        let answer = self.ask_at_client(&cx, (&call, &runtime), &inputs, answer).await;
        let answer = self.ask_live(&cx, (&call, &runtime), &inputs, answer).await;
        self.answer(&cx, (call, runtime), *effect, answer).map(Into::into)
    }

    async fn get_task(&self, request: GetTaskParams, cx: RequestContext<RoleServer>) -> Result<GetTaskResult, ErrorData> {
        self.task_state(&request.task_id, &cx).await
    }

    async fn cancel_task(&self, request: CancelTaskParams, cx: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.cancel(&request.task_id, &cx).await
    }

    async fn update_task(&self, request: UpdateTaskParams, cx: RequestContext<RoleServer>) -> Result<(), ErrorData> {
        self.update(&request.task_id, &request.input_responses, &cx).await
    }
}

impl McpHost {
    /// The MCP result of `answer` to `call` (a JSON-RPC error for an
    /// unknown tool), recorded as told once written if the tool is irreversible.
    fn answer(
        &self,
        cx: &RequestContext<RoleServer>,
        ran: (CallRequest, Arc<Runtime>),
        effect: Effect,
        answer: tasks::Answer,
    ) -> Result<CallToolResult, ErrorData> {
        let result = match &answer {
            Ok(out) => results::success(out.clone()),
            Err(e) if e.kind == ErrorKind::UnknownTool => return Err(ErrorData::invalid_params(e.message.clone(), None)),
            Err(e) => results::error_result(e),
        };
        let result = results::naming(result, &ran.0.call_id);
        if effect == Effect::Irreversible {
            self.deliver(cx, ran, answer);
        }
        Ok(result)
    }
}

/// The error for a call of a tool in `[mcp] tasks_required` from a client
/// that did not opt into the tasks extension (-32021).
fn tasks_required() -> ErrorData {
    let needed = serde_json::json!({ "extensions": { rmcp::model::TASKS_EXTENSION_ID: {} } });
    let mut error = ErrorData::missing_required_client_capability(serde_json::from_value(needed).unwrap_or_default());
    error.message = "this tool is served only as an MCP task: declare the io.modelcontextprotocol/tasks extension and call it again".into();
    error
}

/// The answer to a call past its principal's `[mcp] max_calls_per_principal`.
fn busy(tool: &str, call_id: &str, cap: usize) -> CallToolResult {
    let message = format!(
        "{cap} of your tool calls are already running, the most [mcp] max_calls_per_principal lets one principal have at once; \
         `{tool}` was not run and nothing was recorded"
    );
    busy_saying(tool, call_id, message)
}

/// A `busy` answer to a call of `tool` saying `message`: nothing was run.
fn busy_saying(tool: &str, call_id: &str, message: String) -> CallToolResult {
    crate::metrics::tool_call(tool, ErrorKind::Busy.as_str());
    results::naming(results::error_result(&crate::CallError::new(ErrorKind::Busy, message)), call_id)
}
