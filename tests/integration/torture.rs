//! The crash torture harness. Each trial runs the real `toolguard call` for
//! a new tool call (a refund of a trial-unique amount) and kills it:
//!
//! - *paused*: deterministically between the provider's commit and our
//!   outcome write (the sandbox holds its answer; SIGKILL; release);
//! - *failpoint*: aborted at a named point of the attempt protocol;
//! - *random*: SIGKILL after a random delay across a whole call (mostly
//!   start-up, before the request), or a random few milliseconds after the
//!   request reached the provider (around the answer and our writes) — or
//!   not at all if the call finished first. A third of these trials meet a
//!   provider that commits the refund and then drops the connection or
//!   answers 500, so the kill may land while the host reconciles.
//!
//! Then it restarts the host (whose start-up recovery runs first). A call
//! whose answer the caller got is replayed. A call that was never answered
//! is what a model re-issues blindly: the trial makes that repeat under a
//! new tool-call id, and then resumes the original id too (a harness
//! replaying its checkpoint). It checks the hold rule's invariant at the
//! provider: one refund per trial — two only if the killed call was never
//! even received (killed before its receipt was kept: the host never saw
//! it, so the repeat and the resume are each a call made after the caller
//! heard a definitive outcome; a received one's resume is held with the
//! repeat's outcome, `host/src/receipts.rs`); every result
//! acknowledged before a kill is identical after it; after a final
//! `toolguard recover`, no attempt is left pending or unknown.
//!
//! CI runs 200 trials; `TOOLGUARD_TORTURE_TRIALS=1000 cargo test -p
//! toolguard --test integration torture -- --nocapture` runs more and prints
//! the tally (`TOOLGUARD_TORTURE_SEED` replays a run).

use crate::world::{World, wait_for};
use std::collections::BTreeMap;
use std::time::Duration;
use toolguard::ledger::AttemptState;
use toolguard_sandbox::Fault;

/// The warm-up refund's amount, distinct from every trial's.
const WARM_UP_AMOUNT: u64 = 99_999_999;

/// The attempt protocol's failpoints a trial may abort at.
pub(crate) const FAILPOINTS: [&str; 5] = ["after-admission", "after-attempt-write", "after-answer", "after-outcome-write", "after-print"];

/// xorshift64*: a tiny deterministic generator, so a seed replays a run
/// (the fleet torture's too).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n`.
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The refund a killed `toolguard call` printed before it died, if it got
/// that far: then its caller was told.
fn printed(out: &std::process::Output) -> Option<serde_json::Value> {
    // Killed, it may have printed nothing or part of its answer: then none.
    serde_json::from_slice::<serde_json::Value>(&out.stdout).ok().filter(|v| v.get("refund_id").is_some())
}

/// The seed of a run: `TOOLGUARD_TORTURE_SEED` to replay one, else the clock.
pub(crate) fn seed() -> u64 {
    env_u64("TOOLGUARD_TORTURE_SEED").unwrap_or_else(|| std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1)
}

/// The number environment variable `name` holds, if it holds one.
pub(crate) fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn torture_kill_9_never_duplicates_or_loses_a_refund() {
    torture(World::new(), env_u64("TOOLGUARD_TORTURE_TRIALS").unwrap_or(200), "");
}

/// The same torture with the provider behind HTTPS (a test CA the host trusts).
#[test]
fn torture_over_https_kill_9_never_duplicates_or_loses_a_refund() {
    let pki = crate::tls::Pki::new();
    torture(World::over_https(&pki), env_u64("TOOLGUARD_TORTURE_TLS_TRIALS").unwrap_or(40), " over HTTPS");
}

/// The same torture with the refund's repeats confirmed (the shipped
/// example's `confirm_repeat_within_minutes = 15`): a call killed before the
/// host recorded it, re-issued under a new id and then resumed under its
/// old one, refunds once — the resume waits for a person's confirmation.
#[test]
fn torture_confirming_repeats_kill_9_makes_no_unlinkable_pair() {
    torture(World::confirming_repeats(), env_u64("TOOLGUARD_TORTURE_CONFIRM_TRIALS").unwrap_or(120), " confirming repeats");
}

/// The same torture with every tool call giving its reason in its own
/// words, under the refund's declared action: a reworded blind repeat or
/// resume must be the same action (`docs/keys.md`, "The action arguments").
#[test]
fn torture_in_other_words_kill_9_never_duplicates_or_loses_a_refund() {
    torture(World::in_other_words(), env_u64("TOOLGUARD_TORTURE_WORDS_TRIALS").unwrap_or(40), " in other words");
}

fn torture(w: World, trials: u64, over: &str) {
    let seed = seed();
    let mut rng = Rng(seed);
    // A warm-up call: compiles the plugin into the cache and times a whole call.
    let started = std::time::Instant::now();
    assert!(w.refund("warm-up", WARM_UP_AMOUNT).0);
    let call_ms = (started.elapsed().as_millis() as u64).max(10);
    let mut phases: BTreeMap<String, u64> = BTreeMap::new();
    let mut acknowledged = 0;
    let (mut repeats_held, mut repeats_ran, mut never_admitted, mut confirmations) = (0, 0, 0, 0);
    // Killed before even its receipt was kept: nothing of it on disk at all.
    let mut unreceived = 0;
    let receipts = toolguard::receipts::Receipts::beside(toolguard::Config::load(&w.config).unwrap().ledger_dir().unwrap());

    for trial in 0..trials {
        let amount = trial + 1;
        let call_id = format!("t{trial}");
        let (phase, ack) = kill_a_refund(&w, &mut rng, (trial, seed), &call_id, call_ms);
        acknowledged += usize::from(ack.is_some());
        *phases.entry(phase).or_default() += 1;

        // Restart: the caller who got an answer replays the same tool call.
        if let Some(ack) = ack {
            let (ok, result) = w.refund(&call_id, amount);
            assert!(ok, "trial {trial}: the replay failed: {result}");
            assert_eq!(result, ack, "trial {trial}: an acknowledged result changed after the restart");
            assert_eq!(w.refunds_of(amount), 1, "trial {trial} (seed {seed})");
            continue;
        }
        // Never answered: the model re-issues it under a new id, then the harness resumes the original.
        let admitted = w.ledger().call("crash", &call_id).unwrap().is_some();
        let received = receipts.of("crash", &call_id).is_some();
        assert!(admitted || w.posts_of(amount).is_empty(), "trial {trial}: a call whose request reached the provider must have been admitted");
        let (repeat_ok, repeat) = w.refund(&format!("{call_id}-model"), amount);
        let (resume_ok, resumed) = w.refund(&call_id, amount);
        for (ok, answer) in [(repeat_ok, &repeat), (resume_ok, &resumed)] {
            let waits = w.confirms_repeats && answer["kind"] == "awaiting-approval";
            confirmations += usize::from(waits);
            assert!(ok || answer["kind"] == "held" || waits, "trial {trial} (seed {seed}): {answer}");
            if ok {
                assert_eq!(answer["amount_cents"], amount, "trial {trial}");
            }
        }
        if repeat_ok {
            repeats_ran += 1
        } else {
            repeats_held += 1
        }
        // Never admitted, the resume arrived (its receipt says) before the repeat's answer: held. Not even
        // received, it is a new action to the host; confirming repeats, it waits for a person.
        let expected = if admitted || received || w.confirms_repeats { 1 } else { 2 };
        never_admitted += usize::from(!admitted);
        unreceived += usize::from(!admitted && !received);
        let refunds = w.refunds_of(amount);
        assert_eq!(refunds, expected, "trial {trial} (seed {seed}, admitted: {admitted}): repeat {repeat}, resume {resumed}");
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
    // Only a trial whose call was never admitted may have two (a new action after a
    // definitive answer): the pairs no host can link, unless repeats are confirmed.
    let pairs = if w.confirms_repeats { 0 } else { unreceived };
    let duplicates: usize = per_amount.values().map(|n| n.saturating_sub(1)).sum::<usize>() - pairs;
    let lost = (1..=trials).filter(|a| !per_amount.contains_key(a)).count();

    println!("torture tally{over} (seed {seed})");
    println!("  trials: {trials}");
    for (phase, n) in &phases {
        println!("  {phase}: {n}");
    }
    println!("  acknowledged before a kill point: {acknowledged}");
    println!("  never answered: the model's blind repeat was held {repeats_held}, ran {repeats_ran}; then the original id resumed");
    println!("  never admitted (killed before the host recorded the call): {never_admitted}, of which not even received: {unreceived}");
    println!("  unlinkable pairs refunded twice: {pairs}; calls waiting for a person to confirm a repeat: {confirmations}");
    println!("  refunds at the provider: {} for {trials} trials (and the warm-up)", refunds.len() - 1);
    println!("  duplicates = {duplicates}, lost = {lost}, left pending = {pending}, left unknown = {unknown}");
    assert_eq!((duplicates, lost, pending, unknown), (0, 0, 0, 0));
    assert_eq!(refunds.len() as u64, trials + 1 + pairs as u64, "the trials' refunds and the warm-up's");
    if w.confirms_repeats {
        assert_eq!(confirmations, unreceived, "each unlinkable resume waited for a person, and only those");
    }
}

/// Runs trial `trial`'s refund of `trial + 1` cents under `call_id` and
/// kills it (in one of the ways the module's doc lists): how, and the
/// answer its caller got before the kill, if any. `call_ms`: how long a
/// whole call takes here.
pub(crate) fn kill_a_refund(w: &World, rng: &mut Rng, (trial, seed): (u64, u64), call_id: &str, call_ms: u64) -> (String, Option<serde_json::Value>) {
    let amount = trial + 1;
    let mut ack = None;
    let phase = match trial % 4 {
        0 => {
            w.sandbox.inject(Fault::PauseAfterCommit);
            let mut child = w.spawn_refund(call_id, amount, None);
            // A call a spending limit refuses ends without reaching the provider.
            if !wait_for(Duration::from_secs(30), || w.sandbox.paused() == 1 || child.try_wait().is_ok_and(|s| s.is_some())) {
                child.kill().unwrap();
                let out = child.wait_with_output().unwrap();
                panic!(
                    "trial {trial} (seed {seed}): never reached the provider; paused {}; it ended {}; stdout {}; stderr:\n{}",
                    w.sandbox.paused(),
                    out.status,
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            if w.sandbox.paused() == 0 {
                w.sandbox.clear_faults();
                return finished(trial, child.wait_with_output().unwrap(), "");
            }
            child.kill().unwrap();
            child.wait().unwrap();
            w.sandbox.release();
            "killed between the provider's commit and our outcome write".to_string()
        }
        1 => {
            let point = FAILPOINTS[rng.below(FAILPOINTS.len() as u64) as usize];
            let out = w.spawn_refund(call_id, amount, Some(point)).wait_with_output().unwrap();
            assert!(!out.status.success(), "trial {trial}: failpoint {point} did not fire");
            ack = printed(&out);
            format!("aborted at failpoint {point}")
        }
        mode => {
            // Half of these meet a provider that commits, then fails to say so.
            let fault = match rng.below(6) {
                0 => Some((Fault::DropAfterCommit, ", the provider dropping the connection after committing")),
                1 => Some((Fault::HiddenCommit500, ", the provider answering 500 after committing")),
                2 => Some((Fault::CommitStuckInFlight, ", the provider committing and then answering 409 to the key for good")),
                _ => None,
            };
            let faulty = fault.as_ref().map_or("", |(_, what)| *what);
            if let Some((fault, _)) = fault {
                w.sandbox.inject(fault);
            }
            let mut child = w.spawn_refund(call_id, amount, None);
            if mode == 2 {
                std::thread::sleep(Duration::from_millis(rng.below(call_ms + call_ms / 5)));
            } else {
                wait_for(Duration::from_secs(30), || !w.posts_of(amount).is_empty());
                std::thread::sleep(Duration::from_micros(rng.below(8_000)));
            }
            match child.try_wait().unwrap() {
                Some(_) => {
                    w.sandbox.clear_faults();
                    return finished(trial, child.wait_with_output().unwrap(), faulty);
                }
                None => {
                    let reached = !w.posts_of(amount).is_empty();
                    child.kill().unwrap();
                    // The answer may be out already (the process stays a moment for calls handed to it).
                    ack = printed(&child.wait_with_output().unwrap());
                    let when = match (ack.is_some(), reached) {
                        (true, _) => "SIGKILL after the answer was printed (acknowledged)",
                        (false, true) => "SIGKILL after the request reached the provider",
                        (false, false) => "SIGKILL before the request reached the provider",
                    };
                    format!("{when}{faulty}")
                }
            }
        }
    };
    // A fault aimed at a request the killed call never made is not left for the next trial's.
    w.sandbox.clear_faults();
    (phase, ack)
}

/// A call that finished before its kill: its answer was told. A success,
/// or a refusal by a spending limit (the only failure a trial may meet).
fn finished(trial: u64, out: std::process::Output, faulty: &str) -> (String, Option<serde_json::Value>) {
    let answer = crate::common::stdout_json(&out);
    let refused = answer["kind"] == "denied" && answer["message"].as_str().is_some_and(|m| m.contains("over a spending limit"));
    assert!(out.status.success() || refused, "trial {trial}: {answer} {}", String::from_utf8_lossy(&out.stderr));
    (format!("finished before the kill (acknowledged){faulty}"), Some(answer))
}
