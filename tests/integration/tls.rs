//! Real TLS: the payments sandbox serves HTTPS with a certificate from a
//! test CA made at test time (rcgen), and guarded refunds, replays and
//! reconciliation run over it; mutual TLS, a wrong CA, SPKI pins, and an
//! egress proxy; every refusal is a `transport` error with nothing sent.

use crate::common::{shared_cache, wasm};
use crate::payments::{Downstream, PI, PI_AMOUNT, config_text, refund_args};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use toolguard::{CallError, CallOutput, CallRequest, Config, ErrorKind, Runtime};
use toolguard_sandbox::config::{KEY_HEADER_ONLY, PaymentsConfig};
use toolguard_sandbox::rustls;
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// A test PKI in a temporary directory: a CA that signs the server's
/// certificate (for 127.0.0.1 and localhost), another CA that signs a
/// client certificate, and a third CA that signs nothing here.
pub struct Pki {
    _dir: tempfile::TempDir,
    pub ca_file: PathBuf,
    pub wrong_ca_file: PathBuf,
    pub client_cert_file: PathBuf,
    pub client_key_file: PathBuf,
    /// The server's certificate chain and key as PEM files (for servers run as processes).
    pub server_cert_file: PathBuf,
    pub server_key_file: PathBuf,
    server_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    server_key: rustls::pki_types::PrivateKeyDer<'static>,
    client_ca: rustls::pki_types::CertificateDer<'static>,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

impl Pki {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (server_ca, client_ca, wrong_ca) = (ca("toolguard test CA"), ca("toolguard client CA"), ca("some other CA"));
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap().signed_by(&server_key, &server_ca).unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(vec!["toolguard-host".to_string()]).unwrap();
        client_params.distinguished_name.push(DnType::CommonName, "toolguard host");
        let client = client_params.signed_by(&client_key, &client_ca).unwrap();
        let write = |name: &str, text: String| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let ca_file = write("ca.pem", server_ca.pem());
        let wrong_ca_file = write("wrong-ca.pem", wrong_ca.pem());
        let client_cert_file = write("client.pem", client.pem());
        let client_key_file = write("client.key", client_key.serialize_pem());
        let server_cert_file = write("server.pem", format!("{}{}", server.pem(), server_ca.pem()));
        let server_key_file = write("server.key", server_key.serialize_pem());
        Self {
            server_chain: vec![server.der().clone(), server_ca.der().clone()],
            server_key: rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
            client_ca: client_ca.der().clone(),
            _dir: dir,
            ca_file,
            wrong_ca_file,
            client_cert_file,
            client_key_file,
            server_cert_file,
            server_key_file,
        }
    }

    /// The sandbox's TLS: its certificate, and (if `clients_must_present`) a
    /// client certificate from the client CA required of every connection.
    pub fn server(&self, clients_must_present: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions().unwrap();
        let builder = if clients_must_present {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.client_ca.clone()).unwrap();
            builder.with_client_cert_verifier(rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider).build().unwrap())
        } else {
            builder.with_no_client_auth()
        };
        Arc::new(builder.with_single_cert(self.server_chain.clone(), self.server_key.clone_key()).unwrap())
    }

    /// The SPKI pin of the server's certificate, as `tls.spki_sha256` takes it.
    pub fn server_pin(&self) -> String {
        toolguard::net::tls::spki_pin(&self.server_chain[0]).unwrap()
    }
}

/// A host with the payments plugin on an HTTPS sandbox; `tls` is the
/// downstream's `[…tls]` table (and any other downstream keys), as TOML lines.
pub struct Tls {
    pub sandbox: Sandbox,
    pub rt: Runtime,
    _dir: tempfile::TempDir,
}

impl Tls {
    pub async fn call(&self, call_id: &str, amount: u64) -> Result<CallOutput, CallError> {
        let req =
            CallRequest { session: "s1".into(), call_id: call_id.into(), tool: "refund".into(), args_json: refund_args(amount), principal: None, tenant: None };
        let answer = self.rt.call(&req).await;
        self.rt.report(&req, &answer).await;
        answer
    }
}

/// `d`'s config for `url`, with extra lines for the payments downstream.
pub fn tls_config_text(url: &str, data: &Path, d: &Downstream, downstream_extra: &str) -> String {
    let text = config_text(url, data, d);
    text.replace("[policy.downstreams.payments]\n", &format!("[policy.downstreams.payments]\n{downstream_extra}\n"))
}

async fn tls_host(pki: &Pki, clients_must_present: bool, d: Downstream, extra: &str) -> Result<Tls, String> {
    let sandbox = Sandbox::start_tls("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION, pki.server(clients_must_present)).await.unwrap();
    sandbox.add_payment_intent(PI, PI_AMOUNT);
    let dir = tempfile::tempdir().unwrap();
    let text = tls_config_text(&sandbox.url(), &dir.path().join("data"), &d, extra);
    let config = Config::parse(&text, "tls.toml", dir.path()).map_err(|e| e.to_string())?;
    let rt = Runtime::from_config(&config).await.map_err(|e| e.to_string())?;
    Ok(Tls { sandbox, rt, _dir: dir })
}

fn trust(pki: &Pki) -> String {
    format!("tls = {{ ca_file = {:?}, platform_roots = false }}", pki.ca_file.display().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_replays_and_reconciliation_run_over_https() {
    let pki = Pki::new();
    let h = tls_host(&pki, false, Downstream::default(), &trust(&pki)).await.unwrap();
    assert!(h.sandbox.url().starts_with("https://"));
    let first = h.call("c1", 500).await.unwrap();
    assert_eq!(first.value["status"], "succeeded");
    let again = h.call("c1", 500).await.unwrap();
    assert!(again.replayed);
    // The provider commits, answers 500: reconciliation (a GET over TLS) finds it.
    h.sandbox.inject(Fault::HiddenCommit500);
    let found = h.call("c2", 600).await.unwrap();
    assert_eq!(found.value["status"], "succeeded");
    // The answer is lost after the commit: the retry re-sends the same key over TLS.
    h.sandbox.set_list_lag(std::time::Duration::from_secs(600));
    h.sandbox.inject(Fault::DropAfterCommit);
    assert_eq!(h.call("c3", 700).await.unwrap_err().kind, ErrorKind::OutcomeUnknown);
    let retried = h.call("c3", 700).await.unwrap();
    assert_eq!(retried.value["amount_cents"], 700);
    assert_eq!(h.sandbox.refunds().len(), 3);
}

/// A handshake that fails is a `transport` error, settled as not sent.
async fn refused_before_sending(h: &Tls, what: &str) {
    let err = h.call("c1", 500).await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Transport, "{what}: {err}");
    assert!(h.sandbox.requests().is_empty(), "{what}: no request reached the provider");
    let attempt = h.rt.guard().unwrap().ledger().attempts().unwrap().remove(0);
    assert_eq!(attempt.state, toolguard::ledger::AttemptState::Failed, "{what}: settled as never sent, not unknown");
    assert!(attempt.response.is_none() && attempt.last_error.as_deref().unwrap_or("").starts_with("not sent"), "{what}: {attempt:?}");
    // Nothing is held behind it: it provably sent nothing.
    assert_eq!(h.sandbox.refunds().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_a_pin_mismatch_is_a_transport_error_with_nothing_sent() {
    let pki = Pki::new();
    let d = || Downstream { max_retries: 0, ..Downstream::default() };
    let wrong = format!("tls = {{ ca_file = {:?}, platform_roots = false }}", pki.wrong_ca_file.display().to_string());
    refused_before_sending(&tls_host(&pki, false, d(), &wrong).await.unwrap(), "wrong CA").await;
    let no_ca = "tls = { platform_roots = true }";
    refused_before_sending(&tls_host(&pki, false, d(), no_ca).await.unwrap(), "a private CA the platform does not know").await;
    let bad_pin =
        format!("tls = {{ ca_file = {:?}, platform_roots = false, spki_sha256 = [\"sha256/{}\"] }}", pki.ca_file.display().to_string(), "A".repeat(43) + "=");
    refused_before_sending(&tls_host(&pki, false, d(), &bad_pin).await.unwrap(), "pin mismatch").await;
    let good_pin = format!("tls = {{ ca_file = {:?}, platform_roots = false, spki_sha256 = [{:?}] }}", pki.ca_file.display().to_string(), pki.server_pin());
    let h = tls_host(&pki, false, d(), &good_pin).await.unwrap();
    h.call("c1", 500).await.expect("the pinned key matches");
    let tls13 = format!("tls = {{ ca_file = {:?}, platform_roots = false, min_version = \"1.3\" }}", pki.ca_file.display().to_string());
    tls_host(&pki, false, d(), &tls13).await.unwrap().call("c1", 500).await.expect("the sandbox speaks TLS 1.3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_a_host_without_its_certificate() {
    let pki = Pki::new();
    let d = || Downstream { max_retries: 0, ..Downstream::default() };
    refused_before_sending(&tls_host(&pki, true, d(), &trust(&pki)).await.unwrap(), "no client certificate").await;
    let with_cert = format!(
        "tls = {{ ca_file = {:?}, platform_roots = false, client_cert_file = {:?}, client_key_file = {:?} }}",
        pki.ca_file.display().to_string(),
        pki.client_cert_file.display().to_string(),
        pki.client_key_file.display().to_string()
    );
    let h = tls_host(&pki, true, d(), &with_cert).await.unwrap();
    h.call("c1", 500).await.expect("the host presents its certificate");
    // The key may come from the environment instead (never a plugin's).
    // SAFETY: set before any thread of this test reads it.
    unsafe { std::env::set_var("TG_TEST_CLIENT_KEY", std::fs::read_to_string(&pki.client_key_file).unwrap()) };
    let from_env = format!(
        "tls = {{ ca_file = {:?}, platform_roots = false, client_cert_file = {:?}, client_key_env = \"TG_TEST_CLIENT_KEY\" }}",
        pki.ca_file.display().to_string(),
        pki.client_cert_file.display().to_string()
    );
    tls_host(&pki, true, d(), &from_env).await.unwrap().call("c1", 500).await.expect("the key from the environment");
}

/// A small HTTP CONNECT proxy: records each tunnel's target and every byte
/// it relays from the client.
struct Proxy {
    url: String,
    targets: Arc<Mutex<Vec<String>>>,
    relayed: Arc<Mutex<Vec<u8>>>,
}

async fn connect_proxy() -> Proxy {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (targets, relayed) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (t, r) = (targets.clone(), relayed.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (t, r) = (t.clone(), r.clone());
            tokio::spawn(async move {
                let mut client = tokio::io::BufReader::new(client);
                let mut line = String::new();
                client.read_line(&mut line).await.unwrap();
                let target = line.split_whitespace().nth(1).unwrap_or_default().to_string();
                t.lock().unwrap().push(line.trim().to_string());
                loop {
                    let mut header = String::new();
                    if client.read_line(&mut header).await.unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                }
                let Ok(mut upstream) = tokio::net::TcpStream::connect(&target).await else { return };
                client.get_mut().write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
                let (mut client_read, mut client_write) = client.into_inner().into_split();
                let (mut up_read, mut up_write) = upstream.split();
                let to_upstream = async {
                    let mut buf = [0u8; 8192];
                    while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                        r.lock().unwrap().extend_from_slice(&buf[..n]);
                        if up_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                };
                let to_client = tokio::io::copy(&mut up_read, &mut client_write);
                let _ = tokio::join!(to_upstream, to_client);
            });
        }
    });
    Proxy { url, targets, relayed }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_egress_proxy_carries_a_tunnel_and_never_sees_the_credential() {
    const SECRET: &str = "sk_test_only_the_provider_sees_this";
    let pki = Pki::new();
    let proxy = connect_proxy().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key"), SECRET).unwrap();
    let extra =
        format!("{}\nproxy = {:?}\ncredential = {{ prefix = \"Bearer \", file = {:?} }}", trust(&pki), proxy.url, dir.path().join("key").display().to_string());
    let h = tls_host(&pki, false, Downstream::default(), &extra).await.unwrap();
    h.sandbox.require_api_key(Some(SECRET));
    let out = h.call("c1", 500).await.expect("through the proxy");
    assert_eq!(out.value["status"], "succeeded");
    let targets = proxy.targets.lock().unwrap().clone();
    let authority = h.sandbox.url().trim_start_matches("https://").to_string();
    assert!(!targets.is_empty() && targets.iter().all(|t| *t == format!("CONNECT {authority} HTTP/1.1")), "{targets:?}");
    let relayed = proxy.relayed.lock().unwrap().clone();
    assert!(!relayed.is_empty());
    let text = String::from_utf8_lossy(&relayed);
    assert!(!text.contains(SECRET) && !text.contains("/v1/refunds") && !text.contains("Idempotency-Key"), "the proxy sees only TLS records");
    // A URL outside the grant is refused before the proxy sees anything.
    let before = proxy.targets.lock().unwrap().len();
    let req = CallRequest {
        session: "s1".into(),
        call_id: "r1".into(),
        tool: "send_all".into(),
        principal: None,
        args_json: crate::payments::rogue_args(serde_json::json!([{ "method": "POST", "url": format!("{}/v1/charges", h.sandbox.url()) }]), false),
        tenant: None,
    };
    assert_eq!(h.rt.call(&req).await.unwrap_err().kind, ErrorKind::Denied);
    assert_eq!(proxy.targets.lock().unwrap().len(), before);
}

#[test]
fn plain_http_beyond_loopback_is_refused_unless_allowed_and_the_audit_flags_it() {
    let dir = tempfile::tempdir().unwrap();
    let text = |url: &str, extra: &str| {
        let payments = PaymentsConfig {
            methods: vec!["POST"],
            key: KEY_HEADER_ONLY.into(),
            downstream_extra: extra.into(),
            ..PaymentsConfig::new(url, wasm("payments").display().to_string())
        };
        format!("data_dir = \"data\"\ncompile_cache = {:?}\n{}", shared_cache().display().to_string(), payments.toml())
    };
    let err = Config::parse(&text("http://payments.internal:8080", ""), "t.toml", dir.path()).unwrap_err();
    assert_eq!(err.field, "policy.downstreams.payments.url", "{err}");
    let allowed = dir.path().join("allowed.toml");
    std::fs::write(&allowed, text("http://payments.internal:8080", "insecure_http = true")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_toolguard")).args(["audit", "--config", allowed.to_str().unwrap()]).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("IN CLEAR beyond loopback") && report.contains("plain HTTP, beyond loopback"), "{report}");
}

/// The test PostgreSQL's URL for a fresh database, with `query` appended.
fn postgres_url_with(query: &str) -> String {
    // SAFETY-free: a fresh database on the plain URL, then the TLS settings.
    let url = crate::common::fresh_postgres_database();
    let base = url.split('?').next().unwrap().to_string();
    format!("{base}?{query}")
}

#[test]
fn the_ledger_reaches_postgresql_over_verified_tls() {
    let ca = std::env::var("TOOLGUARD_TEST_POSTGRES_CA").expect("TOOLGUARD_TEST_POSTGRES_CA: ./dev.sh test starts PostgreSQL with TLS and sets it");
    let pki = Pki::new();
    std::thread::spawn(move || {
        let url = postgres_url_with(&format!("sslmode=verify-full&sslrootcert={ca}"));
        let ledger = toolguard::ledger::Ledger::connect(&url).expect("verify-full against the right CA");
        // Every connection of this ledger's pool is encrypted.
        let db = url.split('?').next().unwrap().rsplit('/').next().unwrap().to_string();
        let admin = std::env::var("TOOLGUARD_TEST_POSTGRES").unwrap();
        let mut client = r2d2_postgres::postgres::Client::connect(&admin, r2d2_postgres::postgres::NoTls).unwrap();
        let sql = "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a ON a.pid = s.pid WHERE a.datname = $1";
        let row = client.query_one(sql, &[&db]).unwrap();
        let (encrypted, all): (i64, i64) = (row.get(0), row.get(1));
        assert!(all > 0 && encrypted == all, "{encrypted} of {all} connections use TLS");
        drop(ledger);
        // A CA that did not sign the server's certificate: refused, with why.
        let wrong = postgres_url_with(&format!("sslmode=verify-full&sslrootcert={}", pki.wrong_ca_file.display()));
        let err = toolguard::ledger::Ledger::connect(&wrong).unwrap_err().to_string();
        assert!(err.contains("TLS handshake") && err.contains("sslrootcert"), "{err}");
        // A password never shows in what the ledger says about itself.
        let with_password = postgres_url_with(&format!("sslmode=verify-full&sslrootcert={ca}")).replacen("toolguard@", "toolguard:hunter2-secret@", 1);
        if let Err(e) = toolguard::ledger::Ledger::connect(&with_password) {
            assert!(!e.to_string().contains("hunter2-secret"), "{e}");
        }
    })
    .join()
    .unwrap();
}
