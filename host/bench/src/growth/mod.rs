//! (i) flat as the ledger grows: the same figures with 0, 1 M and 10 M
//! completed calls already in the ledger — guarded calls (b), cold replays
//! of old calls (e) and the admission's own latency — and the bytes each
//! completed call takes. Run only when asked for (`--only i`): filling
//! 10 M calls takes minutes and gigabytes.
//!
//! The filler writes, through the ledger's ordinary writes, copies of what
//! one real guarded refund left (its call, attempt and closed episode, with
//! every index those writes keep), each under its own session, id,
//! arguments and key. Guarded calls are measured beside an empty ledger
//! ([`measure`]).

mod measure;
mod report;

use super::guarded::{call_as_a_client, drive, null_provider, refund, refund_config, replay};
use super::{Figure, Scale};
use measure::Figures;
use std::sync::Arc;
use toolguard::keys;
use toolguard::ledger::{AttemptRecord, CallRecord, EpisodeOp, EpisodeRecord, Ledger, LedgerWrite, Prior};
use toolguard::{Config, Runtime};

/// Calls of one filler session (each a distinct action of it).
const PER_SESSION: usize = 1_000;
/// Calls per ledger write while filling.
const BATCH: usize = 1_000;

/// What one real guarded refund left in the ledger.
#[derive(Clone)]
struct Template {
    call: CallRecord,
    attempt: AttemptRecord,
    episode: EpisodeRecord,
}

/// The schema, beside a PostgreSQL ledger's, of the empty ledger measured
/// with it.
const EMPTY_SCHEMA: &str = "toolguard_bench_empty";

/// The figures at one ledger size.
struct AtSize {
    filled: usize,
    /// Guarded calls on the filled ledger.
    own: Figures,
    /// The same, in turns with them, on an empty ledger.
    beside: Figures,
    /// Replays/s of each pass of [`PASSES`] run (none on an empty ledger;
    /// only the first on PostgreSQL).
    cold: Vec<f64>,
    bytes_per_call: f64,
}

/// The passes of cold replays on a filled ledger, each on a fresh host over
/// its own sample of old calls: what it measures, and its RocksDB block cache
/// in MiB (else the default). The first carries the target; the second shows
/// what a larger cache (`ledger_cache_mib`) buys; the third, the default
/// again, separates the first's figure from the order the passes ran in.
const PASSES: [(&str, Option<u64>); 3] = [
    ("cold replays of old calls, 8 in flight", None),
    ("cold replays of other old calls, 64 MiB block cache", Some(64)),
    ("cold replays of still other old calls, the default cache, last", None),
];

/// A host over `ledger` (a directory's `data`, or a PostgreSQL URL), with a
/// RocksDB block cache of `cache_mib` (else the default).
async fn host(dir: &std::path::Path, provider: &str, ledger: Option<&str>, cache_mib: Option<u64>) -> anyhow::Result<Runtime> {
    let mut text = refund_config(provider);
    if let Some(url) = ledger {
        text = text.replacen("data_dir = \"data\"", &format!("data_dir = \"data\"\nledger = {url:?}"), 1);
    }
    if let Some(mib) = cache_mib {
        text = text.replacen("data_dir = \"data\"", &format!("data_dir = \"data\"\nledger_cache_mib = {mib}"), 1);
    }
    Ok(Runtime::from_config(&Config::parse(&text, "<bench>", dir)?).await?)
}

/// (i): the figures at 0, 1 M and 10 M completed calls (scaled), on RocksDB
/// and, given a URL, on PostgreSQL (alone if `postgres_only`).
///
/// # Errors
/// Set-up failed, a write failed or a call failed.
pub async fn growth(dir: &std::path::Path, scale: Scale, postgres: Option<&str>, postgres_only: bool) -> anyhow::Result<Vec<Figure>> {
    let provider = null_provider().await?;
    let sizes = [0, scale.n(1_000_000), scale.n(10_000_000)];
    let mut figures = Vec::new();
    let rocksdb = (!postgres_only).then_some(("RocksDB", None));
    let backends: Vec<(&str, Option<&str>)> = rocksdb.into_iter().chain(postgres.map(|u| ("PostgreSQL", Some(u)))).collect();
    for (backend, url) in backends {
        MEASURED.store(0, std::sync::atomic::Ordering::Relaxed);
        let (scratch, beside) = (tempfile::tempdir_in(dir)?, tempfile::tempdir_in(dir)?);
        let mut runtime = Arc::new(host(scratch.path(), &provider, url, None).await?);
        let ledger = runtime.guard().expect("a guarded host").ledger().clone();
        let held = tokio::task::spawn_blocking(move || ledger.stats()).await??.total_calls();
        anyhow::ensure!(held == 0, "(i) fills the ledger it measures: give it an empty PostgreSQL database (this one holds {held} calls)");
        let empty = Arc::new(host(beside.path(), &provider, empty_schema(&runtime, url, true).await?.as_deref(), None).await?);
        let template = template(&runtime).await?;
        let mut results: Vec<AtSize> = Vec::new();
        for &size in &sizes {
            let ledger = runtime.guard().expect("a guarded host").ledger().clone();
            let filled = results.last().map_or(0, |r| r.filled);
            let started = std::time::Instant::now();
            fill(&ledger, &template, filled, size).await?;
            if size > filled {
                let path = scratch.path().to_path_buf();
                let synced = tokio::task::spawn_blocking(move || write_back(&path)).await??;
                println!(
                    "    ({backend}: filled {} calls in {:.0} s; its dirty pages written back in {:.1} s)",
                    size - filled,
                    started.elapsed().as_secs_f64() - synced.as_secs_f64(),
                    synced.as_secs_f64()
                );
            }
            drop(ledger);
            // A fresh host: nothing of the ledger in its caches.
            drop(runtime);
            runtime = Arc::new(host(scratch.path(), &provider, url, None).await?);
            // Cold replays first, while nothing of the ledger is cached.
            let passes = match (size, url) {
                (0, _) => 0,
                (_, Some(_)) => 1,
                (_, None) => PASSES.len(),
            };
            let mut cold = Vec::new();
            for (pass, (_, cache_mib)) in PASSES.iter().enumerate().take(passes) {
                if pass > 0 {
                    drop(runtime);
                    runtime = Arc::new(host(scratch.path(), &provider, url, *cache_mib).await?);
                }
                cold.push(cold_replays(&runtime, size, scale, pass).await?);
            }
            let (own, beside) = measure::beside_empty(&runtime, &empty, size, scale.n(1_000), scale.n(4_000)).await?;
            let ledger = runtime.guard().expect("a guarded host").ledger().clone();
            let stats = tokio::task::spawn_blocking(move || ledger.stats()).await??;
            let bytes_per_call = stats.bytes as f64 / stats.total_calls().max(1) as f64;
            results.push(AtSize { filled: size, own, beside, cold, bytes_per_call });
        }
        drop(empty);
        empty_schema(&runtime, url, false).await?;
        figures.extend(report::report(backend, &results));
    }
    Ok(figures)
}

/// On PostgreSQL, creates (or drops) [`EMPTY_SCHEMA`] beside the ledger of
/// `runtime`, and once created returns the URL of a ledger in it; on
/// RocksDB, `None` (the empty ledger is a directory of its own). A schema a
/// killed run left is dropped first, so the empty ledger starts empty.
async fn empty_schema(runtime: &Runtime, url: Option<&str>, create: bool) -> anyhow::Result<Option<String>> {
    let Some(url) = url else { return Ok(None) };
    let ledger = runtime.guard().expect("a guarded host").ledger().clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        ledger.bench_schema(EMPTY_SCHEMA, false)?;
        if create {
            ledger.bench_schema(EMPTY_SCHEMA, true)?;
        }
        Ok(())
    })
    .await??;
    if !create {
        return Ok(None);
    }
    let mut beside = url::Url::parse(url)?;
    beside.query_pairs_mut().append_pair("options", &format!("--search_path={EMPTY_SCHEMA}"));
    Ok(Some(beside.into()))
}

/// Makes one guarded refund and reads back what it left.
async fn template(runtime: &Arc<Runtime>) -> anyhow::Result<Template> {
    let request = refund("template".into(), 0);
    call_as_a_client(runtime, &request).await.map_err(anyhow::Error::msg)?;
    let ledger = runtime.guard().expect("a guarded host").ledger().clone();
    let call = ledger.call(&request.session, &request.call_id)?.ok_or_else(|| anyhow::anyhow!("the template call left no record"))?;
    let attempt = ledger.attempts_of_call(&request.session, &request.call_id)?.into_iter().next().ok_or_else(|| anyhow::anyhow!("no attempt"))?;
    let episode =
        ledger.episode(&call.session, &call.tool, &call.args_digest, call.episode)?.ok_or_else(|| anyhow::anyhow!("the template call has no episode"))?;
    anyhow::ensure!(episode.closed, "the template's episode is not closed");
    Ok(Template { call, attempt, episode })
}

/// The arguments of filler call `i` (distinct within its session).
fn args_of(i: usize) -> serde_json::Value {
    serde_json::json!({ "payment_intent": "pi_bench", "amount_cents": i % PER_SESSION + 1, "reason": "duplicate" })
}

/// The session of filler call `i`: `fill-` and five digits (what
/// `Ledger::replicate_for_bench` writes), so all sort together and a
/// measured session ([`measured_session`]) can sort among them.
fn session_of(i: usize) -> String {
    format!("fill-{:05}", i / PER_SESSION)
}

/// Sessions measured so far in this run (each a new one).
static MEASURED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A new session for measured calls whose keys sort **among** the filler
/// sessions' (`fill-0123m` between `fill-01239` and `fill-01240`), as a
/// real new session's land among the old ones, spread over the first
/// thousand filler sessions (1 M calls): a lookup of its calls meets the tables' index and
/// filter partitions there, not the end of the key range where no table
/// reaches. Unique for the first 100 of a backend's run (37 and 100 are
/// coprime); (i) measures 54 on each.
fn measured_session() -> String {
    let n = MEASURED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("fill-{:04}m", (n * 37) % 100)
}

/// The tool-call id of filler call `i`: ids repeat across sessions, as a
/// model's do.
fn call_id_of(i: usize) -> String {
    format!("f{}", i % PER_SESSION)
}

/// Writers filling at once (PostgreSQL's round trips overlap; RocksDB's
/// group commit takes them together).
const FILLERS: usize = 4;

/// Writes filler calls `from..to` (whole sessions), then settles the
/// ledger. The first session is written through the ledger's ordinary
/// writes; the others are its copies, made by the backend itself where it
/// can (PostgreSQL), else written the same way by [`FILLERS`] writers.
async fn fill(ledger: &Ledger, t: &Template, from: usize, to: usize) -> anyhow::Result<()> {
    let mut from = from;
    if from == 0 && to > 0 {
        write_calls(ledger, t, 0, PER_SESSION.min(to)).await?;
        from = PER_SESSION.min(to);
    }
    let (first, last) = (from / PER_SESSION, to.div_ceil(PER_SESSION));
    let l = ledger.clone();
    let fast = first < last && tokio::task::spawn_blocking(move || l.replicate_for_bench(&session_of(0), "fill-", first as u64, last as u64 - 1)).await??;
    if !fast {
        write_calls(ledger, t, from, to).await?;
    }
    // Compacted, as a ledger that grew over months would be: a bulk load's
    // pending compactions would otherwise compete with the measurement.
    let ledger = ledger.clone();
    tokio::task::spawn_blocking(move || ledger.settle()).await??;
    Ok(())
}

/// Writes the filesystem of `dir` back to disk (`syncfs`), as a ledger that
/// grew over months is, so that no writeback of the fill competes with the
/// reads measured next. Returns how long that took (≈ 0 so far: RocksDB
/// syncs its table files as it writes them).
fn write_back(dir: &std::path::Path) -> anyhow::Result<std::time::Duration> {
    use std::os::fd::AsRawFd;
    let started = std::time::Instant::now();
    let file = std::fs::File::open(dir)?;
    // SAFETY: `syncfs` reads only the descriptor, which `file` keeps open.
    if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(started.elapsed())
}

/// Writes filler calls `from..to` through the ledger's ordinary writes, in
/// batches, unsynced, by [`FILLERS`] writers at once.
async fn write_calls(ledger: &Ledger, t: &Template, from: usize, to: usize) -> anyhow::Result<()> {
    let digests: Arc<Vec<String>> = Arc::new((0..PER_SESSION).map(|i| keys::args_digest(&keys::canonical_args(&args_of(i)).expect("plain JSON"))).collect());
    let batches: Vec<usize> = (from..to).step_by(BATCH).collect();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..FILLERS)
        .map(|_| {
            let (ledger, t, digests, batches, next) = (ledger.clone(), t.clone(), digests.clone(), batches.clone(), next.clone());
            tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                while let Some(&start) = batches.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    let (mut open, mut close) = (LedgerWrite::new(), LedgerWrite::new());
                    for n in start..(start + BATCH).min(to) {
                        let (call, attempt, episode) = copy(&ledger, &t, n, &digests[n % PER_SESSION]);
                        let opened = EpisodeRecord { closed: false, closed_ms: None, ..episode.clone() };
                        open = open.call(call).attempt_over(attempt, Prior::Absent).episode(EpisodeOp::Open(opened));
                        close = close.episode(EpisodeOp::Close { at_ms: episode.closed_ms.unwrap_or_default(), episode: episode.id() });
                    }
                    ledger.commit(open, toolguard::ledger::Durability::Buffered)?;
                    ledger.commit(close, toolguard::ledger::Durability::Buffered)?;
                }
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        worker.await??;
    }
    Ok(())
}

/// Filler call `n`: the template's records under their own identity.
fn copy(ledger: &Ledger, t: &Template, n: usize, digest: &str) -> (CallRecord, AttemptRecord, EpisodeRecord) {
    let (session, call_id) = (session_of(n), call_id_of(n));
    let call = CallRecord { session: session.clone(), call_id: call_id.clone(), args_digest: digest.to_string(), args: args_of(n), ..t.call.clone() };
    let input = keys::KeyInput { session: &session, call_id: &call_id, tool: &call.tool, args_digest: digest, step: 0, generation: 0 };
    let attempt = AttemptRecord { key: keys::mint(ledger.secret(), input), session: session.clone(), call_id: call_id.clone(), ..t.attempt.clone() };
    let episode = EpisodeRecord { session, args_digest: digest.to_string(), executor: call_id, ..t.episode.clone() };
    (call, attempt, episode)
}

/// Replays per second of 5,000 (scaled) filler calls spread over the whole
/// ledger of `filled` calls, 8 in flight; each `sample` (a pass of [`PASSES`]) picks other calls.
async fn cold_replays(runtime: &Arc<Runtime>, filled: usize, scale: Scale, sample: usize) -> anyhow::Result<f64> {
    let n = scale.n(5_000);
    let rt = runtime.clone();
    let (cached, read, machine) = (page_cache_mib(), disk_read_bytes(), disks_read());
    let (_, wall) = drive(8, n, move |k| {
        let i = (k * 7_919_993 + sample * filled / 3) % filled;
        let request = toolguard::CallRequest {
            session: session_of(i),
            call_id: call_id_of(i),
            tool: "refund".into(),
            args_json: args_of(i).to_string(),
            principal: None,
            tenant: None,
        };
        replay(rt.clone(), request)
    })
    .await?;
    // Where the reads came from: the disk, or the OS page cache. This
    // process's own reads miss a PostgreSQL server's; the machine's disks see both.
    let (reads, bytes) = disks_read();
    println!(
        "    (cold replays, pass {sample}, {filled} calls: OS page cache {cached} MiB before; per replay, this process read {:.1} KiB from the disk, \
         the machine's disks {:.1} KiB in {:.2} reads)",
        disk_read_bytes().saturating_sub(read) as f64 / 1024.0 / n as f64,
        bytes.saturating_sub(machine.1) as f64 / 1024.0 / n as f64,
        reads.saturating_sub(machine.0) as f64 / n as f64
    );
    Ok(n as f64 / wall.as_secs_f64())
}

/// The OS page cache now, in MiB (`Cached` of `/proc/meminfo`; 0 if unreadable).
fn page_cache_mib() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = info.lines().find_map(|l| l.strip_prefix("Cached:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kib.unwrap_or(0) / 1024
}

/// Bytes this process has read from the disk (`read_bytes` of `/proc/self/io`; 0 if unreadable).
fn disk_read_bytes() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("read_bytes:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Reads completed and bytes read by the machine's disks (`/proc/diskstats`,
/// block devices backed by hardware: not loop, RAM or zram devices, nor
/// partitions, which their disk already counts); zeros if unreadable.
fn disks_read() -> (u64, u64) {
    let stats = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    stats
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            f.get(2).filter(|name| std::path::Path::new(&format!("/sys/block/{name}/device")).exists())?;
            Some((f.get(3)?.parse::<u64>().ok()?, f.get(5)?.parse::<u64>().ok()? * 512))
        })
        .fold((0, 0), |(r, b), (reads, bytes)| (r + reads, b + bytes))
}
