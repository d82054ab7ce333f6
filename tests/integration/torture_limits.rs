//! The kill -9 torture (`torture.rs`) under a spending limit: each trial's
//! refund is killed the torture's ways, re-issued blindly under a new id
//! and resumed, while a daily limit fills up and begins to refuse. At the
//! provider: no refund twice (beyond the unlinkable pairs the torture
//! explains), none lost (every refund a caller heard of was made), none
//! made that the limit refused, and the sum of all of them never past the
//! limit. The ledger never counts less than the provider made.

use crate::payments::Downstream;
use crate::torture::{Rng, env_u64, kill_a_refund, seed};
use crate::world::{SESSION, World, torture_downstream};
use std::collections::BTreeMap;
use toolguard::ledger::AttemptState;

fn over_the_limit(answer: &serde_json::Value) -> bool {
    answer["kind"] == "denied" && answer["message"].as_str().is_some_and(|m| m.contains("over a spending limit"))
}

#[test]
fn torture_under_a_limit_kill_9_never_duplicates_loses_or_passes_it() {
    let trials = env_u64("TOOLGUARD_TORTURE_LIMIT_TRIALS").unwrap_or(60);
    // Trials refund 1, 2, … cents: the limit holds about 70 % of their sum, and the warm-up's.
    let warm_up = trials + 1;
    let limit = trials * (trials + 1) / 2 * 7 / 10 + warm_up;
    let policy: &'static str = Box::leak(format!(r#"limits = [{{ sum = "/amount_cents", max = {limit}, per = "session", window = "day" }}]"#).into_boxed_str());
    let w = World::with(Downstream { refund_policy: Some(policy), ..torture_downstream() });
    let seed = seed();
    let mut rng = Rng(seed);
    let started = std::time::Instant::now();
    assert!(w.refund("warm-up", warm_up).0);
    let call_ms = (started.elapsed().as_millis() as u64).max(10);
    let receipts = toolguard::receipts::Receipts::beside(toolguard::Config::load(&w.config).unwrap().ledger_dir().unwrap());
    let (mut phases, mut refused, mut pairs) = (BTreeMap::<String, u64>::new(), 0, 0);
    for trial in 0..trials {
        let (amount, call_id) = (trial + 1, format!("t{trial}"));
        let (phase, ack) = kill_a_refund(&w, &mut rng, (trial, seed), &call_id, call_ms);
        *phases.entry(phase).or_default() += 1;
        let answers = match ack {
            // Told before the kill: the replay says the same.
            Some(ack) => {
                let (_, replay) = w.refund(&call_id, amount);
                assert_eq!(replay, ack, "trial {trial} (seed {seed}): an answer changed after the restart");
                vec![ack]
            }
            // Never told: the model re-issues it under a new id, then the harness resumes the original.
            None => {
                let admitted = w.ledger().call(SESSION, &call_id).unwrap().is_some();
                let received = receipts.of(SESSION, &call_id).is_some();
                let (_, repeat) = w.refund(&format!("{call_id}-model"), amount);
                let (_, resumed) = w.refund(&call_id, amount);
                // Not even received: to the host, the resume is a new action after the repeat's answer.
                let both_made = !admitted && !received && repeat["refund_id"].is_string() && resumed["refund_id"].is_string();
                pairs += usize::from(both_made);
                vec![repeat, resumed]
            }
        };
        for a in &answers {
            assert!(a["refund_id"].is_string() || a["kind"] == "held" || over_the_limit(a), "trial {trial} (seed {seed}): {a}");
        }
        let made = w.refunds_of(amount);
        let told_made = answers.iter().any(|a| a["refund_id"].is_string() || a["detail"]["earlier_outcome"]["refund_id"].is_string());
        if answers.iter().all(over_the_limit) {
            refused += 1;
            assert_eq!(made, 0, "trial {trial} (seed {seed}): refused by the limit, yet the provider made it: {answers:?}");
        } else if told_made {
            assert!(made >= 1, "trial {trial} (seed {seed}): a caller heard of a refund the provider never made: {answers:?}");
        }
        assert!(made <= 1 + usize::from(answers.iter().filter(|a| a["refund_id"].is_string()).count() == 2), "trial {trial} (seed {seed}): {made} refunds");
    }
    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "recover: {}", String::from_utf8_lossy(&out.stdout));
    let ledger = w.ledger();
    let unsettled = ledger.attempts_in_state(AttemptState::Pending).unwrap().len() + ledger.attempts_in_state(AttemptState::Unknown).unwrap().len();
    let counted: u64 = ledger.spent(toolguard::ledger::records::now_ms()).unwrap().iter().map(|u| u.amount).sum();
    drop(ledger);
    let refunds = w.sandbox.refunds();
    let total: u64 = refunds.iter().map(|r| r.amount).sum();
    let mut per_amount: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &refunds {
        *per_amount.entry(r.amount).or_default() += 1;
    }
    let duplicates = per_amount.values().map(|n| n.saturating_sub(1)).sum::<usize>() - pairs;
    println!("torture under a limit of {limit} cents (seed {seed}): {trials} trials");
    for (phase, n) in &phases {
        println!("  {phase}: {n}");
    }
    println!("  refused by the limit: {refused}; unlinkable pairs: {pairs}");
    println!("  the provider made {} refunds, {total} cents; the ledger counts {counted}", refunds.len());
    println!("  duplicates = {duplicates}, unsettled = {unsettled}");
    assert_eq!((duplicates, unsettled), (0, 0));
    assert!(total <= limit, "the provider made {total} cents past the limit of {limit}");
    assert!(counted >= total, "the ledger counts {counted} cents, less than the {total} the provider made");
    assert!(refused > 0, "the limit was reached (70 % of the trials' sum)");
}
