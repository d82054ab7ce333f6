//! The demo's last step: an MCP client that opted into tasks, served over
//! Streamable HTTP on loopback by the demo's own runtime, is answered with
//! a task where a plain call would get `outcome-unknown`, and polls it to
//! the call's real outcome.

use crate::Runtime;
use crate::config::McpConfig;
use crate::mcp::McpHost;
use crate::mcp::client::McpClient;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// `tools/call` of `refund` with `args` as call_4, then `tasks/get` until the task settles.
pub(super) async fn run(runtime: Arc<Runtime>, args: &str) -> anyhow::Result<()> {
    let config = McpConfig { task_after_ms: 300, task_poll_ms: 500, ..McpConfig::default() };
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let runtime_for_ledger = runtime.clone();
    let app = crate::mcp::http::router(McpHost::new(crate::reload::Live::fixed(runtime), config), addr)?;
    tokio::spawn(crate::mcp::listen::serve_on(listener, app, 16));
    let client = McpClient::connect(&url).await?;
    let tasks = json!({ "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } } });
    let mut meta = tasks.clone();
    meta["toolguard/toolCallId"] = "call_4".into();
    meta["toolguard/sessionId"] = "demo".into();
    let params = json!({ "name": "refund", "arguments": serde_json::from_str::<Value>(args)?, "_meta": meta });
    let handle = client.request(1, "tools/call", params).await?["result"].clone();
    let Some(task) = handle["taskId"].as_str().map(str::to_string) else {
        outln!("   → answered at once (not a task): {handle}");
        return Ok(());
    };
    outln!("   → a task, {}: {}", handle["status"], handle["statusMessage"].as_str().unwrap_or(""));
    for id in 2..200 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let got = client.request(id, "tasks/get", json!({ "taskId": task, "_meta": tasks })).await?["result"].clone();
        if got["status"] != "working" {
            outln!("   → tasks/get after {} polls: {}, {}", id - 1, got["status"], got["result"]["structuredContent"]);
            settled_in_ledger(&runtime_for_ledger).await;
            return Ok(());
        }
    }
    anyhow::bail!("task {task} was still working after 50 s")
}

/// Waits (at most 5 s) until the ledger shows call_4 completed and its
/// final answer recorded as told: that record is written once the
/// `tasks/get` response carrying it has been sent, just after the client
/// read it — the ledger the demo prints next shows it.
async fn settled_in_ledger(runtime: &Runtime) {
    let Some(guard) = runtime.guard() else { return };
    for _ in 0..100 {
        let settled = guard
            .ledger()
            .calls(None)
            .ok()
            .into_iter()
            .flatten()
            .any(|c| c.call_id == "call_4" && c.state == crate::ledger::CallState::Completed && c.reported.as_str() == "definitive");
        if settled {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
