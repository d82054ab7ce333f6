//! Spending limits through the real binary (`docs/policy.md`, "Limits"),
//! counted at the sandbox: a refund that would pass its limit sends
//! nothing; only an effect counts (a replay spends nothing more, a refund
//! the provider refuses gives its amount back); a limit on each call alone;
//! a limit on an argument the schema does not guarantee is refused at load.

use crate::payments::Downstream;
use crate::world::PI;
use crate::world::{World, torture_downstream};
use serde_json::json;

/// A world whose refunds may move at most `limit` (inline TOML) together.
fn limited(limit: &'static str) -> World {
    World::with(Downstream { refund_policy: Some(limit), ..torture_downstream() })
}

const DAILY_2000: &str = r#"limits = [{ sum = "/amount_cents", max = 2000, per = "session", window = "day" }]"#;

#[test]
fn a_refund_that_would_pass_the_daily_limit_sends_nothing_and_only_effects_count() {
    let w = limited(DAILY_2000);
    let (ok, out) = w.refund("c1", 1_500);
    assert!(ok, "{out}");
    let (ok, out) = w.refund("c2", 600);
    assert!(!ok, "1,500 + 600 passes 2,000: {out}");
    let message = out["message"].as_str().unwrap_or_default().to_string();
    assert_eq!(out["kind"], "denied", "{out}");
    assert!(
        message.contains("over a spending limit") && message.contains("1500 of 2000") && message.contains("would add 600"),
        "names the use and the addition: {message}"
    );
    assert!(w.posts_of(600).is_empty(), "nothing was sent for the refused refund");
    // To the edge exactly.
    let (ok, out) = w.refund("c3", 500);
    assert!(ok, "1,500 + 500 is the limit exactly: {out}");
    // A replay spends nothing more; the limit is still full.
    let (ok, out) = w.refund("c1", 1_500);
    assert!(ok, "{out}");
    assert!(!w.refund("c4", 1).0, "one cent more passes it");
    assert_eq!((w.refunds_of(1_500), w.refunds_of(500), w.refunds_of(600), w.refunds_of(1)), (1, 1, 0, 0), "the provider made exactly the admitted refunds");
}

#[test]
fn a_refund_the_provider_refuses_gives_its_amount_back() {
    let w = limited(DAILY_2000);
    // The provider refuses a refund of an unknown payment (a 4xx): no effect, so no use.
    let args = json!({ "payment_intent": "pi_nobody_knows", "amount_cents": 2_000, "reason": "duplicate" });
    let (ok, out, _) = w.call("c1", "refund", &args);
    assert!(!ok, "the provider refused it: {out}");
    assert_ne!(out["kind"], "denied", "refused by the provider, not by the limit: {out}");
    let (ok, out) = w.refund("c2", 2_000);
    assert!(ok, "the refused refund's 2,000 were given back: {out}");
    assert_eq!(w.refunds_of(2_000), 1);
    assert_eq!(w.sandbox.refunds().iter().filter(|r| r.payment_intent == PI).count(), 1);
}

#[test]
fn a_limit_on_each_call_refuses_a_larger_one_before_anything_is_recorded() {
    let w = limited(r#"limits = [{ sum = "/amount_cents", max = 1000, window = "call" }]"#);
    let (ok, out) = w.refund("c1", 1_500);
    assert!(!ok && out["kind"] == "denied", "{out}");
    assert!(out["message"].as_str().unwrap().contains("would move 1500"), "{out}");
    assert!(w.ledger().call(crate::world::SESSION, "c1").unwrap().is_none(), "nothing recorded");
    assert!(w.refund("c2", 1_000).0, "up to the limit runs");
    assert_eq!((w.refunds_of(1_500), w.refunds_of(1_000)), (0, 1));
}

#[test]
fn a_limit_must_sum_an_integer_the_input_schema_declares() {
    let said = |out: &std::process::Output| format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let w = limited(r#"limits = [{ sum = "/reason", max = 1000 }]"#);
    let out = w.toolguard(&["tools"]);
    assert!(!out.status.success(), "the plugin is refused at load: {}", said(&out));
    assert!(said(&out).contains("`/reason`, which the input schema must declare as integer (it says string)"), "{}", said(&out));
    let w = limited(r#"limits = [{ sum = "/amount_cents", max = 1000, window = "fortnight" }]"#);
    let out = w.toolguard(&["tools"]);
    assert!(!out.status.success() && said(&out).contains("fortnight"), "{}", said(&out));
}

#[test]
fn the_audit_shows_each_limit_and_a_review_calls_a_raised_or_removed_one_a_widening() {
    let w = limited(DAILY_2000);
    let out = w.toolguard(&["audit", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    crate::audit::assert_schema(&report);
    let refund = report["components"].as_array().unwrap().iter().flat_map(|c| c["tools"].as_array().unwrap()).find(|t| t["name"] == "refund").unwrap();
    assert_eq!(refund["spending_limits"], json!([{ "sum": "/amount_cents", "max": 2000, "per": "session", "window": "day", "currency": null }]));
    let text = String::from_utf8_lossy(&w.toolguard(&["audit"]).stdout).into_owned();
    assert!(text.contains("limit: sum of /amount_cents ≤ 2000 per session per day"), "{text}");
    // The same config with the limit raised, then removed: each a widening; lowered: a narrowing.
    let config = std::fs::read_to_string(&w.config).unwrap();
    let review = |edited: String| {
        let path = w.dir.path().join("new.toml");
        std::fs::write(&path, edited).unwrap();
        let out = std::process::Command::new(crate::common::BIN)
            .args(["audit", "--config", path.to_str().unwrap(), "--against", w.config.to_str().unwrap(), "--json"])
            .env("TOOLGUARD_LOG", "error")
            .output()
            .unwrap();
        let findings: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        findings.to_string()
    };
    assert!(review(config.replace("max = 2000", "max = 5000")).contains("spending-limit-widened"));
    assert!(review(config.replace(DAILY_2000, "")).contains("spending-limit-widened"));
    let lowered = review(config.replace("max = 2000", "max = 1000"));
    assert!(lowered.contains("spending-limit-narrowed") && !lowered.contains("spending-limit-widened"), "{lowered}");
}

/// `toolguard call` refunding `amount` under `call_id` on a clock moved by `skew_ms` (the tests' build only).
fn refund_at(w: &World, call_id: &str, amount: u64, skew_ms: i64) -> (bool, serde_json::Value) {
    let out = std::process::Command::new(crate::common::BIN)
        .args(["call", "--config", w.config.to_str().unwrap(), "--session", crate::world::SESSION, "--call-id", call_id, "refund"])
        .arg(format!(r#"{{"payment_intent":"{PI}","amount_cents":{amount},"reason":"duplicate"}}"#))
        .env("TOOLGUARD_LOG", "warn")
        .env("TOOLGUARD_CLOCK_SKEW_MS", skew_ms.to_string())
        .output()
        .unwrap();
    (out.status.success(), crate::common::stdout_json(&out))
}

#[test]
fn a_day_window_rolls_over_at_midnight_utc_and_the_operator_sees_the_use() {
    const DAY: i64 = 86_400_000;
    let w = limited(DAILY_2000);
    // Yesterday (the ledger's clock a day back): 1,500 of 2,000.
    assert!(refund_at(&w, "c1", 1_500, -DAY).0);
    assert!(!refund_at(&w, "c2", 600, -DAY).0, "yesterday's window is full past 500 more");
    // Today a new window: yesterday's use does not count.
    let (ok, out) = refund_at(&w, "c3", 2_000, 0);
    assert!(ok, "today's window starts empty: {out}");
    assert!(!refund_at(&w, "c4", 1, 0).0, "and is full now");
    assert_eq!((w.refunds_of(1_500), w.refunds_of(600), w.refunds_of(2_000), w.refunds_of(1)), (1, 0, 1, 0));
    // The operator's view: today's window holds 2,000 in one call (yesterday's has ended).
    let out = w.toolguard(&["ledger", "limits", "--json"]);
    let uses = crate::common::stdout_json(&out);
    let uses = uses.as_array().unwrap_or_else(|| panic!("{uses}"));
    assert_eq!(uses.len(), 1, "{uses:?}");
    assert_eq!((uses[0]["used"].as_u64(), uses[0]["calls"].as_u64()), (Some(2_000), Some(1)), "{uses:?}");
    assert_eq!(uses[0]["limit"][2], "refund", "names its tool: {uses:?}");
    assert!(uses[0]["window_ends"].as_str().unwrap().ends_with("T00:00:00+00:00"), "at midnight UTC: {uses:?}");
}

/// 64 refunds at once (100–163 cents, 8,416 in all) against a limit of
/// 5,000 a day across every caller, which the payment (10,000) would not
/// bind: the provider's refunds never sum past the limit, and every refund
/// it made is one the host answered as made. On the ledger `./dev.sh test`
/// gives the harness (RocksDB). The harness's plugin also has a per-session
/// budget, whose lock serialises these admissions too: the limit's own
/// lock is shown needed by the ledger's two-host race on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_refunds_at_once_never_pass_the_limit() {
    const CALLS: u64 = 64;
    let limit = r#"limits = [{ sum = "/amount_cents", max = 5000, per = "everyone", window = "day" }]"#;
    let h = std::sync::Arc::new(crate::payments::harness(Downstream { refund_policy: Some(limit), ..torture_downstream() }).await);
    let calls: Vec<_> = (0..CALLS)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move { (100 + i, h.refund(&format!("r{i}"), 100 + i).await) })
        })
        .collect();
    let mut answered_made = 0u64;
    let mut refused = 0;
    for call in calls {
        match call.await.unwrap() {
            (amount, Ok(_)) => answered_made += amount,
            (_, Err(e)) if e.kind == toolguard::ErrorKind::Denied && e.message.contains("over a spending limit") => refused += 1,
            (_, Err(e)) => panic!("{e}"),
        }
    }
    let made: u64 = h.sandbox.refunds().iter().map(|r| r.amount).sum();
    assert!(made <= 5_000, "the provider made {made} cents of refunds under a limit of 5,000");
    assert_eq!(made, answered_made, "every refund made was answered as made, and no other");
    assert!(made > 5_000 - 163 && refused > 0, "the limit was filled to its edge ({made}), then refused ({refused})");
}

/// A reload that changes a limit applies it to the calls that come after
/// it, against the uses already counted: lowered below the use, the next
/// call is refused; raised, it runs. Through `toolguard reload` of a
/// serving host, counted at the sandbox.
#[test]
fn a_reload_that_changes_a_limit_applies_to_new_calls_against_the_use_counted() {
    use crate::reload::{Host, refund};
    let limit = |max: u32| -> &'static str { Box::leak(format!("limits = [{{ max = {max}, per = \"everyone\", window = \"day\" }}]").into_boxed_str()) };
    let d = |max| Downstream { refund_policy: Some(limit(max)), ..Downstream::default() };
    let host = Host::start(&d(3), "", &[]);
    let client = std::sync::Arc::new(host.rt.block_on(toolguard::mcp::client::McpClient::connect(&host.url)).unwrap());
    let call = |session: &str, call_id: &str| host.rt.block_on(refund(&client, session, call_id));
    assert_eq!(call("a", "r1")["isError"], false);
    assert_eq!(call("b", "r2")["isError"], false);
    let before = host.payments_policy();
    host.rewrite(&d(2), "");
    let (report, ok) = host.reload();
    assert!(ok, "{report:#}");
    assert_ne!(host.payments_policy(), before, "a limit is part of the effective policy");
    let refused = call("c", "r3");
    let message = refused["structuredContent"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("over a spending limit") && message.contains("calls ≤ 2") && message.contains("2 of 2"), "{refused}");
    host.rewrite(&d(5), "");
    assert!(host.reload().1);
    assert_eq!(call("c", "r4")["isError"], false, "raised: room again");
    assert_eq!(host.sandbox.refunds().len(), 3, "the provider made the three admitted refunds");
}

/// A limit counts the call's argument; bound to the request field the
/// amount travels in (`sent_as`), a plugin cannot say one amount and send
/// another. The hostile `rogue` plugin, its `send_all` limited on its
/// `amount_cents` argument: a request moving more than the argument, or
/// leaving the amount out (a full refund, at Stripe), is refused before it
/// leaves; the honest one goes; the honest payments plugin is unaffected.
#[test]
fn a_plugin_cannot_send_another_amount_than_the_one_its_limit_counted() {
    let bound = r#"limits = [{ sum = "/amount_cents", max = 2000, per = "session", window = "day", sent_as = "amount" }]"#;
    let rogue = r#"
[policy.plugins.rogue.tools]
send_all = { effect = "irreversible", limits = [{ sum = "/amount_cents", max = 2000, per = "session", window = "day", sent_as = "amount" }] }
"#;
    let w = World::with_extra(Downstream { refund_policy: Some(bound), ..torture_downstream() }, rogue);
    assert!(w.refund("c1", 500).0, "the payments plugin sends the amount it was given");
    let url = format!("{}/v1/refunds", w.sandbox.url());
    let send = |call_id: &str, counted: u64, body: &str| {
        let request = json!({ "method": "POST", "url": url, "body": body, "headers": { "Content-Type": "application/x-www-form-urlencoded" } });
        w.call(call_id, "send_all", &json!({ "amount_cents": counted, "requests": [request] }))
    };
    let (ok, out, _) = send("r1", 1, &format!("payment_intent={PI}&amount=1500&reason=duplicate"));
    assert!(!ok, "says 1, sends 1,500: {out}");
    let message = out["message"].as_str().unwrap_or_default();
    assert!(message.contains("the call's argument is 1, but this request carries 1500 as `amount`"), "{out}");
    let (ok, out, _) = send("r2", 1, &format!("payment_intent={PI}&reason=duplicate"));
    assert!(!ok && out["message"].as_str().unwrap_or_default().contains("carries nothing readable"), "leaves the amount out: {out}");
    assert!(w.posts_of(1_500).is_empty() && w.sandbox.refunds().iter().all(|r| r.amount == 500), "nothing the plugin lied about reached the provider");
    let (ok, out, _) = send("r3", 7, &format!("payment_intent={PI}&amount=7&reason=duplicate"));
    assert!(ok, "the amount it was given: {out}");
    assert_eq!((w.refunds_of(500), w.refunds_of(7), w.sandbox.refunds().len()), (1, 1, 2));
}
