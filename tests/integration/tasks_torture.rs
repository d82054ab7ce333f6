//! The kill -9 torture with tasks and approvals in the mix: `serve --http`
//! answers refunds to a client that opted into tasks and can ask its user;
//! a third of them need a person's approval, some meet a provider that
//! commits and then fails to say so, and the host is SIGKILLed at a random
//! moment of each. After a restart the client goes on as a real one would:
//! it polls the task it was given (approving when asked), or, never
//! answered, sends the same tool call again. At the provider: one refund per
//! trial, never two, none lost.
//!
//! `TOOLGUARD_TASKS_TORTURE_TRIALS` (default 30) and
//! `TOOLGUARD_TORTURE_SEED` as for the other tortures.

use crate::common::{Server, serve_http, shared_cache, wasm};
use crate::tasks::Client;
use crate::torture::{Rng, env_u64, seed};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use toolguard_sandbox::config::PaymentsConfig;
use toolguard_sandbox::{Fault, Mode, Sandbox};

/// Refunds above this many cents need a person's approval.
const LINE: u64 = 5_000;

fn config(dir: &Path, sandbox: &Sandbox) -> std::path::PathBuf {
    let payments = PaymentsConfig {
        timeout_ms: Some(1_000),
        reconcile_ms: Some(200),
        refund_policy: Some(format!(r#"approval = {{ above = {{ "/amount_cents" = {LINE} }}, expires_minutes = 30 }}"#)),
        ..PaymentsConfig::new(sandbox.url(), wasm("payments").display().to_string())
    };
    let text = format!(
        "data_dir = \"data\"\ncompile_cache = {:?}\n{}\n[mcp]\ntask_after_ms = 150\ntask_poll_ms = 100\n",
        shared_cache().display().to_string(),
        payments.toml()
    );
    let path = dir.join("tasks-torture.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Follows a task to its end as a client would, approving what it is asked
/// to: its final state, or `None` if the host went away meanwhile.
fn follow(client: &Client, task: &str) -> Value {
    let mut last = Value::Null;
    let ended = crate::world::wait_for(Duration::from_secs(60), || {
        last = client.task("get", task)["result"].clone();
        if last["status"] == "input_required" {
            let key = last["inputRequests"].as_object().and_then(|r| r.keys().next().cloned()).unwrap();
            client.answer(task, &key, json!({ "action": "accept", "content": { "approve": true } }));
        }
        ["completed", "failed", "cancelled"].contains(&last["status"].as_str().unwrap_or(""))
    });
    assert!(ended, "task {task} never ended: {last}");
    last
}

/// The refund a settled answer carries (a complete result, or a completed task's).
fn refund_of(answer: &Value) -> Option<String> {
    let result = if answer["status"] == "completed" { &answer["result"] } else { answer };
    result["structuredContent"]["refund_id"].as_str().map(str::to_string)
}

#[test]
fn tasks_torture_kill_9_with_tasks_and_approvals_never_duplicates_or_loses_a_refund() {
    let trials = env_u64("TOOLGUARD_TASKS_TORTURE_TRIALS").unwrap_or(30);
    let seed = seed();
    let mut rng = Rng(seed);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let sandbox = rt.block_on(Sandbox::start("127.0.0.1:0", Mode::Stripe, toolguard_sandbox::DEFAULT_RETENTION)).unwrap();
    sandbox.add_payment_intent("pi_mcp", u64::MAX / 4);
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), &sandbox);
    let mut server: Server = serve_http(&config, &[]);
    let (mut tasks, mut approvals, mut unanswered) = (0, 0, 0);
    for trial in 0..trials {
        let amount = if trial % 3 == 0 { LINE + 1 + trial } else { trial + 1 };
        approvals += usize::from(amount > LINE);
        let call_id = format!("k{trial}");
        match rng.below(4) {
            0 => sandbox.inject(Fault::DropAfterCommit),
            1 => sandbox.inject(Fault::HiddenCommit500),
            _ => {}
        }
        // The call, and a SIGKILL at a random moment of it (or just after it).
        let caller = Client::open(&server.url, None).eliciting();
        let kill_after = Duration::from_millis(rng.below(400));
        let answered = std::thread::scope(|scope| {
            // A call cut off by the kill has no answer: `None`.
            let call = scope.spawn(|| caller.try_refund(&call_id, amount, true).ok());
            std::thread::sleep(kill_after);
            server.child.kill().unwrap();
            server.child.wait().unwrap();
            call.join().unwrap()
        });
        sandbox.clear_faults();
        server = serve_http(&config, &[]);
        let client = Client::open(&server.url, None).eliciting();
        let end = match answered {
            Some(handle) if handle["resultType"] == "task" => {
                tasks += 1;
                follow(&client, handle["taskId"].as_str().unwrap())
            }
            Some(result) if result.get("content").is_some() && result["isError"] == false => result,
            // Never answered (or answered only with an unsettled result): the same tool call again.
            _ => {
                unanswered += 1;
                let again = client.refund(&call_id, amount, true);
                match again["taskId"].as_str() {
                    Some(task) => follow(&client, task),
                    None => again,
                }
            }
        };
        let made: Vec<_> = sandbox.refunds().into_iter().filter(|r| r.amount == amount).collect();
        assert_eq!(made.len(), 1, "trial {trial} (seed {seed}): {end}");
        assert_eq!(refund_of(&end).as_deref(), Some(made[0].id.as_str()), "trial {trial} (seed {seed}): the answer is the refund made: {end}");
    }
    println!("tasks torture (seed {seed}): {trials} trials, {tasks} answered with a task, {approvals} needing approval, {unanswered} sent again unanswered");
    println!("  refunds at the provider: {} for {trials} trials; duplicates = 0, lost = 0", sandbox.refunds().len());
    assert_eq!(sandbox.refunds().len() as u64, trials);
}
