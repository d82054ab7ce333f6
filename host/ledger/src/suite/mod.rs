//! The ledger's behaviour, run against both backends: RocksDB in a temporary
//! directory and PostgreSQL in a fresh database of the server named by
//! `TOOLGUARD_TEST_POSTGRES` (`./dev.sh test` starts a throwaway one).

mod fleet;
pub(crate) mod limits;
mod retention;

use super::records::{PlannedSend, StoredBody, StoredRequest};
use super::*;
use limits::{
    a_call_whose_sends_never_took_effect_gives_back_what_it_spent, budgets_count_uses_in_their_window_and_refuse_the_one_too_many,
    limits_sum_uses_in_their_window_refuse_the_one_that_passes_and_take_back_a_release,
};
use retention::{
    a_pruning_pass_removes_old_final_units_and_leaves_tombstones, limit_uses_are_forgotten_once_their_window_has_ended, old_budget_uses_are_forgotten,
};

/// Opens (and reopens) one ledger.
trait Store {
    fn open(&self) -> Ledger;
}

struct RocksStore(tempfile::TempDir);

impl Store for RocksStore {
    fn open(&self) -> Ledger {
        Ledger::open(self.0.path()).expect("opening a RocksDB ledger")
    }
}

struct PostgresStore(String);

impl PostgresStore {
    /// A new, empty database on the test server.
    fn new() -> Self {
        let admin = std::env::var("TOOLGUARD_TEST_POSTGRES").expect(
            "TOOLGUARD_TEST_POSTGRES is not set: run the tests with ./dev.sh test, which starts a throwaway PostgreSQL, \
             or point it at a server where this user may CREATE DATABASE (postgres://user@host:port/postgres)",
        );
        let name = format!("tg_{}", hex::encode(super::new_secret().unwrap())[..16].to_owned());
        let mut client = r2d2_postgres::postgres::Client::connect(&admin, r2d2_postgres::postgres::NoTls).expect("connecting to the test server");
        client.batch_execute(&format!("CREATE DATABASE {name}")).expect("creating a test database");
        let mut url = url::Url::parse(&admin).expect("TOOLGUARD_TEST_POSTGRES is a URL");
        url.set_path(&format!("/{name}"));
        Self(url.to_string())
    }
}

impl Store for PostgresStore {
    fn open(&self) -> Ledger {
        Ledger::connect(&self.0).expect("connecting to the test database")
    }
}

/// An attempt of tool call (`s`, `call_id`) in `state`, with fixed times.
pub(super) fn attempt(call_id: &str, step: u32, generation: u32, state: AttemptState) -> AttemptRecord {
    let request = StoredRequest { method: "POST".into(), url: "http://p/r".into(), headers: vec![], body: StoredBody::from_bytes(b"x") };
    let key = format!("tg1_{call_id}_{step}_{generation}");
    let send = PlannedSend { step, generation, fingerprint: "f".into(), downstream: "payments".into(), request };
    let fresh = AttemptRecord::pending(&call("s", call_id), key, send);
    AttemptRecord { state, created_ms: 1, updated_ms: 1, ..fresh }
}

/// A refund call just admitted, with a fixed time.
pub(super) fn call(session: &str, call_id: &str) -> CallRecord {
    let args = serde_json::json!({ "amount_cents": 100, "payment_intent": "pi_1" });
    CallRecord { created_ms: 1, ..CallRecord::admitted(session.into(), call_id.into(), "refund".into(), "d".into(), args) }
}

fn keys(attempts: &[AttemptRecord]) -> Vec<&str> {
    attempts.iter().map(|a| a.key.as_str()).collect()
}

fn calls_round_trip_and_group_by_session(store: &dyn Store) {
    let ledger = store.open();
    let write = LedgerWrite::new().call(call("a", "2")).call(call("ab", "1")).call(call("a", "1"));
    ledger.commit(write, Durability::Synced).unwrap();
    assert_eq!(ledger.call("a", "1").unwrap(), Some(call("a", "1")));
    assert_eq!(ledger.call("a", "3").unwrap(), None);
    let ids = |calls: Vec<CallRecord>| calls.into_iter().map(|c| format!("{}/{}", c.session, c.call_id)).collect::<Vec<_>>();
    assert_eq!(ids(ledger.calls(Some("a")).unwrap()), ["a/1", "a/2"], "`a` is not a prefix match: `ab` is another session");
    assert_eq!(ids(ledger.calls(None).unwrap()), ["a/1", "a/2", "ab/1"]);
    // A later write replaces the record.
    let mut done = call("a", "1");
    done.state = CallState::Completed;
    done.outcome = Some(StoredOutcome::Result(serde_json::json!({ "id": "re_1" })));
    ledger.commit(LedgerWrite::new().call(done.clone()), Durability::Buffered).unwrap();
    assert_eq!(ledger.call("a", "1").unwrap(), Some(done));
}

fn attempts_are_found_by_key_step_call_and_state(store: &dyn Store) {
    let ledger = store.open();
    let (first, second) = (attempt("c1", 0, 0, AttemptState::Succeeded), attempt("c1", 1, 0, AttemptState::Pending));
    let other = attempt("c2", 0, 0, AttemptState::Pending);
    let write = LedgerWrite::new().call(call("s", "c1")).attempt_over(second.clone(), Prior::Absent).attempt_over(first.clone(), Prior::Absent);
    ledger.commit(write.attempt_over(other.clone(), Prior::Absent), Durability::Synced).unwrap();
    assert_eq!(ledger.attempt(&first.key).unwrap(), Some(first.clone()));
    assert_eq!(ledger.attempt("tg1_nothing").unwrap(), None);
    assert_eq!(ledger.attempt_at("s", "c1", 1).unwrap(), Some(second.clone()));
    assert_eq!(ledger.attempt_at("s", "c1", 2).unwrap(), None);
    assert_eq!(keys(&ledger.attempts_of_call("s", "c1").unwrap()), [&first.key, &second.key], "by step");
    assert_eq!(keys(&ledger.attempts_in_state(AttemptState::Pending).unwrap()), [&second.key, &other.key], "key order");
    assert_eq!(ledger.attempts().unwrap().len(), 3);
}

fn a_new_generation_becomes_the_steps_current_attempt(store: &dyn Store) {
    let ledger = store.open();
    let mut old = attempt("c1", 0, 0, AttemptState::Unknown);
    ledger.commit(LedgerWrite::new().attempt_over(old.clone(), Prior::Absent), Durability::Synced).unwrap();
    old = ledger.resolve_not_sent(&old.key, "checked with the provider").unwrap();
    assert_eq!((old.state, old.resolution), (AttemptState::Failed, Some(Resolution::OperatorNotSent)));
    let err = ledger.resolve_not_sent(&old.key, "again").unwrap_err();
    assert!(err.to_string().contains("already settled"), "{err}");
    let new = attempt("c1", 0, 1, AttemptState::Pending);
    ledger.commit(LedgerWrite::new().attempt_over(new.clone(), Prior::Absent), Durability::Synced).unwrap();
    assert_eq!(ledger.attempt_at("s", "c1", 0).unwrap(), Some(new.clone()));
    assert_eq!(keys(&ledger.attempts_of_call("s", "c1").unwrap()), [&new.key]);
    assert_eq!(ledger.attempt(&old.key).unwrap(), Some(old), "the old generation stays readable");
}

/// Paths an attempt's state takes through its writes.
pub(super) const STATE_PATHS: [&[AttemptState]; 5] = {
    use AttemptState::*;
    [
        &[Pending, Succeeded],
        &[Pending, Unknown, Succeeded],
        &[Pending, Failed, Pending, Unknown],
        &[Pending, Pending, Failed],
        &[Pending, Unknown, Unknown, Failed],
    ]
};

fn states_follow_every_transition(store: &dyn Store) {
    let ledger = store.open();
    for (n, path) in STATE_PATHS.iter().enumerate() {
        let ids = [format!("p{n}-precise"), format!("p{n}-blind")];
        let mut prior = Prior::Absent;
        for state in *path {
            for (id, p) in [(&ids[0], prior), (&ids[1], Prior::Unread)] {
                ledger.commit(LedgerWrite::new().attempt_over(attempt(id, 0, 0, *state), p), Durability::Buffered).unwrap();
            }
            prior = Prior::Was(*state);
            let mine = |found: Vec<AttemptRecord>| found.into_iter().filter(|a| ids.contains(&a.call_id)).count();
            for s in AttemptState::ALL {
                let expect = if s == *state { 2 } else { 0 };
                assert_eq!(mine(ledger.attempts_in_state(s).unwrap()), expect, "path {path:?} at {state:?}: in {s:?}");
            }
        }
    }
}

/// Episode `n` of call `executor`'s action (session `s`, refund, digest `d`).
fn episode(n: u64, executor: &str) -> EpisodeRecord {
    EpisodeRecord { opened_ms: 1, ..EpisodeRecord::open(&call("s", executor), n) }
}

fn episodes_open_once_hand_over_conditionally_and_close(store: &dyn Store) {
    let ledger = store.open();
    let latest = || ledger.episode("s", "refund", "d", None).unwrap();
    assert_eq!(latest(), None);
    ledger.commit(LedgerWrite::new().call(call("s", "c1")).episode(EpisodeOp::Open(episode(1, "c1"))), Durability::Buffered).unwrap();
    assert_eq!(latest(), Some(episode(1, "c1")));
    // Someone else opening the same episode (another host, a stale decision) is refused, whole.
    let err = ledger.commit(LedgerWrite::new().call(call("s", "c2")).episode(EpisodeOp::Open(episode(1, "c2"))), Durability::Buffered).unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(ledger.call("s", "c2").unwrap(), None, "nothing of the refused write applied");
    // Handing over needs the executor the writer saw.
    let stale = EpisodeOp::Hand { record: episode(1, "c3"), from: "c9".into() };
    assert!(ledger.commit(LedgerWrite::new().episode(stale), Durability::Buffered).unwrap_err().is_conflict());
    ledger.commit(LedgerWrite::new().episode(EpisodeOp::Hand { record: episode(1, "c3"), from: "c1".into() }), Durability::Buffered).unwrap();
    assert_eq!(latest().unwrap().executor, "c3");
    // Closing is idempotent and keeps the first time.
    for at in [50, 60] {
        ledger.commit(LedgerWrite::new().episode(EpisodeOp::Close { episode: episode(1, "c3").id(), at_ms: at }), Durability::Buffered).unwrap();
    }
    let closed = latest().unwrap();
    assert_eq!((closed.closed, closed.closed_ms, closed.executor.as_str()), (true, Some(50), "c3"));
    ledger.commit(LedgerWrite::new().episode(EpisodeOp::Open(episode(2, "c4"))), Durability::Buffered).unwrap();
    assert_eq!(latest().unwrap().episode, 2, "the latest episode of the action");
    assert_eq!(ledger.episode("s", "refund", "d", Some(1)).unwrap().unwrap().executor, "c3", "earlier ones stay readable");
    assert_eq!(ledger.episode("s", "refund", "other", None).unwrap(), None, "another action");
    assert_eq!(ledger.episode("other", "refund", "d", None).unwrap(), None, "another session");
}

/// What a caller was told and the close of its episode, written together
/// (the guard's report; one statement on PostgreSQL): both land, with the
/// episode's retire entry, and a repeat keeps the first close.
fn a_report_and_its_episodes_close_land_together(store: &dyn Store) {
    let ledger = store.open();
    let c1 = CallRecord { episode: Some(1), ..call("s", "c1") };
    ledger.commit(LedgerWrite::new().call(c1).episode(EpisodeOp::Open(episode(1, "c1"))), Durability::Synced).unwrap();
    let retiring = ledger.stats().unwrap().retiring;
    let report = |reported: Reported, at_ms: u64| {
        let close = EpisodeOp::Close { episode: episode(1, "c1").id(), at_ms };
        ledger.commit(LedgerWrite::new().reported("s", "c1", reported).episode(close), Durability::Buffered).unwrap();
        let closed = ledger.episode("s", "refund", "d", Some(1)).unwrap().unwrap();
        (ledger.call("s", "c1").unwrap().unwrap().reported, closed.closed, closed.closed_ms, ledger.stats().unwrap().retiring - retiring)
    };
    assert_eq!(report(Reported::Definitive, 70), (Reported::Definitive, true, Some(70), 1));
    assert_eq!(report(Reported::Unknown, 90), (Reported::Unknown, true, Some(70), 1), "closed once, at the first time");
}

fn what_the_caller_was_told_is_set_on_the_stored_call(store: &dyn Store) {
    let ledger = store.open();
    let mut done = call("s", "c1");
    done.state = CallState::Completed;
    done.outcome = Some(StoredOutcome::Result(serde_json::json!({ "id": "re_1" })));
    ledger.commit(LedgerWrite::new().call(done.clone()), Durability::Buffered).unwrap();
    ledger.commit(LedgerWrite::new().reported("s", "c1", Reported::Definitive).reported("s", "none", Reported::Unknown), Durability::Buffered).unwrap();
    assert_eq!(ledger.call("s", "c1").unwrap(), Some(CallRecord { reported: Reported::Definitive, ..done }), "only the field changed");
    assert_eq!(ledger.call("s", "none").unwrap(), None, "no record is created");
}

fn only_a_call_that_sent_nothing_can_be_superseded(store: &dyn Store) {
    let ledger = store.open();
    let supersede = |executor: &str| {
        let condition = Superseding { session: "s".into(), call_id: executor.into(), now_ms: 10 };
        let moved = CallRecord { superseded_by: Some("new".into()), ..call("s", executor) };
        ledger.commit(LedgerWrite::new().call(moved).superseding(condition), Durability::Buffered)
    };
    let mut not_sent = attempt("a", 0, 0, AttemptState::Failed);
    not_sent.last_error = Some("not sent: connection refused".into());
    let mut done = call("s", "done");
    done.state = CallState::Completed;
    done.outcome = Some(StoredOutcome::Result(serde_json::json!({})));
    let write = LedgerWrite::new().call(call("s", "none")).call(call("s", "a")).call(call("s", "p")).call(done);
    ledger
        .commit(write.attempt_over(not_sent, Prior::Absent).attempt_over(attempt("p", 0, 0, AttemptState::Pending), Prior::Absent), Durability::Buffered)
        .unwrap();
    supersede("none").expect("no attempt at all");
    supersede("a").expect("its only attempt never left");
    for refused in ["p", "done", "missing"] {
        assert!(supersede(refused).unwrap_err().is_conflict(), "{refused}");
        assert!(ledger.call("s", refused).unwrap().is_none_or(|c| c.superseded_by.is_none()), "{refused} untouched");
    }
    assert_eq!(ledger.call("s", "a").unwrap().unwrap().superseded_by.as_deref(), Some("new"));
}

fn the_secret_and_records_survive_a_reopen(store: &dyn Store) {
    let (secret, record) = {
        let ledger = store.open();
        let record = attempt("c1", 0, 0, AttemptState::Pending);
        ledger.commit(LedgerWrite::new().call(call("s", "c1")).attempt_over(record.clone(), Prior::Absent), Durability::Synced).unwrap();
        (ledger.secret().0, record)
    };
    let ledger = store.open();
    assert_eq!(ledger.secret().0, secret, "keys derive from the secret; it must never change");
    assert_ne!(secret, [0; 32]);
    assert_eq!(ledger.attempt(&record.key).unwrap(), Some(record));
    assert!(ledger.call("s", "c1").unwrap().is_some());
}

fn grant_history_keeps_changes_only(store: &dyn Store) {
    let ledger = store.open();
    let entry = |plugin: &str, digest: &str, at: u64| GrantRecord {
        plugin: plugin.into(),
        digest: digest.into(),
        grants: serde_json::json!([{ "downstream": "payments", "methods": ["POST"] }]),
        recorded_ms: at,
    };
    assert!(ledger.record_grants(&entry("payments", "d1", 10)).unwrap());
    assert!(!ledger.record_grants(&entry("payments", "d1", 20)).unwrap(), "unchanged: not recorded again");
    assert!(ledger.record_grants(&entry("text", "t1", 15)).unwrap());
    assert!(ledger.record_grants(&entry("payments", "d2", 30)).unwrap());
    let history: Vec<(String, u64)> = ledger.grant_history().unwrap().into_iter().map(|g| (g.digest, g.recorded_ms)).collect();
    assert_eq!(history, [("d1".to_string(), 10), ("t1".into(), 15), ("d2".into(), 30)]);
}

pub(super) fn claimed(call_id: &str, owner: &str, until: u64) -> CallRecord {
    CallRecord { owner: Some(owner.into()), lease_until_ms: Some(until), ..call("s", call_id) }
}

fn claims_tell_new_completed_and_conflicting_calls_apart(store: &dyn Store) {
    let ledger = store.open();
    assert!(matches!(ledger.claim_call(&claimed("c1", "host-a", 1_000), 0).unwrap(), Claim::Run { .. }));
    let mut done = call("s", "c1");
    done.state = CallState::Completed;
    done.outcome = Some(StoredOutcome::Result(serde_json::json!({ "id": "re_1" })));
    ledger.commit(LedgerWrite::new().call(done.clone()), Durability::Synced).unwrap();
    assert_eq!(ledger.claim_call(&claimed("c1", "host-b", 1_000), 0).unwrap(), Claim::Completed(done));
    let other = CallRecord { args_digest: "other".into(), ..claimed("c1", "host-b", 1_000) };
    assert!(matches!(ledger.claim_call(&other, 0).unwrap(), Claim::Conflict(_)));
}

fn writes_from_many_tasks_at_once_all_land(store: &dyn Store) {
    let ledger = store.open();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        let before = ledger.write_counts().0;
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let ledger = ledger.clone();
                tokio::spawn(async move { ledger.commit_async(LedgerWrite::new().call(call("t", &format!("c{i}"))), Durability::Synced).await })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        assert_eq!(ledger.read(|l| l.calls(Some("t"))).await.unwrap().len(), 32);
        assert_eq!(ledger.write_counts().0 - before, 32, "each write is counted once");
    });
}

macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod rocksdb {
            $(#[test]
            fn $test() {
                super::$test(&super::RocksStore(tempfile::tempdir().unwrap()));
            })*
        }
        mod postgres {
            $(#[test]
            fn $test() {
                super::$test(&super::PostgresStore::new());
            })*
        }
    };
}

on_both_backends!(
    calls_round_trip_and_group_by_session,
    attempts_are_found_by_key_step_call_and_state,
    a_new_generation_becomes_the_steps_current_attempt,
    states_follow_every_transition,
    episodes_open_once_hand_over_conditionally_and_close,
    what_the_caller_was_told_is_set_on_the_stored_call,
    a_report_and_its_episodes_close_land_together,
    only_a_call_that_sent_nothing_can_be_superseded,
    budgets_count_uses_in_their_window_and_refuse_the_one_too_many,
    limits_sum_uses_in_their_window_refuse_the_one_that_passes_and_take_back_a_release,
    a_call_whose_sends_never_took_effect_gives_back_what_it_spent,
    the_secret_and_records_survive_a_reopen,
    grant_history_keeps_changes_only,
    claims_tell_new_completed_and_conflicting_calls_apart,
    writes_from_many_tasks_at_once_all_land,
    a_pruning_pass_removes_old_final_units_and_leaves_tombstones,
    old_budget_uses_are_forgotten,
    limit_uses_are_forgotten_once_their_window_has_ended,
);
