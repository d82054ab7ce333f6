//! The crash torture harness. Each trial runs the real `toolguard call` for
//! a new tool call (a refund of a trial-unique amount) and kills it:
//!
//! - *paused*: deterministically between the provider's commit and our
//!   outcome write (the sandbox holds its answer; SIGKILL; release);
//! - *failpoint*: aborted at a named point of the attempt protocol;
//! - *random*: SIGKILL after a random delay across a whole call (mostly
//!   start-up, before the request), or a random few milliseconds after the
//!   request reached the provider (around the answer and our writes) — or
//!   not at all if the call finished first.
//!
//! Then it restarts the host (whose start-up recovery runs first) and
//! replays the same tool call, and checks: refunds at the sandbox ==
//! distinct tool-call ids (no duplicate, none lost); every result
//! acknowledged before a kill is identical after it; after a final
//! `toolguard recover`, no attempt is left pending or unknown.
//!
//! CI runs 200 trials; `TOOLGUARD_TORTURE_TRIALS=1000 cargo test -p
//! toolguard --test integration torture -- --nocapture` runs more and prints
//! the tally (`TOOLGUARD_TORTURE_SEED` replays a run).

use crate::crash::{World, wait_for};
use std::collections::BTreeMap;
use std::time::Duration;
use toolguard::ledger::AttemptState;
use toolguard_sandbox::Fault;

/// The warm-up refund's amount, distinct from every trial's.
const WARM_UP_AMOUNT: u64 = 99_999_999;

const FAILPOINTS: [&str; 3] = ["after-attempt-write", "after-answer", "after-outcome-write"];

/// xorshift64*: a tiny deterministic generator, so a seed replays a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn torture_kill_9_never_duplicates_or_loses_a_refund() {
    let trials = env_u64("TOOLGUARD_TORTURE_TRIALS").unwrap_or(200);
    let seed = env_u64("TOOLGUARD_TORTURE_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    let mut rng = Rng(seed);
    let w = World::new();
    // A warm-up call: compiles the plugin into the cache and times a whole call.
    let started = std::time::Instant::now();
    assert!(w.refund("warm-up", WARM_UP_AMOUNT).0);
    let call_ms = (started.elapsed().as_millis() as u64).max(10);
    let mut phases: BTreeMap<String, u64> = BTreeMap::new();
    let mut acknowledged = 0;

    for trial in 0..trials {
        let amount = trial + 1;
        let call_id = format!("t{trial}");
        let mut ack = None;
        let phase = match trial % 4 {
            0 => {
                w.sandbox.inject(Fault::PauseAfterCommit);
                let mut child = w.spawn_refund(&call_id, amount, None);
                assert!(wait_for(Duration::from_secs(30), || w.sandbox.paused() == 1), "trial {trial}: never reached the provider");
                child.kill().unwrap();
                child.wait().unwrap();
                w.sandbox.release();
                "killed between the provider's commit and our outcome write".to_string()
            }
            1 => {
                let point = FAILPOINTS[rng.below(FAILPOINTS.len() as u64) as usize];
                let out = w.spawn_refund(&call_id, amount, Some(point)).wait_with_output().unwrap();
                assert!(!out.status.success(), "trial {trial}: failpoint {point} did not fire");
                format!("aborted at failpoint {point}")
            }
            mode => {
                let mut child = w.spawn_refund(&call_id, amount, None);
                if mode == 2 {
                    std::thread::sleep(Duration::from_millis(rng.below(call_ms + call_ms / 5)));
                } else {
                    wait_for(Duration::from_secs(30), || !w.posts_of(amount).is_empty());
                    std::thread::sleep(Duration::from_micros(rng.below(8_000)));
                }
                match child.try_wait().unwrap() {
                    Some(_) => {
                        let out = child.wait_with_output().unwrap();
                        assert!(out.status.success(), "trial {trial}: {}", String::from_utf8_lossy(&out.stderr));
                        ack = Some(crate::crash::stdout_json(&out));
                        acknowledged += 1;
                        "finished before the kill (acknowledged)".to_string()
                    }
                    None => {
                        let reached = !w.posts_of(amount).is_empty();
                        child.kill().unwrap();
                        child.wait().unwrap();
                        if reached { "SIGKILL after the request reached the provider" } else { "SIGKILL before the request reached the provider" }.to_string()
                    }
                }
            }
        };
        *phases.entry(phase).or_default() += 1;

        // Restart and replay the same tool call.
        let (ok, result) = w.refund(&call_id, amount);
        assert!(ok, "trial {trial}: the replay failed: {result}");
        assert_eq!(result["amount_cents"], amount, "trial {trial}");
        if let Some(ack) = ack {
            assert_eq!(result, ack, "trial {trial}: an acknowledged result changed after the restart");
        }
        let refunds = w.refunds_of(amount);
        assert_eq!(refunds, 1, "trial {trial} (seed {seed}): {refunds} refunds for one tool call");
    }

    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "recover: {}", String::from_utf8_lossy(&out.stdout));
    let ledger = w.ledger();
    let pending = ledger.attempts_in_state(AttemptState::Pending).unwrap().len();
    let unknown = ledger.attempts_in_state(AttemptState::Unknown).unwrap().len();

    let refunds = w.sandbox.refunds();
    let mut per_amount: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &refunds {
        *per_amount.entry(r.amount).or_default() += 1;
    }
    per_amount.remove(&(WARM_UP_AMOUNT));
    let duplicates: usize = per_amount.values().map(|n| n.saturating_sub(1)).sum();
    let lost = (1..=trials).filter(|a| !per_amount.contains_key(a)).count();

    println!("torture tally (seed {seed})");
    println!("  trials: {trials}");
    for (phase, n) in &phases {
        println!("  {phase}: {n}");
    }
    println!("  acknowledged before a kill point: {acknowledged}");
    println!("  refunds at the provider: {} for {trials} distinct tool-call ids (and the warm-up)", refunds.len() - 1);
    println!("  duplicates = {duplicates}, lost = {lost}, left pending = {pending}, left unknown = {unknown}");
    assert_eq!((duplicates, lost, pending, unknown), (0, 0, 0, 0));
    assert_eq!(refunds.len() as u64, trials + 1, "the trials' refunds and the warm-up's");
}
