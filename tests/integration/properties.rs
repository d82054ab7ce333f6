//! Properties of everything hostile input reaches, checked on generated
//! input (proptest): argument canonicalisation and the digest, URL
//! authorisation against grants, config and policy parsing, header and body
//! checks with key injection, and the plugin → host boundary (random
//! requests through a real plugin's `send` and `fetch`).
//!
//! The test command runs a short pass of each (`TOOLGUARD_FUZZ_CASES`,
//! default 256 cases). A long run keeps generating new cases for a given
//! time per property: `TOOLGUARD_FUZZ_SECONDS=600 cargo test -p toolguard
//! --test integration properties -- --nocapture --test-threads 1`; each
//! prints how many cases it ran. `docs/fuzzing.md` has the figures and why
//! this is not a coverage-guided fuzzer.

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{Map, Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolguard::guard::prepare;
use toolguard::keys;
use toolguard::policy::{Downstream, Downstreams, Grant, KeyTransport, RawDownstream, Refusal, authorize};

/// Runs `test` on inputs from `strategy`: the short pass, or for
/// `TOOLGUARD_FUZZ_SECONDS` with fresh seeds until the time is up.
pub(crate) fn check<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let seconds: u64 = std::env::var("TOOLGUARD_FUZZ_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let cases: u32 = std::env::var("TOOLGUARD_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
    let started = Instant::now();
    let mut ran = 0u64;
    loop {
        let mut runner = TestRunner::new(RunnerConfig { cases, failure_persistence: None, ..RunnerConfig::default() });
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("{name}: {e}");
        }
        ran += u64::from(cases);
        if started.elapsed() >= Duration::from_secs(seconds) {
            break;
        }
    }
    if seconds > 0 {
        println!("{name}: {ran} cases in {:.0} s, no failure", started.elapsed().as_secs_f64());
    }
}

// --- Canonical arguments and their digest ---

/// JSON values with the awkward parts: unicode and escapes in strings and
/// keys, integers up to and past 2^53, floats, nesting.
fn json_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<i64>().prop_map(Value::from),
        (0u64..=keys::MAX_EXACT_NUMBER).prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
    ];
    let leaf = prop_oneof![Just(Value::Null), any::<bool>().prop_map(Value::Bool), number, ".{0,12}".prop_map(Value::String)];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// `v` written another way that means the same: keys in another order,
/// whitespace, integers written as floats or exponents, strings escaped.
fn rewrite(v: &Value, salt: u64) -> String {
    match v {
        Value::Object(m) => {
            let mut fields: Vec<String> = m.iter().map(|(k, x)| format!("{} : {}", escaped(k, salt), rewrite(x, salt.rotate_left(7)))).collect();
            if salt % 2 == 1 {
                fields.reverse();
            }
            format!("{{ {} }}", fields.join(" ,\n "))
        }
        Value::Array(items) => format!("[ {} ]", items.iter().map(|x| rewrite(x, salt.rotate_left(3))).collect::<Vec<_>>().join(" , ")),
        Value::String(s) => escaped(s, salt),
        Value::Number(n) if n.as_i64().is_some_and(|i| i.unsigned_abs() <= keys::MAX_EXACT_NUMBER) && salt.is_multiple_of(3) => {
            format!("{}.0e0", n.as_i64().unwrap())
        }
        other => other.to_string(),
    }
}

/// `s` as a JSON string, every non-ASCII character (or all, by `salt`) as a `\u` escape.
fn escaped(s: &str, salt: u64) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || !c.is_ascii() || salt.is_multiple_of(5) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn digest(v: &Value) -> Option<String> {
    keys::canonical_args(v).ok().map(|c| keys::args_digest(&c))
}

#[test]
fn equal_arguments_have_equal_digests_whatever_their_spelling() {
    check("canonicalisation: same value", (json_value(), any::<u64>()), |(v, salt)| {
        let text = rewrite(&v, salt);
        let parsed: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(digest(&parsed), digest(&v), "{}", text);
        Ok(())
    });
}

#[test]
fn different_arguments_have_different_digests() {
    check("canonicalisation: other value", (json_value(), json_value()), |(a, b)| {
        if let (Some(da), Some(db)) = (digest(&a), digest(&b)) {
            let same = keys::canonical_args(&a).unwrap() == keys::canonical_args(&b).unwrap();
            prop_assert_eq!(da == db, same);
            if same {
                // One canonical text, one value: parsing it back gives both.
                prop_assert_eq!(
                    serde_json::from_str::<Value>(&keys::canonical_args(&a).unwrap()).unwrap(),
                    serde_json::from_str::<Value>(&keys::canonical_args(&b).unwrap()).unwrap()
                );
            }
        }
        if digest(&a).is_some() {
            let mutated = json!({ "wrapped": a.clone(), "n": 1 });
            prop_assert_ne!(digest(&mutated), digest(&json!({ "wrapped": a, "n": 2 })));
        }
        Ok(())
    });
}

#[test]
fn every_number_that_reaches_a_plugin_is_exact() {
    check("canonicalisation: numbers", any::<i64>(), |n| {
        let v = json!({ "id": n });
        match keys::canonical_args(&v) {
            Ok(text) => {
                prop_assert!(n.unsigned_abs() <= keys::MAX_EXACT_NUMBER);
                prop_assert_eq!(text, format!(r#"{{"id":{n}}}"#));
            }
            Err(_) => prop_assert!(n.unsigned_abs() > keys::MAX_EXACT_NUMBER),
        }
        Ok(())
    });
}

// --- URL authorisation against grants ---

fn downstreams() -> Downstreams {
    let raw = RawDownstream { url: "http://127.0.0.1:4242/api".into(), ..RawDownstream::default() };
    Downstreams::from([("pay".to_string(), Arc::new(Downstream::from_raw("pay", raw, Path::new(".")).unwrap()))])
}

fn grant(allow_encoded_path: bool) -> Grant {
    Grant { downstream: "pay".into(), methods: vec!["POST".into()], path_prefix: "/v1/refunds".into(), allow_encoded_path }
}

/// Path pieces a hostile plugin would try: separators and dots in every encoding.
fn path_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "v1",
        "refunds",
        "charges",
        "api",
        "re_1",
        "..",
        ".",
        "%2e",
        "%2E%2e",
        ".%2e",
        "%2f",
        "%2F",
        "%5c",
        "\\",
        ";",
        ";x=1",
        "%25",
        "%252f",
        "%252e%252e",
        "%00",
        "%0a",
        "//",
        "?",
        "#",
        "%3f",
        "%23",
        "a%20b",
        "é",
        "%c3%a9",
        "%ff",
        "@",
        ":",
        "%40",
    ])
}

/// The path a lenient server might end up routing: decoded until it stops
/// changing, backslashes as slashes, `;` parameters cut, dot segments resolved.
fn as_a_lenient_server_reads_it(path: &str) -> String {
    let mut p = path.to_string();
    for _ in 0..4 {
        let decoded = percent_encoding::percent_decode_str(&p).decode_utf8_lossy().into_owned();
        if decoded == p {
            break;
        }
        p = decoded;
    }
    let p = p.replace('\\', "/");
    let mut out: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment.split(';').next().unwrap_or("") {
            "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s),
        }
    }
    out.join("/")
}

#[test]
fn no_url_a_grant_accepts_leads_outside_it_after_any_decoding() {
    let d = downstreams();
    let pieces = prop::collection::vec(path_piece(), 0..8);
    check(
        "authorisation",
        (
            pieces,
            any::<bool>(),
            prop::sample::select(vec![
                "http://127.0.0.1:4242",
                "http://127.0.0.1:4243",
                "https://127.0.0.1:4242",
                "http://localhost:4242",
                "http://127.0.0.1:4242@evil.example",
                "http://evil.example",
            ]),
        ),
        |(pieces, lax, origin)| {
            let url = format!("{origin}/api/v1/refunds/{}", pieces.join("/"));
            let grants = [grant(lax)];
            match authorize(&grants, &d, "POST", &url) {
                Ok((downstream, parsed)) => {
                    prop_assert_eq!(&downstream.name, "pay");
                    prop_assert_eq!(parsed.origin(), downstream.origin.origin(), "{}", url);
                    let routed = as_a_lenient_server_reads_it(parsed.path());
                    if !lax {
                        prop_assert!(routed == "/api/v1/refunds" || routed.starts_with("/api/v1/refunds/"), "{} → {} → {}", url, parsed, routed);
                    }
                }
                Err(Refusal::Denied(_) | Refusal::Invalid(_)) => {}
            }
            Ok(())
        },
    );
}

// --- Config and policy parsing ---

const VALID_CONFIG: &str = r#"
data_dir = "data"
[plugins.p]
component = "p.wasm"
[plugins.p.limits]
wall_ms = 1000
[policy.downstreams.d]
url = "https://api.example.com/v1"
timeout_ms = 500
key = [{ transport = "header" }, { transport = "form-field", name = "metadata[k]" }]
[policy.plugins.p]
max_sends_per_call = 2
[policy.plugins.p.tools]
t = { effect = "irreversible" }
[[policy.plugins.p.grants]]
downstream = "d"
methods = ["POST"]
path_prefix = "/refunds"
[mcp]
tokens = [{ principal = "a", token_env = "X" }]
"#;

#[test]
fn any_config_text_parses_or_is_refused_with_a_message_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let edits = prop::collection::vec(
        (
            0usize..VALID_CONFIG.len(),
            prop::sample::select(vec!["", "\"", "[", "]", "=", "\n", "0", "-1", "99999999999999999999", "{", "}", ".", "\u{0}", "é", "TRACE", "../", "%2f"]),
        ),
        0..6,
    );
    check("config parsing", edits, |edits| {
        let mut text = VALID_CONFIG.to_string();
        for (at, insert) in edits {
            let at = (0..=at.min(text.len())).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
            text.insert_str(at, insert);
        }
        if let Err(e) = toolguard::Config::parse(&text, "fuzz.toml", dir.path()) {
            prop_assert!(!e.to_string().is_empty());
        }
        Ok(())
    });
}

// --- Header and body checks, key injection ---

fn header() -> impl Strategy<Value = (String, String)> {
    let name = prop_oneof![
        ".{0,6}",
        "[A-Za-z-]{1,12}",
        prop::sample::select(vec!["Idempotency-Key".to_string(), "authorization".into(), "Host".into(), "X-Key".into(), "Content-Length".into()])
    ];
    (name, ".{0,16}")
}

#[test]
fn a_checked_request_always_builds_into_valid_http_with_exactly_the_hosts_key() {
    let keys = vec![
        KeyTransport::Header { name: "Idempotency-Key".into() },
        KeyTransport::SfString { name: "X-Key".into() },
        KeyTransport::FormField { name: "metadata[k]".into() },
    ];
    let raw = RawDownstream { url: "http://127.0.0.1:1".into(), key: Some(keys), ..RawDownstream::default() };
    let d = Downstream::from_raw("d", raw, Path::new(".")).unwrap();
    let body = prop_oneof![".{0,40}", "[a-z]{1,4}=[a-z0-9%]{0,6}(&[a-z\\[\\]]{1,8}=[a-z0-9]{0,6}){0,4}"];
    let method = prop::sample::select(vec!["POST", "post", "GET", "TRACE", "", "P OST", "DELETE"]);
    check("headers and key injection", (method, prop::collection::vec(header(), 0..8), body), |(method, headers, body)| {
        let request = prepare::stored(method, "http://127.0.0.1:1/x", headers, body.as_bytes());
        if prepare::check(&request, &d).is_err() {
            return Ok(());
        }
        let built = prepare::build(&request, url::Url::parse(&request.url).unwrap(), &d, Some("tg1_key"));
        for (name, value) in &built.headers {
            prop_assert!(http::HeaderName::from_bytes(name.as_bytes()).is_ok(), "{:?}", name);
            prop_assert!(http::HeaderValue::from_str(value).is_ok(), "{:?}", value);
        }
        let count = |n: &str| built.headers.iter().filter(|(k, _)| k.eq_ignore_ascii_case(n)).count();
        prop_assert_eq!(count("idempotency-key"), 1);
        prop_assert_eq!(count("x-key"), 1);
        prop_assert_eq!(count("authorization"), 0);
        let pairs: Vec<(String, String)> = form_urlencoded::parse(&built.body).into_owned().collect();
        prop_assert_eq!(pairs.iter().filter(|(k, _)| k == "metadata[k]").count(), 1);
        prop_assert!(pairs.iter().any(|(k, v)| k == "metadata[k]" && v == "tg1_key"));
        Ok(())
    });
}

// --- The plugin → host boundary ---

#[test]
fn random_requests_through_a_plugin_are_answered_without_a_host_failure_and_never_leave_its_grants() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let h = rt.block_on(crate::payments::harness(crate::payments::Downstream { timeout_ms: 300, max_retries: 0, ..Default::default() }));
    let url = h.sandbox.url();
    let request = (
        prop::sample::select(vec!["POST", "GET", "HEAD", "PUT", "DELETE", "TRACE", "CONNECT", "post", "", "X\r\nY"]),
        prop::collection::vec(path_piece(), 0..5),
        prop::collection::vec(header(), 0..4),
        ".{0,32}",
        prop::sample::select(vec![
            url.clone(),
            url.replace("127.0.0.1", "localhost"),
            "http://example.com".into(),
            "file:///etc/passwd".into(),
            "not a url".into(),
        ]),
    );
    let n = std::sync::atomic::AtomicU64::new(0);
    check("plugin boundary", prop::collection::vec(request, 1..4), |requests| {
        let list: Vec<Value> = requests
            .into_iter()
            .map(|(method, pieces, headers, body, origin)| {
                let headers: Map<String, Value> = headers.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
                json!({ "method": method, "url": format!("{origin}/v1/refunds/{}", pieces.join("/")), "headers": headers, "body": body })
            })
            .collect();
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for tool in ["send_all", "fetch_all"] {
            // The host answers every call as what it is. `Runtime::call` turns a
            // panic of the host into an `internal` answer (and goes on serving),
            // so a panic shows here as that kind, not as a failed test thread.
            let answer = rt.block_on(h.call(&format!("b{i}-{tool}"), tool, &crate::payments::rogue_args(Value::Array(list.clone()), true)));
            if let Err(e) = &answer {
                prop_assert!(e.kind != toolguard::ErrorKind::Internal, "{tool}: the host failed on {list:?}: {}", e.message);
            }
        }
        for seen in h.sandbox.requests() {
            let path = as_a_lenient_server_reads_it(&seen.path);
            prop_assert!(path == "/v1/refunds" || path.starts_with("/v1/refunds/"), "{} {} left its grant", seen.method, seen.path);
            prop_assert!(matches!(seen.method.as_str(), "POST" | "GET" | "HEAD"), "{}", seen.method);
            prop_assert!(seen.headers.iter().all(|(k, _)| k != "authorization"), "no credential the plugin set");
        }
        Ok(())
    });
    // The host still serves a good call afterwards.
    rt.block_on(h.refund("after-fuzz", 1)).expect("the host still works");
}
