//! Policy parsing and request authorisation against hostile paths.

use super::*;

fn downstreams() -> Downstreams {
    let raw = RawDownstream { url: "http://127.0.0.1:4242".into(), ..RawDownstream::default() };
    BTreeMap::from([("pay".to_string(), Arc::new(Downstream::from_raw("pay", raw, Path::new(".")).unwrap()))])
}

fn grant(methods: &[&str], prefix: &str) -> Grant {
    Grant { downstream: "pay".into(), methods: methods.iter().map(|m| m.to_string()).collect(), path_prefix: prefix.into(), allow_encoded_path: false }
}

#[test]
fn grants_match_origin_method_and_path_prefix_by_segment() {
    let g = [grant(&["POST"], "/v1/refunds")];
    let d = downstreams();
    assert!(authorize(&g, &d, "post", "http://127.0.0.1:4242/v1/refunds").is_ok());
    assert!(authorize(&g, &d, "POST", "http://127.0.0.1:4242/v1/refunds/re_1?x=1").is_ok());
    for (method, url) in [
        ("GET", "http://127.0.0.1:4242/v1/refunds"),
        ("POST", "http://127.0.0.1:4242/v1/refundsX"),
        ("POST", "http://127.0.0.1:4242/v1/charges"),
        ("POST", "http://127.0.0.1:4243/v1/refunds"),
        ("POST", "https://127.0.0.1:4242/v1/refunds"),
        ("POST", "http://localhost:4242/v1/refunds"),
        ("POST", "http://127.0.0.1:4242/v1/refunds/../charges"),
    ] {
        assert!(matches!(authorize(&g, &d, method, url), Err(Refusal::Denied(_))), "{method} {url}");
    }
    assert!(matches!(authorize(&g, &d, "POST", "/v1/refunds"), Err(Refusal::Invalid(_))));
    assert!(matches!(authorize(&g, &d, "POST", "http://u:p@127.0.0.1:4242/v1/refunds"), Err(Refusal::Invalid(_))));
    assert!(matches!(authorize(&[], &d, "GET", "http://127.0.0.1:4242/"), Err(Refusal::Denied(_))));
}

#[test]
fn paths_that_could_be_read_as_another_path_are_refused_unless_the_grant_allows_them() {
    let g = [grant(&["POST"], "/v1/refunds")];
    let d = downstreams();
    let base = "http://127.0.0.1:4242";
    for path in [
        "/v1/refunds/..%2Fcharges",
        "/v1/refunds/..%2fcharges",
        "/v1/refunds/..;/charges",
        "/v1/refunds;jsessionid=1/../charges",
        "/v1/refunds/%2e%2e/charges",
        "/v1/refunds/.%2E/charges",
        "/v1/refunds\\..\\charges",
        "/v1/refunds/..%5Ccharges",
        "/v1/refunds/%252e%252e/charges",
        "/v1/refunds/re_1%00",
        "/v1/refunds%2F..%2Fcharges",
    ] {
        let url = format!("{base}{path}");
        assert!(matches!(authorize(&g, &d, "POST", &url), Err(Refusal::Denied(_))), "{path}: {:?}", authorize(&g, &d, "POST", &url));
    }
    // Encodings that do not change the path's structure are compared decoded.
    assert!(authorize(&g, &d, "POST", &format!("{base}/v1/%72efunds/re_1")).is_ok());
    assert!(authorize(&g, &d, "POST", &format!("{base}/v1/refunds/re%20one")).is_ok());
    // A reviewer may let a grant carry encoded separators, never climb out of it.
    let open = [Grant { allow_encoded_path: true, ..grant(&["POST"], "/v1/refunds") }];
    assert!(authorize(&open, &d, "POST", &format!("{base}/v1/refunds/a%2Fb")).is_ok());
    assert!(matches!(authorize(&open, &d, "POST", &format!("{base}/v1/refunds/..%2Fcharges")), Err(Refusal::Denied(_))));
}

#[test]
fn grants_list_real_methods_only_and_header_names_are_checked() {
    let policy = |methods: &str| {
        let text = format!("[downstreams.pay]\nurl = \"http://127.0.0.1:1\"\n[[plugins.p.grants]]\ndownstream = \"pay\"\nmethods = {methods}\n");
        Policy::from_raw(toml::from_str(&text).unwrap(), Path::new("."))
    };
    assert!(policy(r#"["POST", "GET"]"#).is_ok());
    for bad in [r#"["TRACE"]"#, r#"["CONNECT"]"#, r#"["post"]"#, r#"["FOO"]"#, "[]"] {
        let (field, message) = policy(bad).unwrap_err();
        assert_eq!(field, "plugins.p.grants[0].methods", "{bad}");
        assert!(message.contains("never TRACE or CONNECT"), "{message}");
    }
    let header = |name: &str| {
        let raw = RawDownstream { url: "http://127.0.0.1:1".into(), key: Some(vec![KeyTransport::Header { name: name.into() }]), ..RawDownstream::default() };
        Downstream::from_raw("d", raw, Path::new("."))
    };
    assert!(header("Idempotency-Key").is_ok());
    assert_eq!(header("Bad Header\r\n").unwrap_err().0, "key[0].name");
    let query = |name: &str| {
        let raw = RawDownstream { url: "http://127.0.0.1:1".into(), key: Some(vec![KeyTransport::Query { name: name.into() }]), ..RawDownstream::default() };
        Downstream::from_raw("d", raw, Path::new("."))
    };
    assert!(query("idempotency_key").is_ok());
    assert_eq!(query("").unwrap_err(), ("key[0].name".to_string(), "must not be empty".to_string()));
}

#[test]
fn an_effective_policy_is_recorded_as_the_grant_history_always_recorded_it() {
    // The grant history compares each new entry with the last one: the
    // record must keep the shape entries written before it had, or every
    // host would write a spurious change at its next start.
    let text = r#"
[downstreams.pay]
url = "https://api.pay.example/base"
credential = { env = "TOOLGUARD_TEST_UNSET_CREDENTIAL", prefix = "Bearer " }
[downstreams.local]
url = "http://127.0.0.1:4242"
[plugins.p]
max_sends_per_call = 3
max_irreversible_calls_per_session_hour = 5
[plugins.p.tools]
refund = { effect = "irreversible" }
[[plugins.p.grants]]
downstream = "pay"
methods = ["POST"]
path_prefix = "/v1/refunds"
[[plugins.p.grants]]
downstream = "local"
"#;
    let policy = Policy::from_raw(toml::from_str(text).unwrap(), Path::new("/cfg")).unwrap();
    let tools = vec![ToolClass { name: "refund".into(), effect: Effect::Irreversible, reviewed: true }];
    let effective = EffectivePolicy::of(&policy.plugins["p"], tools, &policy.downstreams);
    let expected = serde_json::json!({
        "tools": [{ "name": "refund", "effect": "irreversible", "reviewed": true }],
        "grants": [
            { "downstream": "pay", "url": "https://api.pay.example/base/v1/refunds", "methods": ["POST"], "allow_encoded_path": false,
              "max_request_bytes": DEFAULT_MAX_REQUEST_BYTES, "transport": "https", "proxy": null,
              "tls": { "platform_roots": true, "ca_file": null, "client_certificate": null, "spki_pins": 0, "min_version": "1.2" } },
            { "downstream": "local", "url": "http://127.0.0.1:4242/", "methods": ["GET", "HEAD"], "allow_encoded_path": false,
              "max_request_bytes": DEFAULT_MAX_REQUEST_BYTES, "transport": "http (loopback)", "proxy": null, "tls": null },
        ],
        "credentials": [{ "downstream": "pay", "header": "Authorization", "source": "env:TOOLGUARD_TEST_UNSET_CREDENTIAL" }],
        "budgets": { "max_sends_per_call": 3, "max_irreversible_calls_per_session_hour": 5, "max_irreversible_calls_per_principal_hour": null },
    });
    assert_eq!(effective.to_record(), expected);
    assert_eq!(&*effective.rules, policy.plugins["p"].grants.as_slice(), "requests are authorised against the reviewer's grants");
}

#[test]
fn an_action_is_declared_for_irreversible_tools_only_as_json_pointers() {
    let with = |tool: &str| {
        let text = format!("[plugins.p.tools]\n{tool}\n");
        Policy::from_raw(toml::from_str(&text).unwrap(), Path::new("/cfg"))
    };
    let policy = with(r#"refund = { effect = "irreversible", action = ["/payment_intent", "/amount_cents"] }"#).unwrap();
    assert_eq!(policy.plugins["p"].actions["refund"].pointers(), ["/payment_intent", "/amount_cents"]);
    assert!(with(r#"refund = { effect = "irreversible" }"#).unwrap().plugins["p"].actions.is_empty(), "by default, all the arguments");
    let (field, why) = with(r#"status = { effect = "read-only", action = ["/id"] }"#).unwrap_err();
    assert_eq!(field, "plugins.p.tools.status.action");
    assert!(why.contains("irreversible") && why.contains("read-only"), "{why}");
    let (_, why) = with(r#"refund = { effect = "irreversible", action = ["amount_cents"] }"#).unwrap_err();
    assert!(why.contains("start it with `/`"), "{why}");
    assert!(with(r#"refund = { effect = "irreversible", action = [] }"#).is_err());
}

#[test]
fn approval_and_repeat_confirmation_are_for_irreversible_tools_only() {
    let with = |tool: &str| {
        let text = format!("[plugins.p.tools]\n{tool}\n");
        Policy::from_raw(toml::from_str(&text).unwrap(), Path::new("/cfg"))
    };
    let policy = with(r#"refund = { effect = "irreversible", approval = { above = { "/amount_cents" = 100 } }, confirm_repeat_within_minutes = 15 }"#).unwrap();
    assert_eq!(policy.plugins["p"].confirm_repeats["refund"], 15);
    assert_eq!(policy.plugins["p"].approvals["refund"].above, [("/amount_cents".to_string(), 100.0)]);
    for (setting, field) in [("approval = { always = true }", "approval"), ("confirm_repeat_within_minutes = 5", "confirm_repeat_within_minutes")] {
        let (at, why) = with(&format!(r#"status = {{ effect = "idempotent", {setting} }}"#)).unwrap_err();
        assert_eq!(at, format!("plugins.p.tools.status.{field}"));
        assert!(why.contains("irreversible") && why.contains("`status` is idempotent"), "{why}");
    }
    let (at, why) = with(r#"refund = { effect = "irreversible", confirm_repeat_within_minutes = 0 }"#).unwrap_err();
    assert_eq!((at.as_str(), why.contains("at least 1")), ("plugins.p.tools.refund.confirm_repeat_within_minutes", true));
    let (at, why) = with(r#"refund = { effect = "irreversible", approval = {} }"#).unwrap_err();
    assert_eq!((at.as_str(), why.contains("say when")), ("plugins.p.tools.refund.approval", true));
}
