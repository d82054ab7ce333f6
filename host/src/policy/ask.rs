//! What a plugin may ask the MCP client mid-call (`ask_client`): the kinds
//! of question of the `toolguard:plugin/client` interface. None by default.

use serde::{Deserialize, Serialize};

/// A kind of question a plugin may put to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuestionKind {
    /// `elicitation/create`: a form for the person at the client.
    Elicitation,
    /// `sampling/createMessage`: a completion from the client's model.
    Sampling,
    /// `roots/list`: the client's roots.
    Roots,
}

impl QuestionKind {
    /// Every kind, in order.
    pub const ALL: [QuestionKind; 3] = [Self::Elicitation, Self::Sampling, Self::Roots];

    /// The policy's and the audit's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Elicitation => "elicitation",
            Self::Sampling => "sampling",
            Self::Roots => "roots",
        }
    }

    /// The MCP request that asks it.
    pub fn method(self) -> &'static str {
        match self {
            Self::Elicitation => "elicitation/create",
            Self::Sampling => "sampling/createMessage",
            Self::Roots => "roots/list",
        }
    }
}
