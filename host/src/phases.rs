//! A clock per phase of a tool call, for `toolguard-bench`'s breakdown of
//! what the guard costs. The clocks exist only with the `bench` feature
//! (the bench crate's), and are off unless the bench turns them on: then
//! each timed phase adds its wall time to a process-wide total. In any
//! other build — the shipped one — [`time`] is nothing at all.

#[cfg(feature = "bench")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(feature = "bench")]
use std::time::Instant;

/// The phases of a call that are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The guard's admission: replay, conflict and hold checks, the call's records.
    Admit,
    /// The ledger reads the hold rule decides on (inside [`Phase::Admit`]).
    AdmitRead,
    /// The write that admits the call (inside [`Phase::Admit`]).
    AdmitWrite,
    /// The sandboxed run of the plugin, sends included.
    Run,
    /// The synced write of an attempt before its send (inside [`Phase::Run`]).
    PendingWrite,
    /// The HTTP exchange with the downstream (inside [`Phase::Run`]).
    Http,
    /// Recording the attempt's outcome after its send (inside [`Phase::Run`]).
    OutcomeWrite,
    /// The call's completion record.
    Finish,
    /// The record of what the caller was told.
    Report,
}

/// Every phase, in the order a call passes them.
pub const ALL: [Phase; 9] =
    [Phase::Admit, Phase::AdmitRead, Phase::AdmitWrite, Phase::Run, Phase::PendingWrite, Phase::Http, Phase::OutcomeWrite, Phase::Finish, Phase::Report];

#[cfg(feature = "bench")]
static ON: AtomicBool = AtomicBool::new(false);
#[cfg(feature = "bench")]
static NANOS: [AtomicU64; ALL.len()] = [const { AtomicU64::new(0) }; ALL.len()];

/// Turns the clocks on (from zero) or off.
#[cfg(feature = "bench")]
pub fn enable(on: bool) {
    for n in &NANOS {
        n.store(0, Ordering::Relaxed);
    }
    ON.store(on, Ordering::Relaxed);
}

/// The wall time spent in `phase` since [`enable`], in nanoseconds.
#[cfg(feature = "bench")]
pub fn total_ns(phase: Phase) -> u64 {
    NANOS[phase as usize].load(Ordering::Relaxed)
}

/// The mean wall time of `phase` over `calls` calls since [`enable`], in µs.
#[cfg(feature = "bench")]
pub fn mean_us(phase: Phase, calls: usize) -> f64 {
    total_ns(phase) as f64 / 1e3 / calls.max(1) as f64
}

/// Times `phase` until dropped (nothing when the clocks are off).
#[cfg(feature = "bench")]
pub fn time(phase: Phase) -> Timer {
    Timer(ON.load(Ordering::Relaxed).then(|| (phase, Instant::now())))
}

/// Without the `bench` feature there are no clocks: nothing is timed.
#[cfg(not(feature = "bench"))]
#[inline(always)]
pub fn time(_phase: Phase) -> Timer {
    Timer
}

/// A running phase clock; see [`time`].
#[cfg(feature = "bench")]
pub struct Timer(Option<(Phase, Instant)>);

/// A phase clock of a build without clocks: nothing.
#[cfg(not(feature = "bench"))]
pub struct Timer;

/// Ends the phase: nothing to record without clocks (the callers end their
/// phases with `drop`, in either build).
#[cfg(not(feature = "bench"))]
impl Drop for Timer {
    fn drop(&mut self) {}
}

#[cfg(feature = "bench")]
impl Drop for Timer {
    fn drop(&mut self) {
        if let Some((phase, since)) = self.0 {
            NANOS[phase as usize].fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
        }
    }
}
