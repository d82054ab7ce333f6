//! `toolguard-bench`: the figures of `docs/benchmarks.md`, each printed with
//! a ratio to a baseline measured in the same run (the disk's own fsync
//! rate above all). Benchmarks report targets; nothing here asserts them.
//!
//! A crate of its own, beside the host: the shipped `toolguard` has no
//! benchmark in it. What the benchmarks need from the host — the unguarded
//! baseline runtime, the per-phase clocks, a slowed fsync — exists only with
//! toolguard's `bench` feature, which this crate turns on. (h) and (k)
//! measure the real `toolguard` binary, the one a default build makes.
//!
//! - [`disk`]: (a) sequential synced appends and batches of 64 — the bound.
//! - [`unguarded`]: (b) guarded calls against the same calls unguarded at
//!   1/8/64/256 in flight, by phase, and on a slowed disk.
//! - [`guarded`]: what (b) is built from, (c) the guard's CPU path, (e) replays.
//! - [`host`]: (d) a fresh sandbox + one invoke, (f) MCP over HTTP, (g) RSS.
//! - [`growth`]: (i) the same figures with 0, 1 M and 10 M completed calls in the ledger (only on request).
//! - [`idle`]: (h) the CPU of `toolguard serve` idle and at one call per second.
//! - [`languages`]: (j) a fresh sandbox + invoke of the same tool in Rust, Python and JavaScript.
//! - [`threads`]: CPU per call by the role of the thread that spent it, for (b).
//! - [`anchor`]: (k) MCP `tools/call` over stdio, against another MCP server on an equal tool.

pub mod anchor;
pub mod described;
pub mod disk;
pub mod growth;
pub mod guarded;
pub mod host;
pub mod idle;
pub mod languages;
pub mod limits;
pub mod threads;
pub mod unguarded;

use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// How much work each benchmark does.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Multiplies the iteration counts (1.0: the documented run).
    pub factor: f64,
}

/// Where the optional inputs of some benchmarks come from.
#[derive(Debug, Clone)]
pub struct Sources {
    /// (i) also on this PostgreSQL database.
    pub postgres: Option<String>,
    /// (i) on PostgreSQL alone: RocksDB is not measured.
    pub postgres_only: bool,
    /// (j): the Python and JavaScript plugins `plugins/build-foreign.sh` built.
    pub foreign: Option<PathBuf>,
    /// (k): another MCP server to measure beside toolguard.
    pub anchor: Option<anchor::Anchor>,
    /// (h), (k): the `toolguard` binary to run as a server.
    pub host: PathBuf,
}

/// Which benchmarks to run, by letter (`a`–`k`); (a) always runs: the others
/// need its bound. (i), which fills ledgers with millions of calls, runs only when named.
#[derive(Debug, Clone)]
pub struct Selection(pub String);

impl Selection {
    /// Whether `letter` runs: named, or every benchmark but (i) when none is.
    fn has(&self, letter: char) -> bool {
        self.0.contains(letter) || (self.0.is_empty() && letter != 'i')
    }
}

impl Scale {
    /// `n` scaled, at least 10.
    pub fn n(&self, n: usize) -> usize {
        ((n as f64 * self.factor) as usize).max(10)
    }
}

/// One reported figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// Which benchmark (a–g) and what.
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// What it is compared with, measured in the same run.
    pub baseline: Option<String>,
    /// The figure divided by the baseline.
    pub ratio: Option<f64>,
    /// The target from the issue, in words.
    pub target: Option<String>,
    /// Whether the target is met (`None`: no target).
    pub met: Option<bool>,
}

impl Figure {
    fn new(name: impl Into<String>, value: f64, unit: &'static str) -> Self {
        Self { name: name.into(), value, unit, baseline: None, ratio: None, target: None, met: None }
    }

    fn against(mut self, baseline: impl Into<String>, ratio: f64) -> Self {
        self.baseline = Some(baseline.into());
        self.ratio = Some(ratio);
        self
    }

    fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = Some(target.into());
        self.met = Some(met);
        self
    }
}

/// Latency statistics of a set of samples.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    /// Median.
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Mean.
    pub mean: Duration,
}

impl Stats {
    /// Statistics of `samples` (which it sorts).
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
        let total: Duration = samples.iter().sum();
        Self { p50: at(0.50), p99: at(0.99), mean: total / samples.len().max(1) as u32 }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Runs every benchmark in `dir` (the data directory's filesystem) and
/// prints each figure as it comes; returns them all.
///
/// # Errors
/// A benchmark could not set up (no engine, no ledger, a port).
pub async fn run(dir: PathBuf, scale: Scale, only: Selection, sources: Sources) -> anyhow::Result<Vec<Figure>> {
    std::fs::create_dir_all(&dir)?;
    let mut figures = Vec::new();
    let mut report = |f: Vec<Figure>| {
        for f in &f {
            println!("{}", line(f));
        }
        figures.extend(f);
    };
    println!("toolguard-bench — build profile: {}, data dir: {}\n", profile(), dir.display());
    let bound = disk::measure(&dir, scale).await?;
    report(bound.figures());
    // (g) first: RSS is the process's, and the other benchmarks leave theirs behind.
    if only.has('g') {
        report(host::memory(&dir, scale).await?);
    }
    if only.has('b') {
        report(unguarded::throughput(&dir, &bound, scale).await?);
    }
    if only.has('c') {
        report(guarded::cpu_path(&dir, &bound, scale).await?);
    }
    if only.has('d') {
        report(host::fresh_sandbox(&dir, &bound, scale).await?);
    }
    if only.has('e') {
        report(guarded::replays(&dir, &bound, scale).await?);
    }
    if only.has('f') {
        report(host::mcp_http(&dir, &bound, scale).await?);
    }
    if only.has('h') {
        report(idle::serve_cpu(&dir, scale, &sources.host).await?);
    }
    if only.has('i') {
        report(growth::growth(&dir, scale, sources.postgres.as_deref(), sources.postgres_only).await?);
    }
    if only.has('j') {
        report(languages::per_language(&dir, scale, sources.foreign.as_deref()).await?);
    }
    if only.has('l') {
        report(limits::admission(&dir, scale).await?);
    }
    if only.has('k') {
        let (dir, host, anchor) = (dir.clone(), sources.host.clone(), sources.anchor.clone());
        report(tokio::task::spawn_blocking(move || anchor::stdio_calls(&dir, scale, &host, anchor.as_ref())).await??);
    }
    Ok(figures)
}

/// One figure as a line of the report.
pub fn line(f: &Figure) -> String {
    let mut s = format!("{:<58} {:>12.2} {:<9}", f.name, f.value, f.unit);
    if let (Some(b), Some(r)) = (&f.baseline, f.ratio) {
        s.push_str(&format!("  {r:>6.3}× {b}"));
    }
    if let (Some(t), Some(met)) = (&f.target, f.met) {
        s.push_str(&format!("  [target {t}: {}]", if met { "met" } else { "NOT met" }));
    }
    s
}

/// The profile this binary was built with.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) { "dev (debug assertions; figures are not representative)" } else { "optimised" }
}
