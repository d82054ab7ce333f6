//! The kinds of change a review reports (`toolguard audit --against`):
//! each rule's id, direction and the reviewer's help — the same table the
//! SARIF output lists as its rules.

use Direction::{Narrowing, Widening};
use serde::Serialize;

/// Whether a change lets a plugin do more (or tell the model something
/// unreviewed), or less.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// More reach, fewer guards, or words and schemas not yet reviewed: fails unless acknowledged.
    Widening,
    /// Less: listed.
    Narrowing,
}

/// A kind of change: its id, and what a reviewer should check.
pub struct Rule {
    /// The id findings carry.
    pub id: &'static str,
    /// Widening or narrowing.
    pub direction: Direction,
    /// What to check, for the reviewer.
    pub help: &'static str,
}

const fn rule(id: &'static str, direction: Direction, help: &'static str) -> Rule {
    Rule { id, direction, help }
}

/// Every kind of change the review reports.
pub const RULES: &[Rule] = &[
    rule("plugin-added", Widening, "A new plugin: audit it whole (toolguard audit) before it serves."),
    rule("plugin-removed", Narrowing, "A plugin no longer served."),
    rule("component-changed", Widening, "New bytes: a new version of the component. Check what else this review lists for it."),
    rule("source-changed", Widening, "The component now comes from elsewhere (file, registry, repository, tag)."),
    rule("signer-changed", Widening, "Another publisher, or none, now vouches for the component."),
    rule("signer-added", Narrowing, "A publisher's signature now vouches for the component."),
    rule("import-added", Widening, "The component imports an interface it did not (and so may use it)."),
    rule("import-removed", Narrowing, "The component no longer imports an interface."),
    rule("import-class-widened", Widening, "An import the host treated as inert or sealed is now linked (or worse)."),
    rule("import-class-narrowed", Narrowing, "An import is now inert or sealed where it was linked."),
    rule("grant-added", Widening, "The plugin may now send a method to a URL it could not reach."),
    rule("grant-removed", Narrowing, "The plugin may no longer reach a method and URL."),
    rule("grant-loosened", Widening, "A grant now allows encoded paths, larger bodies, plain HTTP, another proxy or weaker TLS."),
    rule("grant-tightened", Narrowing, "A grant allows less: smaller bodies, stricter paths or TLS."),
    rule("credential-added", Widening, "The host now injects a credential for the plugin."),
    rule("credential-removed", Narrowing, "The host no longer injects a credential."),
    rule("questions-added", Widening, "The plugin may now ask the MCP client (its person, model or roots) this kind of question mid-call (`ask_client`)."),
    rule("questions-removed", Narrowing, "The plugin may no longer ask the client this kind of question."),
    rule("key-transport-changed", Widening, "How the idempotency key reaches a downstream changed: the provider must recognise re-sends the new way."),
    rule("budget-raised", Widening, "A budget (sends per call, irreversible calls per hour) is higher or gone."),
    rule("budget-lowered", Narrowing, "A budget is lower or new."),
    rule("limits-raised", Widening, "An invocation may take more memory, CPU, time, outbound calls or larger arguments or results ([limits])."),
    rule("limits-lowered", Narrowing, "An invocation may take less ([limits])."),
    rule("tool-added", Widening, "A new tool the model can call: check its class, description and schemas."),
    rule("tool-removed", Narrowing, "A tool the model can no longer call."),
    rule(
        "effect-widened",
        Widening,
        "A tool's enforced class lets it do more: it may now send, or its repeats are no longer held (irreversible to idempotent).",
    ),
    rule("effect-narrowed", Narrowing, "A tool's enforced class lets it do less."),
    rule("action-changed", Widening, "Which calls of an irreversible tool are the same action changed (policy `action`)."),
    rule("consent-removed", Widening, "A person's approval or confirmation is no longer asked for (policy `approval`, `confirm_repeat_within_minutes`)."),
    rule("consent-added", Narrowing, "A person's approval or confirmation is now asked for."),
    rule(
        "spending-limit-widened",
        Widening,
        "A tool's calls may move more: a spending limit raised, removed, or made passable with a person's approval (policy `limits`, `over_limit`).",
    ),
    rule("spending-limit-narrowed", Narrowing, "A tool's calls may move less: a spending limit added or lowered."),
    rule("scopes-changed", Widening, "The OAuth scopes a call needs changed."),
    rule("description-changed", Widening, "What the tool tells the model changed under the same name: read the new description."),
    rule("input-schema-changed", Widening, "The arguments the tool takes changed."),
    rule("output-schema-changed", Widening, "The result the tool promises changed."),
];

/// The direction of rule `id`.
pub(super) fn direction_of(id: &str) -> Direction {
    RULES.iter().find(|r| r.id == id).map_or(Widening, |r| r.direction)
}
