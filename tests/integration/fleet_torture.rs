//! The crash torture of a fleet: two `toolguard serve --http` processes over
//! one PostgreSQL ledger, one of them killed (SIGKILL) at random moments
//! while the model's calls are in flight on both, then restarted. Each trial
//! refunds a trial-unique amount, so the sandbox's ledger counts each
//! trial's side effects on its own. Three kinds of trial, in turn:
//!
//! - *overlap*: the provider commits the refund and holds its answer; the
//!   model's blind repeat (a new tool-call id, the same arguments) lands on
//!   the other host while the first call is unanswered; the first host dies
//!   at a random moment around the provider's answer;
//! - *random*: one call, its host killed after a random delay across a
//!   whole call (often before admission, sometimes after the answer);
//! - *both*: the same tool call sent to both hosts at once (a retry through
//!   a load balancer), one of the two killed at a random moment;
//! - *faulty provider*: the provider commits the refund, then drops the
//!   connection, answers 500, answers 409 "in flight" to its key for good,
//!   or answers after the host's timeout; half the
//!   time the host is killed at a random moment while it finds out;
//! - *one id, two amounts*: the same tool-call id with different arguments
//!   sent to both hosts at once, one killed: one refund, each caller told
//!   only of the amount it asked for, the other a `conflict`.
//!
//! Then the model goes on as in the one-host torture (`torture.rs`): an
//! answered call is replayed on a random host and must answer the same; an
//! unanswered one is re-issued blindly under a new id and the original id is
//! resumed, each on a random host. One refund per trial — two only if the
//! killed call was never admitted and its resume ran as a new action after
//! the repeat's definitive answer (a resume that reaches the other host
//! before that answer is recorded there is held instead). At the end no attempt may be
//! left pending or unknown once the hosts' takeover passes have run.
//!
//! Reloads are in the mix: in half the trials one host's policy flips (a
//! budget: another effective policy, the same identity of every action) and
//! it is sent SIGHUP at a random moment while the trial's calls run.
//!
//! CI runs 40 trials (~50 s); `TOOLGUARD_FLEET_TORTURE_TRIALS=200 ./dev.sh test -p
//! toolguard --test integration fleet_torture -- --nocapture` runs more
//! (`TOOLGUARD_TORTURE_SEED` replays a run).

use crate::common::{Mcp, Server, fresh_postgres_database, serve_http};
use crate::payments::{Downstream, PI};
use crate::torture::{Rng, env_u64};
use crate::world::wait_for;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolguard::ledger::{AttemptState, Ledger};
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// The session `Mcp` calls in.
const SESSION: &str = "s1";
/// The warm-up refunds' amounts, distinct from every trial's.
const WARM_UP_AMOUNTS: [u64; 2] = [99_999_998, 99_999_999];

/// Added to a trial's amount for the other arguments of its tool-call id.
const OTHER_AMOUNT: u64 = 10_000_000;

/// The two policies the hosts flip between (the budget line of each config).
const BUDGETS: [&str; 2] = ["max_irreversible_calls_per_session_hour = 1000000\n", "max_irreversible_calls_per_session_hour = 999999\n"];

/// A call in flight: its host's answer, or the transport error if the host died.
type InFlight = tokio::task::JoinHandle<Result<Value, String>>;

/// Two serving hosts over one PostgreSQL ledger and one payments sandbox.
struct Fleet {
    rt: tokio::runtime::Runtime,
    sandbox: Sandbox,
    ledger_url: String,
    configs: [PathBuf; 2],
    hosts: [Option<(Server, Arc<Mcp>)>; 2],
    _dir: tempfile::TempDir,
}

impl Fleet {
    fn new(d: &Downstream) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
        sandbox.add_payment_intent(PI, u64::MAX / 4);
        let ledger_url = fresh_postgres_database();
        let dir = tempfile::tempdir().unwrap();
        let configs = crate::fleet::host_configs(&sandbox.url(), &ledger_url, dir.path(), d);
        let mut fleet = Self { rt, sandbox, ledger_url, configs, hosts: [None, None], _dir: dir };
        fleet.start(0);
        fleet.start(1);
        fleet
    }

    /// Starts host `i` (again), on a new port, and connects a client to it.
    fn start(&mut self, i: usize) {
        let server = serve_http(&self.configs[i], &[("TOOLGUARD_LOG", "warn")]);
        let client = Arc::new(self.rt.block_on(Mcp::connect(&server.url)));
        self.hosts[i] = Some((server, client));
    }

    /// SIGKILLs host `i`.
    fn kill(&mut self, i: usize) {
        let (mut server, _) = self.hosts[i].take().expect("host is running");
        server.child.kill().unwrap();
        server.child.wait().unwrap();
    }

    /// Flips host `i`'s policy in its config file and, `delay_ms` later,
    /// sends it SIGHUP (a reload), while this trial's calls run; a host
    /// killed by then is restarted on whichever policy the file holds.
    fn reload_later(&self, i: usize, delay_ms: u64) {
        let Some((server, _)) = &self.hosts[i] else { return };
        let path = &self.configs[i];
        let text = std::fs::read_to_string(path).unwrap();
        let flipped = if text.contains(BUDGETS[0]) { text.replace(BUDGETS[0], BUDGETS[1]) } else { text.replace(BUDGETS[1], BUDGETS[0]) };
        let fresh = path.with_extension("toml.new");
        std::fs::write(&fresh, flipped).unwrap();
        std::fs::rename(&fresh, path).unwrap();
        let pid = server.child.id().to_string();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(delay_ms));
            // The host may have been killed meanwhile (then there is nobody to tell).
            let _ = std::process::Command::new("kill").args(["-HUP", &pid]).stderr(std::process::Stdio::null()).status();
        });
    }

    /// The payments plugin's policy digest host `i` serves now.
    fn policy_of(&self, i: usize) -> String {
        let (server, _) = self.hosts[i].as_ref().expect("host is running");
        let url = server.url.replace(toolguard::mcp::http::PATH, toolguard::mcp::http::INFO_PATH);
        let info: Value = self.rt.block_on(async { serde_json::from_str(&reqwest::get(url).await.unwrap().text().await.unwrap()).unwrap() });
        info["plugins"]["payments"]["policy_digest"].as_str().unwrap_or_default().to_string()
    }

    /// `refund` of `amount` under `call_id` on host `i`, started.
    fn call(&self, i: usize, call_id: &str, amount: u64) -> InFlight {
        let client = self.hosts[i].as_ref().expect("host is running").1.clone();
        let call_id = call_id.to_string();
        self.rt.spawn(async move { client.refund(&call_id, amount).await })
    }

    fn answer(&self, call: InFlight) -> Result<Value, String> {
        self.rt.block_on(call).unwrap()
    }

    fn ledger(&self) -> Ledger {
        Ledger::connect(&self.ledger_url).unwrap()
    }

    /// Attempts left pending or unknown.
    fn unsettled(&self) -> usize {
        let ledger = self.ledger();
        [AttemptState::Pending, AttemptState::Unknown].iter().map(|s| ledger.attempts_in_state(*s).unwrap().len()).sum()
    }

    fn refunds_of(&self, amount: u64) -> Vec<String> {
        self.sandbox.refunds().into_iter().filter(|r| r.amount == amount).map(|r| r.id).collect()
    }

    fn posts_of(&self, amount: u64) -> usize {
        let body = format!("amount={amount}&");
        self.sandbox.requests().iter().filter(|r| r.method == "POST" && r.body.contains(&body)).count()
    }
}

/// What an answer says happened: the refund id it reports (a success, or a
/// hold carrying the earlier outcome), `None` for any other answer.
fn refund_told(answer: &Value) -> Option<String> {
    let s = &answer["structuredContent"];
    let id = match answer["isError"].as_bool() {
        Some(false) => &s["refund_id"],
        _ => &s["detail"]["earlier_outcome"]["sends"][0]["body"]["id"],
    };
    id.as_str().map(str::to_string)
}

/// Whether `answer` is a definitive success (what the one-host torture
/// calls acknowledged): the caller knows the refund happened.
fn succeeded(answer: &Result<Value, String>) -> bool {
    answer.as_ref().is_ok_and(|a| a["isError"] == false)
}

/// A trial of one tool-call id sent with two amounts at once, one to each
/// host, and host `h` killed at a random moment; then each caller asks
/// again on a random host. One refund, of one of the amounts: every success
/// reports the amount its caller asked for and that refund, every other
/// answer is a `conflict` (or the dead host's lost connection).
fn one_id_two_amounts(f: &mut Fleet, rng: &mut Rng, (h, other): (usize, usize), (id, amount): (&str, u64), call_ms: u64, context: &str) {
    let amounts = [amount, amount + OTHER_AMOUNT];
    let (a, b) = (f.call(h, id, amounts[0]), f.call(other, id, amounts[1]));
    std::thread::sleep(Duration::from_millis(rng.below(call_ms + call_ms / 5)));
    f.kill(h);
    let mut answers = vec![(amounts[0], f.answer(a))];
    f.start(h);
    answers.push((amounts[1], f.answer(b)));
    for asked in amounts {
        answers.push((asked, f.answer(f.call(rng.below(2) as usize, id, asked))));
    }
    let refunds: Vec<_> = f.sandbox.refunds().into_iter().filter(|r| amounts.contains(&r.amount)).collect();
    assert_eq!(refunds.len(), 1, "{context}: one id, two amounts: {answers:#?}");
    for (asked, answer) in &answers {
        let Ok(answer) = answer else { continue };
        match answer["isError"].as_bool() {
            Some(false) => {
                assert_eq!(answer["structuredContent"]["amount_cents"], *asked, "{context}: a caller told of a refund it did not ask for: {answers:#?}");
                assert_eq!(refund_told(answer).as_deref(), Some(refunds[0].id.as_str()), "{context}: {answers:#?}");
            }
            _ => assert_eq!(answer["structuredContent"]["kind"], "conflict", "{context}: {answers:#?}"),
        }
    }
    // The caller of the amount that ran gets it on asking again.
    let again = answers.iter().skip(2).find(|(asked, _)| *asked == refunds[0].amount).expect("asked again");
    assert!(succeeded(&again.1), "{context}: {answers:#?}");
}

#[test]
fn fleet_torture_kill_9_of_a_host_never_duplicates_or_loses_a_refund() {
    let trials = env_u64("TOOLGUARD_FLEET_TORTURE_TRIALS").unwrap_or(40);
    let seed = crate::torture::seed();
    let mut rng = Rng(seed);
    // A claim lapses 2 s after the wall-clock budget: a dead host's call is taken over in ~3.5 s.
    let d = Downstream { wall_ms: 1_500, timeout_ms: 1_000, refunds_per_session_hour: 1_000_000, ..Downstream::default() };
    let mut f = Fleet::new(&d);
    let started = Instant::now();
    for (host, amount) in WARM_UP_AMOUNTS.iter().enumerate() {
        assert!(succeeded(&f.answer(f.call(host, &format!("warm-up-{host}"), *amount))), "warm-up on host {host}");
    }
    let call_ms = (started.elapsed().as_millis() as u64 / 2).max(10);
    let mut phases: BTreeMap<String, u64> = BTreeMap::new();
    let (mut acknowledged, mut never_admitted, mut second_actions, mut held, mut reloads) = (0, 0, 0, 0, 0);

    for trial in 0..trials {
        let (amount, id) = (trial + 1, format!("f{trial}"));
        let context = format!("trial {trial} (seed {seed})");
        // Earlier trials' sends are settled, so the fault below meets this trial's request.
        assert!(wait_for(Duration::from_secs(30), || f.unsettled() == 0), "{context}: attempts left unsettled");
        let h = rng.below(2) as usize;
        let other = 1 - h;
        // Reloads in the mix: a host's policy flips while this trial's calls run.
        if rng.below(2) == 0 {
            f.reload_later(rng.below(2) as usize, rng.below(call_ms + call_ms / 5));
            reloads += 1;
        }
        if trial % 5 == 4 {
            one_id_two_amounts(&mut f, &mut rng, (h, other), (&id, amount), call_ms, &context);
            *phases.entry("one id with two amounts, one per host, one host killed".into()).or_default() += 1;
            continue;
        }
        let mut answers: Vec<(String, Result<Value, String>)> = Vec::new();
        let phase = match trial % 5 {
            0 => {
                f.sandbox.inject(Fault::PauseAfterCommit);
                let first = f.call(h, &id, amount);
                assert!(wait_for(Duration::from_secs(30), || f.sandbox.paused() == 1), "{context}: the first call never reached the provider");
                let repeat = f.call(other, &format!("{id}-m"), amount);
                std::thread::sleep(Duration::from_millis(rng.below(300)));
                let release_first = rng.below(2) == 0;
                if release_first {
                    f.sandbox.release();
                    std::thread::sleep(Duration::from_micros(rng.below(5_000)));
                }
                f.kill(h);
                f.sandbox.release();
                answers.push((id.clone(), f.answer(first)));
                f.start(h);
                answers.push((format!("{id}-m"), f.answer(repeat)));
                let when = if release_first { "just after the provider answered" } else { "while the provider held its answer" };
                format!("overlap: host killed {when}")
            }
            1 => {
                let first = f.call(h, &id, amount);
                std::thread::sleep(Duration::from_millis(rng.below(call_ms + call_ms / 5)));
                f.kill(h);
                answers.push((id.clone(), f.answer(first)));
                f.start(h);
                "random: host killed at a random moment of the call".to_string()
            }
            3 => {
                // The provider commits, then fails to say so; the host may die while it finds out.
                let (fault, what) = match rng.below(4) {
                    0 => (Fault::DropAfterCommit, "faulty provider (drops the connection after committing)"),
                    1 => (Fault::HiddenCommit500, "faulty provider (a 500 after committing)"),
                    2 => (Fault::CommitStuckInFlight, "faulty provider (commits, then answers 409 in-flight to the key for good)"),
                    _ => (Fault::DelayAfterCommit { ms: 1_500 }, "faulty provider (answers after the host's timeout)"),
                };
                f.sandbox.inject(fault);
                let first = f.call(h, &id, amount);
                assert!(wait_for(Duration::from_secs(30), || f.posts_of(amount) > 0), "{context}: the call never reached the provider");
                std::thread::sleep(Duration::from_millis(rng.below(call_ms + call_ms / 5)));
                let kill = rng.below(2) == 0;
                if kill {
                    f.kill(h);
                }
                answers.push((id.clone(), f.answer(first)));
                if kill {
                    f.start(h);
                }
                format!("{what}{}", if kill { ", host killed" } else { "" })
            }
            _ => {
                let (a, b) = (f.call(h, &id, amount), f.call(other, &id, amount));
                std::thread::sleep(Duration::from_millis(rng.below(call_ms + call_ms / 5)));
                f.kill(h);
                answers.push((id.clone(), f.answer(a)));
                f.start(h);
                answers.push((id.clone(), f.answer(b)));
                "both: the same call on both hosts, one killed".to_string()
            }
        };
        *phases.entry(phase.clone()).or_default() += 1;

        // Whether the host recorded the original call before the kill (in
        // the other kinds a surviving host ran it, or it reached the provider).
        let admitted = f.ledger().call(SESSION, &id).unwrap().is_some();
        let random = phase.starts_with("random");
        assert!(admitted || (random && f.posts_of(amount) == 0), "{context}, {phase}: a call whose request reached the provider must have been admitted");
        never_admitted += usize::from(!admitted);

        // The caller who got a refund back replays it; an unanswered call is re-issued blindly, then resumed.
        let acked = answers.iter().any(|(call, a)| *call == id && succeeded(a));
        let anywhere = |rng: &mut Rng| rng.below(2) as usize;
        if acked {
            acknowledged += 1;
            answers.push((id.clone(), f.answer(f.call(anywhere(&mut rng), &id, amount))));
        } else {
            if random {
                let repeat = format!("{id}-r");
                answers.push((repeat.clone(), f.answer(f.call(anywhere(&mut rng), &repeat, amount))));
            }
            answers.push((id.clone(), f.answer(f.call(anywhere(&mut rng), &id, amount))));
        }

        // Never admitted: the repeat ran as a new action, and the resume —
        // made after the repeat's definitive answer — is one too, unless it
        // reached the other host in the moment between that answer and its
        // record there, which holds it (the safe side, docs/fleet.md).
        let resumed_anew = !admitted && succeeded(&answers.last().expect("the resume").1);
        second_actions += usize::from(resumed_anew);
        let refunds = f.refunds_of(amount);
        let expected = if resumed_anew { 2 } else { 1 };
        assert_eq!(refunds.len(), expected, "{context}, {phase}, admitted {admitted}: answers {answers:#?}");
        let mut original = std::collections::BTreeSet::new();
        for (call, answer) in &answers {
            let Ok(answer) = answer else { continue };
            held += usize::from(answer["structuredContent"]["kind"] == "held");
            // Any refund an answer reports is one the provider made.
            let Some(told) = refund_told(answer) else { continue };
            assert!(refunds.contains(&told), "{context}: {call} reported refund {told}, not one at the provider: {answer}");
            if *call == id && answer["isError"] == false {
                original.insert(told);
            }
        }
        assert!(original.len() <= 1, "{context}: the original id answered with different refunds: {answers:#?}");
    }

    // Both hosts are up: their takeover passes settle whatever a kill left.
    let settled = wait_for(Duration::from_secs(30), || f.unsettled() == 0);
    let unsettled = f.unsettled();
    let refunds = f.sandbox.refunds();
    let mut per_amount: BTreeMap<u64, usize> = BTreeMap::new();
    for r in refunds.iter().filter(|r| !WARM_UP_AMOUNTS.contains(&r.amount)) {
        // A trial's other amount counts as the trial's.
        *per_amount.entry(r.amount % OTHER_AMOUNT).or_default() += 1;
    }
    // Only a trial whose call was never admitted may have two (a new action after a definitive answer).
    let duplicates = per_amount.values().map(|n| n.saturating_sub(1)).sum::<usize>() - second_actions;
    let lost = (1..=trials).filter(|a| !per_amount.contains_key(a)).count();
    println!("fleet torture tally: two hosts over one PostgreSQL ledger (seed {seed})");
    println!("  trials: {trials}");
    for (phase, n) in &phases {
        println!("  {phase}: {n}");
    }
    println!("  the original call answered with its refund before the follow-ups: {acknowledged}");
    println!("  answers that were holds: {held}");
    println!("  never admitted (killed before the host recorded the call): {never_admitted}; of which the resume ran as a new action {second_actions}");
    println!("  reloads (SIGHUP while calls ran): {reloads}");
    println!("  refunds at the provider: {} for {trials} trials (and the warm-ups)", refunds.len() - WARM_UP_AMOUNTS.len());
    println!("  duplicates = {duplicates}, lost = {lost}, left pending or unknown = {unsettled}");
    assert!(settled, "attempts left unsettled after the takeover passes: {unsettled}");
    assert_eq!((duplicates, lost), (0, 0));
    // The reloads took: each host still reloads, and serves the policy its file holds.
    std::thread::sleep(Duration::from_millis(call_ms + call_ms / 5));
    for i in 0..2 {
        let before = f.policy_of(i);
        f.reload_later(i, 0);
        assert!(wait_for(Duration::from_secs(30), || f.policy_of(i) != before), "host {i} did not reload after the torture");
    }
}
