//! Consent no repeat can skip (`docs/threat-model.md`): under
//! `confirm_repeat_within_minutes`, random sequences of identical refund
//! calls under new ids, retries of old ids, operator approvals and
//! denials, task cancels, approvals left to expire, restarts and kill -9
//! (some in the middle of a call) never make more refunds at the sandbox
//! than the first one plus the repeats a person confirmed.
//!
//! Each sequence is drawn from a seed printed with it; set
//! `TOOLGUARD_REPEAT_SEED` to replay one and `TOOLGUARD_REPEAT_SEQUENCES`
//! to run more (4 by default).

use crate::clients::{A, env, operator_decides, world};
use crate::common::serve_http;
use crate::tasks::Client;
use std::time::Duration;

/// One step of a sequence.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A new identical refund under a new tool-call id (as a task or not).
    Call { task: bool },
    /// The same call again under an earlier id (a retry, a resume).
    Retry,
    /// The operator approves a waiting request.
    Approve,
    /// The operator denies one.
    Deny,
    /// The client cancels one of its tasks.
    Cancel,
    /// Time moves past the approvals' expiry (a restart with the ledger's clock 16 minutes on).
    Expire,
    /// kill -9 and start again.
    Kill,
    /// kill -9 while a new call is in flight, then start again.
    KillMidCall,
}

/// xorshift64*: small, seeded, and enough to pick steps.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// What a sequence did, for the bound and the message.
#[derive(Default)]
struct Tally {
    confirmed: usize,
    calls: Vec<String>,
    tasks: Vec<String>,
    log: Vec<String>,
}

/// The amount every call refunds: the calls are one action.
const AMOUNT: u64 = 2_500;

/// A window longer than three expiries (the sequence moves the clock at most that far).
const POLICY: &str = "confirm_repeat_within_minutes = 60";

fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), POLICY, "", None);
    let mut skew_ms: u64 = 0;
    let start = |skew_ms: u64| {
        let mut env = env();
        let skew: &'static str = Box::leak(skew_ms.to_string().into_boxed_str());
        env.push(("TOOLGUARD_CLOCK_SKEW_MS", skew));
        serve_http(&config, &env)
    };
    let mut server = start(skew_ms);
    let mut rng = Rng(seed | 1);
    let mut tally = Tally::default();
    let mut expiries = 0;
    for i in 0..20 {
        let step = match rng.below(18) {
            0..=5 => Step::Call { task: rng.below(2) == 0 },
            6 | 7 => Step::Retry,
            8..=10 => Step::Approve,
            11 | 12 => Step::Deny,
            13 | 14 => Step::Cancel,
            15 if expiries < 3 => Step::Expire,
            16 => Step::KillMidCall,
            _ => Step::Kill,
        };
        let client = Client::open(&server.url, Some(A));
        let note = match step {
            Step::Call { task } => {
                let id = format!("s{seed:x}-c{i}");
                let answer = client.try_refund(&id, AMOUNT, task).unwrap_or_default();
                tally.calls.push(id.clone());
                if let Some(t) = answer["taskId"].as_str() {
                    tally.tasks.push(t.to_string());
                }
                format!("call {id} (task {task}): {}", answer["structuredContent"]["kind"].as_str().or(answer["status"].as_str()).unwrap_or("ok"))
            }
            Step::Retry if !tally.calls.is_empty() => {
                let id = tally.calls[rng.below(tally.calls.len() as u64) as usize].clone();
                let answer = client.try_refund(&id, AMOUNT, false).unwrap_or_default();
                format!("retry {id}: {}", answer["structuredContent"]["kind"].as_str().unwrap_or("ok"))
            }
            Step::Approve | Step::Deny if !tally.calls.is_empty() => {
                let approve = matches!(step, Step::Approve);
                let decided = tally.calls.iter().find(|id| operator_decides(&server.url, id, approve) == 200).cloned();
                if approve && decided.is_some() {
                    tally.confirmed += 1;
                }
                format!("{} {decided:?}", if approve { "approve" } else { "deny" })
            }
            Step::Cancel if !tally.tasks.is_empty() => {
                let task = tally.tasks[rng.below(tally.tasks.len() as u64) as usize].clone();
                let _ = client.try_request("tasks/cancel", serde_json::json!({ "taskId": task }), crate::tasks::opted_in());
                format!("cancel {task}")
            }
            Step::Expire => {
                expiries += 1;
                skew_ms += 16 * 60_000;
                drop(server);
                server = start(skew_ms);
                "16 minutes later".into()
            }
            Step::Kill => {
                drop(server);
                server = start(skew_ms);
                "kill -9".into()
            }
            Step::KillMidCall => {
                let id = format!("s{seed:x}-k{i}");
                tally.calls.push(id.clone());
                let url = server.url.clone();
                let call = std::thread::spawn(move || Client::open(&url, Some(A)).try_refund(&id, AMOUNT, false));
                std::thread::sleep(Duration::from_millis(rng.below(400)));
                drop(server);
                let _ = call.join();
                server = start(skew_ms);
                "kill -9 mid-call".into()
            }
            _ => "nothing to act on".into(),
        };
        tally.log.push(format!("{step:?}: {note}"));
        let refunds = sandbox.refunds().len();
        assert!(
            refunds <= 1 + tally.confirmed,
            "seed {seed:#x}: {refunds} refunds, but only 1 + {} confirmed repeats after:\n{}",
            tally.confirmed,
            tally.log.join("\n")
        );
    }
    eprintln!("repeats: seed {seed:#x}: {} refunds, {} confirmed:\n  {}", sandbox.refunds().len(), tally.confirmed, tally.log.join("\n  "));
}

#[test]
fn repeats_never_make_more_refunds_than_the_first_and_those_a_person_confirmed() {
    let seeds: Vec<u64> = match std::env::var("TOOLGUARD_REPEAT_SEED").ok().and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()) {
        Some(seed) => vec![seed],
        None => {
            let n = std::env::var("TOOLGUARD_REPEAT_SEQUENCES").ok().and_then(|s| s.parse().ok()).unwrap_or(4);
            let base = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
            (0..n).map(|k: u64| base.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15))).collect()
        }
    };
    for seed in seeds {
        run(seed);
    }
}

/// The finding, step by step: call-1 refunds; call-2, identical, waits for
/// a person; however call-2 ends without an effect — the operator denies
/// it, the person at the client declines it, its task is cancelled — the
/// next identical call waits for a person too, and nothing is refunded
/// until one confirms it.
#[test]
fn a_denied_declined_or_cancelled_repeat_does_not_open_the_door_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let (_rt, sandbox, config) = world(dir.path(), POLICY, "", None);
    let server = serve_http(&config, &env());
    let a = Client::open(&server.url, Some(A)).eliciting();
    let first = a.refund("r1", AMOUNT, false);
    assert!(first["structuredContent"].get("refund_id").is_some(), "{first}");
    // A repeat waits for a person; the operator denies it, and its caller is told so (which ends it).
    let waits_and_is_denied = |call_id: &str| {
        let answer = Client::open(&server.url, Some(A)).refund(call_id, AMOUNT, false)["structuredContent"].clone();
        assert_eq!(answer["kind"], "awaiting-approval", "{call_id}: {answer}");
        assert!(answer["message"].as_str().unwrap().contains("`r1`"), "it names the action carried out: {answer}");
        assert_eq!(operator_decides(&server.url, call_id, false), 200);
        assert_eq!(Client::open(&server.url, Some(A)).refund(call_id, AMOUNT, false)["structuredContent"]["kind"], "denied");
    };
    // Denied by the operator, twice in a row.
    waits_and_is_denied("r2");
    waits_and_is_denied("r3");
    // Declined by the person at the client, inside its task.
    let task = crate::tasks::task_id(&a.refund("r4", AMOUNT, true));
    let asked = loop {
        let t = a.task("get", &task)["result"].clone();
        if let Some(k) = t["inputRequests"].as_object().and_then(|r| r.keys().next().cloned()) {
            break k;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    a.answer(&task, &asked, serde_json::json!({ "action": "decline" }));
    assert_eq!(a.settled(&task)["result"]["structuredContent"]["kind"], "denied");
    waits_and_is_denied("r5");
    // Cancelled with tasks/cancel.
    let task = crate::tasks::task_id(&a.refund("r6", AMOUNT, true));
    a.task("cancel", &task);
    assert_eq!(a.settled(&task)["status"], "cancelled");
    let seventh = a.refund("r7", AMOUNT, false)["structuredContent"].clone();
    assert_eq!(seventh["kind"], "awaiting-approval", "{seventh}");
    assert_eq!(sandbox.refunds().len(), 1, "one refund: none of the repeats ran unconfirmed");
    // A person confirms one: it runs, once; and the next waits again.
    assert_eq!(operator_decides(&server.url, "r7", true), 200);
    assert!(a.refund("r7", AMOUNT, false)["structuredContent"].get("refund_id").is_some());
    assert_eq!(sandbox.refunds().len(), 2);
    let next = Client::open(&server.url, Some(A)).refund("r8", AMOUNT, false)["structuredContent"].clone();
    assert!(next["message"].as_str().unwrap().contains("`r7`"), "{next}");
}
