//! (b) guarded calls against the same calls unguarded: the same plugin, the
//! same provider, the same requests, once through the guard and once with
//! `send` going straight to HTTP (a runtime only the bench can build). The
//! ratio says what the guard costs; the phase clocks say where; the
//! slow-fsync mode says how close the guard gets to the disk's bound when
//! the disk, not the CPU, is what limits it.

use super::disk::Bound;
use super::guarded::{call_as_a_client, drive, null_provider, refund, refund_host};
use super::threads::{ROLES, Role, Snapshot};
use super::{Figure, Scale, Stats, ms, us};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use toolguard::Runtime;
use toolguard::phases::{self, Phase};

/// One measured run of calls.
pub(crate) struct Run {
    pub(crate) per_sec: f64,
    /// Latency from the call to the record of what its caller was told.
    pub(crate) stats: Stats,
    /// Latency from the call to its answer: what the caller waits for (the
    /// host records what it told the caller after the answer has left).
    pub(crate) answered: Stats,
    /// Process CPU time per call, in seconds.
    pub(crate) cpu: f64,
    /// Context switches per call, voluntary and not, of all the process's threads.
    pub(crate) switches: f64,
    /// CPU time per call, in seconds, by the role of the thread that spent it.
    pub(crate) by_role: HashMap<Role, f64>,
}

/// Makes `total` refund calls at `in_flight` on `rt`, ids `{prefix}{n}`.
async fn measure(rt: &Arc<Runtime>, in_flight: usize, total: usize, prefix: &str) -> anyhow::Result<Run> {
    let prefix = prefix.to_string();
    measure_calls(rt, in_flight, total, move |i| refund(format!("{prefix}{i}"), i)).await
}

/// Makes calls `request(0..total)` at `in_flight` on `rt`, as a client makes them.
pub(crate) async fn measure_calls(
    rt: &Arc<Runtime>,
    in_flight: usize,
    total: usize,
    request: impl Fn(usize) -> toolguard::CallRequest + Send + Sync + 'static,
) -> anyhow::Result<Run> {
    let rt = rt.clone();
    let answered = Arc::new(std::sync::Mutex::new(Vec::with_capacity(total)));
    let answers = answered.clone();
    let (cpu, switches, threads) = (cpu_seconds(), context_switches(), Snapshot::now());
    let (mut samples, wall) = drive(in_flight, total, move |i| {
        let (rt, request, answers) = (rt.clone(), request(i), answers.clone());
        async move {
            let to_answer = call_as_a_client(&rt, &request).await?;
            answers.lock().expect("no panic while held").push(to_answer);
            Ok(())
        }
    })
    .await?;
    let answered = Stats::of(&mut answered.lock().expect("no panic while held"));
    let spent = cpu_seconds() - cpu;
    let by_role = threads.spent_until(&Snapshot::now(), spent).into_iter().map(|(role, s)| (role, s / total as f64)).collect();
    let switches = context_switches().saturating_sub(switches) as f64 / total as f64;
    Ok(Run { per_sec: total as f64 / wall.as_secs_f64(), stats: Stats::of(&mut samples), answered, cpu: spent / total as f64, switches, by_role })
}

/// (b): guarded and unguarded refunds at 1, 8, 64 and 256 in flight, the
/// guard's cost by phase at 1 in flight, and 64 in flight on a disk made
/// slow on purpose.
///
/// # Errors
/// Set-up failed or a call failed.
pub async fn throughput(dir: &std::path::Path, bound: &Bound, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let provider = null_provider().await?;
    let scratch = tempfile::tempdir_in(dir)?;
    let guarded = Arc::new(refund_host(&scratch.path().join("guarded"), &provider).await?);
    let unguarded = Arc::new(refund_host(&scratch.path().join("unguarded"), &provider).await?.unguarded_for_bench());
    let mut figures = super::guarded::baselines(&scratch.path().join("baseline-ledger"), &provider, bound, scale).await?;
    let ledger = guarded.guard().expect("the bench host has a guard").ledger().clone();
    for in_flight in [1usize, 8, 64, 256] {
        let total = scale.n(if in_flight == 1 { super::described::B_ONE } else { super::described::B_MANY });
        // Unmeasured first: each side fills its instance pool and opens its
        // HTTP connections at this concurrency (a cold start of 2,000 calls
        // once halved the unguarded rate, flattering the ratio).
        for (rt, side) in [(&unguarded, "u"), (&guarded, "g")] {
            measure(rt, in_flight, scale.n(in_flight * super::described::B_WARM_PER_WORKER).min(total), &format!("warm-{side}{in_flight}-")).await?;
        }
        let u = measure(&unguarded, in_flight, total, &format!("u{in_flight}-")).await?;
        let (syncs, synced, pool_reads) = (ledger.wal_syncs().unwrap_or(0), ledger.write_counts().0, ledger.pool_reads());
        let g = measure(&guarded, in_flight, total, &format!("b{in_flight}-")).await?;
        let pool_reads = (ledger.pool_reads() - pool_reads) as f64 / total as f64;
        let fsyncs = ledger.wal_syncs().unwrap_or(0).saturating_sub(syncs).max(1);
        let shared = (ledger.write_counts().0 - synced) as f64 / fsyncs as f64;
        figures.extend(compare(in_flight, &g, &u, bound));
        // Group commit at work: synced ledger writes (one per call) per WAL fsync.
        figures.push(Figure::new(format!("(b) guarded, {in_flight:>3} in flight, synced writes per fsync"), shared, "writes"));
        // Reads memory could not answer: each a hop to the blocking pool and back.
        figures.push(Figure::new(format!("(b) guarded, {in_flight:>3} in flight, ledger reads memory could not answer, per call"), pool_reads, "reads"));
    }
    figures.extend(by_phase(&guarded, &unguarded, scale).await?);
    for extra_ms in [1u64, 4] {
        figures.push(slow_disk(&guarded, bound, scale, Duration::from_millis(extra_ms)).await?);
    }
    // Last: it leaves the ledger ~100,000 calls larger, and the actions of
    // the runs above with their episodes in older table files, out of the
    // block cache (a repeat then reads its episode from disk).
    figures.extend(sustained(&guarded, &unguarded, &ledger, scale).await?);
    Ok(figures)
}

/// The figures of one level of concurrency, guarded against unguarded.
fn compare(in_flight: usize, g: &Run, u: &Run, bound: &Bound) -> Vec<Figure> {
    let mut figures_by_role = Vec::new();
    let mut answered = None;
    let label = |what: &str| format!("(b) guarded, {in_flight:>3} in flight, {what}");
    let [rate, cpu] = rate_and_cpu(&label, g, u, in_flight == 64);
    let mut p50 = Figure::new(label("p50"), ms(g.stats.p50), "ms").against(format!("unguarded {:.3} ms", ms(u.stats.p50)), ms(g.stats.p50) / ms(u.stats.p50));
    let p99 = Figure::new(label("p99"), ms(g.stats.p99), "ms").against(format!("unguarded {:.3} ms", ms(u.stats.p99)), ms(g.stats.p99) / ms(u.stats.p99));
    if in_flight == 64 {
        figures_by_role = by_role(&label("CPU per call"), g, u);
    }
    let switches = Figure::new(label("context switches per call"), g.switches, "switches")
        .against(format!("unguarded {:.1}", u.switches), g.switches / u.switches.max(f64::MIN_POSITIVE));
    let mut figures = vec![switches];
    if in_flight == 1 {
        let allowed = ms(u.stats.p50) + ms(bound.sync.p50) + 0.050;
        p50 = p50.target(format!("≤ unguarded + one fsync (a) + 50 µs = {allowed:.3} ms"), ms(g.stats.p50) <= allowed);
        // What the caller waits for: the record of what it was told follows the answer.
        let allowed = ms(u.answered.p50) + ms(bound.sync.p50) + 0.050;
        answered = Some(
            Figure::new(label("p50 until the answer (the report follows it)"), ms(g.answered.p50), "ms")
                .against(format!("unguarded {:.3} ms", ms(u.answered.p50)), ms(g.answered.p50) / ms(u.answered.p50))
                .target(format!("≤ unguarded + one fsync (a) + 50 µs = {allowed:.3} ms"), ms(g.answered.p50) <= allowed),
        );
        // Busy polling would show as more CPU than the call's own wall time.
        let wall = g.stats.mean.as_secs_f64();
        figures
            .push(Figure::new(label("CPU per call ÷ wall time per call"), g.cpu / wall, "×").target("≤ 2× (no core burnt while waiting)", g.cpu <= 2.0 * wall));
    }
    figures.splice(0..0, [Some(rate), Some(p50), answered, Some(p99), Some(cpu)].into_iter().flatten());
    figures.extend(figures_by_role);
    figures
}

/// Calls/s and CPU per call of `g` against `u`, with the targets of 64 in
/// flight when `targeted`.
fn rate_and_cpu(label: &dyn Fn(&str) -> String, g: &Run, u: &Run, targeted: bool) -> [Figure; 2] {
    let rate = Figure::new(label("calls/s"), g.per_sec, "calls/s").against(format!("unguarded {:.0}/s", u.per_sec), g.per_sec / u.per_sec);
    let cpu = Figure::new(label("CPU per call"), g.cpu * 1e6, "µs").against(format!("unguarded {:.0} µs", u.cpu * 1e6), g.cpu / u.cpu);
    if !targeted {
        return [rate, cpu];
    }
    [rate.target("≥ 0.7× unguarded", g.per_sec >= 0.7 * u.per_sec), cpu.target("≤ 1.5× unguarded", g.cpu <= 1.5 * u.cpu)]
}

/// The CPU per call of `g` and `u` split by the role of the thread that
/// spent it: where, at 64 in flight, the guard's extra CPU lies.
fn by_role(label: &str, g: &Run, u: &Run) -> Vec<Figure> {
    ROLES
        .iter()
        .map(|role| {
            let (gs, us) = (g.by_role[role] * 1e6, u.by_role[role] * 1e6);
            // A role the unguarded call hardly uses (the ledger's threads) has no meaningful ratio.
            if us >= 1.0 {
                Figure::new(format!("{label}: {}", role.label()), gs, "µs").against(format!("unguarded {us:.0} µs"), gs / us)
            } else {
                Figure::new(format!("{label}: {} (unguarded {us:.1} µs)", role.label()), gs, "µs")
            }
        })
        .collect()
}

/// 64 in flight held long enough for the ledger's memtables to fill and
/// flush several times and its compactions to run (100,000 calls each side,
/// ~30 per cent of the memtable budget per 10,000 guarded calls): the cost a
/// host serving without pause pays, which the 8,000-call runs above only
/// begin to include.
async fn sustained(guarded: &Arc<Runtime>, unguarded: &Arc<Runtime>, ledger: &toolguard::ledger::Ledger, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let total = scale.n(super::described::B_SUSTAINED);
    let u = measure(unguarded, 64, total, "su-").await?;
    let pool_reads = ledger.pool_reads();
    let g = measure(guarded, 64, total, "sg-").await?;
    let pool_reads = (ledger.pool_reads() - pool_reads) as f64 / total as f64;
    let label = |what: &str| format!("(b) guarded,  64 in flight, sustained ({total} calls), {what}");
    let mut figures = Vec::from(rate_and_cpu(&label, &g, &u, true));
    figures.extend(by_role(&label("CPU per call"), &g, &u));
    // Its calls repeat the arguments, so the actions, of earlier calls (whose
    // episodes a repeat reads): some now only in table files not in the cache.
    figures.push(Figure::new(label("ledger reads memory could not answer, per call"), pool_reads, "reads"));
    Ok(figures)
}

/// Where the difference goes at 1 in flight: the wall time of each phase per
/// call, guarded minus unguarded (the unguarded run has no admission, no
/// ledger writes and no report; its run and HTTP exchange are the baseline).
async fn by_phase(guarded: &Arc<Runtime>, unguarded: &Arc<Runtime>, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let total = scale.n(1_000);
    let mut sides = Vec::new();
    for (rt, prefix) in [(unguarded, "pu-"), (guarded, "pg-")] {
        phases::enable(true);
        let run = measure(rt, 1, total, prefix).await?;
        let mut times: Vec<f64> = phases::ALL.iter().map(|p| phases::mean_us(*p, total)).collect();
        phases::enable(false);
        times.push(us(run.stats.mean));
        sides.push(times);
    }
    let (u, g) = (&sides[0], &sides[1]);
    let name = |p: Phase| match p {
        Phase::Admit => "admission (replay/conflict/hold checks, the call's records)",
        Phase::AdmitRead => "  of which the hold rule's ledger reads",
        Phase::AdmitWrite => "  of which the admission's write",
        Phase::Run => "sandboxed run, sends included",
        Phase::PendingWrite => "  of which the synced attempt write",
        Phase::Http => "  of which the HTTP exchange",
        Phase::OutcomeWrite => "  of which recording the outcome",
        Phase::Finish => "completion record",
        Phase::Report => "record of what the caller was told",
    };
    let mut figures: Vec<Figure> =
        phases::ALL.iter().enumerate().map(|(i, p)| Figure::new(format!("(b) guarded − unguarded, 1 in flight: {}", name(*p)), g[i] - u[i], "µs")).collect();
    let last = g.len() - 1;
    figures.push(
        Figure::new("(b) guarded − unguarded, 1 in flight: whole call (mean)", g[last] - u[last], "µs")
            .against(format!("unguarded {:.0} µs", u[last]), g[last] / u[last]),
    );
    Ok(figures)
}

/// 64 guarded calls in flight while every synced ledger write takes `extra`
/// longer (the writer thread sleeps after each fsync: a disk whose fsync is
/// that much slower), against the batched bound of such a disk.
async fn slow_disk(guarded: &Arc<Runtime>, bound: &Bound, scale: Scale, extra: Duration) -> anyhow::Result<Figure> {
    let sync_of_64 = 64.0 / bound.batch64_records_per_sec + extra.as_secs_f64();
    let limit = 64.0 / sync_of_64;
    toolguard::ledger::simulate_slow_fsync(extra);
    let run = measure(guarded, 64, scale.n(3_000), &format!("s{}-", extra.as_millis())).await;
    toolguard::ledger::simulate_slow_fsync(Duration::ZERO);
    let run = run?;
    Ok(Figure::new(format!("(b) guarded, 64 in flight, fsync slowed by {} ms", extra.as_millis()), run.per_sec, "calls/s")
        .against(format!("batched bound of that disk ({limit:.0} rec/s)"), run.per_sec / limit)
        .target("≥ 0.8× the batched bound", run.per_sec >= 0.8 * limit))
}

/// CPU time this process has used (user + system), in seconds, to the
/// microsecond (`getrusage`; `/proc/self/stat` counts 10 ms ticks, too
/// coarse for 300 calls); 0 if unavailable.
pub(crate) fn cpu_seconds() -> f64 {
    let Some(usage) = rusage() else { return 0.0 };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// Context switches of this process's threads so far (voluntary — a thread
/// went to sleep — and involuntary); 0 if unavailable.
pub(crate) fn context_switches() -> u64 {
    rusage().map_or(0, |u| u64::try_from(u.ru_nvcsw + u.ru_nivcsw).unwrap_or(0))
}

/// This process's resource usage, all threads together.
fn rusage() -> Option<libc::rusage> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; on success it is initialised.
    (unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0).then(|| unsafe { usage.assume_init() })
}

/// utime + stime of a `/proc/PID/stat` line, in seconds.
pub(crate) fn cpu_of_stat(stat: &str) -> f64 {
    // Fields after the command name (which may hold spaces): utime and stime
    // are the 12th and 13th, in USER_HZ ticks (100 per second on Linux).
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let ticks: u64 = after.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum();
    ticks as f64 / 100.0
}
