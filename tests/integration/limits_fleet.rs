//! A spending limit under a race, through the real binaries: two `toolguard
//! serve --http` processes over one PostgreSQL ledger, and one over
//! RocksDB, each given 64 different refunds at once at the edge of one
//! limit across every caller, counted at the sandbox. The sum the provider made never passes the limit; every refund
//! made was answered as made; every refusal names the limit, and was right
//! to refuse (it would not have fit in what was finally used).

use crate::common::{Mcp, serve_http};
use crate::fleet::processes;
use crate::payments::{Downstream, PI, config_text};
use toolguard_sandbox::{Mode, Sandbox};

/// Cents every caller of `refund` may move together today.
const LIMIT: u64 = 10_000;

/// What a race of 64 different refunds made, each answer checked: the
/// amounts made, the amounts refused, and the provider's sum.
struct Raced {
    made: Vec<u64>,
    refused: Vec<u64>,
    total: u64,
}

/// 64 different refunds at once at the edge of the limit, through 8 MCP
/// connections spread over the hosts at `urls`, counted at `sandbox`.
fn race(urls: &[String], sandbox: &Sandbox) -> Raced {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let answers = rt.block_on(async {
        let mut clients = Vec::new();
        for i in 0..8 {
            clients.push(std::sync::Arc::new(Mcp::connect(&urls[i % urls.len()]).await));
        }
        let calls = (0..64u64).map(|i| {
            let client = clients[(i % 8) as usize].clone();
            // 700 + i cents: 64 of them sum to 46,816, far past the limit.
            async move { (700 + i, client.refund(&format!("f{i}"), 700 + i).await) }
        });
        futures_util::future::join_all(calls).await
    });
    let (mut made, mut refused) = (Vec::new(), Vec::new());
    for (amount, answer) in answers {
        let answer = answer.unwrap_or_else(|e| panic!("refund of {amount}: {e}"));
        if answer["isError"] == false {
            assert_eq!(answer["structuredContent"]["amount_cents"], amount, "{answer}");
            made.push(amount);
        } else {
            let e = &answer["structuredContent"];
            assert_eq!(e["kind"], "denied", "refund of {amount}: {answer}");
            assert!(e["message"].as_str().is_some_and(|m| m.contains("over a spending limit")), "{answer}");
            refused.push(amount);
        }
    }
    let provider: Vec<u64> = sandbox.refunds().iter().map(|r| r.amount).collect();
    let total: u64 = provider.iter().sum();
    println!("limit race over {} host(s): {} made ({total} of {LIMIT} cents), {} refused", urls.len(), made.len(), refused.len());
    assert!(total <= LIMIT, "the provider made {total} cents of refunds past a limit of {LIMIT}: {provider:?}");
    made.sort_unstable();
    let mut at_provider = provider;
    at_provider.sort_unstable();
    assert_eq!(made, at_provider, "each refund made was answered as made, and nothing else was made");
    assert!(!refused.is_empty(), "46,816 cents cannot fit in {LIMIT}");
    for amount in &refused {
        assert!(total + amount > LIMIT, "a refund of {amount} was refused though it fits beside the {total} finally made");
    }
    Raced { made, refused, total }
}

/// The limit, across every caller; no per-session budget (its own lock
/// would queue these admissions and hide the limit's).
fn limited() -> Downstream {
    let policy = r#"limits = [{ sum = "/amount_cents", max = 10000, per = "everyone", window = "day" }]"#;
    Downstream { refund_policy: Some(policy), refunds_per_session_hour: 0, ..Downstream::default() }
}

#[test]
fn sixty_four_refunds_from_two_hosts_at_a_limits_edge_never_pass_it() {
    let p = processes(limited());
    // A payment that covers every one of them: only the limit may refuse.
    p.sandbox.add_payment_intent(PI, 1_000_000);
    let urls: Vec<String> = p.servers.iter().map(|s| s.url.clone()).collect();
    let Raced { made, total, .. } = race(&urls, &p.sandbox);
    // The fleet view (`ledger stats` on either host's config): the one limit's use, both hosts' together.
    let out = std::process::Command::new(crate::common::BIN)
        .args(["ledger", "stats", "--json", "--config", p.config(1).to_str().unwrap()])
        .env("TOOLGUARD_LOG", "error")
        .output()
        .unwrap();
    let stats = crate::common::stdout_json(&out);
    let limits = stats["limits"].as_array().unwrap_or_else(|| panic!("{stats}"));
    assert_eq!(limits.len(), 1, "{stats}");
    assert_eq!((limits[0]["used"].as_u64(), limits[0]["calls"].as_u64()), (Some(total), Some(made.len() as u64)), "{stats}");
    assert_eq!(limits[0]["limit"][4], serde_json::json!(["everyone"]), "{stats}");
}

#[test]
fn sixty_four_refunds_in_flight_on_one_host_over_rocksdb_never_pass_the_limit() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent(PI, 1_000_000);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("host.toml");
    std::fs::write(&config, config_text(&sandbox.url(), &dir.path().join("data"), &limited())).unwrap();
    let server = serve_http(&config, &[]);
    let Raced { made, refused, .. } = race(std::slice::from_ref(&server.url), &sandbox);
    assert_eq!(made.len() + refused.len(), 64);
}
