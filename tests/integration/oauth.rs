//! `serve --http` as an OAuth 2.1 resource server, against a real
//! authorization server (authlib, `tests/oauth/authorization_server.py`) and
//! the official Python SDK's OAuth client: discovery from the server's
//! metadata, tokens issued for this resource, step-up on a missing scope;
//! and every token it must refuse, each with its status and challenge and
//! nothing executed (refunds counted at the sandbox).

use crate::common::{BIN, stdout_json};
use crate::mcp::send;
use crate::payments::{Downstream, config_text};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use toolguard_sandbox::{Mode, Sandbox};

/// The authorization server, killed on drop.
pub struct AuthServer {
    child: Child,
    pub issuer: String,
    /// The CA its HTTPS certificate chains to, if it serves HTTPS.
    ca_file: Option<std::path::PathBuf>,
}

impl Drop for AuthServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl AuthServer {
    /// Clients: (id, secret, allowed scopes); tokens live `lifetime` seconds.
    pub fn start(clients: &[(&str, &str, &str)], lifetime: u64) -> Self {
        Self::serving(clients, lifetime, None)
    }

    /// [`AuthServer::start`] over HTTPS with the test PKI's server certificate.
    fn over_https(pki: &crate::tls::Pki) -> Self {
        Self::serving(&[], 300, Some(pki))
    }

    fn serving(clients: &[(&str, &str, &str)], lifetime: u64, pki: Option<&crate::tls::Pki>) -> Self {
        let python = std::env::var("TOOLGUARD_PYTHON").expect("TOOLGUARD_PYTHON: run the tests with ./dev.sh test");
        let port = free_port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/oauth/authorization_server.py");
        let clients = serde_json::to_string(&clients.iter().map(|(a, b, c)| [a, b, c]).collect::<Vec<_>>()).unwrap();
        let mut child = Command::new(python)
            .arg(script)
            .args([port.to_string(), clients, lifetime.to_string()])
            .args(pki.map(|p| [p.server_cert_file.clone(), p.server_key_file.clone()]).into_iter().flatten())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "listening");
        let issuer = format!("{}://127.0.0.1:{port}", if pki.is_some() { "https" } else { "http" });
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        Self { child, issuer, ca_file: pki.map(|p| p.ca_file.clone()) }
    }

    fn control(&self, path: &str, body: serde_json::Value) -> String {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let _ = rustls::crypto::ring::default_provider().install_default();
            let url = format!("{}/control/{path}", self.issuer);
            let client = match &self.ca_file {
                Some(ca) => {
                    let tls = toolguard::policy::TlsPolicy { ca_file: Some(ca.clone()), platform_roots: false, ..Default::default() };
                    reqwest::Client::builder().tls_backend_preconfigured(toolguard::net::tls::rustls_config(&tls, "test").unwrap()).build().unwrap()
                }
                None => reqwest::Client::new(),
            };
            let request = if body.is_null() { client.get(url) } else { client.post(url).header("content-type", "application/json").body(body.to_string()) };
            request.send().await.unwrap().text().await.unwrap()
        })
    }

    /// A token for `aud` with `claims` over the server's defaults, signed by
    /// its current key (or by a key its JWKS does not publish).
    pub fn mint(&self, aud: &str, claims: serde_json::Value, unpublished: bool) -> String {
        self.control("mint", serde_json::json!({ "aud": aud, "claims": claims, "key": if unpublished { "unpublished" } else { "current" } }))
    }

    pub fn rotate(&self) {
        self.control("rotate", serde_json::json!({}));
    }

    pub fn down(&self) {
        self.control("down", serde_json::json!({}));
    }

    pub fn jwks_fetches(&self) -> u64 {
        self.control("jwks-fetches", serde_json::Value::Null).trim().parse().unwrap()
    }
}

/// A host serving the payments plugin behind `[mcp.oauth]`, and its sandbox.
struct Resource {
    _rt: tokio::runtime::Runtime,
    sandbox: Sandbox,
    _dir: tempfile::TempDir,
    child: Child,
    /// `http://127.0.0.1:PORT/mcp`: the resource URI and the endpoint.
    url: String,
    /// Everything the host has logged so far.
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Resource {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Resource {
    /// `oauth` is the body of `[mcp.oauth]` after `resource` and the issuer.
    fn start(auth: &AuthServer, oauth: &str) -> Self {
        Self::with_issuer(auth, oauth, "")
    }

    /// [`Resource::start`] with `issuer` lines (TLS, say) in the issuer's table.
    fn with_issuer(auth: &AuthServer, oauth: &str, issuer: &str) -> Self {
        Self::serving(auth, oauth, issuer, Downstream::default())
    }

    /// [`Resource::start`] with the refund's policy `refund_policy` (inline-table entries).
    fn with_refund_policy(auth: &AuthServer, oauth: &str, refund_policy: &'static str) -> Self {
        Self::serving(auth, oauth, "", Downstream { refund_policy: Some(refund_policy), ..Downstream::default() })
    }

    fn serving(auth: &AuthServer, oauth: &str, issuer: &str, downstream: Downstream) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
        sandbox.add_payment_intent("pi_mcp", 100_000);
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}/mcp");
        let text = format!(
            "{}\n[mcp.oauth]\nresource = \"{url}\"\n{oauth}\n[[mcp.oauth.issuers]]\nissuer = \"{}\"\n{issuer}\n",
            config_text(&sandbox.url(), &dir.path().join("data"), &downstream),
            auth.issuer
        );
        let config = dir.path().join("host.toml");
        std::fs::write(&config, text).unwrap();
        let mut child = Command::new(BIN)
            .args(["serve", "--config", config.to_str().unwrap(), "--http", &format!("127.0.0.1:{port}")])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("serve exited before listening").unwrap();
            if line.starts_with("toolguard: MCP on ") {
                break;
            }
        }
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| sink.lock().unwrap().push_str(&format!("{l}\n"))));
        Self { _rt: rt, sandbox, _dir: dir, child, url, log }
    }

    /// POSTs a JSON-RPC body with `token` (if any): status, headers, body.
    fn post(&self, token: Option<&str>, extra: &[(&str, &str)], body: String) -> (u16, reqwest::header::HeaderMap, String) {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers: Vec<(&str, &str)> = extra.to_vec();
        if let Some(b) = &bearer {
            headers.push(("Authorization", b));
        }
        send(&self.url, &headers, body)
    }

    /// A 2025-11-25 session opened with `token`: its id.
    fn session(&self, token: &str) -> String {
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        let (status, headers, body) = self.post(Some(token), &[], init.into());
        assert_eq!(status, 200, "{body}");
        let id = headers.get("mcp-session-id").unwrap().to_str().unwrap().to_string();
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        self.post(Some(token), &crate::mcp::in_session(&id), note.into());
        id
    }

    /// A refund call in `session` with `token`: status, `WWW-Authenticate`, body.
    fn refund(&self, token: Option<&str>, session: &str, call_id: &str) -> (u16, String, String) {
        let (status, headers, body) = self.post(token, &crate::mcp::in_session(session), crate::mcp::refund_request(7, call_id, 500));
        let challenge = headers.get("www-authenticate").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (status, challenge, body)
    }
}

fn python(args: &[&str]) -> Vec<serde_json::Value> {
    let python = std::env::var("TOOLGUARD_PYTHON").expect("TOOLGUARD_PYTHON: run the tests with ./dev.sh test");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/mcp/oauth_client.py");
    let out = Command::new(python).arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Every request needs `tools:read` (the 401's challenge names it: clients ask
/// for the least first); a refund also needs `payments:refund`.
const SCOPES: &str = "[mcp.oauth.scopes]\nany = \"tools:read\"\neffects = { irreversible = \"payments:refund\" }\n";

#[test]
fn the_python_sdks_oauth_client_discovers_the_server_gets_a_token_and_steps_up() {
    let auth = AuthServer::start(&[("agent-a", "secret-a", "tools:read payments:refund")], 300);
    let server = Resource::start(&auth, SCOPES);
    let calls = serde_json::json!([
        ["refund_status", { "payment_intent": "pi_mcp" }, "c-read"],
        ["refund", { "payment_intent": "pi_mcp", "amount_cents": 500, "reason": "duplicate" }, "c-refund"],
        ["refund", { "payment_intent": "pi_mcp", "amount_cents": 500, "reason": "duplicate" }, "c-refund"],
    ]);
    // It asks for what the 401 names (tools:read); the refund's 403 names payments:refund, and it steps up.
    let steps = python(&[&server.url, &auth.issuer, "agent-a", "secret-a", "tools:read", &calls.to_string()]);
    assert_eq!(steps.len(), 3, "{steps:#?}");
    for step in &steps {
        assert!(step.get("exception").is_none() && step["is_error"] == false, "{steps:#?}");
    }
    assert_eq!(steps[2]["meta"]["toolguard/replayed"], true, "the same call id is the same call");
    // It asked for tools:read, was refused the refund with 403 naming payments:refund, and stepped up.
    let requests: Vec<String> = serde_json::from_str(&auth.control("token-requests", serde_json::Value::Null)).unwrap();
    assert_eq!(requests.len(), 2, "{requests:?}");
    assert_eq!(requests[0], "tools:read");
    assert!(requests[1].split_whitespace().any(|s| s == "payments:refund"), "{requests:?}");
    assert_eq!(server.sandbox.refunds().len(), 1);
    // The client's token never travels downstream.
    let seen = server.sandbox.requests();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|r| r.headers.iter().all(|(_, v)| !v.contains("eyJ"))), "a JWT reached the provider");
    // The metadata names the authorization server and the scopes.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let metadata: serde_json::Value = rt.block_on(async {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let url = server.url.replace("/mcp", "/.well-known/oauth-protected-resource/mcp");
        serde_json::from_str(&reqwest::get(url).await.unwrap().text().await.unwrap()).unwrap()
    });
    assert_eq!(metadata["resource"], server.url.as_str());
    assert_eq!(metadata["authorization_servers"][0], auth.issuer.as_str());
    assert_eq!(metadata["scopes_supported"], serde_json::json!(["payments:refund", "tools:read"]));
    // The audit lists what each tool needs.
    let out = Command::new(BIN).args(["audit", "--json", "--config"]).arg(server._dir.path().join("host.toml")).output().unwrap();
    let report = stdout_json(&out);
    crate::audit::assert_schema(&report);
    let tools = &report["components"][0]["tools"];
    let scopes_of = |name: &str| tools.as_array().unwrap().iter().find(|t| t["name"] == name).map(|t| t["scopes"].clone());
    assert_eq!(scopes_of("refund"), Some(serde_json::json!(["payments:refund", "tools:read"])));
    assert_eq!(scopes_of("refund_status"), Some(serde_json::json!(["tools:read"])));
}

#[test]
fn every_token_it_must_refuse_is_refused_with_its_status_and_challenge_and_nothing_runs() {
    let auth = AuthServer::start(&[("agent-a", "secret-a", "tools:read payments:refund")], 300);
    let server = Resource::start(&auth, SCOPES);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let all = serde_json::json!({ "sub": "agent-a", "scope": "tools:read payments:refund" });
    let good = auth.mint(&server.url, all.clone(), false);
    let session = server.session(&good);
    let with = |extra: serde_json::Value| {
        let mut claims = all.clone();
        claims.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        claims
    };
    let b64 = |v: &serde_json::Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
    };
    let payload = with(serde_json::json!({ "iss": auth.issuer, "aud": server.url, "exp": now + 300 }));
    // `alg: none`, and HS256 keyed with the issuer's public key (the algorithm-confusion attack).
    let none = format!("{}.{}.", b64(&serde_json::json!({ "alg": "none", "typ": "JWT" })), b64(&payload));
    let jwks = auth.control("../jwks", serde_json::Value::Null);
    let hs_input = format!("{}.{}", b64(&serde_json::json!({ "alg": "HS256", "typ": "JWT", "kid": "key-1" })), b64(&payload));
    let hs256 = {
        use base64::Engine as _;
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(jwks.as_bytes()).unwrap();
        mac.update(hs_input.as_bytes());
        format!("{hs_input}.{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes()))
    };
    // A valid token whose payload is changed afterwards.
    let tampered = {
        let parts: Vec<&str> = good.split('.').collect();
        format!("{}.{}.{}", parts[0], b64(&with(serde_json::json!({ "iss": auth.issuer, "aud": server.url, "exp": now + 300, "sub": "agent-b" }))), parts[2])
    };
    let cases = [
        ("expired", auth.mint(&server.url, with(serde_json::json!({ "exp": now - 120 })), false), "expired"),
        ("not yet valid", auth.mint(&server.url, with(serde_json::json!({ "nbf": now + 600 })), false), "not valid yet"),
        ("for another resource", auth.mint("http://127.0.0.1:1/mcp", all.clone(), false), "not issued for this resource"),
        ("from another issuer", auth.mint(&server.url, with(serde_json::json!({ "iss": "http://127.0.0.1:1" })), false), "issuer"),
        ("alg none", none, "does not accept"),
        ("HS256 with the public key", hs256, "does not accept"),
        ("an unknown kid", auth.mint(&server.url, all.clone(), true), "a key its issuer does not publish"),
        ("a tampered payload", tampered, "signature does not verify"),
        ("garbage", "not-a-jwt".into(), "not a signed JWT"),
    ];
    for (what, token, why) in &cases {
        let (status, challenge, body) = server.refund(Some(token), &session, &format!("c-{what}"));
        assert_eq!(status, 401, "{what}: {body}");
        assert!(challenge.contains("error=\"invalid_token\"") && challenge.contains("resource_metadata=\""), "{what}: {challenge}");
        assert!(body.contains(why), "{what}: {body}");
    }
    // No token at all: 401 pointing at the metadata, no error code.
    let (status, challenge, _) = server.refund(None, &session, "c-none");
    assert_eq!(status, 401);
    assert!(challenge.starts_with("Bearer resource_metadata=\"") && challenge.contains("/.well-known/oauth-protected-resource/mcp"), "{challenge}");
    // A valid token without the refund's scope: 403 naming it.
    let reader = auth.mint(&server.url, with(serde_json::json!({ "scope": "tools:read" })), false);
    let (status, challenge, _) = server.refund(Some(&reader), &session, "c-scope");
    assert_eq!(status, 403);
    assert!(challenge.contains("error=\"insufficient_scope\"") && challenge.contains("scope=\"payments:refund\""), "{challenge}");
    assert_eq!(server.sandbox.refunds().len(), 0, "nothing a refused request asked for ran");
    // And the good token works.
    let (status, _, body) = server.refund(Some(&good), &session, "c-good");
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.sandbox.refunds().len(), 1);
    // No token, accepted or refused, is logged or stored: not in the host's log, not in its ledger.
    let signature_of = |t: &str| t.rsplit('.').next().unwrap().to_string();
    let log = server.log.lock().unwrap().clone();
    let out = Command::new(BIN).args(["ledger", "export", "--config"]).arg(server._dir.path().join("host.toml")).output().unwrap();
    let ledger = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && ledger.contains("c-good"), "{ledger}");
    for token in [&good, &reader] {
        let (header, signature) = (token.split('.').next().unwrap(), signature_of(token));
        assert!(!log.contains(&signature) && !log.contains(header), "a token reached the log:\n{log}");
        assert!(!ledger.contains(&signature) && !ledger.contains(header), "a token reached the ledger");
    }
}

#[test]
fn forged_kids_are_refused_without_making_the_host_fetch_the_keys_again() {
    let auth = AuthServer::start(&[], 300);
    let server = Resource::start(&auth, "refetch_min_seconds = 3600\n");
    let claims = serde_json::json!({ "sub": "agent-a" });
    let session = server.session(&auth.mint(&server.url, claims.clone(), false));
    let fetches = auth.jwks_fetches();
    assert_eq!(fetches, 1, "the keys are fetched once, on first use");
    for i in 0..20 {
        let forged = auth.mint(&server.url, claims.clone(), true);
        let (status, challenge, _) = server.refund(Some(&forged), &session, &format!("c-forged-{i}"));
        assert_eq!(status, 401);
        assert!(challenge.contains("invalid_token"));
    }
    assert_eq!(auth.jwks_fetches(), fetches, "a flood of unknown kids made the host fetch the keys again");
    assert_eq!(server.sandbox.refunds().len(), 0);
}

#[test]
fn keys_rotate_without_an_outage() {
    let auth = AuthServer::start(&[], 300);
    let server = Resource::start(&auth, "refetch_min_seconds = 1\n");
    let claims = serde_json::json!({ "sub": "agent-a" });
    let first = auth.mint(&server.url, claims.clone(), false);
    let session = server.session(&first);
    auth.rotate();
    // Past the refetch limit, a token under the new key makes the host fetch the keys once and find it.
    std::thread::sleep(std::time::Duration::from_millis(1_100));
    let rotated = auth.mint(&server.url, claims.clone(), false);
    let (status, _, body) = server.refund(Some(&rotated), &session, "c-rotated");
    assert_eq!(status, 200, "{body}");
    assert_eq!(auth.jwks_fetches(), 2);
    // Tokens under the old key, still published, keep working.
    assert_eq!(server.refund(Some(&first), &session, "c-first").0, 200);
}

#[test]
fn the_idp_down_its_cached_keys_serve_until_they_expire_then_every_request_is_refused() {
    let auth = AuthServer::start(&[], 300);
    let server = Resource::start(&auth, "keys_max_age_seconds = 5\nrefetch_min_seconds = 1\n");
    let token = auth.mint(&server.url, serde_json::json!({ "sub": "agent-a" }), false);
    let session = server.session(&token);
    auth.down();
    // Its keys were fetched moments ago: they still check tokens.
    assert_eq!(server.refund(Some(&token), &session, "c1").0, 200);
    std::thread::sleep(std::time::Duration::from_millis(5_500));
    for i in 0..3 {
        let (status, challenge, body) = server.refund(Some(&token), &session, &format!("c-down-{i}"));
        assert_eq!(status, 503, "{body}");
        assert!(challenge.contains("temporarily_unavailable") && body.contains("not available"), "{challenge} {body}");
        std::thread::sleep(std::time::Duration::from_millis(1_100));
    }
    assert_eq!(server.sandbox.refunds().len(), 1);
}

#[test]
fn principals_come_from_the_token_and_one_cannot_reach_anothers_calls() {
    let auth = AuthServer::start(&[], 300);
    let server = Resource::start(&auth, "");
    let a = auth.mint(&server.url, serde_json::json!({ "sub": "agent-a" }), false);
    let b = auth.mint(&server.url, serde_json::json!({ "sub": "agent-b" }), false);
    let session = server.session(&b);
    let (status, _, body) = server.refund(Some(&b), &session, "c1");
    assert_eq!(status, 200, "{body}");
    // A holding B's transport session id reaches nothing of it: the session is B's (404, as for no session).
    let (status, _, body) = server.refund(Some(&a), &session, "c1");
    assert_eq!((status, body.as_str()), (404, "Not Found: Session not found"), "A used B's session");
    // A sends B's conversation and call id from its own session: its own call in its own namespace, never B's answer.
    let own = server.session(&a);
    let (status, _, body) = server.refund(Some(&a), &own, "c1");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""toolguard/replayed":false"#), "A was answered with B's call: {body}");
    let (status, _, body) = server.refund(Some(&b), &session, "c1");
    assert_eq!(status, 200);
    assert!(body.contains(r#""toolguard/replayed":true"#), "B's own repeat is a replay: {body}");
    assert_eq!(server.sandbox.refunds().len(), 2, "one refund per principal");
    // The ledger names both principals.
    let out = Command::new(BIN).args(["ledger", "list", "--json", "--config"]).arg(server._dir.path().join("host.toml")).output().unwrap();
    let listing = stdout_json(&out).to_string();
    assert!(listing.contains("agent-a") && listing.contains("agent-b"), "{listing}");
}

#[test]
fn keys_come_only_over_the_tls_the_reviewer_set() {
    let pki = crate::tls::Pki::new();
    let auth = AuthServer::over_https(&pki);
    let claims = serde_json::json!({ "sub": "agent-a" });
    let ca = format!("ca_file = {:?}, platform_roots = false", pki.ca_file.display().to_string());
    // The private CA and the right pin: keys are fetched, tokens accepted.
    let tls = format!("tls = {{ {ca}, spki_sha256 = [{:?}] }}", pki.server_pin());
    let server = Resource::with_issuer(&auth, "", &tls);
    let token = auth.mint(&server.url, claims.clone(), false);
    server.session(&token);
    // Another CA, or a pin the IdP's key does not match: no keys, so every request is refused (503), never accepted.
    let wrong_ca = format!("tls = {{ ca_file = {:?}, platform_roots = false }}", pki.wrong_ca_file.display().to_string());
    let wrong_pin = format!("tls = {{ {ca}, spki_sha256 = [\"sha256/AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\"] }}");
    for tls in [wrong_ca, wrong_pin] {
        let server = Resource::with_issuer(&auth, "", &tls);
        let token = auth.mint(&server.url, claims.clone(), false);
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
        let (status, _, body) = server.post(Some(&token), &[], init.into());
        assert_eq!(status, 503, "{tls}: {body}");
        assert!(body.contains("not available"), "{body}");
    }
}

#[test]
fn a_tenants_spending_limit_counts_all_its_principals_and_never_another_tenants() {
    let auth = AuthServer::start(&[], 300);
    let limit = r#"limits = [{ sum = "/amount_cents", max = 1000, per = "tenant", window = "day" }]"#;
    let server = Resource::with_refund_policy(&auth, "tenant_claim = \"tid\"", limit);
    let token = |tid: &str, sub: &str| auth.mint(&server.url, serde_json::json!({ "sub": sub, "tid": tid }), false);
    let (a1, a2, b1) = (token("acme", "agent-1"), token("acme", "agent-2"), token("globex", "agent-1"));
    let refund = |token: &str, call_id: &str| {
        let session = server.session(token);
        let (status, _, body) = server.refund(Some(token), &session, call_id);
        assert_eq!(status, 200, "{body}");
        body
    };
    // Two principals of one tenant share its 1,000 a day: 500 + 500, then no more.
    assert!(!refund(&a1, "c1").contains("over a spending limit"));
    assert!(!refund(&a2, "c1").contains("over a spending limit"));
    let refused = refund(&a2, "c2");
    assert!(refused.contains("over a spending limit") && refused.contains("1000 of 1000"), "{refused}");
    // Another tenant's principal — the same subject — has its own.
    assert!(!refund(&b1, "c1").contains("over a spending limit"));
    assert_eq!(server.sandbox.refunds().len(), 3, "acme's third refund was never sent");
}
