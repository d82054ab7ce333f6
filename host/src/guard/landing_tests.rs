//! A completion queued and not waited for ([`Landing`]): until it lands, its
//! call counts as in progress and the next holder of the call's lock waits.

use super::Landing;
use crate::guard::Guard;
use crate::ledger::records::{CallRecord, CallState};
use crate::ledger::{Durability, Ledger, LedgerWrite, simulate_slow_fsync};
use std::sync::Arc;
use std::time::Duration;

/// A completed call record.
fn completed(call_id: &str) -> CallRecord {
    let mut record = CallRecord::admitted("s".into(), call_id.into(), "refund".into(), "digest".into(), serde_json::json!({}));
    record.state = CallState::Completed;
    record
}

// One worker: a synced write goes to the sync thread, so it lands only
// after the (slowed) fsync, long after `queue` returned.
#[tokio::test(flavor = "current_thread")]
async fn the_next_holder_of_a_calls_lock_waits_for_its_queued_completion() {
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let guard = Arc::new(Guard::new(ledger.clone()));
    simulate_slow_fsync(Duration::from_millis(300));
    let record = completed("c1");
    let write = ledger.queue(LedgerWrite::new().call(record.clone()), Durability::Synced);
    let mut lock = guard.call_lock("s", "c1").lock_owned().await;
    *lock = Some(Landing::new(write, Vec::new(), record));
    drop(lock);
    let synced_before = ledger.write_counts().0;
    assert!(guard.in_progress("s", "c1"), "a call whose completion has not landed is still in progress");
    // Other calls' locks come and go meanwhile: the map is swept, the pending completion stays.
    for n in 0..200 {
        drop(guard.lock_call("s", &format!("other-{n}")).await);
    }
    assert!(guard.in_progress("s", "c1"), "a sweep keeps a lock whose completion has not landed");
    // A holder that gives up waiting leaves the completion for the next one.
    assert!(tokio::time::timeout(Duration::from_millis(20), guard.lock_call("s", "c1")).await.is_err());
    assert!(guard.in_progress("s", "c1"), "a cancelled wait leaves the completion in the lock");
    let held = guard.lock_call("s", "c1").await;
    simulate_slow_fsync(Duration::ZERO);
    assert!(held.is_none(), "the holder took the completion out");
    assert_eq!(ledger.write_counts().0, synced_before + 1, "the lock was handed over only once the completion had landed");
    drop(held);
    assert!(!guard.in_progress("s", "c1"));
}

/// A host with the payments plugin granted an in-process provider that
/// answers every refund, its ledger in `dir`; its completions wait `wait`
/// for their reports.
async fn refund_host(dir: &std::path::Path, wait: Duration) -> crate::Runtime {
    let (provider, _) = counting_provider().await;
    let rt = payments_host(dir, &provider).await;
    rt.guard().unwrap().deferrals.wait_us.store(wait.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
    rt
}

/// A host with the payments plugin granted `provider`, its data in `dir`.
async fn payments_host(dir: &std::path::Path, provider: &str) -> crate::Runtime {
    use toolguard_sandbox::config::{KEY_HEADER_ONLY, PaymentsConfig};
    let payments = PaymentsConfig { methods: vec!["POST"], key: KEY_HEADER_ONLY.into(), ..PaymentsConfig::new(provider, "builtin:payments") };
    let config = crate::Config::parse(&format!("data_dir = \"data\"\n{}", payments.toml()), "<test>", dir).unwrap();
    crate::Runtime::from_config(&config).await.unwrap()
}

/// A refund of one cent under `call_id`, in session `bench`.
fn refund(call_id: &str) -> crate::CallRequest {
    crate::CallRequest {
        session: "bench".into(),
        call_id: call_id.into(),
        tool: "refund".into(),
        args_json: r#"{"payment_intent":"pi_bench","amount_cents":1,"reason":"duplicate"}"#.into(),
        principal: None,
        tenant: None,
    }
}

/// The call `call_id` as the ledger of `rt` holds it.
async fn stored(rt: &crate::Runtime, call_id: &str) -> CallRecord {
    let ledger = rt.guard().unwrap().ledger().clone();
    let call_id = call_id.to_string();
    ledger.read(move |l| l.call("bench", &call_id)).await.unwrap().expect("the call is in the ledger")
}

#[tokio::test]
async fn an_irreversible_calls_completion_rides_with_the_report_of_what_its_caller_was_told() {
    use crate::ledger::records::Reported;
    let dir = tempfile::tempdir().unwrap();
    let rt = refund_host(dir.path(), Duration::from_secs(3600)).await;
    let request = refund("c1");
    let answer = rt.call(&request).await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_ne!(stored(&rt, "c1").await.state, CallState::Completed, "the completion waits for the report");
    assert!(rt.guard().unwrap().in_progress("bench", "c1"), "a call whose completion has not landed is still in progress");
    let ledger = rt.guard().unwrap().ledger().clone();
    let buffered = ledger.write_counts().1;
    rt.report(&request, &answer).await;
    assert_eq!(ledger.write_counts().1, buffered + 1, "the completion and the report landed as one write");
    let call = stored(&rt, "c1").await;
    assert_eq!((call.state, call.reported), (CallState::Completed, Reported::Definitive));
    let attempts = ledger.read(|l| l.attempts_of_call("bench", "c1")).await.unwrap();
    assert!(attempts.iter().all(|a| a.state == crate::ledger::records::AttemptState::Succeeded), "the send's outcome rode with them: {attempts:?}");
    let episode = ledger.read(move |l| l.episode("bench", &call.tool, &call.args_digest, call.episode)).await.unwrap().unwrap();
    assert!(episode.closed, "a definitive report closes the episode");
    assert!(!rt.guard().unwrap().in_progress("bench", "c1"));
}

#[tokio::test]
async fn a_completion_whose_report_never_comes_lands_alone() {
    let dir = tempfile::tempdir().unwrap();
    let rt = refund_host(dir.path(), Duration::from_millis(1)).await;
    assert!(rt.call(&refund("c1")).await.is_ok());
    // No report: the watcher queues it once it has waited.
    for _ in 0..1000 {
        let call = stored(&rt, "c1").await;
        if call.state == CallState::Completed {
            assert!(call.outcome.is_some(), "it landed with its outcome");
            assert_eq!(call.reported, crate::ledger::records::Reported::Nothing, "nothing was reported");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("a completion without a report never landed");
}

#[tokio::test]
async fn the_next_holder_of_the_lock_lands_a_deferred_completion_first() {
    let dir = tempfile::tempdir().unwrap();
    let rt = refund_host(dir.path(), Duration::from_secs(3600)).await;
    assert!(rt.call(&refund("c1")).await.is_ok());
    assert_ne!(stored(&rt, "c1").await.state, CallState::Completed);
    let held = rt.guard().unwrap().lock_call("bench", "c1").await;
    assert_eq!(stored(&rt, "c1").await.state, CallState::Completed, "the lock was handed over only once the completion had landed");
    drop(held);
    assert!(!rt.guard().unwrap().in_progress("bench", "c1"));
}

#[test]
fn a_host_that_goes_away_lands_the_completions_waiting_for_their_reports() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let rt = refund_host(dir.path(), Duration::from_secs(3600)).await;
        assert!(rt.call(&refund("c1")).await.is_ok());
        assert_ne!(stored(&rt, "c1").await.state, CallState::Completed);
    });
    drop(runtime);
    let ledger = Ledger::open(&dir.path().join("data").join("ledger")).unwrap();
    let call = ledger.call("bench", "c1").unwrap().unwrap();
    assert_eq!(call.state, CallState::Completed, "the completion was queued when its lock went away");
}

/// A provider that answers every refund and counts them.
async fn counting_provider() -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    let app = axum::Router::new().route(
        "/v1/refunds",
        axum::routing::post(move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let body = r#"{"id":"re_1","object":"refund","amount":1,"currency":"usd","payment_intent":"pi_bench","reason":"duplicate","status":"succeeded","metadata":{},"created":0}"#;
            async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, count)
}

#[tokio::test]
async fn an_identical_call_before_the_report_is_held_with_the_outcome_and_sends_nothing() {
    use crate::error::ErrorKind;
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let (provider, refunds) = counting_provider().await;
    let rt = payments_host(dir.path(), &provider).await;
    rt.guard().unwrap().deferrals.wait_us.store(3_600_000_000, std::sync::atomic::Ordering::Relaxed);
    let first = refund("c1");
    let answer = rt.call(&first).await;
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(refunds.load(SeqCst), 1);
    // The model repeats the refund under a new id before the first answer
    // was recorded as told: its completion still waits for the report.
    // (It waits, up to its hold wait, for the first answer to be told.)
    let repeat = rt.call(&refund("c2")).await.unwrap_err();
    assert_eq!(repeat.kind, ErrorKind::Held, "{repeat}");
    assert!(repeat.detail.as_ref().is_some_and(|d| d.get("earlier_outcome").is_some()), "held with the first call's outcome: {repeat:?}");
    assert_eq!(refunds.load(SeqCst), 1, "the repeat sent nothing");
    assert_eq!(stored(&rt, "c1").await.state, CallState::Completed, "the repeat landed the first call's completion before deciding");
    // Once the caller was told, an identical call is a new action.
    rt.report(&first, &answer).await;
    assert!(rt.call(&refund("c3")).await.is_ok());
    assert_eq!(refunds.load(SeqCst), 2);
}

#[test]
fn a_watcher_whose_runtime_has_shut_down_is_replaced() {
    use super::Deferrals;
    let dir = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(dir.path()).unwrap();
    let deferred =
        |call_id: &str| Arc::new(tokio::sync::Mutex::new(Some(Landing::deferred(ledger.clone(), LedgerWrite::new(), Vec::new(), completed(call_id)))));
    let deferrals = Deferrals::default();
    deferrals.wait_us.store(1_000, std::sync::atomic::Ordering::Relaxed);
    // The first watcher task runs on a runtime that then shuts down.
    let first = tokio::runtime::Runtime::new().unwrap();
    first.block_on(async { deferrals.watch(deferred("c0")) });
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let lock = deferred("c1");
        deferrals.watch(lock.clone());
        for _ in 0..1000 {
            if ledger.call("s", "c1").unwrap().is_some() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("a completion watched after the first watcher's runtime shut down never landed");
    });
}
