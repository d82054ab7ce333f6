//! Traces over OpenTelemetry: when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the `tool_call` and `attempt`
//! spans go to that collector as OTLP/HTTP with JSON bodies.
//!
//! Over HTTPS, the collector is verified against the platform's roots and
//! `OTEL_EXPORTER_OTLP_CERTIFICATE` (a CA file), and the host presents
//! `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` / `OTEL_EXPORTER_OTLP_CLIENT_KEY`
//! for mutual TLS — the standard variables, read once at start.
//!
//! The OpenTelemetry SDK batches the spans (`tracing-opentelemetry` bridges
//! them from `tracing`); the exporter here only encodes a batch in OTLP's
//! JSON mapping and posts it with the host's HTTP client. (The official
//! `opentelemetry-otlp` exporter needs `prost`, whose build features would
//! force RocksDB's C++ to rebuild; docs/fleet.md.)

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, SpanData, SpanExporter};
use serde_json::{Value as Json, json};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often batched spans are sent.
const EXPORT_EVERY: Duration = Duration::from_secs(1);

/// The collector's traces URL, if one is configured (standard OTel variables).
fn traces_url() -> Option<String> {
    if let Ok(url) = std::env::var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return Some(url);
    }
    std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok().map(|base| format!("{}/v1/traces", base.trim_end_matches('/')))
}

/// A tracer provider exporting to the configured collector, or `None` when
/// none is configured. Exports run on `runtime`.
pub fn otlp_provider(runtime: tokio::runtime::Handle) -> Option<SdkTracerProvider> {
    let url = traces_url()?;
    let client = match client(&url) {
        Ok(client) => client,
        Err(e) => {
            eprintln!("toolguard: traces are not exported: {e}");
            return None;
        }
    };
    let exporter = OtlpJson { url, client, runtime };
    let batches = BatchSpanProcessor::builder(exporter).with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(EXPORT_EVERY).build()).build();
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("toolguard").build();
    Some(SdkTracerProvider::builder().with_span_processor(batches).with_resource(resource).build())
}

/// The exporter's HTTP client: TLS as the standard variables set it.
fn client(url: &str) -> Result<reqwest::Client, String> {
    let var = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
    let tls = crate::policy::TlsPolicy {
        ca_file: var("OTEL_EXPORTER_OTLP_CERTIFICATE"),
        client_cert_file: var("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        client_key_file: var("OTEL_EXPORTER_OTLP_CLIENT_KEY"),
        ..crate::policy::TlsPolicy::default()
    };
    let label = "the OTLP collector";
    let tls = if url.starts_with("https:") { Some(crate::net::tls::rustls_config(&tls, label)?) } else { None };
    crate::net::client(crate::net::Peer::direct(label, tls, crate::net::deadlines::OTLP_EXPORT))
}

/// A `tracing` layer sending spans to `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("toolguard"))
}

/// Posts span batches as OTLP/HTTP JSON.
#[derive(Debug)]
struct OtlpJson {
    url: String,
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl SpanExporter for OtlpJson {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let body = encode(&batch).to_string();
        let request = self.client.post(&self.url).header("content-type", "application/json").body(body);
        // The batch processor runs on its own thread: the request runs on the host's runtime.
        let sent = self.runtime.spawn(async move { request.send().await.and_then(reqwest::Response::error_for_status) });
        match sent.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(OTelSdkError::InternalFailure(format!("OTLP export failed: {e}"))),
            Err(e) => Err(OTelSdkError::InternalFailure(format!("OTLP export task failed: {e}"))),
        }
    }
}

/// A batch in OTLP's JSON mapping (ids as hex, 64-bit integers as strings).
fn encode(batch: &[SpanData]) -> Json {
    let spans: Vec<Json> = batch.iter().map(span).collect();
    json!({ "resourceSpans": [{
        "resource": { "attributes": [attribute(&KeyValue::new("service.name", "toolguard"))] },
        "scopeSpans": [{ "scope": { "name": "toolguard" }, "spans": spans }],
    }]})
}

fn span(s: &SpanData) -> Json {
    let parent = if s.parent_span_id == opentelemetry::trace::SpanId::INVALID { String::new() } else { s.parent_span_id.to_string() };
    json!({
        "traceId": s.span_context.trace_id().to_string(),
        "spanId": s.span_context.span_id().to_string(),
        "parentSpanId": parent,
        "name": s.name,
        "kind": 1,
        "startTimeUnixNano": nanos(s.start_time),
        "endTimeUnixNano": nanos(s.end_time),
        "attributes": s.attributes.iter().map(attribute).collect::<Vec<_>>(),
    })
}

fn nanos(t: SystemTime) -> String {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()).to_string()
}

fn attribute(kv: &KeyValue) -> Json {
    let value = match &kv.value {
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::I64(i) => json!({ "intValue": i.to_string() }),
        Value::F64(f) => json!({ "doubleValue": f }),
        other => json!({ "stringValue": other.to_string() }),
    };
    json!({ "key": kv.key.as_str(), "value": value })
}
