//! Real crashes of the real binary: `toolguard call` as a child process
//! against the in-process sandbox, killed (SIGKILL, or aborted at a
//! failpoint) mid-call, then restarted. Edge cases 8 and 9, `toolguard
//! recover`, and the torture harness.

use crate::common::{BIN, stdout_json};
use crate::payments::Downstream;
use crate::world::{PI, World, wait_for};
use std::process::{Command, Stdio};
use std::time::Duration;
use toolguard::ledger::{AttemptState, Resolution};
use toolguard_sandbox::Fault;

#[test]
fn e08_crash_after_the_attempt_is_written_before_it_is_sent() {
    let w = World::new();
    let child = w.spawn_refund("c1", 111, Some("after-attempt-write"));
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "it aborted at the failpoint");
    assert!(w.posts_of(111).is_empty(), "nothing was sent");
    let pending = w.ledger().attempts_in_state(AttemptState::Pending).unwrap();
    assert_eq!(pending.len(), 1, "the attempt was durable before anything left");
    let key = pending[0].key.clone();

    let (ok, result) = w.refund("c1", 111);
    assert!(ok, "{result}");
    assert_eq!(w.refunds_of(111), 1);
    let posts = w.posts_of(111);
    assert_eq!(posts.len(), 1, "recovery re-drove it once; the re-run replayed the recorded answer");
    assert_eq!(posts[0].idempotency_key.as_deref(), Some(key.as_str()), "with the same key");
}

#[test]
fn recovery_resolves_several_attempts_at_once_each_with_its_key() {
    // Two calls crashed after their attempts were written. The provider then
    // holds each re-send until released: a pass resolving one attempt at a
    // time would wait out the first (60 s) before sending the second.
    let w = World::with(Downstream { timeout_ms: 60_000, refunds_per_session_hour: 1_000, ..Downstream::default() });
    assert!(!w.spawn_refund("r1", 121, Some("after-attempt-write")).wait_with_output().unwrap().status.success());
    // The next process's start-up re-sends r1 and is turned away (429) on every try: r1 stays unknown.
    for _ in 0..4 {
        w.sandbox.inject(Fault::RateLimit429);
    }
    assert!(!w.spawn_refund("r2", 122, Some("after-attempt-write")).wait_with_output().unwrap().status.success());
    let ledger = w.ledger();
    let mut unsettled = ledger.attempts_in_state(AttemptState::Pending).unwrap();
    unsettled.extend(ledger.attempts_in_state(AttemptState::Unknown).unwrap());
    drop(ledger);
    let keys: Vec<String> = unsettled.into_iter().map(|a| a.key).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!((w.refunds_of(121), w.refunds_of(122)), (0, 0));
    w.sandbox.inject(Fault::PauseAfterCommit);
    w.sandbox.inject(Fault::PauseAfterCommit);
    let recover = Command::new(BIN).args(["recover", "--config", w.config.to_str().unwrap()]).stdout(Stdio::piped()).spawn().unwrap();
    let both = wait_for(Duration::from_secs(30), || w.sandbox.paused() == 2);
    w.sandbox.release();
    let out = recover.wait_with_output().unwrap();
    assert!(both, "the two re-sends were never at the provider at once");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let settled = stdout_json(&out)["settled"].clone();
    assert_eq!(settled, serde_json::json!(keys), "reported in ledger order");
    for amount in [121, 122] {
        assert_eq!(w.refunds_of(amount), 1);
        let sent: Vec<_> = w.posts_of(amount).into_iter().filter_map(|p| p.idempotency_key).collect();
        assert!(sent.iter().all(|k| *k == sent[0]) && keys.contains(&sent[0]), "{amount}: one key, its own: {sent:?}");
    }
}

#[test]
fn serve_answers_calls_while_its_start_up_pass_waits_on_the_provider() {
    // A call crashed after its attempt was written. When `serve` starts, the
    // provider takes the re-send of its start-up pass and holds the answer.
    // The host must answer other calls meanwhile: a start-up that resolved
    // every attempt before listening kept every caller waiting on one slow
    // provider (here until the safety release, which then fails the test).
    let w = World::with(Downstream { timeout_ms: 60_000, refunds_per_session_hour: 1_000, ..Downstream::default() });
    assert!(!w.spawn_refund("r1", 131, Some("after-attempt-write")).wait_with_output().unwrap().status.success());
    w.sandbox.inject(Fault::PauseAfterCommit);
    let released = std::sync::atomic::AtomicBool::new(false);
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|scope| {
        let (released, sandbox) = (&released, &w.sandbox);
        scope.spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(Duration::from_secs(40)) {
                released.store(true, std::sync::atomic::Ordering::SeqCst);
                sandbox.release();
            }
        });
        let _server = crate::common::serve_http(&w.config, &[]);
        assert!(wait_for(Duration::from_secs(30), || w.sandbox.paused() == 1), "the start-up pass re-sent r1");
        let (ok, other) = w.refund("r2", 132);
        assert!(ok, "{other}");
        assert!(!released.load(std::sync::atomic::Ordering::SeqCst), "r2 was answered only once r1's re-send was let go");
        assert_eq!((w.sandbox.paused(), w.refunds_of(132)), (1, 1), "r2 refunded while r1's re-send is still held");
        // The model's blind repeat of r1 under a new id, while the pass still has r1.
        let (ok, repeat) = w.refund("r1-again", 131);
        assert!(!ok && repeat["kind"] == "held", "the repeat waits on r1, it does not run: {repeat}");
        done.send(()).unwrap();
        w.sandbox.release();
        let (ok, first) = w.refund("r1", 131);
        assert!(ok, "{first}");
        let refunds: Vec<_> = w.sandbox.refunds().into_iter().filter(|r| r.amount == 131).collect();
        assert_eq!(refunds.len(), 1, "one refund for r1 and its blind repeat");
        assert_eq!(first["refund_id"], refunds[0].id.as_str(), "r1 answered with the refund its start-up re-send made");
        let keys: Vec<_> = w.posts_of(131).into_iter().filter_map(|p| p.idempotency_key).collect();
        assert!(keys.iter().all(|k| *k == keys[0]), "one key: {keys:?}");
    });
}

#[test]
fn e09_crash_between_the_providers_commit_and_our_outcome_write() {
    let w = World::new();
    w.sandbox.inject(Fault::PauseAfterCommit);
    let mut child = w.spawn_refund("c1", 222, None);
    assert!(wait_for(Duration::from_secs(20), || w.sandbox.paused() == 1), "the provider committed and is holding its answer");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    w.sandbox.release();
    assert_eq!(w.refunds_of(222), 1);
    assert_eq!(w.ledger().attempts_in_state(AttemptState::Pending).unwrap().len(), 1, "our outcome write never happened");

    // `toolguard recover` resolves it (same key: the provider replays).
    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let report = stdout_json(&out);
    assert_eq!(report["examined"], 1);
    assert_eq!(report["settled"].as_array().unwrap().len(), 1);
    let attempt = w.ledger().attempts().unwrap().remove(0);
    assert_eq!(attempt.state, AttemptState::Succeeded);
    assert!(attempt.provider_replayed, "the provider replayed its stored answer");

    let (ok, result) = w.refund("c1", 222);
    assert!(ok, "{result}");
    assert_eq!(result["refund_id"], w.sandbox.refunds()[0].id.as_str());
    assert_eq!(w.refunds_of(222), 1);
    let posts = w.posts_of(222);
    assert_eq!(posts.len(), 2, "the original and recovery's re-send");
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key);
}

/// A refund found by reconciliation (the provider answered 500 after
/// committing) reaches its caller, and the host dies before that outcome
/// lands. By the time `toolguard recover` looks again, more than a page of
/// newer refunds of the payment list before it: recovery re-sends the key,
/// the provider replays its stored 500, and the refund must still be found
/// (the plugin once read the first page only, and left it unknown for good).
#[test]
fn a_found_refund_whose_outcome_was_lost_is_found_again_behind_a_page_of_newer_ones() {
    let w = World::new();
    w.sandbox.inject(Fault::HiddenCommit500);
    let out = w.spawn_refund("c1", 444, Some("after-print")).wait_with_output().unwrap();
    assert!(!out.status.success(), "it aborted after printing");
    assert_eq!(stdout_json(&out)["amount_cents"], 444, "the caller heard the refund");
    assert_eq!(w.ledger().attempts_in_state(AttemptState::Pending).unwrap().len(), 1, "its outcome never landed");
    for amount in 1..=120 {
        assert_eq!(w.sandbox.refund_elsewhere(PI, amount).0, 200);
    }
    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(stdout_json(&out)["settled"].as_array().map(Vec::len), Some(1));
    let attempt = w.ledger().attempts().unwrap().remove(0);
    assert_eq!((attempt.state, attempt.resolution), (AttemptState::Succeeded, Some(Resolution::ReconciledFound)));
    assert_eq!(w.refunds_of(444), 1);
}

#[test]
fn ledger_resolve_needs_the_host_stopped_and_an_unsettled_attempt() {
    let w = World::new();
    let (ok, _) = w.refund("c1", 333);
    assert!(ok);
    let key = w.ledger().attempts().unwrap().remove(0).key;
    let out = w.toolguard(&["ledger", "resolve", &key, "--not-sent"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout_json(&out)["message"].as_str().unwrap().contains("already settled"));
    let out = w.toolguard(&["ledger", "resolve", &key]);
    assert_eq!(out.status.code(), Some(2), "--not-sent is required");
}

/// The synced attempt write lands but its acknowledgement is lost (a
/// connection dropped between a commit and its answer): the host records
/// the attempt as not sent before telling the caller nothing was sent, so
/// recovery never sends it behind the caller's back; the same tool call,
/// resumed, sends it then, once.
#[test]
fn an_unacknowledged_attempt_write_is_settled_as_not_sent_and_recovery_never_sends_it() {
    let w = World::new();
    let out = w.spawn_refund("c1", 333, Some("lost-ack:attempt-write")).wait_with_output().unwrap();
    let told = stdout_json(&out);
    assert!(!out.status.success());
    assert_eq!(told["kind"], "transport", "{told}");
    assert!(told["message"].as_str().unwrap().contains("recorded as not sent"), "{told}");
    let attempts = w.ledger().attempts().unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!((attempts[0].state, attempts[0].response.is_none()), (AttemptState::Failed, true), "settled as not sent");
    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(w.posts_of(333).is_empty(), "recovery sent nothing: the caller was told nothing was sent");
    let (ok, result) = w.refund("c1", 333);
    assert!(ok, "{result}");
    assert_eq!(w.refunds_of(333), 1);
    assert_eq!(w.posts_of(333)[0].idempotency_key.as_deref(), Some(attempts[0].key.as_str()), "the same key");
}

/// Neither the attempt write nor its settling as not sent is confirmed:
/// the record may have landed, so the caller hears `outcome-unknown`, not
/// "nothing was sent" — and indeed recovery sends it. A blind repeat is
/// held with what it did; the resumed call returns that refund. One refund.
#[test]
fn an_attempt_write_neither_confirmed_nor_settled_is_an_unknown_outcome() {
    let w = World::new();
    let out = w.spawn_refund("c1", 444, Some("lost-ack:attempt-writes")).wait_with_output().unwrap();
    let told = stdout_json(&out);
    assert_eq!(told["kind"], "outcome-unknown", "{told}");
    assert!(w.posts_of(444).is_empty());
    assert_eq!(w.ledger().attempts_in_state(AttemptState::Pending).unwrap().len(), 1, "the record landed");
    let (ok, repeat) = w.refund("c1-model", 444);
    assert!(!ok);
    assert_eq!(repeat["kind"], "held", "{repeat}");
    let (ok, resumed) = w.refund("c1", 444);
    assert!(ok, "{resumed}");
    assert_eq!(w.refunds_of(444), 1);
    assert_eq!(resumed["refund_id"], w.sandbox.refunds()[0].id.as_str());
}

/// A send that reached nobody (429 on every try) is settled as not sent
/// before the caller hears `transport`; when that settling cannot be
/// written, the ledger still holds the send as pending and recovery will
/// send it, so the caller hears `outcome-unknown` instead — and recovery's
/// refund is then the only one: a blind repeat is held with it.
#[test]
fn a_send_that_reached_nobody_but_could_not_be_recorded_so_is_an_unknown_outcome() {
    let w = World::new();
    for _ in 0..4 {
        w.sandbox.inject(Fault::RateLimit429);
    }
    let out = w.spawn_refund("c1", 555, Some("fail:not-sent-write")).wait_with_output().unwrap();
    let told = stdout_json(&out);
    assert_eq!(told["kind"], "outcome-unknown", "{told}");
    assert_eq!(w.refunds_of(555), 0, "nothing reached the provider");
    assert_eq!(w.ledger().attempts_in_state(AttemptState::Pending).unwrap().len(), 1, "still pending in the ledger");
    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(w.refunds_of(555), 1, "recovery sent it, as the caller was warned it might");
    let (ok, repeat) = w.refund("c1-model", 555);
    assert!(!ok);
    assert_eq!(repeat["kind"], "held", "{repeat}");
    assert_eq!(w.refunds_of(555), 1);
}

/// The same send, its settling written: `transport`, and recovery sends nothing.
#[test]
fn a_send_that_reached_nobody_is_recorded_so_and_recovery_never_sends_it() {
    let w = World::new();
    for _ in 0..4 {
        w.sandbox.inject(Fault::RateLimit429);
    }
    let (ok, told) = w.refund("c1", 556);
    assert!(!ok);
    assert_eq!(told["kind"], "transport", "{told}");
    let out = w.toolguard(&["recover"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(w.refunds_of(556), 0, "recovery sent nothing: the caller was told nothing reached the provider");
}

/// A client that hangs up while its refund is in flight (its harness timed
/// out) never hears the answer the host produces a moment later: it is not
/// recorded as told, so the model's blind repeat is held with the refund
/// (after waiting `DELIVERY_WAIT` to learn whether the answer left), and
/// resuming the call returns it. One refund per round. (A client that
/// abandons its request in the very instant its answer is handed to its
/// still-open connection counts as told: docs/mcp.md.)
#[test]
fn a_client_that_hung_up_before_its_answer_left_was_not_told() {
    let w = World::new();
    w.sandbox.add_payment_intent(crate::payments::PI, 1_000_000);
    let server = crate::common::serve_http(&w.config, &[("TOOLGUARD_LOG", "warn")]);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for round in 0..5u64 {
        let (amount, id) = (700 + round, format!("h{round}"));
        w.sandbox.inject(Fault::PauseAfterCommit);
        let client = rt.block_on(crate::common::Mcp::connect(&server.url));
        let (call_id, hanging) = (id.clone(), std::sync::Arc::new(client));
        let call = rt.spawn(async move { hanging.refund(&call_id, amount).await });
        assert!(wait_for(Duration::from_secs(20), || w.sandbox.paused() == 1), "round {round}: the provider committed");
        // The client's harness gives up: its connection closes (the client's
        // connection task closes the socket just after the call is dropped).
        call.abort();
        let _ = rt.block_on(call);
        std::thread::sleep(Duration::from_millis(5 + round % 3));
        w.sandbox.release();
        let client = rt.block_on(crate::common::Mcp::connect(&server.url));
        let repeat = rt.block_on(client.refund(&format!("{id}-model"), amount)).unwrap();
        let resumed = rt.block_on(client.refund(&id, amount)).unwrap();
        assert_eq!(w.refunds_of(amount), 1, "round {round}: repeat {repeat}, resumed {resumed}");
        let refund = w.sandbox.refunds().into_iter().find(|r| r.amount == amount).unwrap().id;
        assert_eq!(repeat["structuredContent"]["kind"], "held", "round {round}: {repeat}");
        assert_eq!(repeat["structuredContent"]["detail"]["earlier_outcome"]["result"]["refund_id"], refund.as_str(), "round {round}: {repeat}");
        assert_eq!(resumed["structuredContent"]["refund_id"], refund.as_str(), "round {round}: {resumed}");
    }
}

/// `toolguard call` records that its caller was told as the last thing it
/// does, then exits at once. A harness that trusts only a clean exit kills
/// it right after the first byte of the answer — in some trials at once, in
/// the others once the ledger shows the answer recorded as told, the moment
/// a process that lived on after that record would be at its most exposed.
/// Whenever the kill took the clean exit, the ledger must not say the caller
/// was told, so the harness's blind repeat under a new id is held with the
/// first refund: one refund per trial, counted at the provider. The one
/// exception is the window no process can close — between the record's
/// write and the exit itself, a few instructions that a preempted process
/// can stretch: an immediate kill that lands there is counted (its repeat
/// refunds a second time, as docs/guard.md says) and at most two of the six
/// may; a kill once the record shows must always find the process gone, so a
/// process that lingers after its record, as it once did for 300 ms, fails.
#[test]
fn a_kill_right_after_the_answer_never_finds_it_recorded_as_told_without_a_clean_exit() {
    use std::io::Read as _;
    let mut in_window = 0;
    let w = World::new();
    let told = |call_id: &str| {
        toolguard::ledger::Ledger::open_read_only(&crate::world::ledger_dir(w.dir.path()))
            .ok()
            .and_then(|l| l.call(crate::world::SESSION, call_id).ok().flatten())
            .is_some_and(|c| c.reported != toolguard::ledger::records::Reported::Nothing)
    };
    let (mut clean, mut killed) = (0, 0);
    for trial in 0..12u64 {
        let (call_id, amount) = (format!("x{trial}"), 900 + trial);
        let mut child = w.spawn_refund(&call_id, amount, None);
        let mut first = [0u8; 1];
        child.stdout.as_mut().unwrap().read_exact(&mut first).expect("the answer's first byte");
        if trial % 2 == 1 {
            // Until the told record shows, or the process is gone.
            wait_for(Duration::from_secs(30), || told(&call_id) || child.try_wait().unwrap().is_some());
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        if status.success() {
            clean += 1;
        } else {
            killed += 1;
            // No clean exit: the harness has no answer, and repeats the call blindly.
            let (ok, answer) = w.refund(&format!("{call_id}-again"), amount);
            if ok && trial % 2 == 0 && told(&call_id) {
                // Killed between the told record and the exit: the window this test bounds.
                in_window += 1;
                assert_eq!(w.refunds_of(amount), 2, "trial {trial}: the repeat made the one refund more the window allows");
                continue;
            }
            assert!(!ok && answer["kind"] == "held", "trial {trial}: a blind repeat after a kill that took the clean exit ran: {answer}");
            assert!(answer["detail"]["earlier_outcome"].is_object(), "trial {trial}: held with the first refund: {answer}");
        }
        assert_eq!(w.refunds_of(amount), 1, "trial {trial}: one refund");
    }
    println!("answer-then-exit: {clean} clean exits, {killed} killed after the first byte, {in_window} of them between the record and the exit");
    assert!(in_window <= 2, "{in_window} of 6 immediate kills landed after the told record and before the exit: the process does not exit at once");
}
