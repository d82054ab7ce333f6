//! The hold rule through the real binary: `toolguard call` processes
//! (restarted, killed, run in parallel), `toolguard recover`, the MCP
//! server, and two `serve --http` hosts over one PostgreSQL ledger. Every
//! test counts refunds at the sandbox.

use crate::common::{Mcp, Server, fresh_postgres_database, serve_http, stdout_json};
use crate::payments::{Downstream, INTENT_AND_AMOUNT, config_text};
use crate::world::{PI, World, wait_for};
use serde_json::Value;
use std::time::Duration;
use toolguard::ledger::AttemptState;
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// Longer than any test runs: reconciliation by listing cannot see the refund.
const LONG_LAG: Duration = Duration::from_secs(600);

/// A deadline far shorter than the provider's late answer.
fn short_deadline() -> Downstream {
    Downstream { timeout_ms: 500, reconcile_ms: 200, ..Downstream::default() }
}

/// Makes the provider commit the next refund but answer late, and lag its listing.
fn commit_then_answer_late(sandbox: &Sandbox) {
    sandbox.set_list_lag(LONG_LAG);
    sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

/// Checks `v` is `held` carrying an earlier outcome; returns that outcome.
fn held_with_outcome(v: &Value) -> Value {
    assert_eq!(kind(v), "held", "{v}");
    let outcome = v["detail"]["earlier_outcome"].clone();
    assert!(!outcome.is_null(), "the held answer carries the earlier call's outcome: {v}");
    assert!(v["message"].as_str().unwrap().contains("Nothing new was sent"), "{v}");
    outcome
}

/// The refund id an earlier outcome names (a tool result, or the provider's answer).
fn refund_id(outcome: &Value) -> Option<&str> {
    outcome["result"]["refund_id"].as_str().or_else(|| outcome["sends"][0]["body"]["id"].as_str())
}

/// k1's outcome is unknown; a later process settles it in the background
/// (`resolve` runs between the two calls); the model's blind repeat under a
/// new id is held with the real outcome; a third identical call runs.
fn unknown_resolved_then_repeated(resolve: impl FnOnce(&World)) {
    let w = World::with(short_deadline());
    commit_then_answer_late(&w.sandbox);
    let (ok, first) = w.refund("k1", 500);
    assert!(!ok);
    assert_eq!(kind(&first), "outcome-unknown", "{first}");
    resolve(&w);
    let (ok, repeat) = w.refund("k1-retry", 500);
    assert!(!ok, "{repeat}");
    let outcome = held_with_outcome(&repeat);
    assert_eq!(refund_id(&outcome), Some(w.sandbox.refunds()[0].id.as_str()), "the real refund: {outcome}");
    assert_eq!(w.refunds_of(500), 1);
    let posts = w.posts_of(500);
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key), "only k1's key ever went out");
    let (ok, third) = w.refund("k1-third", 500);
    assert!(ok, "after the definitive answer, a new call is a new refund: {third}");
    assert_eq!(w.refunds_of(500), 2);
}

/// A refund of 500 in words of `reason` under `call_id`, run to completion: whether it succeeded, its stdout.
fn refund_saying(w: &World, call_id: &str, reason: &str) -> (bool, Value) {
    let out = w.spawn_refund_saying(call_id, 500, reason, None).wait_with_output().unwrap();
    (out.status.success(), stdout_json(&out))
}

/// k1's outcome is unknown; the model's blind repeat `k2` gives another
/// reason. Returns the world and k2's answer, with the refund's action
/// declared as `action` (or all of its arguments).
fn a_repeat_in_other_words(refund_action: Option<&'static str>) -> (World, Value) {
    let w = World::with(Downstream { refund_action, ..short_deadline() });
    commit_then_answer_late(&w.sandbox);
    let (ok, first) = refund_saying(&w, "k1", "duplicate");
    assert!(!ok);
    assert_eq!(kind(&first), "outcome-unknown", "{first}");
    let (_, repeat) = refund_saying(&w, "k2", "requested_by_customer");
    (w, repeat)
}

#[test]
fn a_repeat_in_other_words_is_held_when_the_reviewer_names_the_arguments_of_the_action() {
    // Undeclared, the other reason is another action: a second refund.
    let (w, repeat) = a_repeat_in_other_words(None);
    assert_eq!(repeat["amount_cents"], 500, "{repeat}");
    assert_eq!(w.refunds_of(500), 2, "without `action`, a reworded repeat runs");

    let (w, repeat) = a_repeat_in_other_words(Some(INTENT_AND_AMOUNT));
    let outcome = held_with_outcome(&repeat);
    let first_refund = w.sandbox.refunds()[0].id.clone();
    assert_eq!(refund_id(&outcome), Some(first_refund.as_str()), "k1's real refund: {outcome}");
    assert_eq!(w.refunds_of(500), 1);
    // k1 again, in yet other words: the same action under its own id runs as
    // first recorded, so its send is the same request and replays.
    let (ok, again) = refund_saying(&w, "k1", "fraudulent");
    assert!(ok, "{again}");
    assert_eq!((again["refund_id"].as_str(), again["reason"].as_str()), (Some(first_refund.as_str()), Some("duplicate")), "{again}");
    let posts = w.posts_of(500);
    assert!(posts.iter().all(|p| p.idempotency_key == posts[0].idempotency_key && p.body.contains("reason=duplicate")), "only k1's request went out");
    assert_eq!(w.refunds_of(500), 1);
    // Told a definitive outcome, the caller's next refund of the same action is a new one.
    let (ok, third) = refund_saying(&w, "k3", "fraudulent");
    assert!(ok, "{third}");
    assert_eq!(w.refunds_of(500), 2);

    // A pointer the tool's schema does not declare would make every refund one action: refused at load.
    let text = std::fs::read_to_string(&w.config).unwrap().replacen(r#""/amount_cents"]"#, r#""/amount"]"#, 1);
    std::fs::write(&w.config, text).unwrap();
    let (ok, refused) = refund_saying(&w, "k4", "duplicate");
    assert!(!ok);
    assert!(refused["message"].as_str().unwrap_or_default().contains("`/amount`, which its input schema does not declare"), "{refused}");
    assert_eq!(w.refunds_of(500), 2);
}

#[test]
fn a_repeat_after_start_up_recovery_settled_the_first_is_held_with_its_outcome() {
    // The repeat's own process resolves k1 at start-up, before admitting the repeat.
    unknown_resolved_then_repeated(|_| {});
}

#[test]
fn a_repeat_after_toolguard_recover_settled_the_first_is_held_with_its_outcome() {
    unknown_resolved_then_repeated(|w| {
        let out = w.toolguard(&["recover"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(stdout_json(&out)["settled"].as_array().unwrap().len(), 1);
        assert_eq!(w.ledger().attempts_in_state(AttemptState::Succeeded).unwrap().len(), 1);
    });
}

#[test]
fn a_repeat_after_the_host_was_killed_mid_call_is_held_with_the_outcome() {
    let w = World::new();
    w.sandbox.inject(Fault::PauseAfterCommit);
    let mut child = w.spawn_refund("k1", 700, None);
    assert!(wait_for(Duration::from_secs(30), || w.sandbox.paused() == 1), "the provider committed");
    child.kill().unwrap();
    child.wait().unwrap();
    w.sandbox.release();
    let (ok, repeat) = w.refund("k2", 700);
    assert!(!ok);
    held_with_outcome(&repeat);
    assert_eq!(w.refunds_of(700), 1);
    // The harness resumes k1 itself: its send replays from the ledger.
    let (ok, k1) = w.refund("k1", 700);
    assert!(ok, "{k1}");
    assert_eq!(k1["refund_id"], w.sandbox.refunds()[0].id.as_str());
    assert_eq!(w.refunds_of(700), 1);
}

#[test]
fn a_call_killed_before_it_sent_is_answered_with_the_repeat_that_superseded_it() {
    let w = World::new();
    let out = w.spawn_refund("t1", 800, Some("after-admission")).wait_with_output().unwrap();
    assert!(!out.status.success(), "aborted after its admission was written");
    assert!(w.posts_of(800).is_empty(), "nothing was sent");
    let (ok, model) = w.refund("t1-model", 800);
    assert!(ok, "t1 sent nothing and runs nowhere: the model's repeat takes its place: {model}");
    assert_eq!(w.refunds_of(800), 1);
    let (ok, resumed) = w.refund("t1", 800);
    assert!(!ok);
    let outcome = held_with_outcome(&resumed);
    assert_eq!(outcome["result"], model, "t1 is answered with t1-model's outcome");
    assert_eq!(w.refunds_of(800), 1);
    assert_eq!(w.posts_of(800).len(), 1);
}

#[test]
fn a_plugin_that_resends_an_unknown_request_makes_one_refund() {
    let w = World::with(short_deadline());
    w.sandbox.inject(Fault::DelayAfterCommit { ms: 2_000 });
    let request = serde_json::json!({ "method": "POST", "url": format!("{}/v1/refunds", w.sandbox.url()),
        "headers": { "Content-Type": "application/x-www-form-urlencoded" }, "body": format!("payment_intent={PI}&amount=950") });
    let args = crate::payments::rogue_args(serde_json::json!([request, request]), true);
    let out = w.toolguard(&["call", "--session", "crash", "--call-id", "r1", "send_all", &args]);
    let answer = stdout_json(&out);
    assert!(out.status.success(), "{answer}");
    assert!(answer[0]["error"].as_str().unwrap().starts_with("outcome-unknown"), "{answer}");
    assert_eq!(answer[1]["status"], 200, "the re-send got the provider's stored answer: {answer}");
    assert_eq!(w.refunds_of(950), 1);
    let posts = w.posts_of(950);
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "one key: the same step");
}

#[test]
fn eight_concurrent_toolguard_calls_on_one_data_directory_are_all_answered() {
    let w = World::new();
    // (call id, amount): two ids twice (the same tool call, e.g. a transport retry),
    // and a pair of identical refunds under different ids.
    let calls = [("c1", 901), ("c1", 901), ("c2", 902), ("c2", 902), ("c3", 903), ("c4", 904), ("c5", 905), ("c6", 905)];
    let children: Vec<_> = calls.iter().map(|(id, amount)| w.spawn_refund(id, *amount, None)).collect();
    let outputs: Vec<_> = children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    let answers: Vec<(bool, Value)> = outputs.iter().map(|o| (o.status.success(), stdout_json(o))).collect();
    for (i, (ok, answer)) in answers.iter().enumerate() {
        let held = kind(answer) == "held";
        assert!(*ok || held, "call {i} {:?}: {answer}\n{}", calls[i], String::from_utf8_lossy(&outputs[i].stderr));
    }
    assert_eq!(answers[0], answers[1], "the same tool call, the same answer");
    assert_eq!(answers[2], answers[3]);
    for amount in [901, 902, 903, 904] {
        assert_eq!(w.refunds_of(amount), 1, "one refund per tool call ({amount})");
    }
    // c5 and c6 are identical: what each caller was told matches the provider.
    let ran = answers[6..].iter().filter(|(ok, _)| *ok).count();
    assert_eq!(w.refunds_of(905), ran, "{:?}", &answers[6..]);
    if ran == 1 {
        let held = answers[6..].iter().find(|(ok, _)| !ok).unwrap();
        let winner = answers[6..].iter().find(|(ok, _)| *ok).unwrap();
        assert_eq!(held_with_outcome(&held.1)["result"], winner.1, "the held one carries the other's refund");
    }
}

/// A refund host over MCP (`serve --http`) on the payments sandbox.
fn mcp_world(d: &Downstream, ledger: Option<&str>) -> (tokio::runtime::Runtime, Sandbox, Vec<Server>, tempfile::TempDir) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(crate::payments::PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let hosts = if ledger.is_some() { 2 } else { 1 };
    let servers = (0..hosts)
        .map(|i| {
            let text = config_text(&sandbox.url(), &dir.path().join(format!("host{i}")), d);
            let text = ledger.map_or(text.clone(), |url| format!("ledger = {url:?}\n{text}"));
            let path = dir.path().join(format!("host{i}.toml"));
            std::fs::write(&path, text).unwrap();
            serve_http(&path, &[])
        })
        .collect();
    (rt, sandbox, servers, dir)
}

/// The structured content of an MCP tool result.
fn structured(result: &Value) -> &Value {
    &result["structuredContent"]
}

#[test]
fn over_mcp_a_blind_repeat_is_held_with_the_outcome_and_a_third_call_runs() {
    let (rt, sandbox, servers, _dir) = mcp_world(&short_deadline(), None);
    let client = rt.block_on(Mcp::connect(&servers[0].url));
    commit_then_answer_late(&sandbox);
    let first = rt.block_on(client.refund("k1", 500)).unwrap();
    assert_eq!(structured(&first)["kind"], "outcome-unknown", "{first}");
    let repeat = rt.block_on(client.refund("k2", 500)).unwrap();
    assert_eq!(repeat["isError"], true);
    held_with_outcome(structured(&repeat));
    assert_eq!(sandbox.refunds().len(), 1);
    // The held answer was written to the client, so the episode is over.
    let third = rt.block_on(client.refund("k3", 500)).unwrap();
    assert_eq!(third["isError"], false, "{third}");
    assert_eq!(sandbox.refunds().len(), 2);
}

#[test]
fn over_mcp_parallel_identical_calls_make_one_refund() {
    let d = Downstream { reconcile_ms: 3_000, ..Downstream::default() };
    let (rt, sandbox, servers, _dir) = mcp_world(&d, None);
    sandbox.inject(Fault::DelayBeforeCommit { ms: 300 });
    let (a, b) = rt.block_on(async {
        let client = Mcp::connect(&servers[0].url).await;
        let second = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            client.refund("p2", 500).await
        };
        tokio::join!(client.refund("p1", 500), second)
    });
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a["isError"], false, "{a}");
    let outcome = held_with_outcome(structured(&b));
    assert_eq!(&outcome["result"], structured(&a), "the second waited and carries the first's refund");
    assert_eq!(sandbox.refunds().len(), 1);
}

/// Waits until the shared ledger at `url` holds no unsettled attempt.
fn until_settled(url: &str) {
    let url = url.to_string();
    let settled = std::thread::spawn(move || {
        let ledger = toolguard::ledger::Ledger::connect(&url).unwrap();
        wait_for(Duration::from_secs(30), || {
            let open = ledger.attempts_in_state(AttemptState::Pending).unwrap().len() + ledger.attempts_in_state(AttemptState::Unknown).unwrap().len();
            open == 0 && !ledger.attempts().unwrap().is_empty()
        })
    });
    assert!(settled.join().unwrap(), "a takeover pass settles the unknown attempt");
}

#[test]
fn on_a_fleet_a_repeat_after_a_takeover_pass_settled_the_first_is_held_with_its_outcome() {
    let ledger = fresh_postgres_database();
    let (rt, sandbox, servers, _dir) = mcp_world(&short_deadline(), Some(&ledger));
    let (a, b) = rt.block_on(async { (Mcp::connect(&servers[0].url).await, Mcp::connect(&servers[1].url).await) });
    commit_then_answer_late(&sandbox);
    let first = rt.block_on(a.refund("k1", 500)).unwrap();
    assert_eq!(structured(&first)["kind"], "outcome-unknown", "{first}");
    // Every 2 s each host re-drives unknown attempts with their keys.
    until_settled(&ledger);
    let repeat = rt.block_on(b.refund("k2", 500)).unwrap();
    held_with_outcome(structured(&repeat));
    assert_eq!(sandbox.refunds().len(), 1);
    let third = rt.block_on(b.refund("k3", 500)).unwrap();
    assert_eq!(third["isError"], false, "{third}");
    assert_eq!(sandbox.refunds().len(), 2);
}

#[test]
fn on_a_fleet_a_repeat_in_other_words_on_the_other_host_is_held_under_the_declared_action() {
    let ledger = fresh_postgres_database();
    let d = Downstream { refund_action: Some(INTENT_AND_AMOUNT), ..short_deadline() };
    let (rt, sandbox, servers, _dir) = mcp_world(&d, Some(&ledger));
    let (a, b) = rt.block_on(async { (Mcp::connect(&servers[0].url).await, Mcp::connect(&servers[1].url).await) });
    let saying = |reason: &str| serde_json::json!({ "payment_intent": crate::payments::PI, "amount_cents": 500, "reason": reason });
    commit_then_answer_late(&sandbox);
    let first = rt.block_on(a.call("refund", "k1", saying("duplicate"))).unwrap();
    assert_eq!(structured(&first)["kind"], "outcome-unknown", "{first}");
    // The model re-issues on the other host, giving another reason.
    let repeat = rt.block_on(b.call("refund", "k2", saying("requested_by_customer"))).unwrap();
    let outcome = held_with_outcome(structured(&repeat));
    assert_eq!(refund_id(&outcome), Some(sandbox.refunds()[0].id.as_str()), "{outcome}");
    assert_eq!(sandbox.refunds().len(), 1);
    // Told, the caller's next refund of it runs (on the host that told it:
    // another may hold it once more in the milliseconds before that answer's
    // record lands, the safe side, docs/guard.md).
    let third = rt.block_on(b.call("refund", "k3", saying("fraudulent"))).unwrap();
    assert_eq!(third["isError"], false, "{third}");
    assert_eq!(sandbox.refunds().len(), 2);
}

#[test]
fn on_a_fleet_a_repeat_of_a_dead_hosts_call_never_refunds_twice() {
    let ledger = fresh_postgres_database();
    let d = Downstream { wall_ms: 1_500, ..Downstream::default() };
    let (rt, sandbox, mut servers, _dir) = mcp_world(&d, Some(&ledger));
    let (a, b) = rt.block_on(async { (Mcp::connect(&servers[0].url).await, Mcp::connect(&servers[1].url).await) });
    sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    // Host A sends; the provider commits; A is SIGKILLed before the answer.
    let pending = rt.spawn(async move { a.refund("k1", 500).await });
    assert!(wait_for(Duration::from_secs(10), || !sandbox.refunds().is_empty()));
    servers[0].child.kill().unwrap();
    servers[0].child.wait().unwrap();
    assert!(rt.block_on(pending).unwrap().is_err(), "A died mid-call: the model never heard");
    // The client re-issues on B under a new id, and keeps retrying that id while it is held.
    let mut answer = Value::Null;
    assert!(
        wait_for(Duration::from_secs(30), || {
            answer = rt.block_on(b.refund("k2", 500)).unwrap();
            !structured(&answer)["detail"]["earlier_outcome"].is_null()
        }),
        "once A's claim lapsed, k2 gets k1's outcome: {answer}"
    );
    held_with_outcome(structured(&answer));
    assert_eq!(sandbox.refunds().len(), 1, "never a second refund");
    let third = rt.block_on(b.refund("k3", 500)).unwrap();
    assert_eq!(third["isError"], false, "{third}");
    assert_eq!(sandbox.refunds().len(), 2);
}
