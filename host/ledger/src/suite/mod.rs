//! The ledger's behaviour, run against both backends: RocksDB in a temporary
//! directory and PostgreSQL in a fresh database of the server named by
//! `TOOLGUARD_TEST_POSTGRES` (`./dev.sh test` starts a throwaway one).

mod retention;

use super::records::{PlannedSend, StoredBody, StoredRequest};
use super::*;
use retention::{a_pruning_pass_removes_old_final_units_and_leaves_tombstones, old_budget_uses_are_forgotten};

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

fn budgets_count_uses_in_their_window_and_refuse_the_one_too_many(store: &dyn Store) {
    let ledger = store.open();
    let charge = |scope: &str, at_ms: u64, call_id: &str| Charge {
        scope: scope.into(),
        max: 2,
        since_ms: at_ms.saturating_sub(100),
        at_ms,
        call_id: call_id.into(),
        what: format!("budget {scope}"),
    };
    let spend = |c: Charge| ledger.commit(LedgerWrite::new().call(call("s", &c.call_id)).charge(c), Durability::Buffered);
    spend(charge("a", 1_000, "c1")).unwrap();
    spend(charge("a", 1_050, "c2")).unwrap();
    let refused = spend(charge("a", 1_060, "c3")).unwrap_err();
    assert!(refused.is_refused() && refused.message().contains("budget a is spent"), "{refused}");
    assert_eq!(ledger.call("s", "c3").unwrap(), None, "nothing of a refused write applies");
    spend(charge("b", 1_060, "c4")).expect("another budget");
    // "a" = [1_000, 1_050]; at 1_120 the window starts at 1_020: one use left.
    spend(charge("a", 1_120, "c5")).expect("the oldest use left the window");
    assert!(spend(charge("a", 1_130, "c6")).unwrap_err().is_refused());
    // A scope that is a prefix of another is another budget.
    spend(charge("a-longer", 1_130, "c7")).unwrap();
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

fn claimed(call_id: &str, owner: &str, until: u64) -> CallRecord {
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
    the_secret_and_records_survive_a_reopen,
    grant_history_keeps_changes_only,
    claims_tell_new_completed_and_conflicting_calls_apart,
    writes_from_many_tasks_at_once_all_land,
    a_pruning_pass_removes_old_final_units_and_leaves_tombstones,
    old_budget_uses_are_forgotten,
);

/// Hosts starting together with the same plugin record its grants once: each
/// compares with the entry the one before it committed (before, each saw no
/// entry and all of them wrote one).
#[test]
fn hosts_starting_together_record_unchanged_grants_once() {
    let store = PostgresStore::new();
    let hosts: Vec<Ledger> = (0..6).map(|_| store.open()).collect();
    for round in 0..5u64 {
        let barrier = std::sync::Barrier::new(hosts.len());
        let recorded: usize = std::thread::scope(|scope| {
            let runs: Vec<_> = hosts
                .iter()
                .enumerate()
                .map(|(i, ledger)| {
                    let barrier = &barrier;
                    scope.spawn(move || {
                        let entry = GrantRecord {
                            plugin: "payments".into(),
                            digest: format!("d{round}"),
                            grants: serde_json::json!([{ "downstream": "payments", "methods": ["POST"] }]),
                            recorded_ms: 1_000 * round + i as u64,
                        };
                        barrier.wait();
                        ledger.record_grants(&entry).unwrap()
                    })
                })
                .collect();
            runs.into_iter().map(|r| usize::from(r.join().unwrap())).sum()
        });
        assert_eq!(recorded, 1, "round {round}: one host records the change, the others find it");
    }
    assert_eq!(hosts[0].grant_history().unwrap().len(), 5, "one entry per change");
}

/// A host keeps at most its pool's connections to the server, however many
/// of its threads use the ledger at once (a fleet shares the server's
/// `max_connections`): more wait their turn, and all of them are served.
#[test]
fn a_host_keeps_at_most_its_pools_connections() {
    let store = PostgresStore::new();
    let ledger = Ledger::connect_pooled(&store.0, 2).unwrap();
    std::thread::scope(|scope| {
        for t in 0..12 {
            let ledger = &ledger;
            scope.spawn(move || {
                for i in 0..20 {
                    ledger.commit(LedgerWrite::new().call(call("s", &format!("c{t}-{i}"))), Durability::Synced).unwrap();
                    assert!(ledger.call("s", &format!("c{t}-{i}")).unwrap().is_some());
                }
            });
        }
    });
    assert_eq!(ledger.calls(Some("s")).unwrap().len(), 240, "every write landed");
    let database = url::Url::parse(&store.0).unwrap().path().trim_start_matches('/').to_string();
    let admin = std::env::var("TOOLGUARD_TEST_POSTGRES").unwrap();
    let mut client = r2d2_postgres::postgres::Client::connect(&admin, r2d2_postgres::postgres::NoTls).unwrap();
    let open: i64 = client.query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&database]).unwrap().get(0);
    assert!((1..=2).contains(&open), "{open} connections open to the ledger's database");
}

/// A host's claim keeps other hosts out until it lapses or is released.
#[test]
fn a_live_claim_keeps_other_hosts_out_until_it_lapses() {
    let ledger = PostgresStore::new().open();
    assert!(ledger.shared());
    let run = |claim: Claim| matches!(claim, Claim::Run { persisted: true, .. });
    assert!(run(ledger.claim_call(&claimed("c1", "host-a", 1_000), 0).unwrap()), "inserted and held");
    match ledger.claim_call(&claimed("c1", "host-b", 5_000), 500).unwrap() {
        Claim::Busy(r) => assert!(r.leased_elsewhere("host-b", 500) && r.owner.as_deref() == Some("host-a")),
        other => panic!("host-b must wait while host-a's claim is live: {other:?}"),
    }
    assert!(run(ledger.claim_call(&claimed("c1", "host-a", 2_000), 900).unwrap()), "the owner may renew");
    assert!(run(ledger.claim_call(&claimed("c1", "host-b", 9_000), 2_001).unwrap()), "a lapsed claim is taken over");
    assert!(matches!(ledger.claim_call(&claimed("c1", "host-a", 9_000), 3_000).unwrap(), Claim::Busy(_)));
    ledger.release_call("s", "c1", "host-a").unwrap();
    assert!(matches!(ledger.claim_call(&claimed("c1", "host-a", 9_000), 3_000).unwrap(), Claim::Busy(_)), "only the owner releases");
    ledger.release_call("s", "c1", "host-b").unwrap();
    assert!(run(ledger.claim_call(&claimed("c1", "host-a", 9_000), 3_000).unwrap()), "released: free to claim");
}

/// On a shared ledger a call's write never replaces the record of another
/// action under the same tool-call id (another host admitted the id first
/// with other arguments): the whole write is refused as a conflict, and the
/// first record, its columns and its claim stay as they were. (On a host's
/// own ledger the call's lock keeps a second writer of one id out.)
#[test]
fn a_call_written_over_another_actions_record_of_the_same_id_is_refused() {
    let ledger = PostgresStore::new().open();
    let first = claimed("c1", "host-a", 1_000);
    assert!(matches!(ledger.claim_call(&first, 0).unwrap(), Claim::Run { .. }));
    let other = CallRecord { args_digest: "other".into(), ..call("s", "c1") };
    let episode = EpisodeRecord::open(&other, 1);
    let e = ledger.commit(LedgerWrite::new().call(other.clone()).episode(EpisodeOp::Open(episode)), Durability::Synced).unwrap_err();
    assert!(e.is_conflict(), "{e}");
    let stored = ledger.call("s", "c1").unwrap().unwrap();
    assert_eq!((stored.args_digest.as_str(), stored.owner.as_deref()), ("d", Some("host-a")), "the first record and its claim stay");
    assert!(ledger.episode("s", "refund", "other", Some(1)).unwrap().is_none(), "nothing of the refused write applied");
    // Its claim is the first action's: a claim of the other arguments is a conflict.
    assert!(matches!(
        ledger.claim_call(&CallRecord { owner: Some("host-b".into()), lease_until_ms: Some(9_000), ..other }, 5_000).unwrap(),
        Claim::Conflict(_)
    ));
    // The same action's writes still land.
    ledger.commit(LedgerWrite::new().call(CallRecord { owner: Some("host-a".into()), ..call("s", "c1") }), Durability::Buffered).unwrap();
}

/// A connection the server terminated is told apart from a failed
/// statement: a read that met it runs again on another connection and
/// succeeds, and so does a transaction that met it before its COMMIT; a
/// one-statement write that met it is `is_lost` (it may or may not have
/// landed), never a plain failure or a conflict.
#[test]
fn a_lost_connection_is_told_apart_and_a_read_or_uncommitted_transaction_survives_it() {
    let store = PostgresStore::new();
    let ledger = store.open();
    let terminate = || {
        let admin = std::env::var("TOOLGUARD_TEST_POSTGRES").unwrap();
        let db = url::Url::parse(&store.0).unwrap().path().trim_start_matches('/').to_string();
        let mut client = r2d2_postgres::postgres::Client::connect(&admin, r2d2_postgres::postgres::NoTls).unwrap();
        let sql = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()";
        let terminated = client.query(sql, &[&db]).unwrap().len();
        assert!(terminated > 0, "the ledger holds a connection");
        // The server closes them as it processes the terminations.
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    ledger.commit(LedgerWrite::new().call(call("s", "c1")), Durability::Synced).unwrap();
    terminate();
    assert!(ledger.call("s", "c1").unwrap().is_some(), "the read ran again on another connection");
    terminate();
    // Two statements, in a transaction that lost its connection before its COMMIT: nothing landed, so it ran again.
    let write = LedgerWrite::new().call(call("s", "c2")).attempt_over(attempt("c2", 0, 0, AttemptState::Pending), Prior::Absent);
    ledger.commit(write, Durability::Synced).unwrap();
    assert!(ledger.call("s", "c2").unwrap().is_some() && ledger.attempt_at("s", "c2", 0).unwrap().is_some(), "the transaction ran again whole");
    terminate();
    // One statement, committed on its own: it may have landed before the connection went.
    let e = ledger.commit(LedgerWrite::new().attempt_over(attempt("c2", 1, 0, AttemptState::Pending), Prior::Absent), Durability::Synced).unwrap_err();
    assert!(e.is_lost() && !e.is_conflict(), "{e}");
}

/// PostgreSQL's first look at a call (one statement) finds what the reads
/// one at a time find: the call with its claim, its tombstone once pruned,
/// and its episode — its own, the action's latest when there is no call,
/// none for a call outside episodes. (RocksDB reads one at a time: `None`.)
#[test]
fn the_first_look_finds_the_call_its_claim_its_tombstone_and_its_episode() {
    assert!(RocksStore(tempfile::tempdir().unwrap()).open().first_look("s", "c1", "refund", "d").unwrap().is_none());
    let ledger = PostgresStore::new().open();
    let old = CallRecord {
        state: CallState::Completed,
        outcome: Some(StoredOutcome::Result(serde_json::json!({ "id": "re_old" }))),
        completed_ms: Some(1_000),
        ..call("s", "old")
    };
    ledger.commit(LedgerWrite::new().call(old), Durability::Synced).unwrap();
    assert_eq!(ledger.prune(5_000, 10_000).unwrap().calls, 1, "the old call is pruned");
    let in_episode = |call_id: &str, n: u64| CallRecord { episode: Some(n), ..call("s", call_id) };
    ledger.commit(LedgerWrite::new().call(in_episode("c1", 1)).episode(EpisodeOp::Open(episode(1, "c1"))), Durability::Synced).unwrap();
    ledger.commit(LedgerWrite::new().episode(EpisodeOp::Close { episode: episode(1, "c1").id(), at_ms: 50 }), Durability::Synced).unwrap();
    ledger.commit(LedgerWrite::new().call(in_episode("c2", 2)).episode(EpisodeOp::Open(episode(2, "c2"))), Durability::Synced).unwrap();
    ledger.commit(LedgerWrite::new().call(call("s", "plain")), Durability::Synced).unwrap();
    assert!(matches!(ledger.claim_call(&claimed("plain", "host-a", 1_000), 1).unwrap(), Claim::Run { .. }));

    let look = |call_id: &str, digest: &str| ledger.first_look("s", call_id, "refund", digest).unwrap().expect("PostgreSQL looks in one statement");
    let number = |l: &FirstLook| l.episode.as_ref().map(|e| e.episode);
    let new = look("new", "d");
    assert_eq!((number(&new), new.call, new.expired), (Some(2), None, None), "a new call: the action's latest episode");
    let c1 = look("c1", "d");
    assert_eq!((c1.call, c1.expired), (ledger.call("s", "c1").unwrap(), None));
    assert_eq!(c1.episode, ledger.episode("s", "refund", "d", Some(1)).unwrap(), "its own episode, closed, not the latest");
    assert!(c1.episode.is_some_and(|e| e.closed));
    assert_eq!(number(&look("c2", "d")), Some(2));
    let plain = look("plain", "d");
    assert_eq!(plain.call.as_ref().and_then(|c| c.owner.as_deref()), Some("host-a"), "the claim's columns");
    assert_eq!((plain.call, plain.episode), (ledger.call("s", "plain").unwrap(), None), "a call outside episodes names none");
    let pruned = look("old", "d");
    assert_eq!((pruned.call, pruned.expired), (None, Some(10_000)));
    assert_eq!(look("c1", "other").expired, None, "a tombstone is only told when there is no call");
    assert_eq!(number(&look("new", "other")), None, "another action has no episodes");
    let done = CallRecord { state: CallState::Completed, outcome: Some(StoredOutcome::Result(serde_json::json!({}))), ..in_episode("c2", 2) };
    ledger.commit(LedgerWrite::new().call(done.clone()), Durability::Synced).unwrap();
    let replayed = look("c2", "d");
    assert_eq!((replayed.call, replayed.episode), (Some(done), None), "a completed call is read alone");
}

/// A pooled connection that the server dropped while it sat idle (a
/// restart, an idle timeout, an operator's `pg_terminate_backend`) is
/// checked and replaced when next handed out: no read fails for it.
#[test]
fn a_connection_dropped_while_idle_is_replaced_before_use() {
    let store = PostgresStore::new();
    let ledger = store.open();
    ledger.commit(LedgerWrite::new().call(call("s", "c1")), Durability::Synced).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    let mut admin = r2d2_postgres::postgres::Client::connect(&store.0, r2d2_postgres::postgres::NoTls).unwrap();
    let sql = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()";
    let dropped: i64 = admin.query_one(sql, &[]).unwrap().get(0);
    assert!(dropped >= 1, "the ledger's pool held a connection to drop");
    for _ in 0..5 {
        assert_eq!(ledger.call("s", "c1").unwrap().map(|c| c.call_id).as_deref(), Some("c1"));
    }
}

/// A call another host runs now (a live claim) cannot be superseded; once
/// superseded, no host can claim it to run.
#[test]
fn a_claimed_call_cannot_be_superseded_nor_a_superseded_one_claimed() {
    let ledger = PostgresStore::new().open();
    assert!(matches!(ledger.claim_call(&claimed("c1", "host-a", 1_000), 0).unwrap(), Claim::Run { .. }));
    let supersede = |now_ms: u64| {
        let moved = CallRecord { superseded_by: Some("c2".into()), ..call("s", "c1") };
        let condition = Superseding { session: "s".into(), call_id: "c1".into(), now_ms };
        ledger.commit(LedgerWrite::new().call(moved).superseding(condition), Durability::Buffered)
    };
    assert!(supersede(500).unwrap_err().is_conflict(), "host-a's claim is live");
    supersede(1_500).expect("the claim lapsed");
    assert!(matches!(ledger.claim_call(&claimed("c1", "host-b", 9_000), 2_000).unwrap(), Claim::Superseded(_)));
}

/// A new attempt another host already recorded is refused, whole.
#[test]
fn a_new_attempt_another_host_recorded_first_is_refused() {
    let ledger = PostgresStore::new().open();
    let first = attempt("c1", 0, 0, AttemptState::Pending);
    ledger.commit(LedgerWrite::new().attempt_over(first.clone(), Prior::Absent), Durability::Synced).unwrap();
    let mut again = first.clone();
    again.tries = 7;
    let write = LedgerWrite::new().call(call("s", "c9")).attempt_over(again, Prior::Absent);
    let err = ledger.commit(write, Durability::Synced).unwrap_err();
    assert!(err.to_string().contains("already recorded by another host"), "{err}");
    assert_eq!(ledger.attempt(&first.key).unwrap(), Some(first), "the first record stands");
    assert_eq!(ledger.call("s", "c9").unwrap(), None, "nothing of the refused write applied");
}

/// Hosts claiming one call at the same moment: exactly one runs it.
#[test]
fn of_hosts_claiming_at_once_exactly_one_runs_the_call() {
    let store = std::sync::Arc::new(PostgresStore::new());
    let ledger = store.open();
    let winners = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let ledger = ledger.clone();
                scope.spawn(move || matches!(ledger.claim_call(&claimed("c1", &format!("host-{i}"), 10_000), 0).unwrap(), Claim::Run { .. }))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).filter(|won| *won).count()
    });
    assert_eq!(winners, 1);
}

/// Hosts starting together create the schema once and agree on one secret.
#[test]
fn hosts_connecting_at_once_agree_on_one_secret() {
    let store = std::sync::Arc::new(PostgresStore::new());
    let secrets: Vec<[u8; 32]> = (0..4)
        .map(|_| {
            let store = store.clone();
            std::thread::spawn(move || store.open().secret().0)
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .collect();
    assert!(secrets.windows(2).all(|w| w[0] == w[1]), "every host derives keys from the same secret");
}
