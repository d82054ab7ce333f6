//! `toolguard serve`'s lifecycle, once its runtime is open: the start-up
//! recovery pass alongside serving, a fleet host's takeover passes, the
//! retention pass, `toolguard call`s handed over on this data directory,
//! and the MCP server itself, until the client (stdio) or the process
//! (HTTP) ends.

use crate::Runtime;
use std::sync::Arc;

/// Serves `runtime` (opened from `config`, read from the file at `path`)
/// over MCP — on `http` if given, else stdio — with its background passes,
/// reloading on SIGHUP and `toolguard reload`, until the client or process ends.
///
/// # Errors
/// The MCP server failed (the address was taken, stdio closed badly).
pub async fn run(runtime: Arc<Runtime>, config: &crate::Config, path: &std::path::Path, http: Option<std::net::SocketAddr>) -> anyhow::Result<()> {
    let shared = runtime.guard().is_some_and(|g| g.ledger().shared());
    let live = crate::reload::Live::new(runtime.clone(), config.clone(), path.to_path_buf());
    let passes = live.clone();
    tokio::spawn(async move {
        start_up_pass(&passes.runtime()).await;
        if shared {
            takeovers(passes).await;
        }
    });
    if let (Some(retention), Some(guard)) = (config.retention, runtime.guard()) {
        tokio::spawn(prune_every(guard.ledger().clone(), retention));
    }
    reload_on_hangup(live.clone())?;
    tokio::spawn(live.clone().note_serving_every(SERVING_NOTE_INTERVAL));
    // `toolguard call`s on this data directory hand their calls to this
    // process, and `toolguard reload` asks it to reload, on this socket.
    let _listener = crate::handover::control_socket(config).and_then(|path| {
        crate::handover::Listener::start(path, live.clone())
            .inspect_err(|e| tracing::warn!(error = %e, "cannot take `toolguard call`s or `toolguard reload` from other processes (SIGHUP still reloads)"))
            .ok()
    });
    let host = crate::mcp::McpHost::new(live, config.mcp.clone());
    match http {
        Some(addr) => crate::mcp::http::serve(host, addr).await,
        None => {
            let workers = tokio::runtime::Handle::current().metrics().num_workers();
            eprintln!("toolguard: MCP on stdio, {workers} async worker(s)");
            host.serve_stdio().await
        }
    }
}

/// Reloads `live` on every SIGHUP, logging what happened.
fn reload_on_hangup(live: Arc<crate::reload::Live>) -> anyhow::Result<()> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match live.reload().await {
                Ok(report) => eprintln!("toolguard: reloaded: {}", serde_json::to_string(&report).unwrap_or_default()),
                Err(refused) => {
                    tracing::error!("{refused}");
                    eprintln!("toolguard: {refused}");
                }
            }
        }
    });
    Ok(())
}

/// `serve`'s start-up recovery pass, run while it already answers: a
/// provider that is down or slow delays only the calls whose attempts wait
/// on it, not the host's start (`docs/recovery.md`, "Start-up").
/// The pass logs what it did itself.
async fn start_up_pass(runtime: &Runtime) {
    if let Err(e) = runtime.recover().await {
        tracing::warn!(error = %e, "start-up recovery pass failed; each call still drives its own unsettled attempts");
    }
}

/// How often a host notes in the ledger what it serves (besides at start and on each reload).
const SERVING_NOTE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(600);

/// How often a host of a fleet looks for tool calls whose host died.
const TAKEOVER_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// On a shared ledger: a recovery pass every [`TAKEOVER_INTERVAL`], which
/// takes over the unsettled attempts of calls whose claim lapsed (their host
/// died) and resolves them with the same keys; an attempt no pass settles is
/// tried less often as it ages ([`Runtime::takeover_pass`]).
async fn takeovers(live: Arc<crate::reload::Live>) {
    loop {
        tokio::time::sleep(TAKEOVER_INTERVAL).await;
        // With the generation serving now: its grants and reconcilers.
        if let Err(e) = live.runtime().takeover_pass().await {
            tracing::warn!(error = %e, "takeover pass failed; retrying");
        }
    }
}

/// Prunes the ledger every `retention.every_minutes` (`docs/ledger.md`, "Retention").
async fn prune_every(ledger: crate::ledger::Ledger, retention: crate::config::Retention) {
    let every = std::time::Duration::from_secs(60 * retention.every_minutes);
    loop {
        let ledger = ledger.clone();
        let pass = tokio::task::spawn_blocking(move || {
            let now = crate::ledger::records::now_ms();
            ledger.prune(now.saturating_sub(retention.hours * 3_600_000), now)
        });
        match pass.await {
            Ok(Ok(report)) if report.examined > 0 || report.budget_uses > 0 => tracing::info!(?report, "pruned the ledger"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "pruning the ledger failed; trying again next time"),
            Err(e) => tracing::warn!(error = %e, "the pruning pass stopped"),
        }
        tokio::time::sleep(every).await;
    }
}
