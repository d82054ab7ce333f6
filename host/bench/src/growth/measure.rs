//! (i)'s guarded calls at one ledger size, measured **beside an empty
//! ledger**: two hosts, the filled one and one whose ledger is (nearly)
//! empty, take turns in short segments, the order alternating each round
//! (empty first, then filled first, …). A VM's speed drifts by a fifth or
//! more over the minutes a fill takes; measured in turns, the drift weighs
//! on both hosts alike, so their ratio is the ledger's size and not the
//! moment. (At size 0 both ledgers are empty: the ratio there is the
//! measurement's own noise.)

use super::super::ms;
use super::super::unguarded::measure_calls;
use std::sync::Arc;
use toolguard::Runtime;
use toolguard::phases::{self, Phase};

/// Rounds of turns; each host measured once per round.
const ROUNDS: usize = 4;

/// The figures (i) compares, of one host.
#[derive(Clone, Copy, Default)]
pub(super) struct Figures {
    /// Guarded calls/s at 64 in flight.
    pub rate64: f64,
    /// p50 at 1 in flight, ms (the mean of the rounds' medians).
    pub p50: f64,
    /// Mean wall time of admission at 1 in flight, µs.
    pub admit_us: f64,
}

/// What one host's turns added up to.
#[derive(Default)]
struct Turns {
    calls1: usize,
    phase_ns: [u64; phases::ALL.len()],
    p50s: Vec<f64>,
    calls64: usize,
    secs64: f64,
    pool_reads: u64,
}

impl Turns {
    fn figures(&self) -> Figures {
        Figures {
            rate64: self.calls64 as f64 / self.secs64.max(f64::MIN_POSITIVE),
            p50: self.p50s.iter().sum::<f64>() / self.p50s.len().max(1) as f64,
            admit_us: self.mean_us(Phase::Admit),
        }
    }

    fn mean_us(&self, phase: Phase) -> f64 {
        self.phase_ns[phase as usize] as f64 / 1e3 / self.calls1.max(1) as f64
    }

    /// The phases' means, for the log.
    fn by_phase(&self) -> String {
        phases::ALL.iter().map(|p| format!("{p:?} {:.0}", self.mean_us(*p))).collect::<Vec<_>>().join(", ")
    }
}

/// Refund `i` of `session`: a new action, as every session of a turn is
/// new ([`super::measured_session`]), so no measurement repeats an earlier
/// one's action (which would make it a second episode, with more to read).
fn fresh(session: &str, i: usize) -> toolguard::CallRequest {
    toolguard::CallRequest { session: session.to_string(), ..super::super::guarded::refund(format!("c{i}"), i) }
}

/// One turn of `host`: `one` calls at 1 in flight (with the phase clocks),
/// then `many` at 64 in flight.
async fn turn(host: &Arc<Runtime>, one: usize, many: usize, into: &mut Turns) -> anyhow::Result<()> {
    let ledger = host.guard().expect("a guarded host").ledger().clone();
    let reads = ledger.pool_reads();
    phases::enable(true);
    let session = super::measured_session();
    let run = measure_calls(host, 1, one, move |i| fresh(&session, i)).await;
    for (total, phase) in into.phase_ns.iter_mut().zip(phases::ALL) {
        *total += phases::total_ns(phase);
    }
    phases::enable(false);
    into.p50s.push(ms(run?.stats.p50));
    into.calls1 += one;
    into.pool_reads += ledger.pool_reads() - reads;
    let session = super::measured_session();
    let run = measure_calls(host, 64, many, move |i| fresh(&session, i)).await?;
    into.calls64 += many;
    into.secs64 += many as f64 / run.per_sec;
    Ok(())
}

/// The figures of `filled` (holding `size` filler calls) and of `empty`
/// beside it: `one` calls at 1 in flight and `many` at 64 in flight on
/// each, in [`ROUNDS`] turns, after an unmeasured warm-up of each.
pub(super) async fn beside_empty(filled: &Arc<Runtime>, empty: &Arc<Runtime>, size: usize, one: usize, many: usize) -> anyhow::Result<(Figures, Figures)> {
    let hosts = [empty, filled];
    for host in hosts {
        let session = super::measured_session();
        measure_calls(host, 16, 128, move |i| fresh(&session, i)).await?;
    }
    let mut turns = [Turns::default(), Turns::default()];
    for round in 0..ROUNDS {
        for k in [round % 2, 1 - round % 2] {
            turn(hosts[k], one / ROUNDS, many / ROUNDS, &mut turns[k]).await?;
        }
    }
    let ledger = filled.guard().expect("a guarded host").ledger().clone();
    let [e, f] = &turns;
    println!(
        "    ({size} calls in the ledger: µs per call at 1 in flight by phase: {}; ledger reads memory could not answer: {:.2} per call; \
         the ledger's memory here: {:.1} MiB. The empty ledger beside it: {}; {:.2} reads per call)",
        f.by_phase(),
        f.pool_reads as f64 / f.calls1.max(1) as f64,
        ledger.memory_usage() as f64 / f64::from(1 << 20),
        e.by_phase(),
        e.pool_reads as f64 / e.calls1.max(1) as f64,
    );
    Ok((f.figures(), e.figures()))
}
