//! Effect classes: what a tool does to the world, and the class the host
//! enforces when the reviewer's and the plugin's disagree.

use serde::{Deserialize, Serialize};

/// The side effect a tool has on the world.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    /// Reads only: may fetch, may not send.
    ReadOnly,
    /// Repeating it with the same arguments leaves the world as one call would.
    Idempotent,
    /// Every execution is a new effect in the world (held while an identical one is unresolved).
    Irreversible,
}

impl Effect {
    /// The class the host enforces: the reviewer's if given; otherwise the
    /// plugin's claim may only restrict — `read-only` stays read-only, any
    /// other claim is treated as `irreversible`.
    pub fn effective(claimed: Self, reviewed: Option<Self>) -> Self {
        match (reviewed, claimed) {
            (Some(r), _) => r,
            (None, Self::ReadOnly) => Self::ReadOnly,
            (None, _) => Self::Irreversible,
        }
    }

    /// The kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::Idempotent => "idempotent",
            Self::Irreversible => "irreversible",
        }
    }
}
