//! `toolguard-bench`: measures the host (`docs/benchmarks.md`). Build it
//! beside the host it measures — `./dev.sh bench`, or
//! `cargo build --profile bench --locked -p toolguard` then
//! `cargo run --profile bench --locked -p toolguard-bench -- ARGS`.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// Measure: the disk's fsync bound, guarded calls at 1–256 in flight, the
/// guard's CPU path, sandboxes, replays, MCP over HTTP and stdio, memory.
#[derive(Debug, Parser)]
#[command(name = "toolguard-bench", version)]
struct Args {
    /// Where to measure (the data directory's filesystem).
    #[arg(long, default_value = ".toolguard/bench")]
    dir: PathBuf,
    /// A short run (about 1/20 of the work) that checks the benchmarks work.
    #[arg(long)]
    quick: bool,
    /// Also print the figures as JSON at the end.
    #[arg(long)]
    json: bool,
    /// Run only these benchmarks, by letter (e.g. `bd`); (a) always runs,
    /// (i) — the ledger filled with millions of calls — only when named.
    #[arg(long, default_value = "")]
    only: String,
    /// (i) also on this PostgreSQL database (a postgres:// URL; its toolguard tables are filled).
    #[arg(long)]
    postgres: Option<String>,
    /// (i) on the PostgreSQL database alone, without RocksDB (needs `--postgres`).
    #[arg(long, requires = "postgres")]
    postgres_only: bool,
    /// (j): the Python and JavaScript plugins built by plugins/build-foreign.sh
    /// [default: $TOOLGUARD_FOREIGN_PLUGINS]; without them (j) measures Rust alone.
    #[arg(long)]
    foreign: Option<PathBuf>,
    /// (h), (k): the `toolguard` binary to serve from [default: the one beside this program].
    #[arg(long)]
    host: Option<PathBuf>,
    /// (k): another MCP server to measure beside toolguard on an equal
    /// read-only tool, as a command line that speaks MCP on stdio.
    #[arg(long)]
    anchor: Option<String>,
    /// (k): the anchor's tool equal to `text_stats`.
    #[arg(long, default_value = "text-stats")]
    anchor_tool: String,
    /// (k): its arguments as JSON, `{text}` where the text goes.
    #[arg(long, default_value = r#"{"text":{text}}"#)]
    anchor_args: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let host = match args.host.map_or_else(beside_this_program, Ok) {
        Ok(host) => host,
        Err(e) => {
            eprintln!("toolguard-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let foreign = args.foreign.or_else(|| std::env::var_os("TOOLGUARD_FOREIGN_PLUGINS").map(PathBuf::from));
    let anchor = args.anchor.map(|command| toolguard_bench::anchor::Anchor { command, tool: args.anchor_tool, args: args.anchor_args });
    let sources = toolguard_bench::Sources { postgres: args.postgres, postgres_only: args.postgres_only, foreign, anchor, host };
    let scale = toolguard_bench::Scale { factor: if args.quick { 0.05 } else { 1.0 } };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("toolguard-bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(toolguard_bench::run(args.dir, scale, toolguard_bench::Selection(args.only), sources)) {
        Ok(figures) => {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&figures).unwrap_or_default());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("toolguard-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `toolguard` binary beside this one (cargo builds both into one directory).
fn beside_this_program() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let host = me.with_file_name("toolguard");
    if host.exists() {
        Ok(host)
    } else {
        Err(format!(
            "no toolguard binary at {}: build it with the same profile first (`cargo build --profile bench --locked -p toolguard`), \
             or name one with --host",
            host.display()
        ))
    }
}
