//! One attempt as the guard drives it: what driving it needs to know
//! ([`Drive`]), how it ended ([`Driven`]), how it is looked up at its
//! provider ([`Reconciler`], [`Reconciled`]), and how a definitive answer is
//! recorded on it and how durably. Sending ([`super::drive`]) and
//! reconciling ([`super::reconcile`]) both speak these; neither depends on
//! the other's file for them.

use super::Unsettled;
use crate::ledger::Durability;
use crate::ledger::records::AttemptState;
use crate::ledger::records::{AttemptRecord, CallRecord, Resolution, StoredResponse};
use crate::policy::Downstream;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;

/// One attempt to drive, and what driving it needs to know.
pub(super) struct Drive<'a> {
    /// As the ledger holds it (the caller read or just wrote it); updated in place.
    pub attempt: &'a mut AttemptRecord,
    /// Where it goes.
    pub downstream: &'a Downstream,
    /// The HTTP client to it.
    pub client: &'a reqwest::Client,
    /// Its plugin's `reconcile`, if it has one.
    pub reconciler: Option<&'a dyn Reconciler>,
    /// The tool call it belongs to.
    pub call: &'a CallRecord,
    /// An earlier try may have reached the downstream (it was found pending
    /// or unknown).
    pub possibly_sent: bool,
}

/// How driving an attempt ended.
pub(super) enum Driven {
    /// A definitive answer (from the downstream or found by reconciliation).
    Answered(StoredResponse),
    /// It may have taken effect; what the plugin and model are told.
    Unsettled(Unsettled),
    /// Nothing reached the downstream.
    NotSent(String),
    /// Not sent, and nothing written: the attempt's record is damaged (its
    /// stored request cannot be sent as it is). It may have taken effect
    /// before; an operator must look. The record is left as it is.
    Damaged(Unsettled),
}

/// Records a definitive answer on `attempt`.
pub(super) fn settle(attempt: &mut AttemptRecord, state: AttemptState, response: StoredResponse, resolution: Option<Resolution>) -> Driven {
    attempt.state = state;
    attempt.response = Some(response.clone());
    attempt.last_error = None;
    attempt.resolution = resolution;
    Driven::Answered(response)
}

/// Outcomes of key-honouring downstreams may be buffered: a lost one is
/// recovered by re-sending the same key. Others must be synced.
pub(super) fn settled_durability(d: &Downstream) -> Durability {
    if d.honours_keys { Durability::Buffered } else { Durability::Synced }
}

/// What looking an attempt up at its provider found.
#[derive(Debug, Clone, PartialEq)]
pub enum Reconciled {
    /// The provider has it; the response it stands for.
    Found(StoredResponse),
    /// The provider has no record of it.
    NotFound,
    /// The look-up failed or could not tell; why.
    StillUnknown(String),
}

impl Reconciled {
    /// Its name in the reconciliation metric.
    pub(super) fn label(&self) -> &'static str {
        match self {
            Self::Found(_) => "found",
            Self::NotFound => "not-found",
            Self::StillUnknown(_) => "still-unknown",
        }
    }
}

/// Looks attempts up at their provider: a plugin's `reconcile` export.
pub trait Reconciler: Send + Sync {
    /// Looks `attempt`, made by `tool` with canonical `args`, up.
    fn reconcile<'a>(&'a self, tool: &'a str, args: &'a Value, attempt: &'a AttemptRecord) -> Pin<Box<dyn Future<Output = Reconciled> + Send + 'a>>;
}
