//! `toolguard sandbox`: the payments sandbox, standalone, until Ctrl-C.

use std::io::Write as _;
use toolguard_sandbox::{Mode, Sandbox};

/// Payment intents the standalone sandbox starts with: (id, amount in cents).
pub const DEFAULT_INTENTS: &[(&str, u64)] = &[("pi_demo", 5_000), ("pi_1001", 10_000), ("pi_1002", 25_000)];

/// Serves the sandbox on `addr`, refusing keys that are not UUIDs if
/// `uuid_keys`; returns the exit status.
pub async fn run(addr: &str, mode: Mode, api_key: Option<&str>, uuid_keys: bool) -> u8 {
    let sandbox = match Sandbox::start(addr, mode, toolguard_sandbox::DEFAULT_RETENTION).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("toolguard sandbox: cannot listen on {addr}: {e}");
            return 1;
        }
    };
    sandbox.require_api_key(api_key);
    sandbox.require_uuid_keys(uuid_keys);
    for (id, amount) in DEFAULT_INTENTS {
        sandbox.add_payment_intent(id, *amount);
    }
    let intents = DEFAULT_INTENTS.iter().map(|(id, a)| format!("{id} ({a} cents)")).collect::<Vec<_>>().join(", ");
    let banner = format!(
        "payments sandbox ({mode:?} semantics) on {}\npayment intents: {intents}\n\
         control: GET /_sandbox/refunds, GET /_sandbox/requests, POST /_sandbox/faults {{\"kind\":\"delay-after-commit\",\"ms\":3000}}",
        sandbox.url()
    );
    // Whoever started us may stop reading; that must not stop the sandbox.
    let _ = writeln!(std::io::stdout(), "{banner}");
    let _ = tokio::signal::ctrl_c().await;
    0
}
