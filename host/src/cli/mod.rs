//! The `toolguard` command line: argument parsing, logging set-up and
//! dispatch. Each subcommand lives in its own module.

// First: its `outln!`/`out!` serve every subcommand below.
#[macro_use]
mod output;
mod approvals;
mod audit;
mod call;
mod demo;
mod ledger;
mod logging;
mod registry;
mod reload;
mod review;
mod sandbox;
mod seal;
mod serving;
mod tools;

use logging::{TRACES, flush_traces, init_logging};
use output::{exit_now, json_for_terminal, print_json, terminal_safe, write_json};

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status when the tool call failed (a JSON error is on stdout).
pub const EXIT_CALL_FAILED: u8 = 1;
/// Exit status when the config is bad or a plugin was refused.
pub const EXIT_CONFIG: u8 = 3;

/// Runs third-party AI-agent tools as WebAssembly components; no side effect
/// happens twice or outside the guard.
#[derive(Debug, Parser)]
#[command(name = "toolguard", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the host at work on embedded defaults (no config, no network).
    Demo,
    /// Serve the tools over MCP: stdio by default, Streamable HTTP with --http.
    Serve {
        /// The config file.
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
        /// Serve Streamable HTTP on this address (e.g. 127.0.0.1:8765) instead of stdio.
        #[arg(long)]
        http: Option<std::net::SocketAddr>,
        /// Async worker threads [default: 1 over stdio (one client), one per core over HTTP].
        #[arg(long)]
        workers: Option<std::num::NonZeroUsize>,
    },
    /// Have the running `toolguard serve` of this config read it again:
    /// checked whole, swapped in if valid, refused whole if not (prints JSON).
    Reload {
        /// The config file (the one the serve was started with).
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
    },
    /// List the tools of the configured plugins, with their schemas.
    Tools {
        /// The config file.
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Run one tool call and print its result as JSON (or a JSON error with a `kind`).
    Call {
        /// The config file.
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
        /// The agent session (conversation) the call belongs to.
        #[arg(long)]
        session: String,
        /// The model's tool-call id.
        #[arg(long = "call-id")]
        call_id: String,
        /// The tool to run.
        tool: String,
        /// The arguments as a JSON object; `-` reads them from stdin.
        args: String,
    },
    /// Audit every component's imports and tools against the reviewer's policy (exit 1 on FAIL).
    Audit {
        /// The config file (with its policy).
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
        /// Extra components to audit (not in the config: they fail as unreviewed).
        components: Vec<PathBuf>,
        /// Print the documented JSON report instead of text.
        #[arg(long)]
        json: bool,
        /// The review's form (with --against): text, json, or sarif (SARIF 2.1.0, for code scanning).
        #[arg(long, value_enum)]
        format: Option<audit::Format>,
        /// Show which component digests ran with which grants, from the ledger.
        #[arg(long)]
        history: bool,
        /// Review a change: every widening and narrowing from this older
        /// config to the current one (exit 1 on a widening not acknowledged).
        #[arg(long, value_name = "OLD_CONFIG")]
        against: Option<PathBuf>,
        /// Acknowledge a widening by its fingerprint (repeatable; with --against).
        #[arg(long = "ack", value_name = "FINGERPRINT")]
        acks: Vec<String>,
        /// Write toolguard.lock beside the config: each component's digest,
        /// signer and imports and each tool's description and schemas, as
        /// reviewed; serve and reload then refuse anything that differs.
        #[arg(long)]
        lock: bool,
    },
    /// Resolve every attempt left pending or unknown (also done at every start-up), and report.
    Recover {
        /// The config file.
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
    },
    /// Read the ledger: tool calls, attempts, their states.
    Ledger {
        /// The config file (names the data directory).
        #[arg(long, default_value = "toolguard.toml", global = true)]
        config: PathBuf,
        #[command(subcommand)]
        command: ledger::LedgerCommand,
    },
    /// Decide on actions awaiting a person's approval (as an operator).
    Approvals {
        /// The config file (names the ledger).
        #[arg(long, default_value = "toolguard.toml", global = true)]
        config: PathBuf,
        #[command(subcommand)]
        command: approvals::ApprovalsCommand,
    },
    /// Make a component built by a standard toolchain loadable: compose a stub
    /// whose every function traps under its wasi:sockets / wasi:http imports,
    /// so it reaches nothing (then pin the output's sha256 in the policy).
    Seal {
        /// The component to seal.
        input: PathBuf,
        /// Where to write the sealed component.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Push a component to an OCI registry as a Wasm artifact (and sign it with --sign).
    Push {
        /// The component (sealed or plain).
        component: PathBuf,
        /// Where: oci://REGISTRY/REPOSITORY:TAG.
        target: String,
        /// Sign the pushed manifest with this private key (from `toolguard keygen`).
        #[arg(long)]
        sign: Option<PathBuf>,
        #[command(flatten)]
        registry: registry::RegistryArgs,
    },
    /// Sign a pushed component's manifest (cosign-compatible, stored beside it).
    Sign {
        /// oci://REGISTRY/REPOSITORY@sha256:DIGEST (or :TAG, resolved to its digest now).
        target: String,
        /// The private key (PEM PKCS#8, ECDSA P-256).
        #[arg(long)]
        key: PathBuf,
        #[command(flatten)]
        registry: registry::RegistryArgs,
    },
    /// Make a publisher's signing key pair: OUT.key (secret) and OUT.pub (for `signed_by`).
    Keygen {
        /// The files' path without extension.
        #[arg(long)]
        out: PathBuf,
    },
    /// Pull the configured registry components into the cache, checked as a start checks them.
    Pull {
        /// The config file.
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
        /// Only these plugins.
        plugins: Vec<String>,
    },
    /// Remove from the registry cache what the configuration no longer needs
    /// to load offline, and from the compile cache what was not loaded,
    /// past the grace period; prints what went.
    PruneCache {
        /// The config file (names the data directory and the components it needs).
        #[arg(long, default_value = "toolguard.toml")]
        config: PathBuf,
        /// Keep anything written within this many days, needed or not.
        #[arg(long, default_value_t = 7)]
        older_than_days: u64,
        /// List what would go; remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Run the payments sandbox (a Stripe-like provider) standalone.
    Sandbox {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:4242")]
        addr: String,
        /// Whose idempotency semantics to follow.
        #[arg(long, value_enum, default_value = "stripe")]
        mode: SandboxMode,
        /// Require `Authorization: Bearer <KEY>` on every /v1 request.
        #[arg(long)]
        api_key: Option<String>,
        /// Refuse idempotency keys that are not UUIDs, as some providers do
        /// (a downstream with `key_format = "uuid"` passes).
        #[arg(long)]
        uuid_keys: bool,
    },
}

/// `--mode` of `toolguard sandbox`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SandboxMode {
    Stripe,
    Ietf,
    Adyen,
}

impl Command {
    /// How many async worker threads the command runs on; `None`: one per core.
    ///
    /// `serve` over stdio answers one client, whose calls mostly come one at a
    /// time: on one worker a request never hops between two (a wake-up of an
    /// idle thread is an IPI on a VM), which cut the server's CPU per
    /// read-only call by ~20 % (bench (k), docs/benchmarks.md). The ledger's
    /// writer and sync threads, RocksDB's and the blocking pool are apart from it.
    fn async_workers(&self) -> Option<usize> {
        match self {
            Command::Serve { workers: Some(n), .. } => Some(n.get()),
            Command::Serve { http: None, .. } => Some(1),
            _ => None,
        }
    }
}

/// Parses the command line, runs the subcommand, returns the exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = cli.command.async_workers() {
        builder.worker_threads(workers);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("toolguard: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(provider) = init_logging(runtime.handle().clone()) {
        let _ = TRACES.set(provider);
    }
    let code = runtime.block_on(async {
        match cli.command {
            Command::Demo => demo::run().await,
            Command::Serve { config, http, workers: _ } => serve(&config, http).await,
            Command::Reload { config } => reload::run(&config).await,
            Command::Tools { config, json } => tools::run(&config, json).await,
            Command::Call { config, session, call_id, tool, args } => call::run(&config, session, call_id, tool, args).await,
            // The ledger's client blocks (PostgreSQL's runs its own runtime).
            Command::Ledger { config, command } => tokio::task::block_in_place(|| ledger::run(&config, command)),
            Command::Approvals { config, command } => tokio::task::block_in_place(|| approvals::run(&config, command)),
            Command::Recover { config } => recover(&config).await,
            Command::Seal { input, output } => seal::run(&input, &output),
            Command::Push { component, target, sign, registry } => registry::push(&component, &target, sign.as_deref(), &registry).await,
            Command::Sign { target, key, registry } => registry::sign(&target, &key, &registry).await,
            Command::Keygen { out } => registry::keygen(&out),
            Command::Pull { config, plugins } => registry::pull(&config, &plugins).await,
            Command::PruneCache { config, older_than_days, dry_run } => registry::prune(&config, older_than_days, dry_run),
            Command::Audit { config, components, json, format, history, against, acks, lock } => {
                let format = format.unwrap_or(if json { audit::Format::Json } else { audit::Format::Text });
                audit::run(audit::Args { config, components, format, history, against, acks, lock }).await
            }
            Command::Sandbox { addr, mode, api_key, uuid_keys } => {
                let mode = match mode {
                    SandboxMode::Stripe => toolguard_sandbox::Mode::Stripe,
                    SandboxMode::Ietf => toolguard_sandbox::Mode::Ietf,
                    SandboxMode::Adyen => toolguard_sandbox::Mode::Adyen,
                };
                sandbox::run(&addr, mode, api_key.as_deref(), uuid_keys).await
            }
        }
    });
    if let Some(provider) = TRACES.get() {
        // Sends what is still batched.
        let _ = provider.shutdown();
    }
    ExitCode::from(code)
}

/// How long a command waits for another toolguard process to release an
/// embedded ledger it needs to write.
const LEDGER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);
/// How often it looks again.
const LEDGER_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Prints a JSON `config-error`; returns the exit status to use.
fn config_error(message: String) -> u8 {
    print_json(&serde_json::json!({ "kind": "config-error", "message": message }));
    EXIT_CONFIG
}

/// Why a command gave up waiting for the ledger.
fn busy_message(why: &str) -> String {
    format!(
        "{why}; waited {} s for it. Stop that process (or wait for it), or run this command through it: a `toolguard serve` \
         on this data directory takes `toolguard call`s handed to it",
        LEDGER_WAIT.as_secs()
    )
}

/// Loads the config and its plugins, waiting (bounded) while another
/// process holds the ledger, or prints a JSON `config-error` and returns the
/// exit status to use.
async fn load(path: &std::path::Path) -> Result<crate::Runtime, u8> {
    let config = crate::Config::load(path).map_err(|e| config_error(e.to_string()))?;
    start(&config).await
}

/// [`load`] for a parsed config.
async fn start(config: &crate::Config) -> Result<crate::Runtime, u8> {
    open_runtime(config, StartUpPass::First).await.map_err(config_error)
}

/// When a host loading its config runs the start-up recovery pass.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StartUpPass {
    /// Before the runtime is handed back: one-shot commands.
    First,
    /// Alongside serving, which starts at once (see [`start_up_pass`]).
    Alongside,
}

/// The runtime of `config`, once the ledger is free (bounded), or why not.
async fn open_runtime(config: &crate::Config, pass: StartUpPass) -> Result<crate::Runtime, String> {
    let deadline = std::time::Instant::now() + LEDGER_WAIT;
    loop {
        let opened = match pass {
            StartUpPass::First => crate::Runtime::from_config(config).await,
            StartUpPass::Alongside => crate::Runtime::from_config_recovering_later(config).await,
        };
        match opened {
            Ok(rt) => return Ok(rt),
            Err(crate::runtime::StartError::LedgerBusy(why)) if std::time::Instant::now() < deadline => {
                tracing::debug!(%why, "waiting for the ledger");
                tokio::time::sleep(LEDGER_POLL).await;
            }
            Err(crate::runtime::StartError::LedgerBusy(why)) => return Err(busy_message(&why)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// Loads the host (which runs the recovery pass) and prints what it did.
/// Exits 1 if anything is left unresolved.
async fn recover(config: &std::path::Path) -> u8 {
    let runtime = match load(config).await {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let report = runtime.recovery().cloned().unwrap_or_default();
    print_json(&serde_json::to_value(&report).unwrap_or_default());
    if report.unresolved.is_empty() && report.needs_operator.is_empty() { 0 } else { EXIT_CALL_FAILED }
}

/// Loads the host and serves MCP until the client (stdio) or the process (HTTP) ends.
async fn serve(path: &std::path::Path, http: Option<std::net::SocketAddr>) -> u8 {
    let config = match crate::Config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("toolguard serve: {e}");
            return EXIT_CONFIG;
        }
    };
    let runtime = match open_runtime(&config, StartUpPass::Alongside).await {
        Ok(rt) => std::sync::Arc::new(rt),
        Err(e) => {
            eprintln!("toolguard serve: {e}");
            return EXIT_CONFIG;
        }
    };
    match crate::serve::run(runtime, &config, path, http).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("toolguard serve: {e:#}");
            EXIT_CONFIG
        }
    }
}
