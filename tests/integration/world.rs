//! The world a test drives real `toolguard` processes in: the payments
//! sandbox (on its own runtime, so plain `#[test]`s can run processes) and
//! a config file for child hosts, with helpers that start calls and count
//! what reached the provider. Crash, torture, hold, retention, security and
//! foreign-plugin tests all run in it.

use crate::common::{BIN, stdout_json};
use crate::payments::{Downstream, config_text};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};
use toolguard::ledger::Ledger;
use toolguard_sandbox::{Mode, Sandbox};

/// The payment intent a world's refunds are made against: large, so every trial fits.
pub const PI: &str = "pi_crash";
/// The session a world's calls are made in.
pub const SESSION: &str = "crash";

/// A sandbox (on its own runtime, so plain `#[test]`s can drive processes)
/// and a config file for child hosts; calls are made in session [`SESSION`].
pub struct World {
    pub sandbox: Sandbox,
    pub config: PathBuf,
    pub dir: tempfile::TempDir,
    /// Whether each tool call gives the refund's reason in its own words
    /// (the refund's action declared as its intent and amount).
    pub reworded: bool,
    /// Whether the refund asks a person to confirm a repeat of an action
    /// carried out within the last 15 minutes (`confirm_repeat_within_minutes`).
    pub confirms_repeats: bool,
    _rt: tokio::runtime::Runtime,
}

impl World {
    pub fn new() -> Self {
        Self::with(torture_downstream())
    }

    /// A world whose payments downstream has the knobs of `d`.
    pub fn with(d: Downstream) -> Self {
        Self::build(d, None, "")
    }

    /// A world whose downstream has the knobs of `d`, and whose config ends
    /// with `extra` TOML (`{url}` in it stands for the sandbox's URL).
    pub fn with_extra(d: Downstream, extra: &str) -> Self {
        Self::build(d, None, extra)
    }

    /// [`World::new`] with the sandbox serving HTTPS under `pki`'s CA, which the host trusts.
    pub fn over_https(pki: &crate::tls::Pki) -> Self {
        Self::build(torture_downstream(), Some(pki), "")
    }

    fn build(d: Downstream, tls: Option<&crate::tls::Pki>, extra: &str) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let retention = toolguard_sandbox::DEFAULT_RETENTION;
        let sandbox = match tls {
            Some(pki) => rt.block_on(Sandbox::start_tls("127.0.0.1:0", Mode::Stripe, retention, pki.server(false))),
            None => rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, retention)),
        }
        .unwrap();
        sandbox.add_payment_intent(PI, u64::MAX / 4);
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("toolguard.toml");
        let trust = tls.map(|pki| format!("tls = {{ ca_file = {:?}, platform_roots = false }}", pki.ca_file.display().to_string()));
        let text = match &trust {
            Some(extra) => crate::tls::tls_config_text(&sandbox.url(), &dir.path().join("data"), &d, extra),
            None => config_text(&sandbox.url(), &dir.path().join("data"), &d),
        };
        std::fs::write(&config, format!("{text}\n{}", extra.replace("{url}", &sandbox.url()))).unwrap();
        let confirms_repeats = d.refund_policy.is_some_and(|p| p.contains("confirm_repeat_within_minutes"));
        Self { sandbox, config, dir, reworded: false, confirms_repeats, _rt: rt }
    }

    /// [`World::new`] whose refunds give their reason in words that depend
    /// on the tool-call id (a model's repeat rarely says it the same way),
    /// with the refund's action declared as `/payment_intent` and `/amount_cents`.
    pub fn in_other_words() -> Self {
        let w = Self::with(Downstream { refund_action: Some(crate::payments::INTENT_AND_AMOUNT), ..torture_downstream() });
        Self { reworded: true, ..w }
    }

    /// [`World::new`] with the refund's repeats within 15 minutes confirmed
    /// by a person, as the shipped example config has it.
    pub fn confirming_repeats() -> Self {
        Self::with(Downstream { refund_policy: Some("confirm_repeat_within_minutes = 15"), ..torture_downstream() })
    }

    /// `toolguard call` refunding `amount` cents under `call_id`, started.
    pub fn spawn_refund(&self, call_id: &str, amount: u64, failpoint: Option<&str>) -> Child {
        const REASONS: [&str; 3] = ["duplicate", "fraudulent", "requested_by_customer"];
        let reason = if self.reworded { REASONS[call_id.bytes().map(usize::from).sum::<usize>() % 3] } else { REASONS[0] };
        self.spawn_refund_saying(call_id, amount, reason, failpoint)
    }

    /// [`World::spawn_refund`] giving `reason`.
    pub fn spawn_refund_saying(&self, call_id: &str, amount: u64, reason: &str, failpoint: Option<&str>) -> Child {
        let args = format!(r#"{{"payment_intent":"{PI}","amount_cents":{amount},"reason":"{reason}"}}"#);
        spawn_call(&self.config, [SESSION, call_id, "refund"], &args, failpoint)
    }

    /// Runs a refund to completion; its stdout as JSON, and whether it succeeded.
    pub fn refund(&self, call_id: &str, amount: u64) -> (bool, Value) {
        let out = self.spawn_refund(call_id, amount, None).wait_with_output().unwrap();
        (out.status.success(), stdout_json(&out))
    }

    /// Runs `tool` with `args` under `call_id` to completion: whether it
    /// succeeded, its answer, and what it logged.
    pub fn call(&self, call_id: &str, tool: &str, args: &Value) -> (bool, Value, String) {
        let out = Command::new(BIN)
            .args(["call", "--config", self.config.to_str().unwrap(), "--session", SESSION, "--call-id", call_id, tool, &args.to_string()])
            .env_remove("TOOLGUARD_LOG")
            .output()
            .expect("run toolguard");
        (out.status.success(), stdout_json(&out), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    /// Runs `toolguard ARGS… --config <this world's config>`.
    pub fn toolguard(&self, args: &[&str]) -> Output {
        Command::new(BIN).args(args).args(["--config", self.config.to_str().unwrap()]).env("TOOLGUARD_LOG", "warn").output().unwrap()
    }

    /// The host's ledger, read-only (no host is running).
    pub fn ledger(&self) -> Ledger {
        Ledger::open_read_only(&ledger_dir(self.dir.path())).unwrap()
    }

    /// Refunds at the sandbox of exactly `amount` cents.
    pub fn refunds_of(&self, amount: u64) -> usize {
        self.sandbox.refunds().iter().filter(|r| r.amount == amount).count()
    }

    /// POSTs the sandbox received for a refund of `amount` cents.
    pub fn posts_of(&self, amount: u64) -> Vec<toolguard_sandbox::Observed> {
        let body = format!("amount={amount}&");
        self.sandbox.requests().into_iter().filter(|r| r.method == "POST" && r.body.contains(&body)).collect()
    }
}

/// The torture's downstream: patient, and a budget for thousands of refunds
/// in one session within the hour.
pub fn torture_downstream() -> Downstream {
    Downstream { timeout_ms: 5_000, refunds_per_session_hour: 1_000_000, ..Downstream::default() }
}

/// `toolguard call` of `[session, call id, tool]` with `args` under
/// `config`, started, aborting at `failpoint` if one is named.
pub fn spawn_call(config: &Path, [session, call_id, tool]: [&str; 3], args: &str, failpoint: Option<&str>) -> Child {
    let mut cmd = Command::new(BIN);
    cmd.args(["call", "--config", config.to_str().unwrap(), "--session", session, "--call-id", call_id, tool, args])
        .env("TOOLGUARD_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(point) = failpoint {
        cmd.env("TOOLGUARD_FAILPOINT", point);
    }
    cmd.spawn().expect("spawn toolguard")
}

pub fn ledger_dir(root: &Path) -> PathBuf {
    root.join("data").join("ledger")
}

/// Waits until `done()` or the deadline; true if it happened.
pub fn wait_for(deadline: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    done()
}
