//! The `toolguard` command line: argument parsing, logging set-up and
//! dispatch. Each subcommand lives in its own module.

mod audit;
mod call;
mod demo;
mod ledger;
mod sandbox;
mod seal;
mod tools;

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
        /// Show which component digests ran with which grants, from the ledger.
        #[arg(long)]
        history: bool,
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
            Command::Tools { config, json } => tools::run(&config, json).await,
            Command::Call { config, session, call_id, tool, args } => call::run(&config, session, call_id, tool, args).await,
            // The ledger's client blocks (PostgreSQL's runs its own runtime).
            Command::Ledger { config, command } => tokio::task::block_in_place(|| ledger::run(&config, command)),
            Command::Recover { config } => recover(&config).await,
            Command::Seal { input, output } => seal::run(&input, &output),
            Command::Audit { config, components, json, history } => audit::run(&config, &components, json, history).await,
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

/// The trace exporter, when a collector is configured.
static TRACES: std::sync::OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = std::sync::OnceLock::new();

/// Sends the spans still batched to the collector, if there is one (before
/// [`exit_now`], which would drop them).
fn flush_traces() {
    if let Some(provider) = TRACES.get() {
        let _ = tokio::task::block_in_place(|| provider.force_flush());
    }
}

/// Ends the process at once with `code`: stdout and stderr flushed, nothing
/// torn down (no destructor runs; the ledger is left as a kill would leave
/// it, which it is built to survive). For `toolguard call` once the record
/// that its caller was told has been written: nothing durable is left to
/// do, and every moment the process lived on would be one in which a kill
/// takes the clean exit from a caller that trusts only one, while the
/// ledger says that caller was told.
fn exit_now(code: u8) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process without running atexit handlers or
    // destructors; nothing here relies on them (stdio is flushed above, and
    // every ledger write the caller relies on has landed).
    unsafe { libc::_exit(i32::from(code)) }
}

/// Logs go to stderr (stdout carries results). `TOOLGUARD_LOG` takes an
/// `EnvFilter` directive; the default shows plugin output and warnings.
/// `TOOLGUARD_LOG_SPANS=1` also logs each `tool_call` and `attempt` span as
/// it closes, with its fields (outcome, key, step, state, latency): an
/// access log. With `OTEL_EXPORTER_OTLP_ENDPOINT` set, the spans also go to
/// that OpenTelemetry collector (the provider returned is to be shut down
/// at exit, which sends what is still batched).
fn init_logging(runtime: tokio::runtime::Handle) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOOLGUARD_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let log_spans = std::env::var_os("TOOLGUARD_LOG_SPANS").is_some_and(|v| v == "1");
    let provider = crate::telemetry::otlp_provider(runtime);
    let logs = log_subscriber(filter, ansi, log_spans, provider.is_some());
    // No layer at all without a collector: even an empty one would make the
    // per-call spans live.
    let _ = match &provider {
        Some(p) => logs.with(crate::telemetry::layer(p)).try_init(),
        None => logs.try_init(),
    };
    provider
}

/// The log (stderr, through `filter`), before any OpenTelemetry layer. The
/// per-call spans (`tool_call`, `attempt`) are logged as they close if
/// `log_spans`; unless `spans_wanted` (logged, or sent to a collector) they
/// are off for the whole subscriber, not just ignored by the log: a span a
/// global filter lets through is built, stored and entered on every poll of
/// the call's futures even when no layer wants it (~3 % of a guarded call's
/// CPU at 64 in flight), and formatting their fields for every call halved
/// replay throughput (docs/benchmarks.md, e).
fn log_subscriber(
    filter: tracing_subscriber::EnvFilter,
    ansi: bool,
    log_spans: bool,
    spans_wanted: bool,
) -> impl tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span> + Send + Sync {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = if log_spans { tracing_subscriber::fmt::format::FmtSpan::CLOSE } else { tracing_subscriber::fmt::format::FmtSpan::NONE };
    let per_call = |m: &tracing::Metadata<'_>| m.is_span() && matches!(m.name(), "tool_call" | "attempt");
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_span_events(spans)
        .with_filter(tracing_subscriber::filter::filter_fn(move |m| log_spans || !per_call(m)));
    let calls = tracing_subscriber::filter::filter_fn(move |m| spans_wanted || !per_call(m));
    tracing_subscriber::registry().with(filter).with(calls).with(fmt)
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

/// The directory of a config's embedded ledger, if it has one.
fn ledger_dir(config: &crate::Config) -> Option<&std::path::Path> {
    match &config.ledger {
        crate::ledger::LedgerLocation::Dir(dir) => Some(dir),
        crate::ledger::LedgerLocation::Postgres(_) => None,
    }
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
    let shared = runtime.guard().is_some_and(|g| g.ledger().shared());
    let passes = runtime.clone();
    tokio::spawn(async move {
        start_up_pass(&passes).await;
        if shared {
            takeovers(passes).await;
        }
    });
    if let (Some(retention), Some(guard)) = (config.retention, runtime.guard()) {
        tokio::spawn(prune_every(guard.ledger().clone(), retention));
    }
    // `toolguard call`s on this data directory hand their calls to this process.
    let _listener = ledger_dir(&config).and_then(crate::local::socket_path).and_then(|path| {
        crate::local::Listener::start(path, runtime.clone(), crate::local::config_digest(&config))
            .inspect_err(|e| tracing::warn!(error = %e, "cannot take `toolguard call`s from other processes"))
            .ok()
    });
    let host = crate::mcp::McpHost::new(runtime, config.mcp.clone());
    let served = match http {
        Some(addr) => crate::mcp::http::serve(host, addr).await,
        None => {
            let workers = tokio::runtime::Handle::current().metrics().num_workers();
            eprintln!("toolguard: MCP on stdio, {workers} async worker(s)");
            host.serve_stdio().await
        }
    };
    match served {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("toolguard serve: {e:#}");
            EXIT_CONFIG
        }
    }
}

/// `serve`'s start-up recovery pass, run while it already answers: a
/// provider that is down or slow delays only the calls whose attempts wait
/// on it, not the host's start (`docs/recovery.md`, "Start-up").
/// The pass logs what it did itself.
async fn start_up_pass(runtime: &crate::Runtime) {
    if let Err(e) = runtime.recover().await {
        tracing::warn!(error = %e, "start-up recovery pass failed; each call still drives its own unsettled attempts");
    }
}

/// How often a host of a fleet looks for tool calls whose host died.
const TAKEOVER_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// On a shared ledger: a recovery pass every [`TAKEOVER_INTERVAL`], which
/// takes over the unsettled attempts of calls whose claim lapsed (their host
/// died) and resolves them with the same keys; an attempt no pass settles is
/// tried less often as it ages ([`crate::Runtime::takeover_pass`]).
async fn takeovers(runtime: std::sync::Arc<crate::Runtime>) {
    loop {
        tokio::time::sleep(TAKEOVER_INTERVAL).await;
        if let Err(e) = runtime.takeover_pass().await {
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

/// Prints pretty JSON to stdout.
fn print_json(value: &serde_json::Value) {
    let _ = write_json(value);
}

/// Writes pretty JSON and a newline to stdout and flushes it.
///
/// # Errors
/// stdout is closed or full (the reader went away).
fn write_json(value: &serde_json::Value) -> std::io::Result<()> {
    use std::io::Write as _;
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json_for_terminal(&text))?;
    out.flush()
}

/// `json` with every character a terminal could act on written as a JSON
/// `\u` escape: the same JSON value, but ids and results from plugins or
/// clients cannot move the cursor, retitle the window or reorder text when
/// printed. (serde_json escapes C0 controls already; C1 controls and bidi
/// overrides pass through it.)
fn json_for_terminal(json: &str) -> std::borrow::Cow<'_, str> {
    if !json.chars().any(unsafe_on_terminal) {
        return json.into();
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_on_terminal(c) {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out.into()
}

/// Control characters (but the newlines and indents of pretty JSON) and
/// the bidirectional overrides that reorder what a terminal shows.
fn unsafe_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\n') || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with what a terminal could act on shown as escapes, for the
/// tables of `toolguard ledger` (which print ids plugins and clients chose).
fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c == '\n' || unsafe_on_terminal(c)) {
        return text.into();
    }
    text.chars().map(|c| if c == '\n' || unsafe_on_terminal(c) { c.escape_unicode().to_string() } else { c.to_string() }).collect::<String>().into()
}

#[cfg(test)]
mod tests {
    /// Whether a span named `name` is live under the log built with these settings.
    fn live(name: &str, log_spans: bool, spans_wanted: bool) -> bool {
        let log = super::log_subscriber(tracing_subscriber::EnvFilter::new("info"), false, log_spans, spans_wanted);
        tracing::subscriber::with_default(log, || match name {
            "tool_call" => !tracing::info_span!("tool_call", tool = "refund").is_disabled(),
            "attempt" => !tracing::info_span!("attempt", step = 0).is_disabled(),
            _ => !tracing::info_span!("startup").is_disabled(),
        })
    }

    #[test]
    fn the_per_call_spans_are_off_unless_logged_or_sent_to_a_collector() {
        for name in ["tool_call", "attempt"] {
            assert!(!live(name, false, false), "{name}: nothing wants it, so it must cost nothing");
            assert!(live(name, true, true), "{name}: TOOLGUARD_LOG_SPANS=1 logs it");
            assert!(live(name, false, true), "{name}: a collector receives it");
        }
        assert!(live("startup", false, false), "other spans follow TOOLGUARD_LOG alone");
    }
}
