//! Logs to stderr (stdout carries results) and, with a collector
//! configured, traces to OpenTelemetry.

/// The trace exporter, when a collector is configured.
pub(super) static TRACES: std::sync::OnceLock<opentelemetry_sdk::trace::SdkTracerProvider> = std::sync::OnceLock::new();

/// Sends the spans still batched to the collector, if there is one (before
/// [`exit_now`], which would drop them).
pub(super) fn flush_traces() {
    if let Some(provider) = TRACES.get() {
        let _ = tokio::task::block_in_place(|| provider.force_flush());
    }
}

/// Logs go to stderr (stdout carries results). `TOOLGUARD_LOG` takes an
/// `EnvFilter` directive; the default shows plugin output and warnings.
/// `TOOLGUARD_LOG_SPANS=1` also logs each `tool_call` and `attempt` span as
/// it closes, with its fields (outcome, key, step, state, latency): an
/// access log. With `OTEL_EXPORTER_OTLP_ENDPOINT` set, the spans also go to
/// that OpenTelemetry collector (the provider returned is to be shut down
/// at exit, which sends what is still batched).
pub(super) fn init_logging(runtime: tokio::runtime::Handle) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOOLGUARD_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,rmcp=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let log_spans = std::env::var_os("TOOLGUARD_LOG_SPANS").is_some_and(|v| v == "1");
    let provider = crate::telemetry::otlp_provider(runtime);
    let logs = log_subscriber(filter, ansi, log_spans, provider.is_some());
    // No layer at all without a collector: even an empty one would make the
    // per-call spans live.
    let _ = match &provider {
        Some(p) => logs.with(crate::telemetry::layer(p)).try_init(),
        None => logs.try_init(),
    };
    provider
}

/// The log (stderr, through `filter`), before any OpenTelemetry layer. The
/// per-call spans (`tool_call`, `attempt`) are logged as they close if
/// `log_spans`; unless `spans_wanted` (logged, or sent to a collector) they
/// are off for the whole subscriber, not just ignored by the log: a span a
/// global filter lets through is built, stored and entered on every poll of
/// the call's futures even when no layer wants it (~3 % of a guarded call's
/// CPU at 64 in flight), and formatting their fields for every call halved
/// replay throughput (docs/benchmarks.md, e).
fn log_subscriber(
    filter: tracing_subscriber::EnvFilter,
    ansi: bool,
    log_spans: bool,
    spans_wanted: bool,
) -> impl tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span> + Send + Sync {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let spans = if log_spans { tracing_subscriber::fmt::format::FmtSpan::CLOSE } else { tracing_subscriber::fmt::format::FmtSpan::NONE };
    let per_call = |m: &tracing::Metadata<'_>| m.is_span() && matches!(m.name(), "tool_call" | "attempt");
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_span_events(spans)
        .with_filter(tracing_subscriber::filter::filter_fn(move |m| log_spans || !per_call(m)));
    let calls = tracing_subscriber::filter::filter_fn(move |m| spans_wanted || !per_call(m));
    tracing_subscriber::registry().with(filter).with(calls).with(fmt)
}

#[cfg(test)]
mod tests {
    /// Whether a span named `name` is live under the log built with these settings.
    fn live(name: &str, log_spans: bool, spans_wanted: bool) -> bool {
        let log = super::log_subscriber(tracing_subscriber::EnvFilter::new("info"), false, log_spans, spans_wanted);
        tracing::subscriber::with_default(log, || match name {
            "tool_call" => !tracing::info_span!("tool_call", tool = "refund").is_disabled(),
            "attempt" => !tracing::info_span!("attempt", step = 0).is_disabled(),
            _ => !tracing::info_span!("startup").is_disabled(),
        })
    }

    #[test]
    fn the_per_call_spans_are_off_unless_logged_or_sent_to_a_collector() {
        for name in ["tool_call", "attempt"] {
            assert!(!live(name, false, false), "{name}: nothing wants it, so it must cost nothing");
            assert!(live(name, true, true), "{name}: TOOLGUARD_LOG_SPANS=1 logs it");
            assert!(live(name, false, true), "{name}: a collector receives it");
        }
        assert!(live("startup", false, false), "other spans follow TOOLGUARD_LOG alone");
    }
}
