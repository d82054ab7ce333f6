//! (d) a fresh sandbox plus one invoke of a trivial tool; (f) `tools/call`
//! of a read-only tool over MCP Streamable HTTP on loopback; (g) the host's
//! memory with 10 plugins and 64 calls in flight, and across a soak.

use super::disk::Bound;
use super::guarded::drive;
use super::{Figure, Scale, Stats, ms, us};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use toolguard::config::{ComponentSource, EngineConfig, PluginConfig};
use toolguard::mcp::client::McpClient;
use toolguard::{CallRequest, Config, Runtime};

/// (d): `greet` (the template plugin) on a host without a ledger: argument
/// checks, a fresh store and instance, one invoke, result checks.
///
/// # Errors
/// The engine or the plugin cannot be set up.
pub async fn fresh_sandbox(dir: &Path, bound: &Bound, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let mut runtime = Runtime::new(&EngineConfig::default(), dir.join("compiled"))?;
    let plugin = PluginConfig {
        name: super::described::D_PLUGIN.into(),
        component: ComponentSource::Builtin(super::described::D_PLUGIN.into()),
        limits: Default::default(),
        settings: Default::default(),
        tool_prefix: String::new(),
        policy: Default::default(),
    };
    runtime.add_plugin(&plugin).await?;
    let runtime = Arc::new(runtime);
    let n = scale.n(super::described::D_CALLS);
    let rt = runtime.clone();
    let (mut samples, _) = drive(1, n, move |i| {
        let rt = rt.clone();
        async move {
            let req = CallRequest {
                session: "bench".into(),
                call_id: format!("d{i}"),
                tool: super::described::D_TOOL.into(),
                args_json: r#"{"name":"bench"}"#.into(),
                principal: None,
                tenant: None,
            };
            rt.call(&req).await.map(|_| ()).map_err(|e| e.to_string())
        }
    })
    .await?;
    let stats = Stats::of(&mut samples);
    Ok(vec![
        Figure::new("(d) fresh sandbox + one invoke of a trivial tool, p50", us(stats.p50), "µs")
            .against("one fsync (a)", stats.p50.as_secs_f64() / bound.sync.p50.as_secs_f64())
            .target("≤ 60 µs", us(stats.p50) <= 60.0),
        Figure::new("(d) fresh sandbox + one invoke of a trivial tool, p99", us(stats.p99), "µs"),
    ])
}

/// A guarded host serving `copies` prefixed copies of the read-only text-stats plugin.
async fn stats_host(dir: &Path, copies: usize) -> anyhow::Result<Runtime> {
    let mut text = String::from("data_dir = \"data\"\n[engine]\npool_instances = 320\n");
    for i in 0..copies {
        text.push_str(&format!(
            "[plugins.stats{i}]\ncomponent = \"builtin:text-stats\"\ntool_prefix = \"p{i}_\"\n[policy.plugins.stats{i}.tools]\ntext_stats = {{ effect = \"read-only\" }}\n"
        ));
    }
    let config = Config::parse(&text, "<bench>", dir)?;
    Ok(Runtime::from_config(&config).await?)
}

/// (f): MCP `tools/call` of a read-only tool over Streamable HTTP on loopback.
///
/// # Errors
/// The server or the client could not be set up, or a call failed.
pub async fn mcp_http(dir: &Path, bound: &Bound, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let scratch = tempfile::tempdir_in(dir)?;
    let runtime = Arc::new(stats_host(scratch.path(), 1).await?);
    let addr: std::net::SocketAddr = "127.0.0.1:0".parse()?;
    let app = toolguard::mcp::http::router(toolguard::mcp::McpHost::new(toolguard::reload::Live::fixed(runtime), Default::default()), addr)?;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let url = format!("http://{}{}", listener.local_addr()?, toolguard::mcp::http::PATH);
    tokio::spawn(async move {
        toolguard::mcp::listen::serve_on(listener, app, toolguard::config::McpConfig::default().max_connections).await;
    });
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Arc::new(McpClient::connect(&url).await?);
    let call = |client: Arc<McpClient>| {
        move |i: usize| {
            let client = client.clone();
            async move { call_text_stats(&client, i).await }
        }
    };
    let n = scale.n(2_000);
    let (mut samples, _) = drive(1, n, call(client.clone())).await?;
    let stats = Stats::of(&mut samples);
    let (_, wall) = drive(16, n, call(client)).await?;
    let per_sec = n as f64 / wall.as_secs_f64();
    Ok(vec![
        Figure::new("(f) MCP tools/call over HTTP, read-only tool, p50", ms(stats.p50), "ms")
            .against("one fsync (a)", stats.p50.as_secs_f64() / bound.sync.p50.as_secs_f64()),
        Figure::new("(f) MCP tools/call over HTTP, 16 in flight", per_sec, "calls/s").against("synced appends/s (a)", per_sec / bound.appends_per_sec),
    ])
}

/// One `tools/call` of the read-only `p0_text_stats` over `client`.
async fn call_text_stats(client: &McpClient, id: usize) -> Result<(), String> {
    let body = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"p0_text_stats","arguments":{{"text":"a b c"}}}}}}"#, id + 1);
    let response = client.send(body).await.map_err(|e| e.to_string())?;
    let text = response.text().await.map_err(|e| e.to_string())?;
    if text.contains("\"result\"") && !text.contains("\"isError\":true") { Ok(()) } else { Err(format!("unexpected answer: {text}")) }
}

/// The process's resident set size, in bytes.
fn rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(0, |kb| kb * 1024)
}

/// (g): RSS with 10 plugins loaded and 64 calls in flight; RSS high-water
/// marks before a soak of 100k calls and over its end.
///
/// # Errors
/// Set-up failed or a call failed.
pub async fn memory(dir: &Path, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let scratch = tempfile::tempdir_in(dir)?;
    let runtime = Arc::new(stats_host(scratch.path(), 10).await?);
    let loaded = rss();
    let peak = Arc::new(AtomicU64::new(loaded));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let calls = |offset: usize| {
        let rt = runtime.clone();
        move |i: usize| {
            let rt = rt.clone();
            async move {
                let req = CallRequest {
                    session: "bench".into(),
                    call_id: format!("g{}", offset + i),
                    tool: format!("p{}_text_stats", i % 10),
                    args_json: r#"{"text":"the quick brown fox jumps over the lazy dog"}"#.into(),
                    principal: None,
                    tenant: None,
                };
                rt.call(&req).await.map(|_| ()).map_err(|e| e.to_string())
            }
        }
    };
    drive(64, scale.n(super::described::G_LOADED), calls(0)).await?;
    let in_flight_peak = peak.load(Ordering::Relaxed);
    // Memtables fill and flush in cycles of some 20k calls here, so a single
    // reading depends on the phase. Compare high-water marks instead: over a
    // window of 30k calls once warm (the replay cache, the instance pool and
    // glibc's arenas are full by then), and over the soak's last 30k calls.
    let window = scale.n(super::described::G_WINDOW);
    let soak = scale.n(super::described::G_SOAK);
    peak.store(rss(), Ordering::Relaxed);
    drive(64, window, calls(1_000_000)).await?;
    let before = peak.load(Ordering::Relaxed);
    drive(64, soak - window, calls(10_000_000)).await?;
    peak.store(rss(), Ordering::Relaxed);
    drive(64, window, calls(20_000_000)).await?;
    let after = peak.load(Ordering::Relaxed);
    let rocksdb = runtime.guard().map_or(0, |g| g.ledger().memory_usage());
    sampler.abort();
    let growth = after as f64 / before as f64 - 1.0;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Ok(vec![
        Figure::new("(g) RSS, 10 plugins loaded", mib(loaded), "MiB"),
        Figure::new("(g) RSS peak, 10 plugins, 64 calls in flight", mib(in_flight_peak), "MiB")
            .against("RSS when loaded", in_flight_peak as f64 / loaded as f64),
        Figure::new(format!("(g) RSS high-water, {window} calls once warm"), mib(before), "MiB"),
        Figure::new(format!("(g) RSS high-water, last {window} of a {soak}-call soak"), mib(after), "MiB")
            .against("before the soak", after as f64 / before as f64)
            .target("≤ 10 % growth", growth <= 0.10),
        Figure::new("(g) of which RocksDB (memtables, readers, cache)", mib(rocksdb), "MiB"),
    ])
}
