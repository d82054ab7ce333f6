//! (k) MCP `tools/call` of a read-only tool over stdio, as a client with the
//! least overhead of its own makes it — one JSON-RPC line out, one back —
//! against `toolguard serve` (the real binary, the `text_stats` plugin),
//! and, given `--anchor`, against another MCP server run the same way on an
//! equal tool: the same client, the same calls, in the same run. Reported:
//! the latency a client sees and the CPU the server spends per call
//! (`/proc/PID/stat`).

use super::unguarded::cpu_of_stat;
use super::{Figure, Scale, Stats, ms, us};
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Another MCP server to measure beside toolguard: how to start it, and the
/// tool and arguments that equal `text_stats`' on the text the bench sends.
#[derive(Debug, Clone)]
pub struct Anchor {
    /// The command line (split on whitespace), speaking MCP on stdin/stdout.
    pub command: String,
    /// The tool to call.
    pub tool: String,
    /// Its arguments: JSON with `{text}` where the text goes.
    pub args: String,
}

/// The text every call sends: a paragraph, so the tool does real work.
const TEXT: &str = "The guard mints the key in code, never the model, never the plugin; the attempt is written \
    before the call goes out, and a repeat of the call returns the recorded outcome and sends nothing.";

/// An MCP server on the other end of a pipe, killed when dropped.
struct Stdio2 {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    next_id: u64,
}

impl Drop for Stdio2 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Stdio2 {
    /// Starts `command` and runs the MCP handshake.
    fn start(mut command: Command) -> anyhow::Result<Self> {
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
        let (input, output) = (child.stdin.take().expect("piped"), BufReader::new(child.stdout.take().expect("piped")));
        let mut server = Self { child, input, output, next_id: 0 };
        server.request("initialize", r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"toolguard-bench","version":"1"}}"#)?;
        writeln!(server.input, r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#)?;
        Ok(server)
    }

    /// Sends one request and returns its response line (notifications in between are skipped).
    fn request(&mut self, method: &str, params: &str) -> anyhow::Result<String> {
        self.next_id += 1;
        let id = self.next_id;
        writeln!(self.input, r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#)?;
        self.input.flush()?;
        let needle = format!(r#""id":{id}"#);
        let mut line = String::new();
        loop {
            line.clear();
            anyhow::ensure!(self.output.read_line(&mut line)? > 0, "the server closed its output");
            if line.contains(&needle) {
                return Ok(line);
            }
        }
    }

    /// The server's CPU time so far, in seconds.
    fn cpu(&self) -> f64 {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).map_or(0.0, |s| cpu_of_stat(&s))
    }
}

/// What `n` calls of `tool` cost through `server`: client-side latencies
/// and server CPU per call, after `n / 5` calls of warm-up.
fn measure(server: &mut Stdio2, tool: &str, args: &str, n: usize) -> anyhow::Result<(Stats, Duration)> {
    let params = |i: usize| format!(r#"{{"name":"{tool}","arguments":{args},"_meta":{{"toolguard/toolCallId":"k{i}","toolguard/sessionId":"bench"}}}}"#);
    for i in 0..n / 5 {
        let answer = server.request("tools/call", &params(i))?;
        anyhow::ensure!(!answer.contains(r#""isError":true"#) && !answer.contains(r#""error""#), "{tool} failed: {answer}");
    }
    let mut samples = Vec::with_capacity(n);
    let cpu = server.cpu();
    for i in 0..n {
        let started = Instant::now();
        server.request("tools/call", &params(n + i))?;
        samples.push(started.elapsed());
    }
    let per_call = Duration::from_secs_f64((server.cpu() - cpu) / n as f64);
    Ok((Stats::of(&mut samples), per_call))
}

/// (k): toolguard and, if given, the anchor, each its own process.
///
/// # Errors
/// A server could not start or a call failed.
pub fn stdio_calls(dir: &Path, scale: Scale, host: &Path, anchor: Option<&Anchor>) -> anyhow::Result<Vec<Figure>> {
    let scratch = tempfile::tempdir_in(dir)?;
    let config = scratch.path().join("toolguard.toml");
    std::fs::write(
        &config,
        "data_dir = \"data\"\n[plugins.text-stats]\ncomponent = \"builtin:text-stats\"\n[policy.plugins.text-stats.tools]\ntext_stats = { effect = \"read-only\" }\n",
    )?;
    let mut command = Command::new(host);
    command.arg("serve").arg("--config").arg(&config);
    let n = scale.n(super::described::K_CALLS);
    let text = serde_json::to_string(TEXT)?;
    let mut ours = Stdio2::start(command)?;
    let (stats, cpu) = measure(&mut ours, "text_stats", &format!(r#"{{"text":{text}}}"#), n)?;
    drop(ours);
    let mut figures = vec![
        Figure::new("(k) MCP stdio tools/call (read-only), p50", ms(stats.p50), "ms"),
        Figure::new("(k) MCP stdio tools/call (read-only), p99", ms(stats.p99), "ms"),
        Figure::new("(k) MCP stdio tools/call (read-only), server CPU per call", us(cpu), "µs"),
    ];
    let Some(anchor) = anchor else {
        figures.push(Figure::new("(k) no --anchor given: no other MCP server measured", 0.0, ""));
        return Ok(figures);
    };
    let mut words = anchor.command.split_whitespace();
    let mut command = Command::new(words.next().ok_or_else(|| anyhow::anyhow!("--anchor is empty"))?);
    command.args(words);
    let mut theirs = Stdio2::start(command)?;
    let (their_stats, their_cpu) = measure(&mut theirs, &anchor.tool, &anchor.args.replace("{text}", &text), n)?;
    drop(theirs);
    let ratio = us(cpu) / us(their_cpu);
    figures[0] = figures[0].clone().against(format!("the anchor's p50 {:.3} ms", ms(their_stats.p50)), ms(stats.p50) / ms(their_stats.p50));
    figures[1] = figures[1].clone().against(format!("the anchor's p99 {:.3} ms", ms(their_stats.p99)), ms(stats.p99) / ms(their_stats.p99));
    figures[2] = figures[2].clone().against(format!("the anchor's {:.0} µs", us(their_cpu)), ratio).target("≤ 0.5× the anchor's", ratio <= 0.5);
    Ok(figures)
}
