//! `toolguard audit`: every component against the reviewer's policy, the
//! grant history, or (`--against`) what a change widens and narrows. Exits
//! 1 on any FAIL, so it can gate a CI pipeline.

pub use super::output::Format;
use serde_json::json;
use std::path::PathBuf;

/// What `toolguard audit` was asked.
pub struct Args {
    /// The config file.
    pub config: PathBuf,
    /// Extra component files.
    pub components: Vec<PathBuf>,
    /// How to print it.
    pub format: Format,
    /// The grant history instead.
    pub history: bool,
    /// An older config to review the change from.
    pub against: Option<PathBuf>,
    /// Fingerprints of acknowledged widenings.
    pub acks: Vec<String>,
    /// Write the lock from this audit.
    pub lock: bool,
}

/// Runs the audit (or prints the history, or the review); returns the exit status.
pub async fn run(args: Args) -> u8 {
    let Args { config: config_path, components, format, history, against, acks, lock } = args;
    let json = format != Format::Text;
    let config_path = config_path.as_path();
    let config = match crate::Config::load(config_path) {
        // Locking records what is there now, whatever an older lock says.
        Ok(mut c) if lock => {
            c.plugins.iter_mut().for_each(|p| p.policy.locked = None);
            c
        }
        Ok(c) => c,
        Err(e) => {
            super::print_json(&json!({ "kind": "config-error", "message": e.to_string() }));
            return super::EXIT_CONFIG;
        }
    };
    if history {
        return print_history(&config, json);
    }
    if format == Format::Sarif && against.is_none() {
        return super::config_error("--format sarif is the review's (with --against OLD); the audit itself prints text or --json".into());
    }
    if let Some(old) = against {
        return super::review::run(&config, (config_path, &old), &acks, format).await;
    }
    let report = match crate::audit::audit(&config, config_path, &components).await {
        Ok(r) => r,
        Err(message) => {
            super::print_json(&json!({ "kind": "internal", "message": message }));
            return super::EXIT_CALL_FAILED;
        }
    };
    if lock {
        let path = config_path.with_file_name(crate::policy::lock::FILE_NAME);
        if let Err(e) = std::fs::write(&path, crate::audit::lock_of(&report).to_text()) {
            return super::config_error(format!("cannot write {}: {e}", path.display()));
        }
        eprintln!("toolguard: wrote {} ({} plugin(s)); serve and reload now refuse what differs from it", path.display(), report.components.len());
    }
    if json {
        super::print_json(&serde_json::to_value(&report).unwrap_or_default());
    } else {
        out!("{}", crate::audit::render(&report));
    }
    if report.verdict == crate::audit::Verdict::PASS { 0 } else { super::EXIT_CALL_FAILED }
}

fn print_history(config: &crate::Config, json: bool) -> u8 {
    // The ledger's client blocks (PostgreSQL's runs its own runtime).
    let history = tokio::task::block_in_place(|| config.open_ledger(true).and_then(|l| l.grant_history()));
    let history = match history {
        Ok(h) => h,
        Err(e) => {
            super::print_json(&json!({ "kind": "config-error", "message": e.to_string() }));
            return super::EXIT_CONFIG;
        }
    };
    if json {
        super::print_json(&serde_json::to_value(&history).unwrap_or_default());
        return 0;
    }
    outln!("{:<24} {:<14} {:<16} GRANTS", "FROM (UTC ms)", "PLUGIN", "SHA256");
    for r in &history {
        outln!("{:<24} {:<14} {:<16} {}", r.recorded_ms, r.plugin, &r.digest[..r.digest.len().min(12)], r.grants);
    }
    0
}
