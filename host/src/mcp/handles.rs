//! The handles this host gives clients and later believes only if it made
//! them — a 2026-07-28 `requestState` ([`super::questions`]) and a task id
//! (`super::tasks::id`) — sealed under keys derived from the ledger's
//! secret, one per kind of handle. Every host of a fleet reads the same
//! ledger and so opens what another sealed; a host without a ledger seals
//! with a secret of its own process.

use hmac::{Hmac, Mac as _};
use rmcp::model::RequestStateCodec;
use std::sync::OnceLock;

/// The sealers, made on first use (the ledger is open by then).
#[derive(Default)]
pub(crate) struct Handles(OnceLock<Sealers>);

/// One sealer per kind of handle.
struct Sealers {
    states: RequestStateCodec,
    /// The key task ids are sealed under (`super::tasks::id`).
    tasks: Vec<u8>,
}

impl Handles {
    fn sealers(&self, runtime: impl FnOnce() -> std::sync::Arc<crate::Runtime>) -> &Sealers {
        self.0.get_or_init(|| {
            let secret = match runtime().guard() {
                Some(guard) => guard.ledger().secret().0.to_vec(),
                None => {
                    let mut own = [0u8; 32];
                    getrandom::fill(&mut own).expect("the OS provides randomness");
                    own.to_vec()
                }
            };
            let derive = |label: &[u8]| {
                let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&secret).expect("HMAC takes any key length");
                mac.update(label);
                mac.finalize().into_bytes().to_vec()
            };
            Sealers { states: RequestStateCodec::new_unchecked(derive(b"toolguard requestState v1")), tasks: derive(b"toolguard task ids v2") }
        })
    }

    /// The codec sealing `requestState`.
    pub(crate) fn states(&self, runtime: impl FnOnce() -> std::sync::Arc<crate::Runtime>) -> &RequestStateCodec {
        &self.sealers(runtime).states
    }

    /// The key task ids are sealed under.
    pub(crate) fn task_key(&self, runtime: impl FnOnce() -> std::sync::Arc<crate::Runtime>) -> &[u8] {
        &self.sealers(runtime).tasks
    }
}
