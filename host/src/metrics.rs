//! The operator's view: this process's Prometheus metrics, served as
//! OpenMetrics text at `/metrics` by `toolguard serve --http`.
//!
//! Counters are counted where things happen (tool calls, attempts,
//! reconciliations, sandbox instantiations); what the ledger holds (unknown
//! attempts outstanding, synced writes, WAL fsyncs, spending limits' use)
//! is read at scrape time.
//! One registry per process, like Prometheus's own default registry.

use crate::ledger::{AttemptState, Ledger};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: String,
    /// `ok`, `replayed`, or the error kind (`conflict`, `held`, `outcome-unknown`, …).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    downstream: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    /// `found`, `not-found` or `still-unknown`.
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ComponentLabels {
    plugin: String,
    /// The component's sha256 (hex).
    sha256: String,
    /// `builtin:NAME`, the file, or the `oci://` reference as configured.
    source: String,
    /// For a registry component: the manifest digest its reference resolved to.
    manifest: String,
    /// For a signed component: the fingerprint of the key that signed it.
    signer: String,
    /// The digest of the effective policy it runs under (what approvals bind
    /// to): hosts of a fleet serving different policies show different ones.
    policy: String,
}

/// One spending limit of a tool (`crate::policy::limits`): its index in the tool's `limits`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    plugin: String,
    tool: String,
    limit: String,
}

/// One spending limit's uses in one currency (empty when it keeps none apart).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitUseLabels {
    plugin: String,
    tool: String,
    limit: String,
    currency: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitOverLabels {
    tool: String,
    /// `refused`, or `asked` (a person decides: `over_limit = "approve"`).
    then: String,
}

/// A loaded plugin, as `toolguard_component_info` names it.
#[derive(Debug, Clone, Copy)]
pub struct ComponentInfo<'a> {
    /// The plugin's name.
    pub plugin: &'a str,
    /// The component's sha256 (hex).
    pub sha256: &'a str,
    /// `builtin:NAME`, the file, or the `oci://` reference as configured.
    pub source: &'a str,
    /// For a registry component: the manifest digest its reference resolved to.
    pub manifest: Option<&'a str>,
    /// For a signed component: the fingerprint of the key that signed it.
    pub signer: Option<&'a str>,
    /// The digest of its effective policy.
    pub policy: &'a str,
}

/// Every metric of the process.
struct Metrics {
    registry: Registry,
    tool_calls: Family<CallLabels, Counter>,
    attempts: Family<AttemptLabels, Counter>,
    reconciles: Family<ReconcileLabels, Counter>,
    instantiate: Histogram,
    unknown_outstanding: Gauge,
    synced_writes: Gauge<u64, AtomicU64>,
    wal_syncs: Gauge<u64, AtomicU64>,
    batch: Gauge<f64, AtomicU64>,
    components: Family<ComponentLabels, Gauge>,
    limit_max: Family<LimitLabels, Gauge<u64, AtomicU64>>,
    limit_scopes: Family<LimitUseLabels, Gauge>,
    limit_used_max: Family<LimitUseLabels, Gauge<u64, AtomicU64>>,
    limit_over: Family<LimitOverLabels, Counter>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let (tool_calls, attempts, reconciles, components) = (Family::default(), Family::default(), Family::default(), Family::default());
    // 10 µs … ~80 ms.
    let instantiate = Histogram::new(exponential_buckets(1e-5, 2.0, 14));
    let (unknown_outstanding, synced_writes, wal_syncs, batch) = (Gauge::default(), Gauge::default(), Gauge::default(), Gauge::default());
    let mut registry = Registry::with_prefix("toolguard");
    registry.register("tool_calls", "Tool calls answered, by tool and outcome", tool_calls.clone());
    registry.register("attempts", "Sends driven to an outcome, by downstream and the state they ended in", attempts.clone());
    registry.register("reconciles", "Reconciliations of unknown outcomes, by result", reconciles.clone());
    registry.register("sandbox_instantiate_seconds", "Time to instantiate a fresh sandbox", instantiate.clone());
    registry.register("unknown_attempts", "Attempts whose outcome is unknown, in the ledger now", unknown_outstanding.clone());
    registry.register("ledger_synced_writes", "Synced ledger writes by this process", synced_writes.clone());
    registry.register(
        "ledger_wal_fsyncs",
        "WAL fsyncs by this process's RocksDB ledger (synced writes / fsyncs = the group-commit batch size)",
        wal_syncs.clone(),
    );
    registry.register("ledger_writes_per_fsync", "Mean group-commit batch: synced writes per WAL fsync so far", batch.clone());
    registry.register(
        "component_info",
        "Each loaded plugin's component: its sha256, source, resolved manifest, signer and effective policy digest (value 1)",
        components.clone(),
    );
    let (limit_max, limit_scopes, limit_used_max, limit_over) = (Family::default(), Family::default(), Family::default(), Family::default());
    registry.register("limit_max", "Each spending limit's most a window holds, by plugin, tool and the limit's index in its `limits`", limit_max.clone());
    registry.register(
        "limit_scopes",
        "Scopes (principals, tenants, sessions) holding a use of a spending limit in its current window, in the ledger now (a fleet's, on a shared one)",
        limit_scopes.clone(),
    );
    registry.register(
        "limit_used_max",
        "The most any one scope of a spending limit has used in its current window, in the ledger now: divide by toolguard_limit_max to alert before the edge",
        limit_used_max.clone(),
    );
    registry.register("limit_over", "Calls that would have passed a spending limit, by tool and what happened: refused, or asked a person", limit_over.clone());
    Metrics {
        registry,
        tool_calls,
        attempts,
        reconciles,
        instantiate,
        unknown_outstanding,
        synced_writes,
        wal_syncs,
        batch,
        components,
        limit_max,
        limit_scopes,
        limit_used_max,
        limit_over,
    }
});

/// Counts a tool call's answer.
pub fn tool_call(tool: &str, outcome: &str) {
    METRICS.tool_calls.get_or_create(&CallLabels { tool: tool.into(), outcome: outcome.into() }).inc();
}

/// Counts a send driven to `state` at `downstream`.
pub fn attempt(downstream: &str, state: AttemptState) {
    METRICS.attempts.get_or_create(&AttemptLabels { downstream: downstream.into(), state: state.as_str().into() }).inc();
}

/// Counts a reconciliation's result.
pub fn reconcile(result: &str) {
    METRICS.reconciles.get_or_create(&ReconcileLabels { result: result.into() }).inc();
}

/// Records a loaded plugin's component: what it is, where it came from, the policy it runs under.
pub fn component(c: ComponentInfo<'_>) {
    let labels = ComponentLabels {
        plugin: c.plugin.into(),
        sha256: c.sha256.into(),
        source: c.source.into(),
        manifest: c.manifest.unwrap_or_default().into(),
        signer: c.signer.unwrap_or_default().into(),
        policy: c.policy.into(),
    };
    METRICS.components.get_or_create(&labels).set(1);
}

/// Forgets every component and limit published so far (a reload publishes its own).
pub fn components_cleared() {
    METRICS.components.clear();
    METRICS.limit_max.clear();
}

/// Records the `index`th spending limit of `plugin`'s tool `tool`: the most its window holds.
pub fn limit(plugin: &str, tool: &str, index: usize, max: u64) {
    METRICS.limit_max.get_or_create(&LimitLabels { plugin: plugin.into(), tool: tool.into(), limit: index.to_string() }).set(max);
}

/// Counts a call of `tool` that would have passed a spending limit: `refused`, or `asked` a person.
pub fn limit_over(tool: &str, then: &str) {
    METRICS.limit_over.get_or_create(&LimitOverLabels { tool: tool.into(), then: then.into() }).inc();
}

/// What one scope (a principal, tenant or session) holds of one spending
/// limit in its current window.
#[derive(Debug, Clone)]
pub struct LimitUse {
    /// The limit's plugin.
    pub plugin: String,
    /// Its tool.
    pub tool: String,
    /// Its index in the tool's `limits`.
    pub limit: usize,
    /// The currency its sums are kept apart by (empty: none).
    pub currency: String,
    /// What the scope used.
    pub used: u64,
}

/// Sets the limits' use gauges from what they hold now (scopes whose window ended are gone).
fn limits_in_use(uses: &[LimitUse]) {
    METRICS.limit_scopes.clear();
    METRICS.limit_used_max.clear();
    for u in uses {
        let labels = LimitUseLabels { plugin: u.plugin.clone(), tool: u.tool.clone(), limit: u.limit.to_string(), currency: u.currency.clone() };
        METRICS.limit_scopes.get_or_create(&labels).inc();
        let highest = METRICS.limit_used_max.get_or_create(&labels);
        highest.set(highest.get().max(u.used));
    }
}

/// Records how long a sandbox took to instantiate.
pub fn instantiated(elapsed: std::time::Duration) {
    METRICS.instantiate.observe(elapsed.as_secs_f64());
}

/// The metrics as OpenMetrics text, with the ledger's figures read now and
/// what each spending limit holds (`limits`, read by the caller). Blocks
/// (it reads the ledger).
///
/// # Errors
/// The ledger cannot be read.
pub fn render(ledger: Option<&Ledger>, limits: &[LimitUse]) -> Result<String, crate::ledger::LedgerError> {
    if let Some(ledger) = ledger {
        let unknown = ledger.attempts_in_state(AttemptState::Unknown)?.len();
        METRICS.unknown_outstanding.set(i64::try_from(unknown).unwrap_or(i64::MAX));
        let (synced, fsyncs) = (ledger.write_counts().0, ledger.wal_syncs().unwrap_or(0));
        METRICS.synced_writes.set(synced);
        METRICS.wal_syncs.set(fsyncs);
        #[allow(clippy::cast_precision_loss)] // a ratio of counters
        METRICS.batch.set(if fsyncs == 0 { 0.0 } else { synced as f64 / fsyncs as f64 });
        limits_in_use(limits);
    }
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &METRICS.registry).expect("writing to a String cannot fail");
    Ok(text)
}
