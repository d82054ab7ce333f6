//! A fleet host whose PostgreSQL ledger goes out of reach — every
//! connection cut, new ones refused, as a failover or a partition does —
//! and comes back. The host is reached through a relay the test cuts; it
//! counts refunds at the sandbox.

use crate::common::fresh_postgres_database;
use crate::payments::{Downstream, PI, config_text, refund_args};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use toolguard::{CallRequest, Config, ErrorKind, Runtime};
use toolguard_sandbox::{Mode, Sandbox};

/// A TCP relay to the test PostgreSQL server that can be cut: its
/// connections closed and its port refusing new ones, until restored.
struct Relay {
    addr: SocketAddr,
    target: SocketAddr,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay { addr: listener.local_addr().unwrap(), target, tasks: Arc::default() };
        relay.serve(listener);
        relay
    }

    fn serve(&self, listener: TcpListener) {
        let (tasks, target) = (self.tasks.clone(), self.target);
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let relayed = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                tasks.lock().unwrap().push(relayed);
            }
        });
        self.tasks.lock().unwrap().push(accept);
    }

    /// Closes every relayed connection and the listening port.
    async fn cut(&self) {
        let tasks: Vec<_> = self.tasks.lock().unwrap().drain(..).collect();
        for task in tasks {
            task.abort();
            let _ = task.await;
        }
    }

    /// Listens on the same port again.
    async fn restore(&self) {
        self.serve(TcpListener::bind(self.addr).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_out_of_reach_answers_transport_and_the_same_call_runs_once_it_is_back() {
    let sandbox = Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await.unwrap();
    sandbox.add_payment_intent(PI, crate::payments::PI_AMOUNT);
    let mut ledger = url::Url::parse(&fresh_postgres_database()).unwrap();
    let target = format!("{}:{}", ledger.host_str().unwrap(), ledger.port().unwrap()).parse().unwrap();
    let relay = Relay::start(target).await;
    ledger.set_port(Some(relay.addr.port())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = format!("ledger = {:?}\n{}", ledger.as_str(), config_text(&sandbox.url(), &dir.path().join("data"), &Downstream::default()));
    let host = Runtime::from_config(&Config::parse(&text, "fleet.toml", dir.path()).unwrap()).await.unwrap();
    let refund = |call_id: &str, amount: u64| {
        let req =
            CallRequest { session: "s1".into(), call_id: call_id.into(), tool: "refund".into(), args_json: refund_args(amount), principal: None, tenant: None };
        let host = &host;
        async move { host.call(&req).await }
    };
    let refunds_of = |amount: u64| sandbox.refunds().iter().filter(|r| r.amount == amount).count();

    let first = refund("c1", 100).await.unwrap();
    relay.cut().await;
    // The pooled connections are dead and no new one can be made: nothing runs, and the caller may retry the same id.
    let e = refund("c2", 200).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Transport, "an unavailable ledger is not a fault of the host: {e}");
    assert!(e.message.contains("the ledger is unavailable") && e.message.contains("nothing was run"), "{e}");
    assert_eq!(refunds_of(200), 0, "nothing was sent");

    relay.restore().await;
    let retried = refund("c2", 200).await.unwrap();
    assert!(!retried.replayed, "the retry ran the call");
    assert_eq!(refunds_of(200), 1);
    let again = refund("c1", 100).await.unwrap();
    assert!(again.replayed && again.value == first.value, "the call made before the outage replays");
    assert_eq!(refunds_of(100), 1);
}
