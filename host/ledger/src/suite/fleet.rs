//! Several hosts sharing one PostgreSQL ledger: grants recorded once,
//! connection pools, claims and their leases, lost connections, conditional
//! writes between hosts, and the secret they agree on.

use super::*;

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

/// A row another program wrote over (its record not toolguard's JSON) is
/// refused by what it holds, with the operator's move, and left as it is.
#[test]
fn a_record_that_is_not_json_is_refused_by_what_it_holds_and_left_as_it_is() {
    let store = PostgresStore::new();
    let ledger = store.open();
    ledger.commit(LedgerWrite::new().call(call("s", "c1")), Durability::Synced).unwrap();
    let mut client = r2d2_postgres::postgres::Client::connect(&store.0, r2d2_postgres::postgres::NoTls).unwrap();
    client.batch_execute("UPDATE toolguard_calls SET record = 'written by another program' WHERE call_id = 'c1'").unwrap();
    let e = ledger.call("s", "c1").expect_err("a damaged record is an error, not a panic");
    let message = e.to_string();
    assert!(message.contains("damaged record") && message.contains("written by another program") && message.contains("restore it"), "{message}");
    let kept: String = client.query_one("SELECT record FROM toolguard_calls WHERE call_id = 'c1'", &[]).unwrap().get(0);
    assert_eq!(kept, "written by another program", "left as it is");
}

/// Two hosts spending from one limit at once, 32 calls each, at its edge:
/// the sum admitted never passes it, exactly — the scope's row serialises
/// them across hosts.
#[test]
fn two_hosts_racing_to_a_limits_edge_never_pass_it() {
    let store = PostgresStore::new();
    let hosts: Vec<Ledger> = (0..2).map(|_| store.open()).collect();
    let barrier = std::sync::Barrier::new(64);
    let admitted: Vec<u64> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..64u64)
            .map(|i| {
                let (ledger, barrier) = (&hosts[(i % 2) as usize], &barrier);
                scope.spawn(move || {
                    // 700 + i: 64 of them sum to 46,816, far past 10,000.
                    let amount = 700 + i;
                    let s = super::limits::spend_of("refunds/t1", 10_000, 1_000, &format!("c{i}"), amount);
                    barrier.wait();
                    match ledger.commit(LedgerWrite::new().call(call("s", &format!("c{i}"))).spend(s), Durability::Synced) {
                        Ok(()) => amount,
                        Err(e) if e.is_over_limit() => 0,
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let sum: u64 = admitted.iter().sum();
    let n = admitted.iter().filter(|a| **a > 0).count();
    assert!(sum <= 10_000, "admitted {sum} across two hosts, past the limit of 10,000");
    assert!(n >= 13, "the limit was filled, not refused wholesale: {n} calls, {sum}");
    assert_eq!(hosts[0].calls(Some("s")).unwrap().len(), n, "each admitted call's record landed with its use, and no refused one");
}

/// A shared ledger whose limits' uses were written before their running
/// totals were kept (the totals' rows gone): the first spend of a window
/// sums the window's uses into its row, and a release takes its use off.
#[test]
fn limits_uses_written_before_running_totals_are_summed_by_the_first_spend() {
    let store = PostgresStore::new();
    let ledger = store.open();
    let spend = |call_id: &str, amount: u64| {
        let s = Spend { at_ms: 10, ..super::limits::spend_of("t1", 5_000, 0, call_id, amount) };
        LedgerWrite::new().call(call("s", call_id)).spend(s)
    };
    ledger.commit(spend("c1", 3_000), Durability::Synced).unwrap();
    ledger.commit(spend("c2", 1_500), Durability::Synced).unwrap();
    let mut client = r2d2_postgres::postgres::Client::connect(&store.0, r2d2_postgres::postgres::NoTls).unwrap();
    client.batch_execute("DELETE FROM toolguard_spend_totals").unwrap();
    let refused = ledger.commit(spend("c3", 600), Durability::Synced).unwrap_err();
    assert!(refused.is_over_limit() && refused.message().contains("4500 of 5000"), "{refused}");
    ledger.commit(spend("c4", 500), Durability::Synced).expect("to the edge exactly");
    let release = Release { scope: "t1".into(), at_ms: 10, call_id: "c1".into() };
    ledger.commit(LedgerWrite::new().release(release.clone()), Durability::Synced).unwrap();
    ledger.commit(LedgerWrite::new().release(release), Durability::Synced).unwrap();
    ledger.commit(spend("c5", 3_000), Durability::Synced).expect("c1's 3,000 given back, once");
    assert!(ledger.commit(spend("c6", 1), Durability::Synced).unwrap_err().is_over_limit(), "a second release of c1 gave nothing more");
}
