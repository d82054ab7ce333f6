//! What (b) is built from — the provider, the host, the calls, what bounds
//! them besides the disk — and (c) the guard's CPU path alone; (e) replays
//! of a completed call. (b) itself, guarded against unguarded, is in
//! [`super::unguarded`].

use super::disk::Bound;
use super::{Figure, Scale, Stats, ms, us};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use toolguard::keys;
use toolguard::ledger::records::{AttemptRecord, CallRecord, StoredBody, StoredRequest};
use toolguard::ledger::{Durability, Ledger, LedgerWrite, Prior};
use toolguard::{CallRequest, Config, Runtime};

/// A provider that answers every refund at once with the same object.
pub(crate) async fn null_provider() -> anyhow::Result<String> {
    let body = json!({ "id": "re_bench", "object": "refund", "amount": 1, "currency": "usd",
        "payment_intent": "pi_bench", "reason": "duplicate", "status": "succeeded", "metadata": {}, "created": 0 })
    .to_string();
    let app = axum::Router::new().route(
        "/v1/refunds",
        axum::routing::post(move || {
            let body = body.clone();
            async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        toolguard::mcp::listen::serve_on(listener, app, toolguard::config::McpConfig::default().max_connections).await;
    });
    Ok(url)
}

/// The config of a host with the payments plugin granted `provider`, its
/// data in `data_dir` (relative to the config's directory).
pub(crate) fn refund_config(provider: &str) -> String {
    refund_config_with(provider, None)
}

/// [`refund_config`] with more of the refund's policy (inline-table entries).
pub(crate) fn refund_config_with(provider: &str, refund_policy: Option<String>) -> String {
    use toolguard_sandbox::config::{KEY_HEADER_ONLY, PaymentsConfig};
    let payments = PaymentsConfig { methods: vec!["POST"], key: KEY_HEADER_ONLY.into(), refund_policy, ..PaymentsConfig::new(provider, "builtin:payments") };
    format!("data_dir = \"data\"\n[engine]\npool_instances = 320\n{}", payments.toml())
}

/// A host with the payments plugin granted `provider`, its data in `dir`.
pub(crate) async fn refund_host(dir: &Path, provider: &str) -> anyhow::Result<Runtime> {
    let config = Config::parse(&refund_config(provider), "<bench>", dir)?;
    Ok(Runtime::from_config(&config).await?)
}

pub(crate) fn refund(call_id: String, amount: usize) -> CallRequest {
    CallRequest {
        session: "bench".into(),
        call_id,
        tool: "refund".into(),
        args_json: format!(r#"{{"payment_intent":"pi_bench","amount_cents":{},"reason":"duplicate"}}"#, amount % 1_000_000 + 1),
        principal: None,
        tenant: None,
    }
}

/// Runs `total` calls made by `in_flight` concurrent workers; their latencies
/// and the wall time.
pub(crate) async fn drive<F, Fut>(in_flight: usize, total: usize, call: F) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let call = Arc::new(call);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..in_flight)
        .map(|_| {
            let (call, next) = (call.clone(), next.clone());
            tokio::spawn(async move {
                let mut samples = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return Ok::<_, String>(samples);
                    }
                    let t = Instant::now();
                    call(i).await?;
                    samples.push(t.elapsed());
                }
            })
        })
        .collect();
    let mut samples = Vec::with_capacity(total);
    for w in workers {
        samples.extend(w.await?.map_err(|e| anyhow::anyhow!(e))?);
    }
    Ok((samples, started.elapsed()))
}

/// What bounds (b) besides the disk: the ledger's synced write of a call and
/// its first attempt (the one synced write of a guarded call), and bare HTTP
/// requests to the provider (no plugin, no ledger), at 1 and 64 in flight.
pub(crate) async fn baselines(ledger_dir: &Path, provider: &str, bound: &Bound, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let ledger = Ledger::open(ledger_dir)?;
    let n = scale.n(300);
    let mut writes = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<Duration>> {
        let mut samples = Vec::with_capacity(n);
        for i in 0..n {
            let (call, attempt) = first_write(&ledger, i);
            let t = Instant::now();
            ledger.commit(LedgerWrite::new().call(call).attempt_over(attempt, Prior::Absent), Durability::Synced)?;
            samples.push(t.elapsed());
        }
        Ok(samples)
    })
    .await??;
    let write = Stats::of(&mut writes);
    let client = reqwest::Client::new();
    let url = format!("{provider}/v1/refunds");
    let mut figures = vec![
        Figure::new("(b) baseline: ledger's synced write (call + attempt), p50", ms(write.p50), "ms")
            .against("one fsync (a)", ms(write.p50) / ms(bound.sync.p50)),
    ];
    for in_flight in [1usize, 64] {
        let (client, url) = (client.clone(), url.clone());
        let total = scale.n(if in_flight == 1 { 300 } else { 5_000 });
        let (mut samples, wall) = drive(in_flight, total, move |_| {
            let request = client.post(&url).body("amount=1");
            async move {
                let response = request.send().await.map_err(|e| e.to_string())?;
                response.bytes().await.map(|_| ()).map_err(|e| e.to_string())
            }
        })
        .await?;
        let label = |what: &str| format!("(b) baseline: bare HTTP POST, {in_flight:>2} in flight, {what}");
        figures.push(if in_flight == 1 {
            Figure::new(label("p50"), ms(Stats::of(&mut samples).p50), "ms")
        } else {
            let per_sec = total as f64 / wall.as_secs_f64();
            Figure::new(label("req/s"), per_sec, "req/s").against("batched-fsync bound (a)", per_sec / bound.records_per_sec(64))
        });
    }
    Ok(figures)
}

/// A tool call's record and its first attempt, as a guarded call writes them.
fn first_write(ledger: &Ledger, i: usize) -> (CallRecord, AttemptRecord) {
    let args = json!({ "payment_intent": "pi_bench", "amount_cents": i + 1, "reason": "duplicate" });
    let digest = keys::args_digest(&keys::canonical_args(&args).expect("plain JSON canonicalises"));
    let call = CallRecord::admitted("bench".into(), format!("w{i}"), "refund".into(), digest, args);
    let attempt = attempt(ledger, &call);
    (call, attempt)
}

/// A fresh pending attempt of a refund call, its key minted, as the guard builds it.
fn attempt(ledger: &Ledger, call: &CallRecord) -> AttemptRecord {
    let request = StoredRequest {
        method: "POST".into(),
        url: "http://127.0.0.1:1/v1/refunds".into(),
        headers: vec![],
        body: StoredBody::from_bytes(b"payment_intent=pi_bench&amount=1500"),
    };
    let input = keys::KeyInput { session: &call.session, call_id: &call.call_id, tool: &call.tool, args_digest: &call.args_digest, step: 0, generation: 0 };
    let key = keys::mint(ledger.secret(), input);
    let fingerprint = keys::request_fingerprint(&request.method, &request.url, &request.headers, b"payment_intent=pi_bench&amount=1500");
    let send = toolguard::ledger::records::PlannedSend { step: 0, generation: 0, fingerprint, downstream: "payments".into(), request };
    AttemptRecord::pending(call, key, send)
}

/// (c): canonicalise, digest, mint, encode and an unsynced put, per call.
///
/// # Errors
/// The scratch ledger cannot be opened or written.
pub async fn cpu_path(dir: &Path, bound: &Bound, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let scratch = tempfile::tempdir_in(dir)?;
    let ledger = Ledger::open(&scratch.path().join("ledger"))?;
    let n = scale.n(super::described::C_ROUNDS);
    let per_call = tokio::task::spawn_blocking(move || -> anyhow::Result<Duration> {
        let args = json!({ "payment_intent": "pi_bench", "amount_cents": 1500, "reason": "requested_by_customer" });
        // The guard holds the call's record already; each call here differs in its id.
        let mut call = CallRecord::admitted("bench".into(), String::new(), "refund".into(), String::new(), args.clone());
        let started = Instant::now();
        for i in 0..n {
            let canonical = keys::canonical_args(&args).map_err(anyhow::Error::msg)?;
            call.call_id = format!("c{i}");
            call.args_digest = keys::args_digest(&canonical);
            let attempt = attempt(&ledger, &call);
            ledger.commit(LedgerWrite::new().attempt_over(attempt, Prior::Absent), Durability::Buffered)?;
        }
        Ok(started.elapsed() / n as u32)
    })
    .await??;
    Ok(vec![
        Figure::new("(c) guard CPU path per call (canonicalise … unsynced put)", us(per_call), "µs")
            .against("one fsync (a)", per_call.as_secs_f64() / bound.sync.p50.as_secs_f64())
            .target("≤ 20 µs", us(per_call) <= 20.0),
    ])
}

/// (e): replays of completed tool calls, 8 in flight: warm (the same call,
/// answered from the guard's cache of completed calls) and cold (each of
/// many calls once, by a fresh host that must read the ledger).
///
/// # Errors
/// Set-up failed or a replay failed.
pub async fn replays(dir: &Path, bound: &Bound, scale: Scale) -> anyhow::Result<Vec<Figure>> {
    let provider = null_provider().await?;
    let scratch = tempfile::tempdir_in(dir)?;
    let distinct = scale.n(super::described::E_COLD);
    let runtime = Arc::new(refund_host(scratch.path(), &provider).await?);
    let rt = runtime.clone();
    drive(8, distinct, move |i| {
        let rt = rt.clone();
        async move { call_as_a_client(&rt, &refund(format!("e{i}"), i)).await.map(|_| ()) }
    })
    .await?;
    let total = scale.n(super::described::E_WARM);
    let rt = runtime.clone();
    let (_, wall) = drive(8, total, move |_| replay(rt.clone(), refund("e0".into(), 0))).await?;
    let warm = total as f64 / wall.as_secs_f64();
    drop(runtime);

    // A fresh host over the same ledger: every replay reads it.
    let runtime = Arc::new(refund_host(scratch.path(), &provider).await?);
    let rt = runtime.clone();
    let (_, wall) = drive(8, distinct, move |i| replay(rt.clone(), refund(format!("e{i}"), i))).await?;
    let cold = distinct as f64 / wall.as_secs_f64();
    Ok(vec![
        Figure::new("(e) replays of a completed call, warm (no plugin, no ledger read)", warm, "replays/s")
            .against("synced appends/s (a)", warm / bound.appends_per_sec)
            .target("≥ 100k/s", warm >= 100_000.0),
        Figure::new("(e) replays of completed calls, cold (a ledger read each)", cold, "replays/s")
            .against("synced appends/s (a)", cold / bound.appends_per_sec),
    ])
}

/// One call as a client makes it: the call, then the record that its answer
/// reached the caller (what `toolguard call` and `serve` do after writing
/// it). Returns how long the answer took: what the caller waited for.
pub(crate) async fn call_as_a_client(rt: &Runtime, request: &CallRequest) -> Result<Duration, String> {
    let started = Instant::now();
    let answer = rt.call(request).await;
    let to_answer = started.elapsed();
    rt.report(request, &answer).await;
    answer.map(|_| to_answer).map_err(|e| e.to_string())
}

/// `request`, which must be answered from the ledger without running.
pub(crate) async fn replay(rt: Arc<Runtime>, request: CallRequest) -> Result<(), String> {
    match rt.call(&request).await {
        Ok(out) if out.replayed => Ok(()),
        Ok(_) => Err("not replayed".into()),
        Err(e) => Err(e.to_string()),
    }
}
