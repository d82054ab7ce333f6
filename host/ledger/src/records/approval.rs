//! A person's approval of one irreversible action (`docs/tasks.md`,
//! "Consent"), kept in the record of the tool call that asked for it: bound
//! to that call's principal and session (the record's key), its action
//! digest (the record's), the digest of the effective policy it was asked
//! under, and an expiry.

use serde::{Deserialize, Serialize};

/// Where an approval request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApprovalStatus {
    /// Asked; nobody has decided.
    Pending,
    /// A person approved the action: the call may run once.
    Approved,
    /// A person denied it: the call's definitive answer.
    Denied,
}

/// One approval request of a tool call and its decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// The request's id (random): a decision names it, so a decision meant
    /// for an earlier request (expired, asked again) never applies.
    pub request: String,
    /// Where it stands.
    pub status: ApprovalStatus,
    /// Why it was asked, in words (the rule that matched).
    pub reason: String,
    /// sha256 of the effective policy of the tool's plugin when it was asked:
    /// an approval does not carry over to another policy.
    pub policy_digest: String,
    /// The authenticated principal that made the call, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub principal: Option<String>,
    /// When it was asked (Unix ms).
    pub requested_ms: u64,
    /// Until when it may be decided (Unix ms). Once approved, it may be
    /// used for as long again from its decision ([`Approval::usable_until`]).
    pub expires_ms: u64,
    /// Who decided: `client:<principal>` for the person at the client,
    /// `operator:<name>` for an operator.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub decided_by: Option<String>,
    /// When it was decided (Unix ms).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub decided_ms: Option<u64>,
    /// What the decider said.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub note: Option<String>,
}

impl Approval {
    /// Whether it waits for a decision at `now_ms` (asked, not expired).
    pub fn waiting(&self, now_ms: u64) -> bool {
        self.status == ApprovalStatus::Pending && now_ms < self.expires_ms
    }

    /// Until when an approval may be first used (Unix ms): the time it
    /// gave for a decision, counted again from the decision — an approval
    /// given in its last minute is not lost before its caller can retry.
    pub fn usable_until(&self) -> u64 {
        let window = self.expires_ms.saturating_sub(self.requested_ms);
        self.decided_ms.unwrap_or(self.requested_ms).saturating_add(window)
    }
}
