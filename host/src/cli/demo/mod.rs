//! `toolguard demo`: the seed scenario, narrated, on embedded defaults — the
//! payments sandbox in-process, the embedded refund plugin, timings scaled
//! down to finish in seconds. The demo checks its own counts and exits
//! non-zero if the sandbox ever saw more refunds than it should.

mod tasks;

use crate::error::CallError;
use crate::{CallOutput, CallRequest, Config, Runtime};
use toolguard_sandbox::{Fault, Mode, PaymentsConfig, Sandbox};

/// The payment intent the demo refunds against, and its amount in cents.
const PI: &str = "pi_demo";
const PI_AMOUNT: u64 = 5_000;
/// Our deadline for the provider, and how late its answer comes (scaled from 8 s / 30 s).
const DEADLINE_MS: u64 = 1_000;
const LATE_ANSWER_MS: u64 = 2_500;
/// How long we reconcile before answering, and how long the provider's
/// listing lags behind its writes in step 1 (longer: reconciliation cannot tell).
const RECONCILE_MS: u64 = 1_000;
const LIST_LAG_MS: u64 = 10_000;
/// The refund tool's spending limit: cents a UTC day, over every caller.
const DAILY_LIMIT: u64 = 4_500;

/// Runs the demo; returns the exit status.
pub async fn run() -> u8 {
    match demo().await {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            1
        }
    }
}

fn config_text(url: &str) -> String {
    let limit = format!(r#"limits = [{{ sum = "/amount_cents", max = {DAILY_LIMIT}, per = "everyone", window = "day" }}]"#);
    let payments = PaymentsConfig {
        timeout_ms: Some(DEADLINE_MS),
        reconcile_ms: Some(RECONCILE_MS),
        refund_policy: Some(limit),
        ..PaymentsConfig::new(url, "builtin:payments")
    };
    payments.toml()
}

/// Narrates the scenario; `Ok(false)` if a count came out wrong.
async fn demo() -> anyhow::Result<bool> {
    let sandbox = Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION).await?;
    sandbox.add_payment_intent(PI, PI_AMOUNT);
    let data = tempfile::tempdir()?;
    let config = Config::parse(&config_text(&sandbox.url()), "<demo config>", data.path())?;
    let runtime = std::sync::Arc::new(Runtime::from_config(&config).await?);
    let args = |amount: u64| format!(r#"{{"payment_intent":"{PI}","amount_cents":{amount},"reason":"requested_by_customer"}}"#);
    let mut ok = true;
    let mut expect = |what: &str, refunds: usize| {
        let n = sandbox.refunds().len();
        let mark = if n == refunds { "✓" } else { "✗ UNEXPECTED" };
        outln!("   {mark} refunds at the provider: {n} ({what})");
        ok &= n == refunds;
    };

    outln!("toolguard demo — a refund that times out after the provider accepted it is never refunded twice.");
    outln!("Provider: the payments sandbox at {} (Stripe semantics). Our deadline: {DEADLINE_MS} ms.\n", sandbox.url());

    outln!("1. The model calls refund({PI}, 1500) as tool call call_1. The provider commits the refund but");
    outln!("   answers only after {LATE_ANSWER_MS} ms, and its refund listing lags by {LIST_LAG_MS} ms, so reconciling");
    outln!("   for {RECONCILE_MS} ms cannot tell either.");
    sandbox.inject(Fault::DelayAfterCommit { ms: LATE_ANSWER_MS });
    sandbox.set_list_lag(std::time::Duration::from_millis(LIST_LAG_MS));
    call(&runtime, "call_1", &args(1_500)).await;
    expect("the provider did commit it", 1);

    outln!("\n2. In the background, a recovery pass (as every start-up, `toolguard recover` and a fleet's takeover");
    outln!("   pass run) re-sends call_1 with the same key: the provider replays its stored answer. call_1 is");
    outln!("   settled in our ledger, but the model was never told.");
    let report = runtime.recover().await.map_err(anyhow::Error::msg)?;
    let replayed =
        runtime.guard().and_then(|g| g.ledger().attempts_of_call("demo", "call_1").ok()).is_some_and(|a| a.first().is_some_and(|a| a.provider_replayed));
    outln!("   → recovery settled {} attempt(s) and minted no key; the provider answered with its stored", report.settled.len());
    outln!("     response (Idempotent-Replayed: {replayed})");
    expect("the same refund, replayed by the provider", 1);

    outln!("\n3. The model, having read an inconclusive result, re-issues the refund as a new tool call (call_1b).");
    let posts = count_posts(&sandbox);
    call(&runtime, "call_1b", &args(1_500)).await;
    outln!("   requests sent to the provider for it: {}", count_posts(&sandbox) - posts);
    expect("held, carrying call_1's real outcome: never executed blind", 1);

    outln!("\n4. The transport retries the same tool call (call_1): its send replays from our ledger.");
    let posts = count_posts(&sandbox);
    call(&runtime, "call_1", &args(1_500)).await;
    outln!("   requests sent to the provider for it: {}", count_posts(&sandbox) - posts);
    expect("the original refund, not a new one", 1);

    outln!("\n5. The agent resumes from a checkpoint and replays call_1b once more.");
    call(&runtime, "call_1b", &args(1_500)).await;
    expect("the same answer, from our ledger", 1);

    outln!("\n6. The customer is owed a goodwill refund: a genuinely new tool call (call_2), same arguments, made");
    outln!("   after the model was told how call_1 ended.");
    call(&runtime, "call_2", &args(1_500)).await;
    expect("a new tool-call id after a definitive answer is a new refund", 2);

    outln!("\n7. The model re-issues call_2 with mutated arguments (2500 instead of 1500).");
    let posts = count_posts(&sandbox);
    call(&runtime, "call_2", &args(2_500)).await;
    outln!("   requests sent to the provider for it: {}", count_posts(&sandbox) - posts);
    expect("a conflict, nothing sent", 2);

    outln!("\n8. call_3 refunds 500: the provider commits it but answers HTTP 500. The host reconciles before");
    outln!("   answering: it lists the payment's refunds (no lag now) and finds the one carrying the key.");
    sandbox.set_list_lag(std::time::Duration::ZERO);
    sandbox.inject(Fault::HiddenCommit500);
    call(&runtime, "call_3", &args(500)).await;
    expect("the real outcome, found by reconciliation", 3);

    outln!("\n9. An MCP client that opted into tasks (the 2026-07-28 Tasks extension) refunds 700 as call_4. The");
    outln!("   provider commits it and drops the connection, and its listing lags again: where call_1 got");
    outln!("   outcome-unknown, this client gets a task, and the host settles the call itself.");
    sandbox.set_list_lag(std::time::Duration::from_millis(LIST_LAG_MS));
    sandbox.inject(Fault::DropAfterCommit);
    tasks::run(runtime.clone(), &args(700)).await?;
    expect("one refund, its real outcome delivered through the task", 4);

    outln!("\n10. The policy limits refunds to {DAILY_LIMIT} cents a UTC day across every caller; 4200 are used");
    outln!("    (1500 + 1500 + 500 + 700: call_1b was held, and the conflict admitted nothing). call_5 asks for 500");
    outln!("    more, which the payment could still cover: refused before anything is sent.");
    let posts = count_posts(&sandbox);
    call(&runtime, "call_5", &args(500)).await;
    outln!("    requests sent to the provider for it: {}", count_posts(&sandbox) - posts);
    expect("over the daily limit, nothing sent", 4);

    outln!("\nThe provider's refunds:");
    for r in sandbox.refunds() {
        let key = r.metadata.get("toolguard_key").map_or("-", String::as_str);
        outln!("   {}  {} cents  {}  key {key}", r.id, r.amount, r.status);
    }
    outln!("\nOur ledger:");
    if let Some(guard) = runtime.guard() {
        for c in guard.ledger().calls(None)? {
            let state = if c.state == crate::ledger::CallState::Completed { "completed" } else { "admitted" };
            let role = if c.is_executor() { "" } else { ", held behind an identical call" };
            outln!("   tool call {} ({}, {state}{role}; the model was told: {})", c.call_id, c.tool, c.reported.as_str());
            for a in guard.ledger().attempts_of_call(&c.session, &c.call_id)? {
                let status = a.response.as_ref().map_or("-".to_string(), |r| r.status.to_string());
                let tries = if a.tries == 1 { "1 try".to_string() } else { format!("{} tries", a.tries) };
                outln!("     step {} key {} {} HTTP {status}, {tries}", a.step, a.key, a.state.as_str());
            }
        }
    }
    outln!("\n{}", if ok { "Every count as expected." } else { "Some counts were WRONG." });
    Ok(ok)
}

/// Makes a tool call, shows its answer to "the model", and then records
/// that the model was told it, as `toolguard call` and `serve` do.
async fn call(runtime: &Runtime, call_id: &str, args: &str) {
    let req = CallRequest { session: "demo".into(), call_id: call_id.into(), tool: "refund".into(), args_json: args.into(), principal: None, tenant: None };
    let answer = runtime.call(&req).await;
    show(&answer);
    runtime.report(&req, &answer).await;
}

fn show(result: &Result<CallOutput, CallError>) {
    match result {
        Ok(out) if out.replayed => outln!("   → {} (replayed from the ledger; no plugin ran)", out.value),
        Ok(out) => outln!("   → {}", out.value),
        Err(e) if e.detail.as_ref().is_some_and(|d| d["replayed"] == true) => {
            outln!("   → {}: {} (replayed from the ledger; no plugin ran)", e.kind, e.message);
        }
        Err(e) => outln!("   → {}: {}", e.kind, e.message),
    }
}

fn count_posts(sandbox: &Sandbox) -> usize {
    sandbox.requests().iter().filter(|r| r.method == "POST").count()
}
