//! Fleet mode in one process: two hosts (two runtimes, each with its own
//! data directory and caches) share one PostgreSQL ledger and one payments
//! sandbox. Every test counts refunds at the sandbox.

use crate::common::{Mcp, fresh_postgres_database};
use crate::payments::{Downstream, HEADER_ONLY, PI, config_text, refund_args};
use std::sync::Arc;
use std::time::Duration;
use toolguard::{CallError, CallOutput, CallRequest, Config, ErrorKind, Runtime};
use toolguard_sandbox::{Fault, Mode, Sandbox};

pub(crate) struct Fleet {
    pub sandbox: Sandbox,
    pub hosts: Vec<Arc<Runtime>>,
    /// The shared ledger's URL.
    pub ledger: String,
    _dirs: Vec<tempfile::TempDir>,
}

/// Two hosts started together over one fresh PostgreSQL ledger.
pub(crate) async fn fleet(d: Downstream) -> Fleet {
    fleet_of(2, d).await
}

/// `n` hosts started together over one fresh PostgreSQL ledger.
async fn fleet_of(n: usize, d: Downstream) -> Fleet {
    let sandbox = Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.add_payment_intent(PI, crate::payments::PI_AMOUNT);
    let ledger = fresh_postgres_database();
    let dirs: Vec<tempfile::TempDir> = (0..n).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut hosts = Vec::new();
    for dir in &dirs {
        let text = format!("ledger = {ledger:?}\n{}", config_text(&sandbox.url(), &dir.path().join("data"), &d));
        let config = Config::parse(&text, "fleet.toml", dir.path()).unwrap();
        hosts.push(Arc::new(Runtime::from_config(&config).await.unwrap()));
    }
    Fleet { sandbox, hosts, ledger, _dirs: dirs }
}

impl Fleet {
    pub async fn refund(&self, host: usize, call_id: &str, amount: u64) -> Result<CallOutput, CallError> {
        refund_on(&self.hosts[host], call_id, amount).await
    }
}

async fn refund_on(host: &Runtime, call_id: &str, amount: u64) -> Result<CallOutput, CallError> {
    let req =
        CallRequest { session: "s1".into(), call_id: call_id.into(), tool: "refund".into(), args_json: refund_args(amount), principal: None, tenant: None };
    host.call(&req).await
}

/// The key goes in a header the provider ignores: it would refund every
/// request, so only the hosts' claims keep a duplicate from becoming a second refund.
const NO_KEY: &str = r#"[{ transport = "header", name = "X-Ignored-Key" }]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_completed_on_one_host_is_replayed_by_another() {
    let f = fleet(Downstream::default()).await;
    let first = f.refund(0, "c1", 500).await.unwrap();
    assert!(!first.replayed);
    let again = f.refund(1, "c1", 500).await.expect("the other host finds the completed call in the shared ledger");
    assert!(again.replayed, "replayed from the ledger, no plugin run");
    assert_eq!(again.value, first.value);
    let err = f.refund(1, "c1", 700).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Conflict, "{err}");
    assert_eq!(f.sandbox.refunds().len(), 1);
    f.refund(1, "c2", 700).await.expect("a new tool call id is a new refund");
    assert_eq!(f.sandbox.refunds().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_outcome_on_one_host_holds_a_blind_repeat_on_the_other() {
    let f = fleet(Downstream { key: HEADER_ONLY, ..Downstream::default() }).await;
    f.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let err = f.refund(0, "c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::OutcomeUnknown, "{err}");
    let held = f.refund(1, "c2", 500).await.unwrap_err();
    assert_eq!(held.kind, ErrorKind::Held, "the other host sees the unknown attempt: {held}");
    assert_eq!(f.sandbox.refunds().len(), 1);
    // Retrying the first tool call on the other host re-sends the same key.
    let out = f.refund(1, "c1", 500).await.expect("the same key settles it");
    let refunds = f.sandbox.refunds();
    assert_eq!(refunds.len(), 1, "still one refund");
    assert_eq!(out.value["refund_id"], refunds[0].id.as_str());
    let posts: Vec<_> = f.sandbox.requests().into_iter().filter(|r| r.method == "POST").collect();
    assert!(posts.windows(2).all(|w| w[0].idempotency_key == w[1].idempotency_key), "one key across both hosts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tool_call_sent_to_both_hosts_at_once_runs_once() {
    let f = fleet(Downstream { key: NO_KEY, ..Downstream::default() }).await;
    f.sandbox.inject(Fault::DelayBeforeCommit { ms: 500 });
    let (a, b) = (f.hosts[0].clone(), f.hosts[1].clone());
    let first = tokio::spawn(async move { refund_on(&a, "c1", 500).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = tokio::spawn(async move { refund_on(&b, "c1", 500).await });
    let (first, second) = (first.await.unwrap().unwrap(), second.await.unwrap().unwrap());
    assert_eq!(f.sandbox.refunds().len(), 1, "the provider would have refunded twice: only one host sent");
    assert!(!first.replayed && second.replayed, "the second host waited for the first and replayed its outcome");
    assert_eq!(first.value, second.value);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_hosts_call_is_taken_over_once_its_claim_lapses_with_the_same_key() {
    let f = fleet(Downstream { wall_ms: 1_500, ..Downstream::default() }).await;
    f.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    // Host A sends, the provider commits, and A dies before the answer.
    let a = f.hosts[0].clone();
    let run = tokio::spawn(async move { refund_on(&a, "c1", 500).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    run.abort();
    assert_eq!(f.sandbox.refunds().len(), 1);
    let b = &f.hosts[1];
    let early = b.recover().await.unwrap();
    assert_eq!((early.running_elsewhere.len(), early.settled.len()), (1, 0), "A's claim is live: B leaves it alone");
    tokio::time::sleep(Duration::from_millis(3_600)).await; // wall_ms + the lease margin
    let report = b.recover().await.unwrap();
    assert_eq!(report.settled.len(), 1, "B took the call over and settled it: {report:?}");
    let posts: Vec<_> = f.sandbox.requests().into_iter().filter(|r| r.method == "POST").collect();
    assert_eq!(posts.len(), 2, "A's send and B's re-send");
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "B re-sent A's key; it minted none");
    assert_eq!(f.sandbox.refunds().len(), 1, "still one refund");
    let out = f.refund(1, "c1", 500).await.expect("the tool call completes on B from the settled attempt");
    assert_eq!(out.value["refund_id"], f.sandbox.refunds()[0].id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_no_pass_can_settle_is_tried_less_often_as_it_ages_by_the_whole_fleet() {
    use toolguard::ledger::{AttemptState, Durability, LedgerWrite, records::now_ms};
    // A stored 500 the provider never committed: every re-send gets it back and
    // the listing finds no refund, so no pass settles it within the key's retention.
    let f = fleet(Downstream::default()).await;
    f.sandbox.inject(Fault::Stored500 { should_retry: None });
    assert_eq!(f.refund(0, "c1", 500).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let sent = |method: &str| f.sandbox.requests().into_iter().filter(|r| r.method == method).count();
    let (posts, lookups) = (sent("POST"), sent("GET"));
    assert_eq!(posts, 1);
    // Host A tried it a moment ago: host B's takeover pass leaves it for later.
    let pass = f.hosts[1].takeover_pass().await.unwrap();
    assert_eq!((pass.examined, pass.not_due.len(), pass.unresolved.len()), (1, 1, 0), "{pass:?}");
    assert_eq!((sent("POST"), sent("GET")), (posts, lookups), "nothing re-sent, nothing looked up");
    // A start-up or `toolguard recover` tries every attempt at once.
    let now = f.hosts[1].recover().await.unwrap();
    assert_eq!((now.unresolved.len(), now.not_due.len()), (1, 0), "{now:?}");
    assert_eq!(sent("POST"), posts + 1, "re-sent with its key");

    // Two hours old: a pass waits five minutes after the last try, by whichever host.
    let ledger = f.hosts[0].guard().unwrap().ledger().clone();
    let age = |last_try_ago_ms: u64| {
        let mut attempt = ledger.attempts_of_call("s1", "c1").unwrap().remove(0);
        assert_eq!(attempt.state, AttemptState::Unknown);
        attempt.created_ms = now_ms() - 2 * 3_600_000;
        attempt.updated_ms = now_ms() - last_try_ago_ms;
        ledger.commit(LedgerWrite::new().attempt(attempt), Durability::Synced).unwrap();
    };
    assert_eq!(toolguard::guard::pause_ms(2 * 3_600_000), 300_000);
    age(240_000);
    for host in &f.hosts {
        let pass = host.takeover_pass().await.unwrap();
        assert_eq!(pass.not_due.len(), 1, "tried four minutes ago: {pass:?}");
    }
    assert_eq!(sent("POST"), posts + 1);
    age(360_000);
    let pass = f.hosts[1].takeover_pass().await.unwrap();
    assert_eq!((pass.not_due.len(), pass.unresolved.len()), (0, 1), "tried six minutes ago: due, and still unknown: {pass:?}");
    assert_eq!(sent("POST"), posts + 2, "re-sent once more");
    let pass = f.hosts[0].takeover_pass().await.unwrap();
    assert_eq!(pass.not_due.len(), 1, "host B's try counts for host A too: {pass:?}");
    assert_eq!(sent("POST"), posts + 2);

    let all: Vec<_> = f.sandbox.requests().into_iter().filter(|r| r.method == "POST").collect();
    assert!(all.iter().all(|p| p.idempotency_key == all[0].idempotency_key), "one key throughout");
    assert_eq!(f.sandbox.refunds().len(), 0, "the provider never committed it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_calls_under_new_ids_on_two_hosts_at_once_refund_once() {
    // The provider refunds every request it gets: only the hosts' episodes stand between
    // two identical calls made at the same moment and two refunds.
    let f = fleet(Downstream { key: NO_KEY, reconcile_ms: 3_000, ..Downstream::default() }).await;
    for round in 0..5u64 {
        let amount = 500 + round;
        f.sandbox.inject(Fault::DelayBeforeCommit { ms: 200 });
        let (a, b) = (f.hosts[0].clone(), f.hosts[1].clone());
        let (first, second) = tokio::join!(
            tokio::spawn(async move { refund_on(&a, &format!("a{round}"), amount).await }),
            tokio::spawn(async move { refund_on(&b, &format!("b{round}"), amount).await }),
        );
        let answers = [first.unwrap(), second.unwrap()];
        let refunds = f.sandbox.refunds().iter().filter(|r| r.amount == amount).count();
        assert_eq!(refunds, 1, "round {round}: {answers:?}");
        let ran: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        let held: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        assert_eq!((ran.len(), held.len()), (1, 1), "round {round}: one ran, one was held: {answers:?}");
        assert_eq!(held[0].kind, ErrorKind::Held);
        assert_eq!(held[0].detail.as_ref().unwrap()["earlier_outcome"]["result"], ran[0].value, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hosts_given_one_action_at_once_make_one_refund() {
    // The provider refunds every request it gets. Each round the model's
    // action lands on all three hosts at once: under three new tool-call ids
    // (two are held with the one refund), then under one id (two replay it).
    let f = fleet_of(3, Downstream { key: NO_KEY, reconcile_ms: 3_000, ..Downstream::default() }).await;
    for round in 0..5u64 {
        for same_id in [false, true] {
            let amount = 600 + 2 * round + u64::from(same_id);
            f.sandbox.inject(Fault::DelayBeforeCommit { ms: 200 });
            let runs: Vec<_> = f
                .hosts
                .iter()
                .enumerate()
                .map(|(i, host)| {
                    let (host, id) = (host.clone(), if same_id { format!("s{round}") } else { format!("n{round}-{i}") });
                    tokio::spawn(async move { refund_on(&host, &id, amount).await })
                })
                .collect();
            let mut answers = Vec::new();
            for run in runs {
                answers.push(run.await.unwrap());
            }
            let refunds: Vec<String> = f.sandbox.refunds().iter().filter(|r| r.amount == amount).map(|r| r.id.clone()).collect();
            assert_eq!(refunds.len(), 1, "round {round}, same id {same_id}: {answers:?}");
            for answer in &answers {
                let refund_id = match answer {
                    Ok(out) => out.value["refund_id"].clone(),
                    Err(e) if !same_id && e.kind == ErrorKind::Held => e.detail.as_ref().unwrap()["earlier_outcome"]["result"]["refund_id"].clone(),
                    Err(e) => panic!("round {round}, same id {same_id}: {e}"),
                };
                assert_eq!(refund_id, refunds[0].as_str(), "every host answers with the one refund: {answers:?}");
            }
        }
    }
}

// --- Two `toolguard serve --http` processes over one PostgreSQL ledger ---

/// A sandbox, a fresh PostgreSQL ledger and two `serve --http` processes sharing it.
pub(crate) struct Processes {
    _rt: tokio::runtime::Runtime,
    pub sandbox: Sandbox,
    pub servers: Vec<crate::common::Server>,
    /// The shared ledger's URL.
    pub ledger: String,
    _dir: tempfile::TempDir,
}

impl Processes {
    /// Host `i`'s config file.
    pub fn config(&self, i: usize) -> std::path::PathBuf {
        self._dir.path().join(format!("host{i}.toml"))
    }
}

pub(crate) fn processes(d: Downstream) -> Processes {
    processes_with(d, [&[], &[]])
}

/// [`processes`], each host started with its own extra environment.
fn processes_with(d: Downstream, env: [&[(&str, &str)]; 2]) -> Processes {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(PI, crate::payments::PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let ledger = fresh_postgres_database();
    let configs = host_configs(&sandbox.url(), &ledger, dir.path(), &d);
    let servers = configs.iter().zip(env).map(|(c, env)| crate::common::serve_http(c, env)).collect();
    Processes { _rt: rt, sandbox, servers, ledger, _dir: dir }
}

/// The config files of two hosts sharing the PostgreSQL ledger at `ledger`
/// and the sandbox at `sandbox_url`, each with its own data directory, in `dir`.
pub fn host_configs(sandbox_url: &str, ledger: &str, dir: &std::path::Path, d: &Downstream) -> [std::path::PathBuf; 2] {
    [0, 1].map(|i| {
        let text = format!("ledger = {ledger:?}\n{}", config_text(sandbox_url, &dir.join(format!("host{i}")), d));
        let path = dir.join(format!("host{i}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    })
}

pub(crate) fn posts(sandbox: &Sandbox) -> Vec<toolguard_sandbox::Observed> {
    sandbox.requests().into_iter().filter(|r| r.method == "POST").collect()
}

/// Refund `c1` through host A and, `lag` later, the same tool call through
/// host B: both MCP results.
fn same_call_on_both(p: &Processes, lag: Duration) -> (serde_json::Value, serde_json::Value) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (a, b) = rt.block_on(async {
        let (a, b) = (Mcp::connect(&p.servers[0].url).await, Mcp::connect(&p.servers[1].url).await);
        let first = async { a.refund("c1", 500).await };
        let second = async {
            tokio::time::sleep(lag).await;
            b.refund("c1", 500).await
        };
        tokio::join!(first, second)
    });
    (a.unwrap(), b.unwrap())
}

#[test]
fn two_serving_processes_given_the_same_tool_call_at_once_refund_once() {
    let p = processes(Downstream { key: NO_KEY, ..Downstream::default() });
    p.sandbox.inject(Fault::DelayBeforeCommit { ms: 500 });
    let (a, b) = same_call_on_both(&p, Duration::from_millis(100));
    assert_eq!(a["isError"], false, "{a}");
    assert_eq!(a["structuredContent"], b["structuredContent"], "both hosts answer with the one refund");
    assert_eq!(p.sandbox.refunds().len(), 1, "the provider refunds every request it gets: only one host sent");
    assert_eq!(posts(&p.sandbox).len(), 1);
}

#[test]
fn a_host_whose_clock_runs_two_minutes_ahead_does_not_take_over_a_live_call() {
    // Host B's clock is two minutes fast. Judged on its own clock, A's claim
    // (A's time + wall clock + 2 s) has long lapsed, so B would take the call
    // over while A's request is still at the provider and re-send it; the
    // provider ignores keys and would refund twice. Both read the ledger's
    // clock, PostgreSQL's, so B waits for A and replays its outcome.
    let skewed: &[(&str, &str)] = &[("TOOLGUARD_CLOCK_SKEW_MS", "120000")];
    let p = processes_with(Downstream { key: NO_KEY, ..Downstream::default() }, [&[], skewed]);
    p.sandbox.inject(Fault::DelayBeforeCommit { ms: 700 });
    let (a, b) = same_call_on_both(&p, Duration::from_millis(200));
    assert_eq!(a["isError"], false, "{a}");
    assert_eq!(b["isError"], false, "{b}");
    assert_eq!(p.sandbox.refunds().len(), 1, "only A sent: B's fast clock did not lapse A's claim");
    assert_eq!(posts(&p.sandbox).len(), 1);
    assert_eq!(a["structuredContent"], b["structuredContent"], "B replays A's refund");
}

#[test]
fn a_process_killed_mid_call_is_taken_over_by_the_other_with_the_same_key() {
    let mut p = processes(Downstream { wall_ms: 1_500, ..Downstream::default() });
    p.sandbox.inject(Fault::DelayAfterCommit { ms: 3_000 });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (a, b) = rt.block_on(async { (Mcp::connect(&p.servers[0].url).await, Mcp::connect(&p.servers[1].url).await) });
    // Host A sends; the provider commits; A is SIGKILLed before the answer.
    let pending = rt.spawn(async move { a.refund("c1", 500).await });
    std::thread::sleep(Duration::from_millis(500));
    p.servers[0].child.kill().unwrap();
    p.servers[0].child.wait().unwrap();
    assert!(rt.block_on(pending).unwrap().is_err(), "A died mid-call");
    assert_eq!(p.sandbox.refunds().len(), 1);
    // The model retries through the load balancer, which now reaches B: B
    // waits out A's claim (or finds the attempt its takeover pass settled).
    let out = rt.block_on(b.refund("c1", 500)).unwrap();
    assert_eq!(out["isError"], false, "{out}");
    let refunds = p.sandbox.refunds();
    assert_eq!(refunds.len(), 1, "still one refund");
    assert_eq!(out["structuredContent"]["refund_id"], refunds[0].id.as_str(), "the original refund");
    let posts = posts(&p.sandbox);
    assert_eq!(posts.len(), 2, "A's send and B's one re-send");
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "B re-sent A's key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_id_with_different_arguments_on_two_hosts_at_once_runs_one_of_them() {
    // The provider refunds every request it gets: only the ledger can tell
    // that the second is the same tool-call id with other arguments.
    let f = fleet(Downstream { key: NO_KEY, ..Downstream::default() }).await;
    for round in 0..40u64 {
        let (x, y) = (10 + 2 * round, 11 + 2 * round);
        let id = format!("c{round}");
        let (a, b, ida, idb) = (f.hosts[0].clone(), f.hosts[1].clone(), id.clone(), id.clone());
        let (first, second) =
            tokio::join!(tokio::spawn(async move { refund_on(&a, &ida, x).await }), tokio::spawn(async move { refund_on(&b, &idb, y).await }),);
        let answers = [first.unwrap(), second.unwrap()];
        let refunds: Vec<u64> = f.sandbox.refunds().iter().map(|r| r.amount).filter(|a| *a == x || *a == y).collect();
        assert_eq!(refunds.len(), 1, "round {round}: one refund for one tool-call id: {answers:?}");
        let ran: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        assert_eq!(ran.len(), 1, "round {round}: {answers:?}");
        assert_eq!(ran[0].value["amount_cents"], refunds[0], "round {round}");
        let refused = answers.iter().find_map(|a| a.as_ref().err()).expect("one refused");
        assert_eq!(refused.kind, ErrorKind::Conflict, "round {round}: {answers:?}");
        // Both hosts replay the one that ran, and refuse the other's arguments.
        for host in 0..2 {
            let replay = f.refund(host, &id, refunds[0]).await.expect("a replay");
            assert_eq!(replay.value, ran[0].value, "round {round}, host {host}");
        }
    }
}
