//! The audit's report as text, for a person.

use super::report::{Report, Verdict};
use crate::imports::ImportClass;

/// The human rendering of a report.
pub fn render(report: &Report) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "toolguard audit — config {}, policy {}", report.config, report.policy);
    let l = &report.limits;
    let _ = writeln!(
        out,
        "limits: plugin requests up to {} headers ({} bytes a name, {} a value, {} together); numbers in arguments up to ±{}; ids up to {} bytes\n",
        l.max_request_headers, l.max_header_name_bytes, l.max_header_value_bytes, l.max_header_bytes, l.max_exact_number, l.max_id_bytes
    );
    for c in &report.components {
        let _ = writeln!(out, "{}  {:?}", c.plugin, c.verdict);
        let _ = writeln!(out, "  component    {}", c.source);
        let pin = match c.pin.status {
            "builtin" => " (embedded: pinned by this binary)",
            "match" => " (matches the pin)",
            "mismatch" => " (DOES NOT MATCH the pin)",
            "signed" => " (not pinned: vouched for by a publisher's signature)",
            "digest" => " (pinned by its manifest digest: the reference names the bytes)",
            _ => " (unpinned)",
        };
        if let Some(r) = &c.registry {
            let cached = r.from_cache.as_deref().map(|why| format!("; served from the cache: {why}")).unwrap_or_default();
            let _ = writeln!(out, "  manifest     {} (pulled {}{cached})", r.manifest_digest, r.pulled);
            if let Some(before) = &r.moved_from {
                let _ = writeln!(out, "  tag moved    from {before}: a new component, admitted only by its pin or signature");
            }
            let signature = match (r.signature.status, &r.signature.signer) {
                ("verified", Some(key)) => format!("verified: signed by {key} ({})", r.signature.fingerprint.as_deref().unwrap_or_default()),
                ("unverified", _) => format!("NOT VERIFIED: expected a signature by {}", r.signature.expected.join(" or ")),
                _ => "not required (no signed_by)".into(),
            };
            let _ = writeln!(out, "  signature    {signature}");
        }
        let _ = writeln!(out, "  sha256       {}{pin}", c.sha256.as_deref().unwrap_or("-"));
        for (i, imp) in c.imports.iter().enumerate() {
            let class = imp.class.map_or("", |k| match k {
                ImportClass::Granted => "granted",
                ImportClass::Inert => "inert",
                ImportClass::Sealed => "sealed",
                ImportClass::Forbidden => "FORBIDDEN",
            });
            let label = if i == 0 { "imports" } else { "" };
            let why = imp.why.as_deref().map(|w| format!(" — {w}")).unwrap_or_default();
            let functions = if imp.functions.is_empty() { String::new() } else { format!(" [{}]", imp.functions.join(", ")) };
            let _ = writeln!(out, "  {label:<12} {:<40} {class:<9}{functions}{why}", imp.name);
        }
        for (i, exp) in c.exports.iter().enumerate() {
            let label = if i == 0 { "exports" } else { "" };
            let _ = writeln!(out, "  {label:<12} {:<40} [{}]", exp.name, exp.functions.join(", "));
        }
        for (i, t) in c.tools.iter().enumerate() {
            let label = if i == 0 { "tools" } else { "" };
            let reviewed = if t.reviewed { "reviewed" } else { "unreviewed" };
            let _ = writeln!(
                out,
                "  {label:<12} {:<16} claimed {:<13} granted {:<13} {reviewed}{}{}{}{}{}{}",
                t.name,
                t.claimed.as_str(),
                t.granted.as_str(),
                if t.may_send { ", may send" } else { "" },
                t.action.as_ref().map(|a| format!("; its action: {}", a.join(", "))).unwrap_or_default(),
                t.approval.as_ref().map(|a| format!("; approval: {a}")).unwrap_or_default(),
                t.confirm_repeat_within_minutes.map(|m| format!("; a repeat within {m} min needs confirming")).unwrap_or_default(),
                t.spending_limits.iter().map(|l| format!("; limit: {}", l.describe())).collect::<String>(),
                if t.scopes.is_empty() { String::new() } else { format!("; needs scope {}", t.scopes.join(" ")) }
            );
        }
        if c.grants.is_empty() {
            let _ = writeln!(out, "  grants       none: it reaches nothing");
        }
        for (i, g) in c.grants.iter().enumerate() {
            let label = if i == 0 { "grants" } else { "" };
            let encoded = if g.allow_encoded_path { ", ENCODED PATHS ALLOWED" } else { "" };
            let _ = writeln!(out, "  {label:<12} {} {} ({}; bodies up to {} bytes{encoded})", g.methods.join(","), g.url, g.downstream, g.max_request_bytes);
            let clear = if g.transport == "http (insecure_http)" { " — IN CLEAR beyond loopback" } else { "" };
            let mut route = format!("{}{clear}", g.transport);
            if let Some(t) = &g.tls {
                let roots = match (&t.ca_file, t.platform_roots) {
                    (Some(ca), true) => format!("platform roots + {ca}"),
                    (Some(ca), false) => format!("only {ca}"),
                    (None, _) => "platform roots".into(),
                };
                let mtls = t.client_certificate.as_ref().map_or(String::new(), |c| format!(", client certificate {c}"));
                let pins = if t.spki_pins > 0 { format!(", {} SPKI pin(s)", t.spki_pins) } else { String::new() };
                route.push_str(&format!(", TLS {}+, {roots}{mtls}{pins}", t.min_version));
            }
            if let Some(p) = &g.proxy {
                route.push_str(&format!(", through proxy {p}"));
            }
            let _ = writeln!(out, "  {:<12} {route}", "");
        }
        for c in &c.credentials {
            let state = if c.available { "available" } else { "NOT available" };
            let _ = writeln!(out, "  credential   {}: {} from {} ({state})", c.downstream, c.header, c.source);
        }
        for k in &c.keys {
            let _ = writeln!(out, "  keys         {}: {} ({} format)", k.downstream, k.transports.join(", "), k.format);
        }
        let per_hour = |n: Option<u32>| n.map_or("unlimited".to_string(), |n| n.to_string());
        let _ = writeln!(
            out,
            "  budgets      {} sends per call; {} irreversible calls per session per hour, {} per principal per hour",
            c.budgets.max_sends_per_call,
            per_hour(c.budgets.max_irreversible_calls_per_session_hour),
            per_hour(c.budgets.max_irreversible_calls_per_principal_hour)
        );
        for r in &c.reasons {
            let _ = writeln!(out, "  FAIL         {r}");
        }
        for n in &c.notes {
            let _ = writeln!(out, "  note         {n}");
        }
        out.push('\n');
    }
    let failed = report.components.iter().filter(|c| c.verdict == Verdict::FAIL).count();
    let _ = writeln!(out, "verdict: {:?} ({failed} of {} components fail)", report.verdict, report.components.len());
    out
}
