//! (h) what `toolguard serve` costs when there is little to do: the real
//! binary (the one a default build makes) in its own process, its CPU time read from `/proc/PID/stat`, idle
//! and then serving one guarded refund per second over MCP.

use super::guarded::{null_provider, refund_config};
use super::unguarded::cpu_of_stat;
use super::{Figure, Scale};
use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use toolguard::mcp::client::McpClient;

/// A served host, killed when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Served {
    /// Its CPU time so far, in seconds.
    fn cpu(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).map_or(0.0, |s| cpu_of_stat(&s))
    }
}

/// Starts `host serve --http` on `config`; the server and its MCP URL.
fn serve(host: &std::path::Path, config: &std::path::Path) -> anyhow::Result<(Served, String)> {
    let mut child = Command::new(host)
        .args(["serve", "--http", "127.0.0.1:0", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("piped")).lines();
    let served = Served(child);
    let url = loop {
        let Some(line) = lines.next() else { anyhow::bail!("toolguard serve exited before it listened") };
        if let Some(url) = line?.strip_prefix("toolguard: MCP on ") {
            break url.trim().to_string();
        }
    };
    std::thread::spawn(move || lines.for_each(drop));
    Ok((served, url))
}

/// (h): CPU of `serve` over a quiet window, idle and at one call per second.
///
/// # Errors
/// The server could not start or a call failed.
pub async fn serve_cpu(dir: &std::path::Path, scale: Scale, host: &std::path::Path) -> anyhow::Result<Vec<Figure>> {
    let provider = null_provider().await?;
    let scratch = tempfile::tempdir_in(dir)?;
    let config = scratch.path().join("toolguard.toml");
    std::fs::write(&config, refund_config(&provider))?;
    let (served, url) = serve(host, &config)?;
    // Let start-up settle (recovery pass, first instantiations).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let window = Duration::from_secs_f64((10.0 * scale.factor).max(2.0));
    let before = served.cpu();
    tokio::time::sleep(window).await;
    let idle = (served.cpu() - before) / window.as_secs_f64();

    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = McpClient::connect(&url).await?;
    let before = (served.cpu(), Instant::now());
    let calls = window.as_secs() as usize;
    for i in 0..calls {
        let tick = Instant::now();
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"refund","arguments":{{"payment_intent":"pi_bench","amount_cents":{},"reason":"duplicate"}},"_meta":{{"toolguard/toolCallId":"h{i}","toolguard/sessionId":"bench"}}}}}}"#,
            i + 1,
            i + 1
        );
        let text = client.send(body).await?.text().await?;
        anyhow::ensure!(text.contains(r#""status":"succeeded""#), "unexpected answer: {text}");
        tokio::time::sleep(Duration::from_secs(1).saturating_sub(tick.elapsed())).await;
    }
    let one_per_sec = (served.cpu() - before.0) / before.1.elapsed().as_secs_f64();
    drop(served);
    let pct = |share: f64| share * 100.0;
    Ok(vec![
        Figure::new(format!("(h) serve, idle over {} s: CPU", window.as_secs()), pct(idle), "% of a core").target("≈ 0 % (≤ 0.5 %)", pct(idle) <= 0.5),
        Figure::new(format!("(h) serve, one guarded call per second over {calls} s: CPU"), pct(one_per_sec), "% of a core")
            .target("≈ 0 % (≤ 1 %)", pct(one_per_sec) <= 1.0),
    ])
}
