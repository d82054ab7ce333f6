//! (l): what spending limits cost at admission — the same guarded refunds,
//! 64 in flight, by a host whose refund tool has two daily limits (per
//! session, and across every caller: one scope all 64 calls queue on) set
//! too high to refuse anything, against the same host without limits, in
//! the same run.

use super::guarded::{call_as_a_client, drive, null_provider, refund, refund_config_with};
use super::{Figure, Scale};
use std::path::Path;
use std::sync::Arc;
use toolguard::{Config, Runtime};

/// The two limits: never reached, always counted.
const LIMITS: &str = r#"limits = [{ sum = "/amount_cents", max = 1000000000000, per = "session", window = "day" }, { sum = "/amount_cents", max = 1000000000000, per = "everyone", window = "day" }]"#;

/// Guarded refunds per second at 64 in flight with and without limits, and their ratio.
///
/// # Errors
/// A host or the provider could not be set up, or a call failed.
pub async fn admission(dir: &Path, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let provider = null_provider().await?;
    let total = scale.n(4_000);
    let mut rates = Vec::new();
    for policy in [None, Some(LIMITS.to_string())] {
        let scratch = tempfile::tempdir_in(dir)?;
        let config = Config::parse(&refund_config_with(&provider, policy), "<bench>", scratch.path())?;
        let rt = Arc::new(Runtime::from_config(&config).await?);
        // Warm-up: the pool's instances and the ledger's first writes. Every
        // call refunds its own amount (a different action), as a client
        // that records what it was told.
        for i in 0..64 {
            call_as_a_client(&rt, &refund(format!("warm{i}"), i)).await.map_err(anyhow::Error::msg)?;
        }
        let runtime = rt.clone();
        let (_, wall) = drive(64, total, move |i| {
            let rt = runtime.clone();
            async move { call_as_a_client(&rt, &refund(format!("l{i}"), 64 + i)).await.map(|_| ()) }
        })
        .await?;
        rates.push(total as f64 / wall.as_secs_f64());
    }
    Ok(vec![
        Figure::new("(l) guarded refunds, 64 in flight, without limits", rates[0], "calls/s"),
        Figure::new("(l) the same with 2 spending limits (session, everyone)", rates[1], "calls/s").against("without limits, same run", rates[1] / rates[0]),
    ])
}
