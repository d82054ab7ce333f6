//! Ledgers written by the last schema-1 version of toolguard (the fixtures
//! in `tests/fixtures/ledger-v1/`, see its README) open with this version,
//! keep every record as it was, and follow the hold rule: a call that never
//! completed still holds an identical repeat.

use crate::payments::{Downstream, config_text, refund_args};
use std::path::{Path, PathBuf};
use toolguard::ledger::{AttemptRecord, CallRecord, Ledger};
use toolguard::{CallRequest, Config, ErrorKind, Runtime};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/ledger-v1").join(name)
}

fn expected<T: serde::de::DeserializeOwned>(name: &str) -> T {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// A copy of the RocksDB fixture at `dest` (the fixture itself is never written).
fn copy_rocksdb(dest: &Path) {
    std::fs::create_dir_all(dest).unwrap();
    for entry in std::fs::read_dir(fixture("rocksdb")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dest.join(entry.file_name())).unwrap();
    }
}

/// Every record as schema 1 wrote it to `backend` (`rocksdb`, `postgres`),
/// and episodes for the calls that never completed.
fn check_migrated(ledger: &Ledger, backend: &str) {
    let calls: Vec<CallRecord> = expected(&format!("{backend}-calls.json"));
    let attempts: Vec<AttemptRecord> = expected(&format!("{backend}-attempts.json"));
    assert_eq!(ledger.calls(None).unwrap(), calls, "every call record, unchanged");
    assert_eq!(ledger.attempts().unwrap(), attempts, "every attempt record, unchanged");
    for call in &calls {
        let episode = ledger.episode(&call.session, &call.tool, &call.args_digest, None).unwrap();
        let open = call.state == toolguard::ledger::CallState::Admitted;
        assert_eq!(episode.is_some(), open, "{}: an episode only for calls that never completed", call.call_id);
        if let Some(e) = episode {
            assert_eq!((e.episode, e.executor.as_str(), e.closed), (1, call.call_id.as_str(), false), "{e:?}");
        }
    }
    // Keys derive from the ledger's secret: it must have survived, or a re-run would mint another key.
    for a in &attempts {
        let call = calls.iter().find(|c| c.call_id == a.call_id).unwrap();
        let input = toolguard::keys::KeyInput {
            session: &a.session,
            call_id: &a.call_id,
            tool: &a.tool,
            args_digest: &call.args_digest,
            step: a.step,
            generation: a.generation,
        };
        assert_eq!(toolguard::keys::mint(ledger.secret(), input), a.key, "the same key for the same send");
    }
}

/// After migrating, the completed calls wait in the retire index, and a
/// pass that prunes everything final removes exactly them: the calls that
/// never completed (each the executor of an open episode) stay.
fn check_retention(ledger: &Ledger) {
    let calls = ledger.calls(None).unwrap();
    let (done, open): (Vec<_>, Vec<_>) = calls.iter().partition(|c| c.state == toolguard::ledger::CallState::Completed);
    assert!(!done.is_empty() && !open.is_empty(), "the fixture has both");
    assert_eq!(ledger.stats().unwrap().retiring, done.len() as u64, "each completed call was entered in the retire index");
    let now = toolguard::ledger::records::now_ms();
    let report = ledger.prune(now + 1, now).unwrap();
    assert_eq!(report.calls, done.len() as u64, "{report:?}");
    for c in done {
        assert!(ledger.call(&c.session, &c.call_id).unwrap().is_none() && ledger.expired(&c.session, &c.call_id).unwrap().is_some());
    }
    for c in open {
        assert!(ledger.call(&c.session, &c.call_id).unwrap().is_some(), "{} never completed: kept", c.call_id);
    }
}

#[test]
fn a_schema_1_rocksdb_ledger_opens_and_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    copy_rocksdb(&path);
    let read_only = Ledger::open_read_only(&path).unwrap();
    assert_eq!(read_only.calls(None).unwrap(), expected::<Vec<CallRecord>>("rocksdb-calls.json"), "read as it is before migrating");
    drop(read_only);
    check_migrated(&Ledger::open(&path).unwrap(), "rocksdb");
    // Migrated once: opening again changes nothing.
    check_migrated(&Ledger::open(&path).unwrap(), "rocksdb");
    check_retention(&Ledger::open(&path).unwrap());
}

#[test]
fn a_schema_1_postgresql_ledger_opens_and_keeps_every_record() {
    let url = crate::common::fresh_postgres_database();
    let dump = std::fs::read_to_string(fixture("postgres.sql")).unwrap();
    let load = url.clone();
    std::thread::spawn(move || {
        let mut client = r2d2_postgres::postgres::Client::connect(&load, r2d2_postgres::postgres::NoTls).unwrap();
        client.batch_execute(&dump).unwrap();
    })
    .join()
    .unwrap();
    let open = url.clone();
    std::thread::spawn(move || {
        check_migrated(&Ledger::connect(&open).unwrap(), "postgres");
        check_migrated(&Ledger::connect(&open).unwrap(), "postgres");
        check_retention(&Ledger::connect(&open).unwrap());
    })
    .join()
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_migrated_ledger_an_unresolved_call_still_holds_its_repeat_and_completed_ones_replay() {
    let sandbox = toolguard_sandbox::Sandbox::start("127.0.0.1:0", toolguard_sandbox::Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.add_payment_intent(crate::payments::PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    copy_rocksdb(&dir.path().join("data").join("ledger"));
    let text = config_text(&sandbox.url(), &dir.path().join("data"), &Downstream::default());
    let config = Config::parse(&text, "test.toml", dir.path()).unwrap();
    // Start-up recovery re-sends the old attempts to the provider they were made
    // to (long gone): they stay unknown.
    let rt = Runtime::from_config(&config).await.unwrap();
    let call = |call_id: &str, amount: u64| CallRequest {
        session: "s1".into(),
        call_id: call_id.into(),
        tool: "refund".into(),
        args_json: refund_args(amount),
        principal: None,
        tenant: None,
    };
    // c-unknown (700) never completed: a blind repeat of it is held, and nothing is sent.
    let held = rt.call(&call("c-repeat", 700)).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "{held}");
    assert_eq!(held.detail.as_ref().unwrap()["earlier_call_id"], "c-unknown");
    // c-done completed under schema 1: it replays; with other arguments it is a conflict.
    let done = rt.call(&call("c-done", 500)).await.unwrap();
    assert!(done.replayed);
    assert_eq!(rt.call(&call("c-done", 501)).await.unwrap_err().kind, ErrorKind::Conflict);
    // A new action runs.
    rt.call(&call("c-new", 900)).await.unwrap();
    assert_eq!(sandbox.refunds().len(), 1, "only the new action reached the new provider");
}
