//! A fleet upgraded under running hosts: once a newer toolguard migrates the
//! shared ledger to a schema this build does not know, a host that has not
//! been upgraded admits nothing (it answers `transport`: nothing was run)
//! and takes nothing over, until the ledger is its schema again. Counted at
//! the sandbox. (The migration is simulated: the schema row is set to a
//! version no build knows, as a newer host's migration would set it.)

use crate::common::Mcp;
use crate::fleet::{fleet, posts, processes};
use crate::payments::{Downstream, PI};
use std::time::{Duration, Instant};
use toolguard::{CallRequest, ErrorKind};

/// Runs `f` on a connection to the ledger at `url`.
fn on_ledger<T: Send + 'static>(url: &str, f: impl FnOnce(&mut r2d2_postgres::postgres::Client) -> T + Send + 'static) -> T {
    let url = url.to_string();
    // rust-postgres's blocking client runs its own runtime: not on a test runtime's threads.
    std::thread::spawn(move || f(&mut r2d2_postgres::postgres::Client::connect(&url, r2d2_postgres::postgres::NoTls).unwrap())).join().unwrap()
}

/// Sets the ledger at `url`'s schema version to `version`.
fn set_schema(url: &str, version: &str) {
    let version = version.to_string();
    let sql = "UPDATE toolguard_meta SET value = $1 WHERE name = 'schema'";
    assert_eq!(on_ledger(url, move |c| c.execute(sql, &[&version.as_bytes()]).unwrap()), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outdated_host_refuses_to_open_a_ledger_a_newer_toolguard_migrated_and_changes_nothing_in_it() {
    let f = fleet(Downstream::default()).await;
    f.refund(0, "c1", 500).await.unwrap();
    // The newer toolguard's migration: its version, and a table of this
    // build's schema gone (one its schema replaced).
    set_schema(&f.ledger, "99");
    on_ledger(&f.ledger, |c| c.batch_execute("DROP TABLE toolguard_expired").unwrap());
    let url = f.ledger.clone();
    let refused = std::thread::spawn(move || toolguard::ledger::Ledger::connect(&url).map(|_| ())).join().unwrap();
    let err = refused.expect_err("an outdated host cannot open the ledger");
    assert!(err.to_string().contains("schema 99") && err.to_string().contains("matching toolguard"), "says why and what to do: {err}");
    let tables = "SELECT count(*) FROM pg_tables WHERE tablename = 'toolguard_expired'";
    let left: i64 = on_ledger(&f.ledger, move |c| c.query_one(tables, &[]).unwrap().get(0));
    assert_eq!(left, 0, "the outdated host put none of its own schema back into the newer one");
    let version = on_ledger(&f.ledger, |c| c.query_one("SELECT value FROM toolguard_meta WHERE name = 'schema'", &[]).unwrap().get::<_, Vec<u8>>(0));
    assert_eq!(version, b"99", "nor its version");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_ledger_a_newer_toolguard_migrated_admits_no_recorded_call_until_the_schema_is_its_own() {
    let f = fleet(Downstream::default()).await;
    f.refund(0, "c1", 500).await.unwrap();
    set_schema(&f.ledger, "99");
    // Its next recovery pass (serve runs one every 2 s) reads the schema.
    let report = f.hosts[0].takeover_pass().await.unwrap();
    assert_eq!(report.examined, 0, "an outdated host takes nothing over");
    let refused = f.refund(0, "c2", 300).await.expect_err("an outdated host admits no call");
    assert_eq!(refused.kind, ErrorKind::Transport, "{refused}");
    assert!(refused.message.contains("schema 99") && refused.message.contains("upgraded host"), "says why and what to do: {refused}");
    let replay = f.refund(0, "c1", 500).await.expect_err("nor replays one: it would read records under rules it does not know");
    assert_eq!(replay.kind, ErrorKind::Transport, "{replay}");
    assert_eq!(f.sandbox.refunds().len(), 1, "nothing was sent for the refused calls");
    assert_eq!(posts(&f.sandbox).len(), 1);
    // A read-only tool, which the ledger never records, still runs.
    let status = CallRequest {
        session: "s1".into(),
        call_id: "st1".into(),
        tool: "refund_status".into(),
        args_json: format!(r#"{{"payment_intent":"{PI}"}}"#),
        principal: None,
        tenant: None,
    };
    let out = f.hosts[0].call(&status).await.expect("read-only calls still run");
    assert!(out.value.to_string().contains("re_"), "it lists the one refund: {}", out.value);
    // The ledger is this build's schema again (the upgrade was rolled back).
    set_schema(&f.ledger, toolguard::ledger::Ledger::schema());
    f.hosts[0].takeover_pass().await.unwrap();
    let out = f.refund(0, "c2", 300).await.expect("the host serves again");
    assert!(!out.replayed);
    assert_eq!(f.sandbox.refunds().len(), 2, "c2 ran once, when the host served again");
}

#[test]
fn a_serving_host_stops_admitting_within_its_passes_once_a_newer_toolguard_migrates_the_ledger() {
    let p = processes(Downstream::default());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let a = rt.block_on(Mcp::connect(&p.servers[0].url));
    set_schema(&p.ledger, "99");
    // Each refund is new (its own id and amount): until the host's pass
    // reads the schema it runs; from then on it is refused, nothing sent.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut ran, mut refused) = (0, 0);
    for n in 0u64.. {
        let out = rt.block_on(a.refund(&format!("r{n}"), 1 + n)).unwrap();
        match out["structuredContent"]["kind"].as_str() {
            None if refused == 0 => ran += 1,
            Some("transport") => {
                assert!(out.to_string().contains("upgraded host"), "{out}");
                refused += 1;
            }
            _ => panic!("call {n} after {refused} refusals: {out}"),
        }
        if refused == 5 {
            break;
        }
        assert!(Instant::now() < deadline, "the host never noticed the newer schema ({ran} calls ran)");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(p.sandbox.refunds().len(), ran, "only the calls admitted before the pass refunded; the refused ones sent nothing");
    assert_eq!(posts(&p.sandbox).len(), ran);
}
